import { BRANCH_RULE, branchOf, readerRefOf, refProblem } from "./ref";

/**
 * What a StorageClass's `ref` may name, and the external-provisioner's
 * parameter (`--extra-create-metadata`) each takes its value from: the
 * variables csi-driver-nfs's `subDir` takes.
 */
export const REF_VARIABLES: Record<string, string> = {
  "pvc.metadata.namespace": "csi.storage.k8s.io/pvc/namespace",
  "pvc.metadata.name": "csi.storage.k8s.io/pvc/name",
  "pv.metadata.name": "csi.storage.k8s.io/pv/name",
};

/** The variables that tell one claim from another: only a ref with one is a branch of its own. */
const PER_CLAIM = ["${pvc.metadata.name}", "${pv.metadata.name}"];

export type OnDelete = "keep" | "archive" | "delete";
const ON_DELETE: OnDelete[] = ["keep", "archive", "delete"];

/** What CreateVolume makes on the remote: the branch, where a new one starts, and what DeleteVolume does to it. */
export interface BranchPlan {
  /** The ref with its variables rendered. */
  ref: string;
  /** "" for the remote's default branch. */
  baseRef: string;
  onDelete: OnDelete;
  /**
   * CreateVolume makes the branch when absent: a ref with variables or a
   * baseRef asks for it. A plain ref is the user's branch, as it always was,
   * and CreateVolume does not reach the remote for it.
   */
  makesBranch: boolean;
}

/** gRPC's code for InvalidArgument; config depends on no transport. */
const INVALID_ARGUMENT = 3;

/** A StorageClass parameter that cannot be provisioned, named by its field. */
export class ProvisionError extends Error {
  readonly code = INVALID_ARGUMENT;

  constructor(
    readonly parameter: string,
    rule: string,
  ) {
    super(`parameters.${parameter} ${rule}`);
    this.name = "ProvisionError";
  }
}

/**
 * The branch a StorageClass's parameters ask for, its variables taken from
 * the provisioner's: each name checked by git's rules before anything is
 * made. `parameters` holds the user's and the provisioner's keys. A reader
 * may name a tag or a commit, which CreateVolume never makes.
 */
export function branchPlanOf(parameters: Record<string, string>, reader = false): BranchPlan {
  const template = parameters.ref ?? "";
  const ref = renderRef(template, parameters, reader);
  const baseRef = parameters.baseRef ?? "";
  if (baseRef !== "" && branchOf(baseRef) === undefined) throw new ProvisionError("baseRef", `${JSON.stringify(baseRef)} ${BRANCH_RULE}`);
  const onDelete = (parameters.onDelete ?? "keep") as OnDelete;
  if (!ON_DELETE.includes(onDelete)) throw new ProvisionError("onDelete", `${JSON.stringify(parameters.onDelete)} must be one of ${ON_DELETE.join(", ")}`);
  // A branch several claims share is no claim's to archive or delete.
  if (onDelete !== "keep" && !namesClaim(template)) {
    throw new ProvisionError("onDelete", `${onDelete} applies only to a branch per claim: ref must hold ${PER_CLAIM.join(" or ")}`);
  }
  const makesBranch = template.includes("${") || baseRef !== "";
  const pin = readerRefOf(ref)?.kind;
  if (makesBranch && pin !== "branch") throw new ProvisionError("ref", `${JSON.stringify(ref)} names a ${pin}, which CreateVolume cannot make: a pinned ref takes no variable and no baseRef`);
  return { ref, baseRef, onDelete, makesBranch };
}

/** Whether a ref template gives each claim a branch of its own: only then may a volume archive, delete, restore or clone into it. */
export function namesClaim(template: string): boolean {
  return PER_CLAIM.some((v) => template.includes(v));
}

function renderRef(template: string, parameters: Record<string, string>, reader: boolean): string {
  const ref = renderTemplate("ref", template, REF_VARIABLES, parameters, "external-provisioner");
  const problem = refProblem(ref, reader);
  if (problem !== undefined) {
    const renders = ref === template ? "" : ` renders ${JSON.stringify(ref)}, which`;
    throw new ProvisionError("ref", `${JSON.stringify(template)}${renders} ${problem}`);
  }
  return ref;
}

/**
 * A parameter's `${...}` variables replaced by the sidecar's parameters
 * (`variables`: each name's key), with a ProvisionError naming the field for
 * an unclosed or unknown variable and for one the sidecar did not send.
 */
export function renderTemplate(field: string, template: string, variables: Record<string, string>, parameters: Record<string, string>, sidecar: string): string {
  const unclosed = template.replace(/\$\{[^}]*\}/g, "").includes("${");
  if (unclosed) throw new ProvisionError(field, `${JSON.stringify(template)} opens a variable with \${ and never closes it`);
  return template.replace(/\$\{([^}]*)\}/g, (_, name: string) => {
    const key = variables[name];
    if (key === undefined) {
      const known = Object.keys(variables)
        .map((v) => `\${${v}}`)
        .join(", ");
      throw new ProvisionError(field, `${JSON.stringify(template)} names \${${name}}; a ${field} takes ${known}`);
    }
    const value = parameters[key];
    if (!value) throw new ProvisionError(field, `${JSON.stringify(template)} names \${${name}}, which the ${sidecar} sends only with --extra-create-metadata (the chart sets it)`);
    return value;
  });
}
