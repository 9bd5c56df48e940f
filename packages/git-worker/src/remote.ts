import { GitError, type SimpleGit } from "simple-git";
import { METADATA_REF } from "@git-csi/config";
import { UPSTREAM_METADATA, upstreamRef } from "./store";
import { isAncestor, revParse } from "./tree";

export type FetchResult = "fetched" | "missing";

function messageOf(err: unknown): string {
  return (err instanceof GitError ? err.message : String(err)).trim();
}

export class RemoteError extends Error {}

/** refs/git-csi/metadata as a glob: a remote without it is no error, and --prune drops the node's stale view. */
const METADATA_REFSPEC = `+${METADATA_REF}*:${UPSTREAM_METADATA}*`;

/**
 * Fetches a branch into the node's view of it; "missing" when the remote has
 * no such branch. With metadata, refs/git-csi/metadata comes in the same
 * fetch: one round trip.
 */
export async function fetchBranch(repo: SimpleGit, branch: string, withMetadata = false): Promise<FetchResult> {
  try {
    await fetch(repo, [`+refs/heads/${branch}:${upstreamRef(branch)}`, ...(withMetadata ? [METADATA_REFSPEC] : [])]);
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
  await fetch(repo, [METADATA_REFSPEC]).catch((err: unknown) => {
    throw new RemoteError(`fetch of ${METADATA_REF} failed: ${messageOf(err)}`);
  });
  return revParse(repo, UPSTREAM_METADATA);
}

function fetch(repo: SimpleGit, refspecs: string[]): Promise<string> {
  return repo.raw(["fetch", "--quiet", "--prune", "--no-tags", "--no-write-fetch-head", "origin", ...refspecs]);
}

export type PushResult = { outcome: "pushed" } | { outcome: "rejected"; message: string } | { outcome: "failed"; message: string };

/**
 * Pushes a commit to a ref as a compare-and-swap from the commit the node last
 * saw there (none: the ref must not exist). So a ref that moved or was deleted
 * upstream is never overwritten or silently made again: that is "rejected",
 * and a fetch tells which. "failed" is anything else, such as a refused
 * credential. `seen` is the node's ref holding its last view of `ref`.
 */
export async function pushRef(repo: SimpleGit, commit: string, ref: string, seen: string): Promise<PushResult> {
  const expected = (await repo.raw(["rev-parse", "--verify", "--quiet", seen]).catch(() => "")).trim();
  // The lease alone would let a push replace commits it does not contain: volumes of one URL
  // share the node's view of the remote, so another volume's push moves it. Only a commit
  // that descends from what the remote holds is ever sent; anything else rebases first.
  if (expected !== "" && !(await isAncestor(repo, expected, commit))) {
    return { outcome: "rejected", message: `${ref} holds ${expected.slice(0, 12)}, which ${commit.slice(0, 12)} does not contain` };
  }
  try {
    await repo.raw(["push", "--porcelain", `--force-with-lease=${ref}:${expected}`, "origin", `${commit}:${ref}`]);
  } catch (err) {
    const message = messageOf(err);
    if (/\[rejected\]|non-fast-forward|fetch first|\(stale info\)/.test(message)) return { outcome: "rejected", message };
    return { outcome: "failed", message };
  }
  await repo.raw(["update-ref", seen, commit]);
  return { outcome: "pushed" };
}

export function pushCommit(repo: SimpleGit, commit: string, branch: string): Promise<PushResult> {
  return pushRef(repo, commit, `refs/heads/${branch}`, upstreamRef(branch));
}

export function pushMetadata(repo: SimpleGit, commit: string): Promise<PushResult> {
  return pushRef(repo, commit, METADATA_REF, UPSTREAM_METADATA);
}

/** Deletes a branch on the remote, if it is there. */
export async function deleteBranch(repo: SimpleGit, branch: string): Promise<void> {
  await repo.raw(["push", "--porcelain", "origin", `:refs/heads/${branch}`]).catch((err: unknown) => {
    if (!/remote ref does not exist/.test(messageOf(err))) throw err;
  });
  await repo.raw(["update-ref", "-d", upstreamRef(branch)]).catch(() => undefined);
}
