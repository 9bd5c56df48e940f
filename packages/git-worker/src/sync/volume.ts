import { type ClassPolicy, type EventType, type ReasonName, sideBranchOf } from "@git-csi/config";
import type { InvolvedObject } from "@git-csi/k8s";
import type { Logger } from "@git-csi/logging";
import type { ClaimLabels, DriverMetrics } from "@git-csi/metrics";
import { type CsiError, type gitcsi } from "@git-csi/protos";
import { status } from "@grpc/grpc-js";
import type { SimpleGit } from "simple-git";
import type { RemoteAccess } from "../remote/access";
import { looseRef } from "../remote/loose";
import { revParse } from "../remote/tree";
import { authorEnv, type GitSetting } from "../remote/git";
import type { MountLease } from "../lease/lease";
import type { Fence, PushResult, RefChange } from "../remote/remote";
import type { Store } from "../trees/store";
import type { PodDeleter } from "./recovery";

/** Where a volume's events go besides its report and the log: Kubernetes' recorder in a cluster. */
export interface EventSink {
  record(object: InvolvedObject, type: EventType, reason: ReasonName, message: string): void;
}

export interface SyncContext {
  store: Store;
  volumeId: string;
  source: gitcsi.VolumeSource;
  branch: string;
  claim: gitcsi.Claim;
  logger: Logger;
  metrics: DriverMetrics;
  /** How the volume reaches its remote with the stage's credential. */
  access: RemoteAccess;
  /** The mount epoch's ownership of the volume: every push carries its fence. */
  lease: MountLease;
  /** Posts the volume's events on its claim and pods; none outside a cluster. */
  events?: EventSink;
  /** Deletes the pods a controller owns once the epoch is lost (--delete-fenced-pods); none when off or outside a cluster. */
  pods?: PodDeleter;
  /** The stage carried a Secret, though a restarted worker may not have it. */
  credentialExpected: boolean;
  /** The volume was published before the worker started: a rotation may come with any publish. */
  published: boolean;
  /** The stage Secret's fingerprint, to refuse a first publish with another. */
  stageFingerprint: string;
  /** Opens access with another Secret's credential. */
  openAccess(data: Record<string, string>): Promise<RemoteAccess>;
  /**
   * Runs work on the URL's bare repository alone: volumes of one URL share it,
   * and two fetches of one branch would race for its ref's lock.
   */
  onRepository<T>(work: () => Promise<T>): Promise<T>;
  /**
   * The mount's pages in the kernel reach the tree (the mount owner's
   * SyncMount): with the writeback cache a write can wait there, unseen by git.
   */
  syncMount(): Promise<boolean>;
  /**
   * The kernel forgets the entries and attributes it cached of the mount (the
   * mount owner's InvalidateMount): it keeps them for as long as the lease
   * serves, and the tree just moved behind it.
   */
  invalidateMount(): Promise<boolean>;
}

/**
 * What one staged volume's sync knows, shared by its parts (commit, push,
 * report): the paths waiting, what the remote lacks, where pushes go, and
 * how to reach the tree, the repository and the remote.
 */
export class VolumeState {
  policy?: ClassPolicy;
  className = "";
  /** Paths the watcher reported that git has not been asked about yet. */
  readonly changed = new Set<string>();
  /** Changed paths, not ignored, not committed. */
  readonly pending = new Set<string>();
  /** Every path the watcher saw since the last push, for refs/git-csi/metadata: modes and empty directories too. */
  readonly metadataChanged = new Set<string>();
  /** Files the commits since the last push hold: git listed them as changed, so it does not ignore them. */
  readonly committedPaths = new Set<string>();
  /** Paths over commit.maxFileSize, with their size. */
  readonly skipped = new Map<string, number>();
  /** Paths written where the driver does not serve them, each told of once: a Git LFS file, a submodule's directory. */
  readonly notServed = new Set<string>();
  fullScan = false;
  unpushed = 0;
  /**
   * The bytes of the files committed since the last push, as the commits
   * staged them: whether a push may be large enough to send its objects
   * ahead. Unknown (infinite) for commits made before the worker started.
   */
  unpushedBytes = Number.POSITIVE_INFINITY;
  lastPushAt = 0;
  pushFailures = 0;
  lastPushError = "";
  commitFailures = 0;
  lastCommitError = "";
  onSideBranch = false;
  refDeleted = false;
  upstreamMovedOverWrites = false;
  access: RemoteAccess;
  lease: MountLease;
  claim: gitcsi.Claim;
  pods: gitcsi.Pod[] = [];

