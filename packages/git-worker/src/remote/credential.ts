import { createHash } from "node:crypto";
import { credentialOf, type GitCredential, hasSecret, SecretError } from "@git-csi/config";
import { invalidArgument } from "@git-csi/protos";

/** The credential a Secret's data describes; undefined for no Secret; InvalidArgument for anything else. */
export function parseCredential(data: Record<string, string> | undefined): GitCredential | undefined {
  try {
    return credentialOf(data);
  } catch (err) {
    throw err instanceof SecretError ? invalidArgument(err.message) : err;
  }
}

/** Tells two Secrets apart without keeping either: a hash of the data, never logged. */
export function fingerprint(data: Record<string, string> | undefined): string {
  if (!hasSecret(data)) return "";
  const hash = createHash("sha256");
  for (const key of Object.keys(data).sort()) hash.update(`${key}\0${data[key]}\0`);
  return hash.digest("hex");
}
