import { createHash } from "node:crypto";
import * as fs from "node:fs/promises";
import * as path from "node:path";
import type { SimpleGit } from "simple-git";
import { branchOf, READER_REF_RULE, type ReaderRef, readerRefOf, refProblem, remoteUrlProblem } from "@git-csi/config";
import { failedPrecondition, invalidArgument } from "@git-csi/protos";
import type { RemoteAccess, RemoteOptions } from "../remote/access";
import type { OnRemote } from "../lease/lease";
import { gitIn, type GitSetting, runGit } from "../remote/git";
import { ListingCache } from "../metadata/plumbing";

/**
 * The node's git store: one bare repository per URL under repos/, shared by
 * every volume of that URL through git worktrees, and one work tree per volume
 * under trees/. A work tree holds only the application's files: its .git link
 * is removed and git is always run with an explicit --git-dir, so the
 * application never sees or writes git's own files. The worktree is locked so
 * that no prune drops the admin directory of a tree whose link is gone.
 */
export class Store {
  /** refs/git-csi/metadata's listings the worker read or wrote, shared by every volume: a commit's listings are the same in any repository. */
  readonly listings = new ListingCache();

  constructor(readonly stateDir: string) {}

  repoDir(url: string): string {
    return path.join(this.stateDir, "repos", `${createHash("sha256").update(url).digest("hex").slice(0, 16)}.git`);
  }

  treeDir(volumeId: string): string {
    return path.join(this.stateDir, "trees", volumeId);
  }

  /** The per-tree git directory git keeps for a worktree inside the bare repository. */
  treeGitDir(url: string, volumeId: string): string {
    return path.join(this.repoDir(url), "worktrees", volumeId);
  }

  /** git in the bare repository; with remote options, for a command that talks to the remote. */
  repo(url: string, remote: RemoteOptions = { config: [], env: {} }): SimpleGit {
    return gitAt(this.repoDir(url), { GIT_DIR: this.repoDir(url), ...remote.env }, remote.config);
  }

  /** git in a bare repository of repos/, by its directory: the collection finds them so, before it knows their URL. */
  repoAt(repoDir: string): SimpleGit {
    return gitAt(repoDir, { GIT_DIR: repoDir }, []);
  }

  /** git in the URL's bare repository, each operation on the remote with `access`'s credential. */
  through(url: string, access: RemoteAccess): OnRemote {
    return (operation) => access.run((options) => operation(this.repo(url, options)));
  }

  socketDir(): string {
    return path.join(this.stateDir, "sockets");
  }

  /** Where the worker keeps a volume's own files: the class's ignore patterns, pathspec lists, the watcher's snapshot. */
  volumeDir(volumeId: string): string {
    return path.join(this.stateDir, "sync", volumeId);
  }

  excludesFile(volumeId: string): string {
    return path.join(this.volumeDir(volumeId), "ignore");
  }

  /** Where the commits of a URL and ref (readerKeyOf) are checked out for its read-only volumes, one directory per commit. */
  readerDir(key: string): string {
    return path.join(this.stateDir, "readers", key);
  }

  /** A second worktree beside the pod's, where rebases run out of the application's view. */
  scratchDir(volumeId: string): string {
    return path.join(this.stateDir, "scratch", `${volumeId}.rebase`);
  }

  /**
   * git in a volume's work tree: paths are literal (a file named `*` is a
   * file, not a glob) and the class's ignore patterns apply on top of the
   * repository's own .gitignore. The index is split: a command that changes
   * a few entries writes those, not the whole tree's index again.
   */
  tree(url: string, volumeId: string, env: Record<string, string> = {}): SimpleGit {
    const at = this.treeSetting(url, volumeId, env);
    return gitAt(this.treeDir(volumeId), at.env, at.config);
  }

  /** The same git for a process run inside the work tree, whose relative paths are the tree's own. */
  treeSetting(url: string, volumeId: string, env: Record<string, string> = {}): GitSetting {
    return {
      cwd: this.treeDir(volumeId),
      env: { GIT_DIR: this.treeGitDir(url, volumeId), GIT_WORK_TREE: this.treeDir(volumeId), GIT_LITERAL_PATHSPECS: "1", ...env },
      config: [`core.excludesFile=${this.excludesFile(volumeId)}`, "core.splitIndex=true"],
    };
  }

  /** git in the scratch worktree. */
  scratch(volumeId: string, env: Record<string, string> = {}): SimpleGit {
    return gitIn(this.scratchDir(volumeId), env);
  }

