import * as path from "node:path";
import { ClassParameterError, credentialOf, parseClassParameters, refProblem, remoteUrlProblem, SecretError } from "@git-csi/config";
import { type gitcsi, invalidArgument, isReader, required } from "@git-csi/protos";

/**
 * A volume id is a volumeHandle: it names the side branch `<ref>.<volumeHandle>`
 * and the node's directories, so it must be one safe git ref component.
 */
export function volumeIdOf(value: string, field = "volume_id"): string {
  const id = required(value, field);
  if (!/^[A-Za-z0-9][A-Za-z0-9_.-]{0,252}$/.test(id) || id.includes("..") || id.endsWith(".lock") || id.endsWith(".")) {
    throw invalidArgument(`${field} ${quoted(id)} must be 1 to 253 letters, digits, '-', '_' or '.', start with a letter or digit, and not contain '..' or end in '.' or '.lock'`);
  }
  return id;
}

/** Linux's PATH_MAX (with its NUL) and NAME_MAX, in bytes: a longer path fails every file system call. */
const PATH_MAX = 4096;
const NAME_MAX = 255;

export function absolutePath(value: string, field: string): string {
  const p = required(value, field);
  const fits = Buffer.byteLength(p) < PATH_MAX && p.split("/").every((name) => Buffer.byteLength(name) <= NAME_MAX);
  if (!path.isAbsolute(p) || p.includes("\0") || !fits) {
    throw invalidArgument(`${field} ${quoted(p)} must be an absolute path without NUL, of at most ${PATH_MAX - 1} bytes and ${NAME_MAX} bytes a name`);
  }
  return path.normalize(p);
}

/** Input echoed in a message, cut short: the message names the value, it does not carry all of it. */
export function quoted(value: string): string {
  return JSON.stringify(value.length > 200 ? `${value.slice(0, 200)}…` : value);
}

/** The repository and ref from volume attributes or StorageClass parameters, named as the user wrote them; only a reader may pin a tag or a commit. */
export function sourceOf(attributes: Record<string, string>, field: string, accessMode: gitcsi.AccessMode): gitcsi.VolumeSource {
  const url = required(attributes.url, `${field}.url`);
  const ref = required(attributes.ref, `${field}.ref`);
  const problem = remoteUrlProblem(url);
  if (problem) throw invalidArgument(`${field}.url ${quoted(url)} ${problem}`);
  const refRule = refProblem(ref, isReader(accessMode));
  if (refRule !== undefined) throw invalidArgument(`${field}.ref ${quoted(ref)} ${refRule}`);
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

/** The Secret's shape is checked before the stage writes anything, as the git worker would check it after. */
export function credentialFrom(secrets: Record<string, string>, field: string): gitcsi.Credential | undefined {
  try {
    return credentialOf(secrets) ? { data: secrets } : undefined;
  } catch (err) {
    if (err instanceof SecretError) throw invalidArgument(`${field}: ${err.message}`);
    throw err;
  }
}

const POD_KEYS = {
  name: { key: "csi.storage.k8s.io/pod.name", rule: "a pod name (a DNS-1123 subdomain)", form: /^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/ },
  namespace: { key: "csi.storage.k8s.io/pod.namespace", rule: "a namespace name (a DNS-1123 label)", form: /^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$/ },
  uid: { key: "csi.storage.k8s.io/pod.uid", rule: "a pod uid (letters, digits and '-')", form: /^[A-Za-z0-9-]{1,128}$/ },
};

/** The kubelet's podInfoOnMount keys: the pod the volume's events are posted on. */
export function podOf(context: Record<string, string>, field: string): gitcsi.Pod | undefined {
  for (const { key, rule, form } of Object.values(POD_KEYS)) {
    const value = context[key];
    if (value !== undefined && !form.test(value)) throw invalidArgument(`${field}.${key} ${quoted(value)} must be ${rule}`);
  }
  const name = context[POD_KEYS.name.key];
  if (!name) return undefined;
  return { name, namespace: context[POD_KEYS.namespace.key] ?? "", uid: context[POD_KEYS.uid.key] ?? "" };
}
