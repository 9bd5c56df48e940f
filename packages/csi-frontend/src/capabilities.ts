import { accessModeNamed, csi, describeAccessMode, gitcsi, invalidArgument } from "@git-csi/protos";
import { quoted } from "./validate";

const Mode = csi.VolumeCapability_AccessMode_Mode;

const SUPPORTED =
  "supported: a mount volume (no raw block), with no fsType and no mount flags, and access mode SINGLE_NODE_SINGLE_WRITER (ReadWriteOncePod), SINGLE_NODE_WRITER or SINGLE_NODE_MULTI_WRITER (ReadWriteOnce), or MULTI_NODE_READER_ONLY or SINGLE_NODE_READER_ONLY (ReadOnlyMany, read-only)";

/** The volume's immutable access mode from one CSI capability, or InvalidArgument naming the field and what is supported. */
export function accessModeOf(capability: csi.VolumeCapability, field: string): gitcsi.AccessMode {
  if (capability.block) throw invalidArgument(`${field}.block: raw block volumes are not served; ${SUPPORTED}`);
  if (!capability.mount) throw invalidArgument(`${field}.access_type is required; ${SUPPORTED}`);
  if (capability.mount.fsType !== "") throw invalidArgument(`${field}.mount.fs_type ${quoted(capability.mount.fsType)}: a git volume has no filesystem type; ${SUPPORTED}`);
  if (capability.mount.mountFlags.length > 0) throw invalidArgument(`${field}.mount.mount_flags: mount flags are not supported; ${SUPPORTED}`);
  const mode = capability.accessMode?.mode;
  switch (mode) {
    case Mode.SINGLE_NODE_SINGLE_WRITER:
      return gitcsi.AccessMode.READ_WRITE_ONCE_POD;
    case Mode.SINGLE_NODE_WRITER:
    case Mode.SINGLE_NODE_MULTI_WRITER:
      return gitcsi.AccessMode.READ_WRITE_ONCE;
    // A reader claims nothing, so any number of nodes may serve it.
    case Mode.MULTI_NODE_READER_ONLY:
    case Mode.SINGLE_NODE_READER_ONLY:
      return gitcsi.AccessMode.READ_ONLY_MANY;
    case undefined:
      throw invalidArgument(`${field}.access_mode is required; ${SUPPORTED}`);
    default:
      throw invalidArgument(`${field}.access_mode ${Mode[mode] ?? mode}: one node writes a git volume, and many nodes only read one; ${SUPPORTED}`);
  }
}

/** Linux group ids are 32-bit; (gid_t)-1 means "unchanged" to chown. */
const MAX_GROUP_ID = 2 ** 32 - 2;

/** The pod's fsGroup the kubelet passes (VOLUME_MOUNT_GROUP): empty for none, else a decimal group id. */
export function volumeMountGroupOf(capability: csi.VolumeCapability | undefined, field: string): string {
  const group = capability?.mount?.volumeMountGroup ?? "";
  if (group !== "" && !(/^(0|[1-9][0-9]{0,9})$/.test(group) && Number(group) <= MAX_GROUP_ID)) {
    throw invalidArgument(`${field}.mount.volume_mount_group ${JSON.stringify(group)} must be a decimal group id from 0 to ${MAX_GROUP_ID} (the pod's fsGroup)`);
  }
  return group;
}

/** All capabilities of a request must name one access mode: a volume has exactly one. */
export function accessModeOfAll(capabilities: csi.VolumeCapability[], field: string): gitcsi.AccessMode {
  if (capabilities.length === 0) throw invalidArgument(`${field} is required; ${SUPPORTED}`);
  const modes = new Set(capabilities.map((c, i) => accessModeOf(c, `${field}[${i}]`)));
  if (modes.size > 1) throw invalidArgument(`${field} asks for ${[...modes].map(describeAccessMode).join(" and ")}; a volume has one access mode`);
  return [...modes][0]!;
}

export function requiredCapability(capability: csi.VolumeCapability | undefined, field: string): gitcsi.AccessMode {
  if (!capability) throw invalidArgument(`${field} is required; ${SUPPORTED}`);
  return accessModeOf(capability, field);
}

const CONFIRMED: Record<gitcsi.AccessMode, csi.VolumeCapability_AccessMode_Mode> = {
  [gitcsi.AccessMode.ACCESS_MODE_UNSPECIFIED]: Mode.SINGLE_NODE_MULTI_WRITER,
  [gitcsi.AccessMode.READ_WRITE_ONCE]: Mode.SINGLE_NODE_MULTI_WRITER,
  [gitcsi.AccessMode.READ_WRITE_ONCE_POD]: Mode.SINGLE_NODE_SINGLE_WRITER,
  [gitcsi.AccessMode.READ_ONLY_MANY]: Mode.MULTI_NODE_READER_ONLY,
  [gitcsi.AccessMode.UNRECOGNIZED]: Mode.SINGLE_NODE_MULTI_WRITER,
};

/** The capability a recorded access mode confirms, for ValidateVolumeCapabilities. */
export function capabilityOf(mode: gitcsi.AccessMode): csi.VolumeCapability {
  return { mount: { fsType: "", mountFlags: [], volumeMountGroup: "" }, accessMode: { mode: CONFIRMED[mode] } };
}

/** The access mode the volume context records, so that a node call that asks for another fails validation. */
export const ACCESS_MODE_KEY = "accessMode";

/** A PersistentVolume's mode, or unspecified when it names none the driver serves (or several). */
export function accessModeOfPersistentVolume(accessModes: string[]): gitcsi.AccessMode {
  const modes = accessModes.map(accessModeNamed).filter((m) => m !== undefined);
  return modes.length === 1 ? modes[0]! : gitcsi.AccessMode.ACCESS_MODE_UNSPECIFIED;
}

export function checkContextMode(context: Record<string, string>, requested: gitcsi.AccessMode): void {
  const recorded = context[ACCESS_MODE_KEY];
  if (recorded === undefined) return;
  const mode = accessModeNamed(recorded);
  if (mode === undefined) throw invalidArgument(`volume_context.${ACCESS_MODE_KEY} ${quoted(recorded)} must be ReadWriteOncePod, ReadWriteOnce or ReadOnlyMany`);
  if (mode !== requested) {
    throw invalidArgument(`volume_capability asks for ${describeAccessMode(requested)} but the volume was created ${recorded}; its access mode cannot change`);
  }
}
