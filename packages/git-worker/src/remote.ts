import { GitError, type SimpleGit } from "simple-git";
import { METADATA_REF } from "@git-csi/config";
import { UPSTREAM_METADATA, upstreamRef } from "./store";

export type FetchResult = "fetched" | "missing";

function messageOf(err: unknown): string {
  return (err instanceof GitError ? err.message : String(err)).trim();
}

export class RemoteError extends Error {}

/** Fetches a branch into its remote-tracking ref; "missing" when the remote has no such branch. */
export async function fetchBranch(repo: SimpleGit, branch: string): Promise<FetchResult> {
  try {
    await repo.raw(["fetch", "--quiet", "--no-tags", "--no-write-fetch-head", "origin", `+refs/heads/${branch}:${upstreamRef(branch)}`]);
    return "fetched";
  } catch (err) {
    const message = messageOf(err);
    if (/couldn't find remote ref/i.test(message)) {
      // The branch is gone upstream: so is what the node knew of it.
      await repo.raw(["update-ref", "-d", upstreamRef(branch)]).catch(() => undefined);
      return "missing";
    }
    throw new RemoteError(`fetch of ${branch} failed: ${message}`);
  }
}

/** Fetches refs/git-csi/metadata; "" when the remote has none yet. */
export async function fetchMetadata(repo: SimpleGit): Promise<string> {
  try {
    await repo.raw(["fetch", "--quiet", "--no-tags", "--no-write-fetch-head", "origin", `+${METADATA_REF}:${UPSTREAM_METADATA}`]);
  } catch (err) {
    const message = messageOf(err);
    if (!/couldn't find remote ref/i.test(message)) throw new RemoteError(`fetch of ${METADATA_REF} failed: ${message}`);
    await repo.raw(["update-ref", "-d", UPSTREAM_METADATA]).catch(() => undefined);
    return "";
  }
  return (await repo.raw(["rev-parse", UPSTREAM_METADATA])).trim();
}

export type PushResult = { outcome: "pushed" } | { outcome: "rejected"; message: string } | { outcome: "failed"; message: string };

/**
 * Pushes a commit to a branch (and a metadata commit, when given) as a compare-and-swap from the commit the node
 * last saw there (none: the branch must not exist), atomically with any other
 * ref updates given. So a branch that moved or was deleted upstream is never
 * overwritten or silently made again: that is "rejected", and a fetch tells
 * which. "failed" is anything else, such as a refused credential.
 */
export async function pushCommit(repo: SimpleGit, commit: string, branch: string, metadata?: { commit: string; expected: string }): Promise<PushResult> {
  const expected = (await repo.raw(["rev-parse", "--verify", "--quiet", upstreamRef(branch)]).catch(() => "")).trim();
  const leases = [`--force-with-lease=refs/heads/${branch}:${expected}`];
  const refspecs = [`${commit}:refs/heads/${branch}`];
  if (metadata) {
    leases.push(`--force-with-lease=${METADATA_REF}:${metadata.expected}`);
    refspecs.push(`${metadata.commit}:${METADATA_REF}`);
  }
  try {
    await repo.raw(["push", "--porcelain", "--atomic", ...leases, "origin", ...refspecs]);
  } catch (err) {
    const message = messageOf(err);
    if (/\[rejected\]|non-fast-forward|fetch first|\(stale info\)/.test(message)) return { outcome: "rejected", message };
    return { outcome: "failed", message };
  }
  await repo.raw(["update-ref", upstreamRef(branch), commit]);
  if (metadata) await repo.raw(["update-ref", UPSTREAM_METADATA, metadata.commit]);
  return { outcome: "pushed" };
}

/** Deletes a branch on the remote, if it is there. */
export async function deleteBranch(repo: SimpleGit, branch: string): Promise<void> {
  await repo.raw(["push", "--porcelain", "origin", `:refs/heads/${branch}`]).catch((err: unknown) => {
    if (!/remote ref does not exist/.test(messageOf(err))) throw err;
  });
  await repo.raw(["update-ref", "-d", upstreamRef(branch)]).catch(() => undefined);
}
