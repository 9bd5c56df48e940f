import { AccessMode } from "./gen/gitcsi/v1/volume";

/** The access modes the driver serves, by the names Kubernetes gives them. */
export type AccessModeName = "ReadWriteOnce" | "ReadWriteOncePod" | "ReadOnlyMany";

const BY_NAME: Record<AccessModeName, AccessMode> = {
  ReadWriteOncePod: AccessMode.READ_WRITE_ONCE_POD,
  ReadWriteOnce: AccessMode.READ_WRITE_ONCE,
  ReadOnlyMany: AccessMode.READ_ONLY_MANY,
};

/** A reader writes nothing to the remote and claims no owner ref. */
export function isReader(mode: AccessMode): boolean {
  return mode === AccessMode.READ_ONLY_MANY;
}

/** The mode a Kubernetes name stands for, or undefined for any other name. */
export function accessModeNamed(name: string): AccessMode | undefined {
  return Object.hasOwn(BY_NAME, name) ? BY_NAME[name as AccessModeName] : undefined;
}

/** The Kubernetes name of a mode, or undefined for unspecified and unknown modes. */
export function accessModeName(mode: AccessMode): AccessModeName | undefined {
  return (Object.keys(BY_NAME) as AccessModeName[]).find((name) => BY_NAME[name] === mode);
}

/** A mode for a message: its Kubernetes name, or "unspecified". */
export function describeAccessMode(mode: AccessMode): string {
  return accessModeName(mode) ?? "unspecified";
}
