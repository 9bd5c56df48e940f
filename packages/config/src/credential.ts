/**
 * A volume's git credential, from the Secret the kubelet sent in a CSI call.
 * The Kubernetes secret types users already have: kubernetes.io/ssh-auth
 * (ssh-privatekey, with known_hosts to check the server's key) and
 * kubernetes.io/basic-auth (username, password), or a token for https.
 */
export type GitCredential = { kind: "ssh"; privateKey: string; knownHosts?: string } | { kind: "basic"; username: string; password: string } | { kind: "token"; username: string; token: string };

const SHAPES = "ssh-privatekey (with optional known_hosts), username and password, or token (with optional username)";

/** A Secret that is no git credential. The message names keys, never a value. */
export class SecretError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "SecretError";
  }
}

/** The armour of every private key ssh-add reads: OpenSSH's own and the PEM ones. */
const PRIVATE_KEY = /-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----/;

/** Whether a Secret's data holds anything: the kubelet sends absent and empty alike when no Secret is named. */
export function hasSecret(data: Record<string, string> | undefined): data is Record<string, string> {
  return data !== undefined && Object.keys(data).length > 0;
}

/**
 * The credential a Secret's data describes; undefined for no Secret. Checked
 * by the CSI frontend before anything is staged and again by the git worker,
 * which is the one that uses it.
 */
export function credentialOf(data: Record<string, string> | undefined): GitCredential | undefined {
  if (!hasSecret(data)) return undefined;
  const keys = Object.keys(data).sort();
  if (data["ssh-privatekey"]) {
    if (!PRIVATE_KEY.test(data["ssh-privatekey"]))
      throw new SecretError("the volume's Secret's ssh-privatekey is no private key: it must hold one in OpenSSH or PEM form (-----BEGIN ... PRIVATE KEY-----)");
    const privateKey = data["ssh-privatekey"].endsWith("\n") ? data["ssh-privatekey"] : `${data["ssh-privatekey"]}\n`;
    return { kind: "ssh", privateKey, knownHosts: data.known_hosts || undefined };
  }
  if (data.token) return { kind: "token", username: data.username || "git", token: data.token };
  if (data.username && data.password) return { kind: "basic", username: data.username, password: data.password };
  throw new SecretError(`the volume's Secret has the keys ${keys.join(", ")}; a git credential needs ${SHAPES}`);
}
