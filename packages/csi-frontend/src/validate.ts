import * as path from "node:path";
import { BRANCH_RULE, branchOf, ClassParameterError, parseClassParameters } from "@git-csi/config";
import { type gitcsi, invalidArgument, required } from "@git-csi/protos";

/**
 * A volume id is a volumeHandle: it names the side branch `<ref>.<volumeHandle>`
 * and the node's directories, so it must be one safe git ref component.
 */
export function volumeIdOf(value: string, field = "volume_id"): string {
  const id = required(value, field);
  if (!/^[A-Za-z0-9][A-Za-z0-9_.-]{0,252}$/.test(id) || id.includes("..") || id.endsWith(".lock") || id.endsWith(".")) {
    throw invalidArgument(`${field} ${JSON.stringify(id)} must be 1 to 253 letters, digits, '-', '_' or '.', start with a letter or digit, and not contain '..' or end in '.' or '.lock'`);
  }
  return id;
}

export function absolutePath(value: string, field: string): string {
  const p = required(value, field);
  if (!path.isAbsolute(p) || p.includes("\0")) throw invalidArgument(`${field} ${JSON.stringify(p)} must be an absolute path`);
  return path.normalize(p);
}

/** The repository and ref from volume attributes or StorageClass parameters, named as the user wrote them. */
export function sourceOf(attributes: Record<string, string>, field: string): gitcsi.VolumeSource {
  const url = required(attributes.url, `${field}.url`);
  const ref = required(attributes.ref, `${field}.ref`);
  if (/[\s\0]/.test(url)) throw invalidArgument(`${field}.url ${JSON.stringify(url)} must be a git URL without white space`);
  if (branchOf(ref) === undefined) throw invalidArgument(`${field}.ref ${JSON.stringify(ref)} ${BRANCH_RULE}`);
  return { url, ref };
}

/** Class parameters are checked before anything is stored, so a bad one changes nothing. */
export function checkClassParameters(parameters: Record<string, string>, field: string): void {
  try {
    parseClassParameters(parameters);
  } catch (err) {
    if (err instanceof ClassParameterError) throw invalidArgument(`${field}: ${err.message}`);
    throw err;
  }
}
