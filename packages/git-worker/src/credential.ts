import { createHash } from "node:crypto";
import { invalidArgument } from "@git-csi/protos";

/**
 * A volume's git credential, from the Secret the kubelet sent in a CSI call.
 * The Kubernetes secret types users already have: kubernetes.io/ssh-auth
 * (ssh-privatekey, with known_hosts to check the server's key) and
 * kubernetes.io/basic-auth (username, password), or a token for https.
 */
export type GitCredential =
  | { kind: "ssh"; privateKey: string; knownHosts?: string }
  | { kind: "basic"; username: string; password: string }
  | { kind: "token"; username: string; token: string };

const SHAPES = "ssh-privatekey (with optional known_hosts), username and password, or token (with optional username)";

/** The credential a Secret's data describes; undefined for no Secret. Keys are named, never values. */
export function parseCredential(data: Record<string, string> | undefined): GitCredential | undefined {
  if (!data || Object.keys(data).length === 0) return undefined;
  const keys = Object.keys(data).sort();
  if (data["ssh-privatekey"]) {
    const privateKey = data["ssh-privatekey"].endsWith("\n") ? data["ssh-privatekey"] : `${data["ssh-privatekey"]}\n`;
    return { kind: "ssh", privateKey, knownHosts: data.known_hosts || undefined };
  }
  if (data.token) return { kind: "token", username: data.username || "git", token: data.token };
  if (data.username && data.password) return { kind: "basic", username: data.username, password: data.password };
  throw invalidArgument(`the volume's Secret has the keys ${keys.join(", ")}; a git credential needs ${SHAPES}`);
}

/** Tells two Secrets apart without keeping either: a hash of the data, never logged. */
export function fingerprint(data: Record<string, string> | undefined): string {
  if (!data || Object.keys(data).length === 0) return "";
  const hash = createHash("sha256");
  for (const key of Object.keys(data).sort()) hash.update(`${key}\0${data[key]}\0`);
  return hash.digest("hex");
}