  async ensureRepo(url: string): Promise<SimpleGit> {
    const dir = this.repoDir(url);
    if (!(await exists(path.join(dir, "HEAD")))) {
      await fs.mkdir(dir, { recursive: true });
      await runGit(gitAt(dir, {}), ["init", "--bare", "--quiet", dir]);
      await runGit(this.repo(url), ["config", "remote.origin.url", url]);
    }
    return this.repo(url);
  }
}

/** The branch a writer follows; the frontend refused any other ref before it got here. */
export function branchOfRef(ref: string): string {
  const problem = refProblem(ref, false);
  if (problem !== undefined) throw invalidArgument(`volume_context.ref ${JSON.stringify(ref)} ${problem}`);
  return branchOf(ref)!;
}

/** What a reader serves: a branch, a tag or a commit; the frontend refused any other ref before it got here. */
export function readerTargetOf(ref: string): ReaderRef {
  const target = readerRefOf(ref);
  if (target === undefined) throw invalidArgument(`volume_context.ref ${JSON.stringify(ref)} ${READER_REF_RULE}`);
  return target;
}

/** The volume's remote; the frontend refused any other URL before it got here. */
export function checkRemoteUrl(url: string): void {
  const problem = remoteUrlProblem(url);
  if (problem) throw invalidArgument(`volume_context.url ${JSON.stringify(url)} ${problem}`);
}

/**
 * What the node last saw of a branch on the remote. The node's own refs live
 * under refs/git-csi/upstream/, so the hourly collection finds the ones no
 * volume follows by their prefix.
 */
export function upstreamRef(branch: string): string {
  return `${UPSTREAM_PREFIX}heads/${branch}`;
}

export const UPSTREAM_PREFIX = "refs/git-csi/upstream/";

/** What the node last saw of refs/git-csi/metadata on the remote. */
export const UPSTREAM_METADATA = `${UPSTREAM_PREFIX}metadata`;

/** The volume's ownership ref on the remote (spec 000's coordinator record). */
export function ownerRef(volumeId: string): string {
  return `refs/git-csi/owner/${volumeId}`;
}

/**
 * Where commits a lost mount epoch made wait on the remote for the volume's
 * next stage, named by the commit: no data branch follows the ref, so the
 * epoch's fence holds, and pushing the same commit twice changes nothing.
 */
export function strandedRef(volumeId: string, commit = ""): string {
  return `refs/git-csi/stranded/${volumeId}/${commit}`;
}

/** Where DeleteVolume moves a deleted volume's branch when its class's onDelete is archive: no branch, but kept. */
export function archiveRef(volumeId: string, branch: string): string {
  return `refs/git-csi/archive/${volumeId}/${branch}`;
}

/** A snapshot on the remote: a commit whose parents are the volume's commit and the metadata commit of that moment. */
export function snapshotRef(snapshotId: string): string {
  return `refs/git-csi/snapshots/${snapshotId}`;
}

/**
 * The commit a node's flush pushed for a snapshot or a clone of a volume it
 * serves (request: the snapshot's id or the clone's volume id); the push
 * that makes the snapshot or the clone deletes it.
 */
export function flushedRef(volumeId: string, requestId: string): string {
  return `refs/git-csi/flushed/${volumeId}/${requestId}`;
}

/** What the controller last fetched of a flushed marker. */
export function upstreamFlushedRef(volumeId: string, requestId: string): string {
  return `${UPSTREAM_PREFIX}flushed/${volumeId}/${requestId}`;
}

/** What the node last fetched of a snapshot. */
export function upstreamSnapshotRef(snapshotId: string): string {
  return `${UPSTREAM_PREFIX}snapshots/${snapshotId}`;
}

/** The node's view of the volume's stranded refs, fetched at stage. */
export function upstreamStrandedRef(volumeId: string): string {
  return `${UPSTREAM_PREFIX}stranded/${volumeId}/`;
}

/** What the node last saw of the volume's owner ref. */
export function upstreamOwnerRef(volumeId: string): string {
  return `${UPSTREAM_PREFIX}owner/${volumeId}`;
}

export function missingRef(url: string, branch: string): Error {
  return failedPrecondition(`ref ${branch} does not exist in ${url}; push a first commit to it (a .gitignore is a good one) and stage again`);
}

/** git for a path whose parent exists: git finds its repository through the environment. */
function gitAt(dir: string, env: Record<string, string>, config: string[] = []): SimpleGit {
  return gitIn(path.dirname(dir), env, config);
}

export async function exists(p: string): Promise<boolean> {
  return fs.lstat(p).then(
    () => true,
    () => false,
  );
}
