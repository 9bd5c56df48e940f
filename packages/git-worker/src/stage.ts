import * as fs from "node:fs/promises";
import * as path from "node:path";
import { GitError } from "simple-git";
import { failedPrecondition, unavailable } from "@git-csi/protos";
import type { gitcsi } from "@git-csi/protos";
import { branchOfRef, exists, missingRef, type Store, upstreamRef } from "./store";

export interface PreparedTree {
  treePath: string;
  head: string;
  reused: boolean;
}

/** The local branch a volume's work tree is on, in the shared bare repository. */
export function volumeBranch(volumeId: string): string {
  return `volume/${volumeId}`;
}

/**
 * Fetches the volume's ref into the URL's bare repository and returns the
 * volume's work tree: the one the node kept from an earlier stage, or a new
 * worktree checked out at the ref.
 */
export async function prepareTree(store: Store, volumeId: string, source: gitcsi.VolumeSource): Promise<PreparedTree> {
  const branch = branchOfRef(source.ref);
  const repo = await store.ensureRepo(source.url);
  const fetched = await fetchBranch(store, source.url, branch);
  const treePath = store.treeDir(volumeId);
  const gitDir = store.treeGitDir(source.url, volumeId);
  const [hasTree, hasGitDir] = await Promise.all([exists(treePath), exists(gitDir)]);
  if (hasTree && !hasGitDir) {
    throw failedPrecondition(`volume ${volumeId} has a work tree on this node that follows another repository than ${source.url}; give the volume a new volumeHandle, or delete the old PersistentVolume with reclaim policy Delete`);
  }
  if (!hasTree) {
    if (!fetched) throw missingRef(source.url, branch);
    if (hasGitDir) await repo.raw(["worktree", "unlock", treePath]).then(() => repo.raw(["worktree", "prune"]));
    await fs.mkdir(path.dirname(treePath), { recursive: true });
    await repo.raw(["worktree", "add", "--quiet", "--lock", "-B", volumeBranch(volumeId), treePath, upstreamRef(branch)]);
    // The application sees only its own files: git reaches the tree through GIT_DIR.
    await fs.rm(path.join(treePath, ".git"));
  }
  const head = await store.tree(source.url, volumeId).raw(["rev-parse", "--verify", "--quiet", "HEAD"]).catch(() => "");
  return { treePath, head, reused: hasTree };
}

/** Fetches the branch; false when the remote has no such branch. */
async function fetchBranch(store: Store, url: string, branch: string): Promise<boolean> {
  try {
    await store.repo(url).raw(["fetch", "--quiet", "--no-tags", "origin", `+refs/heads/${branch}:${upstreamRef(branch)}`]);
    return true;
  } catch (err) {
    const message = err instanceof GitError ? err.message : String(err);
    if (/couldn't find remote ref/i.test(message)) return false;
    throw unavailable(`fetch of ${branch} from ${url} failed: ${message.trim()}`);
  }
}
