import * as fs from "node:fs/promises";
import * as path from "node:path";
import { failedPrecondition, unavailable } from "@git-csi/protos";
import type { gitcsi } from "@git-csi/protos";
import type { RemoteAccess } from "../remote/access";
import { type FetchResult, fetchBranch } from "../remote/remote";
import { branchOfRef, exists, missingRef, type Store, upstreamRef } from "./store";
import { revParse } from "../remote/tree";
import { runGit } from "../remote/git";

export interface PreparedTree {
  treePath: string;
  head: string;
  reused: boolean;
  /**
   * "missing" when the ref is gone upstream: a kept tree still serves, and its
   * commits are not lost. "skipped" when the stage's Secret is not at hand (a
   * restarted worker taking a staged volume back): nothing is compared yet.
   */
  fetched: FetchResult | "skipped";
}

/** The local branch a volume's work tree is on, in the shared bare repository. */
function volumeBranch(volumeId: string): string {
  return `volume/${volumeId}`;
}

export function volumeBranchRef(volumeId: string): string {
  return `refs/heads/${volumeBranch(volumeId)}`;
}

/**
 * Fetches the volume's ref into the URL's bare repository and returns the
 * volume's work tree: the one the node kept from an earlier stage, or a new
 * worktree checked out at the ref.
 */
export async function prepareTree(store: Store, volumeId: string, source: gitcsi.VolumeSource, access: RemoteAccess, credentialMissing: boolean): Promise<PreparedTree> {
  const branch = branchOfRef(source.ref);
  const repo = await store.ensureRepo(source.url);
  const treePath = store.treeDir(volumeId);
  const gitDir = store.treeGitDir(source.url, volumeId);
  const [hasTree, hasGitDir] = await Promise.all([exists(treePath), exists(gitDir)]);
  const fetched =
    credentialMissing && hasTree
      ? "skipped"
      : await access
          .run((remote) => fetchBranch(store.repo(source.url, remote), branch))
          .catch((err: Error) => {
            throw unavailable(`${err.message} (${source.url})`);
          });
  if (hasTree && !hasGitDir) {
    throw failedPrecondition(
      `volume ${volumeId} has a work tree on this node that follows another repository than ${source.url}; give the volume a new volumeHandle, or delete the old PersistentVolume with reclaim policy Delete`,
    );
  }
  if (!hasTree) {
    if (fetched !== "fetched") throw missingRef(source.url, branch);
    if (hasGitDir) await runGit(repo, ["worktree", "unlock", treePath]).then(() => runGit(repo, ["worktree", "prune"]));
    await fs.mkdir(path.dirname(treePath), { recursive: true });
    await runGit(repo, ["worktree", "add", "--quiet", "--lock", "-B", volumeBranch(volumeId), treePath, upstreamRef(branch)]);
    // The application sees only its own files: git reaches the tree through GIT_DIR.
    await fs.rm(path.join(treePath, ".git"));
  }
  const head = await revParse(store.tree(source.url, volumeId), "HEAD");
  return { treePath, head, reused: hasTree, fetched };
}