  constructor(readonly ctx: SyncContext) {
    this.access = ctx.access;
    this.lease = ctx.lease;
    this.claim = ctx.claim;
  }

  get volumeId(): string {
    return this.ctx.volumeId;
  }

  get branch(): string {
    return this.ctx.branch;
  }

  get labels(): ClaimLabels {
    return { namespace: this.claim.namespace, claim: this.claim.name || this.ctx.volumeId };
  }

  get tree(): SimpleGit {
    return this.ctx.store.tree(this.ctx.source.url, this.ctx.volumeId, this.authorEnv());
  }

  /** git in the work tree, for a process that runs inside it (see converse). */
  get treeSetting(): GitSetting {
    return this.ctx.store.treeSetting(this.ctx.source.url, this.ctx.volumeId, this.authorEnv());
  }

  get repo(): SimpleGit {
    return this.ctx.store.repo(this.ctx.source.url);
  }

  get treeDir(): string {
    return this.ctx.store.treeDir(this.ctx.volumeId);
  }

  /** The commit the tree's HEAD names, "" for none: from git's files where they settle it, on the way to every commit and push. */
  async head(): Promise<string> {
    const { store, source, volumeId } = this.ctx;
    return (await looseRef({ gitDir: store.treeGitDir(source.url, volumeId), commonDir: store.repoDir(source.url) }, "HEAD")) ?? revParse(this.tree, "HEAD");
  }

  /** The commit a ref of the URL's bare repository names, "" for none, as head() reads it. */
  async repoRef(ref: string): Promise<string> {
    const dir = this.ctx.store.repoDir(this.ctx.source.url);
    return (await looseRef({ gitDir: dir, commonDir: dir }, ref)) ?? revParse(this.repo, ref);
  }

  get volumeDir(): string {
    return this.ctx.store.volumeDir(this.ctx.volumeId);
  }

  get sideBranch(): string {
    return sideBranchOf(this.ctx.branch, this.ctx.volumeId);
  }

  get pushBranch(): string {
    return this.onSideBranch ? this.sideBranch : this.ctx.branch;
  }

  /** Waits for a credential: the stage had one that a restarted worker lost, and no publish brought it yet. */
  get waitingForCredential(): boolean {
    return this.ctx.credentialExpected && !this.access.hasCredential;
  }

  authorEnv(): Record<string, string> {
    return this.policy ? authorEnv(this.policy.author) : {};
  }

  /** Runs a git command against the remote with the volume's credential. */
  remote<T>(operation: (repo: SimpleGit) => Promise<T>): Promise<T> {
    return this.ctx.store.through(this.ctx.source.url, this.access)(operation);
  }

  /** A push of the volume with the owner ref's renewal: it lands only while the epoch holds the volume. `sends`: the changes it sends. */
  fenced(push: (repo: SimpleGit, fence: Fence) => Promise<PushResult>, sends: RefChange[] = []): Promise<PushResult> {
    return this.lease.fenced(
      (operation) => this.remote(operation),
      (fence) => this.remote((repo) => push(repo, fence)),
      sends,
    );
  }

  /**
   * The mount's pages reach the tree before a stage looks at it. False when
   * the mount cannot be synced, so the tree may lack writes and must stay as
   * it is: a restarted mount owner serves its kept connection again only once
   * this very claim answers, and a lost epoch's mount serves nothing.
   */
  async syncMountAtStage(): Promise<boolean> {
    try {
      await this.ctx.syncMount();
      return true;
    } catch (err) {
      const code = (err as CsiError).code;
      if (code !== status.UNAVAILABLE && code !== status.FAILED_PRECONDITION) throw err;
      this.log("info", `the tree stays as it is until the next push: its mount cannot be synced now: ${(err as Error).message}`, "stage");
      return false;
    }
  }

  log(level: "info" | "warn" | "error", message: string, operation: string, fields: Record<string, unknown> = {}): void {
    this.ctx.logger.log(level, message, { volume: this.ctx.volumeId, operation, ...fields });
  }
}
