import * as fs from "node:fs/promises";
import * as path from "node:path";
import watcher from "@parcel/watcher";
import { type ClassPolicy, type EventType, formatDuration, METADATA_REF, orAbsent, parseClassParameters, Reason, type ReasonName, sideBranchOf } from "@git-csi/config";
import type { Logger } from "@git-csi/logging";
import type { InvolvedObject } from "@git-csi/k8s";
import type { ClaimLabels, DriverMetrics } from "@git-csi/metrics";
import type { gitcsi, gitWorker } from "@git-csi/protos";
import type { SimpleGit } from "simple-git";
import { type CsiError, failedPrecondition, internal } from "@git-csi/protos";
import type { RemoteAccess } from "./access";
import { fingerprint } from "./credential";
import { recordMetadata, replayMetadata } from "./metadata";
import type { MountLease } from "./lease";
import { deleteBranch, type Fence, fetchBranch, fetchMetadata, pushCommit, pushMetadata, type PushResult, RemoteError } from "./remote";
import { type Store, UPSTREAM_METADATA, upstreamRef } from "./store";
import { canMoveTree, countCommits, isAncestor, moveTree, revParse, stageChanges, stagedPaths, statusOf } from "./tree";
import { authorEnv, runGit } from "./git";
import { type PreparedTree, volumeBranchRef } from "./stage";

/** Where a volume's events go besides its report and the log: Kubernetes' recorder in a cluster. */
export interface EventSink {
  record(object: InvolvedObject, type: EventType, reason: ReasonName, message: string): void;
}

/** Paths the driver never commits: libfuse's names for open, unlinked files. */
const ALWAYS_IGNORED = [".fuse_hidden*"];
const REBASE_ATTEMPTS = 3;
const RECENT_EVENTS = 50;
const RETRY_MIN_MS = 5_000;
const POD_STOPPED = "the pod stopped";

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
}

/**
 * One staged volume's write path, spec 004 "What happens after a write" and
 * "When upstream moves": it watches the backing tree, commits changed paths
 * once the tree is quiet for push.quiesce, pushes, rebases when the ref moved,
 * and moves to the side branch when it cannot. Every step runs on one chain,
 * so two never interleave on the same tree.
 */
export class VolumeSync {
  private policy?: ClassPolicy;
  private className = "";
  /** Paths the watcher reported that git has not been asked about yet. */
  private readonly changed = new Set<string>();
  /** Changed paths, not ignored, not committed. */
  private readonly pending = new Set<string>();
  /** Every path the watcher saw since the last push, for refs/git-csi/metadata: modes and empty directories too. */
  private readonly metadataChanged = new Set<string>();
  private readonly skipped = new Map<string, number>();
  private fullScan = false;
  private subscription?: watcher.AsyncSubscription;
  private quiesceTimer?: NodeJS.Timeout;
  private latencyTimer?: NodeJS.Timeout;
  private retryTimer?: NodeJS.Timeout;
  /** When the oldest change the remote lacks was seen. */
  private oldestUnpushedAt?: number;
  private unpushed = 0;
  private lastPushAt = 0;
  private pushFailures = 0;
  private lastPushError = "";
  private commitFailures = 0;
  private lastCommitError = "";
  private onSideBranch = false;
  private refDeleted = false;
  private upstreamMovedOverWrites = false;
  private readonly events: gitWorker.VolumeEvent[] = [];
  private access: RemoteAccess;
  private publishFingerprint = "";
  private published: boolean;
  private chain: Promise<unknown> = Promise.resolve();
  private stopped = false;
  private lease: MountLease;
  private claim: gitcsi.Claim;
  private pods: gitcsi.Pod[] = [];
  /**
   * Events from before the first pod, or before the claim, was known (the
   * stage has neither): posted on them when they are, so the pod's and the
   * claim's events tell what the stage found.
   */
  private readonly unposted: { pods?: gitWorker.VolumeEvent[]; claim?: gitWorker.VolumeEvent[] } = { pods: [], claim: [] };
  private leaseTimer?: NodeJS.Timeout;

  constructor(private readonly ctx: SyncContext) {
    this.access = ctx.access;
    this.published = ctx.published;
    this.lease = ctx.lease;
    this.claim = ctx.claim;
  }

  /** The claim bound to the volume, learned from the API after the stage: the metrics move to its labels. */
  setClaim(claim: gitcsi.Claim): void {
    if (claim.namespace === this.claim.namespace && claim.name === this.claim.name && claim.uid === this.claim.uid) return;
    this.ctx.metrics.forget(this.labels);
    this.claim = claim;
    this.publishMetrics();
    if (claim.name) for (const event of this.takeUnposted("claim")) this.postOnClaim(event);
  }

  setPods(pods: gitcsi.Pod[]): void {
    this.pods = pods;
    if (pods.length > 0) for (const event of this.takeUnposted("pods")) this.postOnPods(event);
  }

  private takeUnposted(on: "pods" | "claim"): gitWorker.VolumeEvent[] {
    const events = this.unposted[on] ?? [];
    this.unposted[on] = undefined;
    return events;
  }

  get epoch(): string {
    return this.lease.holder.epoch;
  }

  get mountLease(): MountLease {
    return this.lease;
  }

  /** A new mount session of the volume on this node took ownership while the worker kept watching. */
  useLease(lease: MountLease): void {
    this.lease = lease;
    this.watchLease();
  }

  async renewMount(): Promise<gitWorker.MountLease> {
    try {
      return await this.lease.renew((operation) => this.remote(operation));
    } finally {
      this.watchLease();
    }
  }

  /** The abnormal gauge turns when the lease runs out or is lost, even if nothing else happens to the volume then. */
  private watchLease(): void {
    clearTimeout(this.leaseTimer);
    if (this.stopped) return;
    this.publishMetrics();
    const lease = this.lease.state();
    if (lease.held) this.leaseTimer = setTimeout(() => this.watchLease(), Math.max(0, Number(lease.serveUntilUnixMs) - Date.now()) + 1);
  }

  /** A push of the volume with the owner ref's renewal: it lands only while the epoch holds the volume. */
  private fenced(push: (repo: SimpleGit, fence: Fence) => Promise<PushResult>): Promise<PushResult> {
    return this.lease.fenced(
      (operation) => this.remote(operation),
      (fence) => this.remote((repo) => push(repo, fence)),
    );
  }

  /** Waits for a credential: the stage had one that a restarted worker lost, and no publish brought it yet. */
  private get waitingForCredential(): boolean {
    return this.ctx.credentialExpected && !this.access.hasCredential;
  }

  /** Runs a git command against the remote with the volume's credential. */
  private remote<T>(operation: (repo: SimpleGit) => Promise<T>): Promise<T> {
    return this.access.run((options) => operation(this.ctx.store.repo(this.ctx.source.url, options)));
  }

  private get labels(): ClaimLabels {
    return { namespace: this.claim.namespace, claim: this.claim.name || this.ctx.volumeId };
  }

  private get tree() {
    return this.ctx.store.tree(this.ctx.source.url, this.ctx.volumeId, this.authorEnv());
  }

  private get repo() {
    return this.ctx.store.repo(this.ctx.source.url);
  }

  private get sideBranch(): string {
    return sideBranchOf(this.ctx.branch, this.ctx.volumeId);
  }

  private get pushBranch(): string {
    return this.onSideBranch ? this.sideBranch : this.ctx.branch;
  }

  private authorEnv(): Record<string, string> {
    return this.policy ? authorEnv(this.policy.author) : {};
  }

  /** Runs one step after every step before it. */
  private enqueue<T>(step: () => Promise<T>): Promise<T> {
    const result = this.chain.then(step, step);
    this.chain = result.catch(() => undefined);
    return result;
  }

  // ---- start and stop -------------------------------------------------

  /**
   * Starts watching. Writes made while nothing watched (the driver was down)
   * come from the watcher's snapshot, or from one full `git status` where
   * there is none; and the quiesce starts now, so they are committed when it
   * passes.
   */
  async start(classToApply: gitcsi.VolumeClass | undefined, fetched: PreparedTree["fetched"], reused: boolean): Promise<void> {
    this.applyClass(classToApply);
    this.warnIfHostKeyUnverified();
    await this.writeExcludes();
    await this.enqueue(() => this.ctx.onRepository(() => (reused ? this.reconcileAtStage(fetched) : this.replayMetadata())));
    const treeDir = this.ctx.store.treeDir(this.ctx.volumeId);
    const snapshot = this.snapshotFile();
    const saved = await this.readSavedPending();
    const log = { volume: this.ctx.volumeId, operation: "watch" };
    if (saved && (await fs.stat(snapshot).then(() => true, () => false))) {
      for (const p of saved) this.changed.add(p);
      const since = await watcher.getEventsSince(treeDir, snapshot);
      for (const event of since) this.noteChange(path.relative(treeDir, event.path));
      this.ctx.logger.info(`${since.length} path(s) written while nothing watched, from the watcher's snapshot`, log);
    } else {
      this.fullScan = true;
      this.ctx.logger.info("no watcher snapshot: one full git status finds what changed while nothing watched", log);
    }
    // A snapshot serves one start: a crash after this must not reuse it.
    await Promise.all([fs.rm(snapshot, { force: true }), fs.rm(this.pendingFile(), { force: true })]);
    this.subscription = await watcher.subscribe(treeDir, (err, events) => {
      if (err) {
        this.ctx.logger.warn("the watcher lost events; the next commit scans the whole tree", { volume: this.ctx.volumeId, operation: "watch", error: err.message });
        this.fullScan = true;
      }
      for (const event of events) this.noteChange(path.relative(treeDir, event.path));
      this.onWrite();
    });
    await this.enqueue(() => this.refreshPending());
    await this.enqueue(() => this.refreshUnpushed());
    this.startQuiesce();
    this.ensureLatencyTimer();
    this.watchLease();
  }

  /**
   * Stops watching and keeps what the watcher knew, for the next start on this
   * node; then release_mount of the epoch, when one is given. True when the
   * owner ref no longer names that epoch.
   */
  async stop(releaseEpoch?: string): Promise<boolean> {
    this.stopped = true;
    for (const timer of [this.quiesceTimer, this.latencyTimer, this.retryTimer, this.leaseTimer]) clearTimeout(timer);
    await this.subscription?.unsubscribe();
    await this.chain;
    const treeDir = this.ctx.store.treeDir(this.ctx.volumeId);
    await fs.mkdir(this.ctx.store.volumeDir(this.ctx.volumeId), { recursive: true });
    await watcher.writeSnapshot(treeDir, this.snapshotFile());
    await fs.writeFile(this.pendingFile(), JSON.stringify([...this.changed, ...this.pending]));
    const released = releaseEpoch === this.epoch ? await this.lease.release((operation) => this.remote(operation)) : false;
    this.access.close();
    this.ctx.metrics.forget(this.labels);
    return released;
  }

  /** What the last stop left pending; a record that cannot be read costs one full scan, never a path. */
  private async readSavedPending(): Promise<string[] | undefined> {
    const text = await orAbsent(fs.readFile(this.pendingFile(), "utf8"));
    if (text === undefined) return undefined;
    try {
      return JSON.parse(text) as string[];
    } catch (err) {
      this.ctx.logger.warn(`${this.pendingFile()} cannot be read; one full git status finds what changed: ${(err as Error).message}`, { volume: this.ctx.volumeId, operation: "watch" });
      return undefined;
    }
  }

  private snapshotFile(): string {
    return path.join(this.ctx.store.volumeDir(this.ctx.volumeId), "watch.snapshot");
  }

  private pendingFile(): string {
    return path.join(this.ctx.store.volumeDir(this.ctx.volumeId), "pending.json");
  }

  /**
   * Spec 004, "When upstream moves", at stage: behind takes upstream, ahead
   * changes nothing, diverged rebases (or moves to the side branch), and a
   * tree with uncommitted writes is left as it is whatever upstream did. A
   * side branch on the remote means the volume still pushes there, unless a
   * person merged it.
   */
  private async reconcileAtStage(fetched: PreparedTree["fetched"]): Promise<void> {
    if (fetched === "skipped") {
      // The side branch the node last pushed tells where pushes go until the credential allows a fetch.
      this.onSideBranch = (await revParse(this.repo, upstreamRef(this.sideBranch))) !== "";
      return;
    }
    this.onSideBranch = (await this.remote((repo) => fetchBranch(repo, this.sideBranch))) === "fetched";
    if (fetched === "missing") {
      this.onSideBranch = true;
      this.noteRefDeleted();
      return;
    }
    if (this.onSideBranch) {
      await this.tryToHeal();
      if (this.onSideBranch) this.emit(Reason.Diverged, "Warning", `the volume pushes to ${this.sideBranch} until it is merged into ${this.ctx.branch} on the forge`);
      return;
    }
    const head = await revParse(this.tree, "HEAD");
    const upstream = await revParse(this.repo, upstreamRef(this.ctx.branch));
    if (head === upstream || (await isAncestor(this.repo, upstream, head))) return;
    if ((await statusOf(this.tree)).length > 0) {
      this.noteUpstreamMoved();
      return;
    }
    if (await isAncestor(this.repo, head, upstream)) {
      await moveTree(this.tree, volumeBranchRef(this.ctx.volumeId), head, upstream);
      this.ctx.logger.info("the tree took upstream", { volume: this.ctx.volumeId, operation: "stage", from: head, to: upstream });
      return;
    }
    const rebased = await this.rebaseInScratch(head, upstream);
    if (rebased === undefined || !(await moveTree(this.tree, volumeBranchRef(this.ctx.volumeId), head, rebased))) {
      await this.moveToSideBranch(`the tree and ${this.ctx.branch} diverged and rebasing at stage conflicted`);
      return;
    }
    this.emit(Reason.Rebased, "Normal", `${this.ctx.branch} moved upstream while the volume was away; its commits were rebased onto it at stage`);
  }

  // ---- the class ------------------------------------------------------

  /** Arms with a class or unarms without one. A bad parameter throws before anything changes. */
  async setClass(volumeClass: gitcsi.VolumeClass | undefined): Promise<void> {
    const wasArmed = this.policy !== undefined;
    try {
      this.applyClass(volumeClass);
    } catch (err) {
      const name = volumeClass?.name ? `class ${volumeClass.name}` : "the class";
      this.emit(Reason.Refused, "Warning", `${name} is refused and the volume keeps the policy it had: ${(err as Error).message}`);
      throw err;
    }
    await this.writeExcludes();
    await this.enqueue(async () => {
      this.fullScan = true;
      await this.refreshPending();
    });
    if (this.policy) {
      if (!wasArmed || this.pending.size > 0) this.startQuiesce();
      this.ensureLatencyTimer();
    } else {
      for (const timer of [this.quiesceTimer, this.latencyTimer, this.retryTimer]) clearTimeout(timer);
    }
    this.publishMetrics();
  }

  private applyClass(volumeClass: gitcsi.VolumeClass | undefined): void {
    const policy = volumeClass ? parseClassParameters(volumeClass.parameters) : undefined;
    const wasArmed = this.policy !== undefined;
    this.policy = policy;
    this.className = volumeClass?.name ?? "";
    if (policy) {
      const name = this.className ? `class ${this.className}` : "its class";
      this.emit(Reason.Armed, "Normal", `armed by ${name}: commits after ${formatDuration(policy.quiesceMs)} of quiet, pushes within ${formatDuration(policy.maxLatencyMs)}, as ${policy.author.name} <${policy.author.email}>`);
    } else if (wasArmed) {
      this.emit(Reason.Unarmed, "Normal", "unarmed: the claim names no class; the driver reports what it would commit and commits nothing");
    }
  }

  private async writeExcludes(): Promise<void> {
    const file = this.ctx.store.excludesFile(this.ctx.volumeId);
    await fs.mkdir(path.dirname(file), { recursive: true });
    await fs.writeFile(file, [...ALWAYS_IGNORED, ...(this.policy?.ignore ?? [])].map((p) => `${p}\n`).join(""));
  }

  // ---- writes, quiesce and latency ------------------------------------

  private noteChange(relative: string): void {
    // The tree's root itself (an fsGroup applied, a chmod of the mount): the volume's, never committed or recorded.
    if (relative === "") return;
    this.changed.add(relative);
    this.metadataChanged.add(relative);
  }

  private onWrite(): void {
    if (this.stopped) return;
    void this.enqueue(() => this.refreshPending()).catch((err: unknown) => this.fail("status", err));
    if (this.policy) {
      this.startQuiesce();
      this.ensureLatencyTimer();
    }
  }

  private startQuiesce(): void {
    clearTimeout(this.quiesceTimer);
    if (!this.policy || this.stopped) return;
    this.quiesceTimer = setTimeout(() => void this.sync("quiesce").catch((err: unknown) => this.fail("sync", err)), this.policy.quiesceMs);
  }

  private ensureLatencyTimer(): void {
    if (!this.policy || this.stopped || this.latencyTimer) return;
    if (this.pending.size === 0 && this.changed.size === 0 && this.unpushed === 0) return;
    this.oldestUnpushedAt ??= Date.now();
    const due = this.oldestUnpushedAt + this.policy.maxLatencyMs - Date.now();
    this.latencyTimer = setTimeout(() => {
      this.latencyTimer = undefined;
      void this.sync("maxLatency").catch((err: unknown) => this.fail("sync", err));
    }, Math.max(0, due));
  }

  /** Asks git which of the watcher's paths changed and are not ignored. */
  private async refreshPending(): Promise<void> {
    const scanAll = this.fullScan;
    const asked = scanAll ? undefined : [...this.changed];
    this.fullScan = false;
    this.changed.clear();
    if (asked?.length === 0) return;
    const statuses = await statusOf(this.tree, asked);
    if (scanAll) this.pending.clear();
    for (const p of asked ?? []) this.pending.delete(p);
    const before = this.pending.size;
    for (const s of statuses) this.pending.add(s.path);
    if (this.policy && before === 0 && this.pending.size > 0) {
      this.emit(Reason.Pending, "Normal", `${this.pending.size} changed path(s) wait for ${formatDuration(this.policy.quiesceMs)} of quiet before the commit`);
    }
    this.publishMetrics();
  }

  // ---- commit and push ------------------------------------------------

  /** The pod stopped: commit and push now, whatever the timers say. */
  flush(): Promise<{ pushed: boolean; message: string }> {
    return this.sync(POD_STOPPED);
  }

  private sync(trigger: string): Promise<{ pushed: boolean; message: string }> {
    clearTimeout(this.quiesceTimer);
    return this.enqueue(async () => {
      await this.refreshPending();
      if (!this.policy) return { pushed: this.unpushed === 0, message: "unarmed: nothing is committed or pushed" };
      await this.commitOrRetry(trigger);
      return this.push(trigger);
    });
  }

  /**
   * A commit that fails keeps every path pending, turns the volume abnormal
   * and is tried again with backoff; the caller sees the failure, so an
   * unstage never answers over writes no commit holds.
   */
  private async commitOrRetry(trigger: string): Promise<void> {
    try {
      await this.commit(trigger);
    } catch (err) {
      throw this.commitFailed(err);
    }
    if (this.lastCommitError !== "") {
      this.lastCommitError = "";
      this.commitFailures = 0;
      this.ctx.logger.info("committed again after failed commits", { volume: this.ctx.volumeId, operation: "commit" });
    }
  }

  private commitFailed(err: unknown): CsiError {
    const message = err instanceof Error ? err.message : String(err);
    this.commitFailures++;
    if (message !== this.lastCommitError) {
      this.emit(Reason.CommitFailed, "Warning", `${this.pending.size} written path(s) could not be committed; they stay in the node's work tree and the driver retries: ${message}`);
    }
    this.lastCommitError = message;
    this.retryAfterFailure(this.commitFailures);
    return internal(`volume ${this.ctx.volumeId}: ${this.pending.size} written path(s) could not be committed, so they are not safe to leave the node yet; the driver retries: ${message}`);
  }

  /** The next sync after a failed commit or push, with backoff up to push.maxLatency. */
  private retryAfterFailure(failures: number): void {
    clearTimeout(this.retryTimer);
    const delay = Math.min(this.policy?.maxLatencyMs ?? RETRY_MIN_MS, RETRY_MIN_MS * 2 ** Math.min(failures - 1, 6));
    this.retryTimer = setTimeout(() => void this.sync("a failed commit or push").catch((err: unknown) => this.fail("sync", err)), delay);
    this.publishMetrics();
  }

  /** Commits the pending paths; a path leaves the pending set only once a commit holds it or git shows it unchanged. */
  private async commit(trigger: string): Promise<void> {
    const asked = [...this.pending];
    if (asked.length === 0) return;
    const tooLarge = await this.stage(asked);
    const staged = await stagedPaths(this.tree);
    if (staged.length > 0) await this.writeCommit(staged, trigger);
    this.noteSkipped(asked, tooLarge);
    for (const p of asked) this.pending.delete(p);
    await this.refreshUnpushed();
  }

  /** Stages what changed of these paths as they are now; the ones over commit.maxFileSize stay out. */
  private async stage(asked: string[]): Promise<Map<string, number>> {
    const treeDir = this.ctx.store.treeDir(this.ctx.volumeId);
    const pathspecFile = path.join(this.ctx.store.volumeDir(this.ctx.volumeId), "pathspec");
    let tooLarge = new Map<string, number>();
    await stageChanges(this.tree, pathspecFile, asked, async (changed) => {
      tooLarge = new Map();
      for (const s of changed) {
        // A file that vanished since git listed it is staged as whatever git sees: never too large.
        const stat = s.deleted ? undefined : await orAbsent(fs.lstat(path.join(treeDir, s.path)));
        if (stat?.isFile() && stat.size > this.policy!.maxFileSizeBytes) tooLarge.set(s.path, stat.size);
      }
      return changed.filter((s) => !tooLarge.has(s.path)).map((s) => s.path);
    });
    return tooLarge;
  }

  /** Plumbing, not `git commit`: that re-checks every tracked file, and the cost must follow the change. */
  private async writeCommit(staged: string[], trigger: string): Promise<void> {
    const subject = `${this.claim.name ? `${this.claim.namespace}/${this.claim.name}` : this.ctx.volumeId}: ${staged.length} path(s) after ${trigger}`;
    const body = staged.slice(0, 50).join("\n") + (staged.length > 50 ? `\n… and ${staged.length - 50} more` : "");
    const parent = await revParse(this.tree, "HEAD");
    const treeOid = (await runGit(this.tree, ["write-tree"])).trim();
    const commit = (await runGit(this.tree, ["commit-tree", treeOid, "-p", parent, "-m", subject, "-m", body])).trim();
    await runGit(this.tree, ["update-ref", "-m", "git-csi: commit", "HEAD", commit, parent]);
    this.oldestUnpushedAt ??= Date.now();
    this.ctx.logger.info("committed", { volume: this.ctx.volumeId, operation: "commit", paths: staged.length, trigger });
  }

  private noteSkipped(asked: string[], tooLarge: Map<string, number>): void {
    for (const p of asked) if (!tooLarge.has(p)) this.skipped.delete(p);
    for (const [p, size] of tooLarge) {
      if (!this.skipped.has(p)) {
        this.emit(Reason.FileSkipped, "Warning", `${p} is ${size} bytes, over commit.maxFileSize ${this.policy!.maxFileSizeBytes}: it is not committed; add it to the class's ignore or raise commit.maxFileSize`);
      }
      this.skipped.set(p, size);
    }
  }

  private async refreshUnpushed(): Promise<void> {
    const head = await revParse(this.tree, "HEAD");
    const pushed = await revParse(this.repo, upstreamRef(this.pushBranch));
    this.unpushed = head === "" ? 0 : await countCommits(this.repo, pushed, head);
    if (this.unpushed === 0 && this.pending.size === 0) this.oldestUnpushedAt = undefined;
    this.publishMetrics();
  }

  /** Any failure to reach the remote on the way (a fetch, the metadata, the push itself) is a failed push. */
  private async push(trigger: string): Promise<{ pushed: boolean; message: string }> {
    try {
      // A whole push, fetch and rebase included, holds the URL's repository: volumes of one URL take turns.
      return await this.ctx.onRepository(() => this.pushOnce(trigger));
    } catch (err) {
      if (err instanceof RemoteError) return this.pushFailed(err.message);
      throw err;
    }
  }

  private async pushOnce(trigger: string): Promise<{ pushed: boolean; message: string }> {
    clearTimeout(this.latencyTimer);
    this.latencyTimer = undefined;
    if (this.waitingForCredential) {
      const message = "the driver restarted and holds no credential for the volume until the next publish brings the Secret";
      // At pod stop nothing else will push: say so. Timed pushes just wait.
      if (trigger === POD_STOPPED && this.unpushed > 0) return this.pushFailed(message);
      return { pushed: this.unpushed === 0, message };
    }
    if (this.onSideBranch) await this.tryToHeal();
    if (this.unpushed === 0 && !this.refDeleted && this.metadataChanged.size === 0) return { pushed: true, message: "nothing to push" };
    // The rebased commit goes out straight from the scratch worktree; the pod's tree takes it once it landed.
    const head = await revParse(this.tree, "HEAD");
    let candidate = head;
    for (let attempt = 0; this.unpushed > 0 || this.refDeleted; attempt++) {
      const result = await this.fenced((repo, fence) => pushCommit(repo, candidate, this.pushBranch, fence));
      if (result.outcome === "pushed") {
        if (candidate !== head) await this.takeRebased(head, candidate);
        this.pushed();
        await this.refreshUnpushed();
        break;
      }
      if (result.outcome === "failed") return this.pushFailed(result.message);
      if (this.onSideBranch) return this.pushFailed(`the side branch ${this.sideBranch} moved on the remote: ${result.message}`);
      this.ctx.logger.info("the push was rejected: the remote moved", { volume: this.ctx.volumeId, operation: "push", attempt, detail: result.message });
      const rebased = attempt === REBASE_ATTEMPTS ? `the push was still rejected after ${REBASE_ATTEMPTS} rebases` : await this.rebaseOntoUpstream(head);
      if (typeof rebased === "string") {
        await this.moveToSideBranch(rebased);
        candidate = head;
      } else {
        candidate = rebased.commit;
      }
    }
    await this.pushMetadata();
    return { pushed: true, message: `pushed to ${this.pushBranch}` };
  }

  /**
   * Records the modes, owners and empty directories of the paths the watcher
   * saw on top of the remote's refs/git-csi/metadata, which other volumes of
   * the repository update too: a refused compare-and-swap fetches and records again.
   */
  private async pushMetadata(): Promise<void> {
    for (let attempt = 0; this.metadataChanged.size > 0; attempt++) {
      const recorded = [...this.metadataChanged];
      const base = await revParse(this.repo, UPSTREAM_METADATA);
      const commit = await recordMetadata({
        repo: this.repo,
        treeDir: this.ctx.store.treeDir(this.ctx.volumeId),
        branch: this.ctx.branch,
        base,
        changedPaths: recorded,
        indexFile: path.join(this.ctx.store.volumeDir(this.ctx.volumeId), "metadata.index"),
        author: this.policy!.author,
        tree: this.tree,
      });
      const result = commit === base ? ({ outcome: "pushed" } as const) : await this.fenced((repo, fence) => pushMetadata(repo, commit, fence));
      if (result.outcome === "pushed") {
        for (const p of recorded) this.metadataChanged.delete(p);
        return;
      }
      if (result.outcome === "failed" || attempt === REBASE_ATTEMPTS) {
        this.ctx.logger.warn(`${METADATA_REF} was not pushed; the next push records it again: ${result.message}`, { volume: this.ctx.volumeId, operation: "metadata" });
        return;
      }
      await this.remote((repo) => fetchMetadata(repo));
    }
  }

  private pushed(): void {
    this.lastPushAt = Date.now();
    this.lastPushError = "";
    // A push lands on top of upstream: whatever moved under the uncommitted writes is now in the tree's history.
    this.upstreamMovedOverWrites = false;
    this.unpushed = 0;
    this.oldestUnpushedAt = this.pending.size > 0 ? Date.now() : undefined;
    this.emit(Reason.Pushed, "Normal", `pushed to ${this.pushBranch}`);
    this.ensureLatencyTimer();
    this.publishMetrics();
  }

  private pushFailed(message: string): { pushed: boolean; message: string } {
    this.pushFailures++;
    this.lastPushError = message;
    this.ctx.metrics.pushFailures.inc(this.labels);
    this.emit(Reason.PushFailed, "Warning", `push to ${this.pushBranch} failed; the commits stay in the node's work tree and the driver retries: ${message}`);
    this.retryAfterFailure(this.pushFailures);
    return { pushed: false, message };
  }

  /** A restore: a new tree takes the modes, owners and empty directories the metadata ref recorded. */
  private async replayMetadata(): Promise<void> {
    const metadata = await this.remote((repo) => fetchMetadata(repo));
    if (metadata === "") return;
    const result = await replayMetadata({
      repo: this.repo,
      treeDir: this.ctx.store.treeDir(this.ctx.volumeId),
      branch: this.ctx.branch,
      metadata,
      log: (message, fields) => this.ctx.logger.warn(message, { volume: this.ctx.volumeId, operation: "replay_metadata", ...fields }),
    });
    this.ctx.logger.info("replayed modes, owners and empty directories", { volume: this.ctx.volumeId, operation: "replay_metadata", applied: result.applied, refused: result.refused.length });
  }

  // ---- upstream moves -------------------------------------------------

  /**
   * Fetches the ref and rebases the tree's commits onto it in the scratch
   * worktree, beside the pod's tree; then moves the pod's tree to the result
   * in one step. Returns why it could not, for the side branch's message.
   */
  private async rebaseOntoUpstream(head: string): Promise<{ commit: string } | string> {
    if ((await this.remote((repo) => fetchBranch(repo, this.ctx.branch, true))) === "missing") {
      this.noteRefDeleted();
      return `${this.ctx.branch} was deleted upstream`;
    }
    const upstream = await revParse(this.repo, upstreamRef(this.ctx.branch));
    // Only the metadata ref moved (another volume of the repository pushed): nothing to rebase.
    if (await isAncestor(this.repo, upstream, head)) return { commit: head };
    const rebased = await this.rebaseInScratch(head, upstream);
    if (rebased === undefined) return `rebasing onto ${this.ctx.branch} conflicted and was aborted`;
    if (!(await canMoveTree(this.tree, head, rebased))) return "a file the application changed since the last commit was also changed upstream";
    return { commit: rebased };
  }

  private noteRefDeleted(): void {
    this.refDeleted = true;
    this.emit(Reason.RefDeleted, "Warning", `${this.ctx.branch} was deleted upstream; the volume's commits go to ${this.sideBranch} so nothing is lost`);
  }

  /** The pod's tree takes a rebased commit that landed, in one step. */
  private async takeRebased(head: string, rebased: string): Promise<void> {
    if (await moveTree(this.tree, volumeBranchRef(this.ctx.volumeId), head, rebased)) {
      this.emit(Reason.Rebased, "Normal", `${this.ctx.branch} moved upstream; the volume's commits were rebased onto it and the pod's tree took upstream's files`);
    } else {
      // The application wrote a file upstream changed after the check: the next cycle's rebase decides.
      this.ctx.logger.warn("the pod's tree keeps its commit until the next cycle: the application changed a file upstream changed too", { volume: this.ctx.volumeId, operation: "rebase" });
    }
  }

  /**
   * The rebased commit, or undefined when the rebase conflicted (and was
   * aborted). Any other failure is git's error, never taken for a conflict.
   */
  private async rebaseInScratch(head: string, onto: string): Promise<string | undefined> {
    const git = await this.scratchAt(head);
    try {
      await runGit(git, ["rebase", "--quiet", onto]);
    } catch (err) {
      // Not a conflict: the next scratchAt aborts what is left, or makes the scratch again.
      if ((await runGit(git, ["diff", "--name-only", "--diff-filter=U"])).trim() === "") throw err;
      await runGit(git, ["rebase", "--abort"]);
      return undefined;
    }
    return revParse(git, "HEAD");
  }

  /**
   * The scratch worktree, checked out at head with no rebase in progress. It
   * holds nothing of its own, so one a killed worker left broken (a rebase
   * half done, a lock) is made again rather than trusted.
   */
  private async scratchAt(head: string): Promise<SimpleGit> {
    const scratch = this.ctx.store.scratchDir(this.ctx.volumeId);
    // simple-git wants its directory to exist when it is made.
    const git = () => this.ctx.store.scratch(this.ctx.volumeId, this.authorEnv());
    if (await orAbsent(fs.stat(scratch))) {
      try {
        await runGit(git(), ["rebase", "--abort"]).catch((err: Error) => {
          if (!/no rebase in progress/i.test(err.message)) throw err;
        });
        await runGit(git(), ["checkout", "--quiet", "--force", "--detach", head]);
        return git();
      } catch (err) {
        this.ctx.logger.warn(`the scratch worktree is made again: ${(err as Error).message}`, { volume: this.ctx.volumeId, operation: "rebase" });
        await fs.rm(scratch, { recursive: true, force: true });
      }
    }
    await fs.mkdir(path.dirname(scratch), { recursive: true });
    await runGit(this.repo, ["worktree", "add", "--quiet", "--detach", "--force", scratch, head]);
    return git();
  }

  private async moveToSideBranch(why: string): Promise<void> {
    this.onSideBranch = true;
    this.emit(
      Reason.Diverged,
      "Warning",
      `${why}: the volume now pushes to ${this.sideBranch} instead of ${this.ctx.branch}; merge ${this.sideBranch} into ${this.ctx.branch} on the forge and the volume returns to ${this.ctx.branch} at its next push. Commits continue.`,
    );
    await this.refreshUnpushed();
  }

  /** On the side branch: once a person merged it into the ref, the volume returns to the ref. */
  private async tryToHeal(): Promise<void> {
    const sidePushed = await revParse(this.repo, upstreamRef(this.sideBranch));
    if ((await this.remote((repo) => fetchBranch(repo, this.ctx.branch))) === "missing") return;
    this.refDeleted = false;
    const upstream = await revParse(this.repo, upstreamRef(this.ctx.branch));
    if (sidePushed === "" || !(await isAncestor(this.repo, sidePushed, upstream))) return;
    const head = await revParse(this.tree, "HEAD");
    const rebased = await this.rebaseInScratch(head, upstream);
    if (rebased === undefined || !(await moveTree(this.tree, volumeBranchRef(this.ctx.volumeId), head, rebased))) return;
    this.onSideBranch = false;
    const deleted = await this.fenced((repo, fence) => deleteBranch(repo, this.sideBranch, fence));
    if (deleted.outcome !== "pushed") this.ctx.logger.warn(`the merged side branch ${this.sideBranch} stays on the remote: ${deleted.message}`, { volume: this.ctx.volumeId, operation: "heal" });
    this.emit(Reason.Healed, "Normal", `${this.sideBranch} was merged into ${this.ctx.branch}: the volume is back on ${this.ctx.branch} and the side branch is deleted`);
    await this.refreshUnpushed();
  }

  // ---- the credential -------------------------------------------------

  /**
   * A publish's Secret. The kubelet reads the Secret again for each publish,
   * so a new one is a rotation and pushes what the remote lacks at once; but
   * at the first publish after the stage, a Secret other than the stage's
   * means two credentials for one volume, and the publish is refused.
   */
  async setCredential(data: Record<string, string>): Promise<void> {
    const offered = fingerprint(data);
    // Until a publish passes, every publish is the first: the kubelet's retry of a refused one is refused too.
    if (!this.published && this.ctx.stageFingerprint !== "" && offered !== "" && offered !== this.ctx.stageFingerprint) {
      this.emit(Reason.Refused, "Warning", "the publish Secret differs from the stage Secret: the driver cannot choose between two credentials for one volume; name one Secret in both nodeStageSecretRef and nodePublishSecretRef");
      throw failedPrecondition(`volume ${this.ctx.volumeId}: the publish Secret differs from the stage Secret; name one Secret in both nodeStageSecretRef and nodePublishSecretRef`);
    }
    this.published = true;
    if (offered === "") {
      if (this.ctx.stageFingerprint !== "" || this.ctx.credentialExpected) {
        this.emit(
          Reason.NoPublishSecret,
          "Warning",
          "the PersistentVolume has a nodeStageSecretRef but no nodePublishSecretRef: after a driver restart the volume pushes nothing until the pod is deleted and started again. Give the volume a new PersistentVolume with both references, before the next driver upgrade",
        );
      }
      return;
    }
    if (offered === this.publishFingerprint || (this.publishFingerprint === "" && offered === this.ctx.stageFingerprint && this.access.hasCredential)) {
      this.publishFingerprint = offered;
      return;
    }
    const next = await this.ctx.openAccess(data);
    const previous = this.access;
    this.access = next;
    this.publishFingerprint = offered;
    previous.close();
    this.warnIfHostKeyUnverified();
    this.ctx.logger.info("a publish brought a new credential; pushing what the remote lacks now", { volume: this.ctx.volumeId, operation: "credential" });
    // A restarted worker claims the epoch's lease with the first Secret it gets.
    if (!this.lease.claimed) await this.lease.claim((operation) => this.remote(operation));
    if (this.policy) await this.sync("a new credential");
    else this.publishMetrics();
  }

  private warnIfHostKeyUnverified(): void {
    if (!this.access.hostKeyVerified) {
      this.emit(Reason.HostKeyUnverified, "Warning", "the volume's ssh Secret has no known_hosts: the server's host key was trusted on first sight; add known_hosts to the Secret to check it");
    }
  }

  // ---- report, events, metrics ----------------------------------------

  private emit(reason: ReasonName, type: EventType, message: string): void {
    const event = { reason, type, message, timeUnixMs: Date.now() };
    keepRecent(this.events, event);
    this.ctx.logger.log(type === "Warning" ? "warn" : "info", message, { volume: this.ctx.volumeId, claim: this.labels.claim, operation: "event", reason });
    // Spec 004: the pod's events and the claim's.
    if (this.claim.name) this.postOnClaim(event);
    else if (this.unposted.claim) keepRecent(this.unposted.claim, event);
    if (this.pods.length > 0) this.postOnPods(event);
    else if (this.unposted.pods) keepRecent(this.unposted.pods, event);
  }

  private postOnClaim(event: gitWorker.VolumeEvent): void {
    const claim = { kind: "PersistentVolumeClaim" as const, namespace: this.claim.namespace, name: this.claim.name, uid: this.claim.uid || undefined };
    this.ctx.events?.record(claim, event.type as EventType, event.reason as ReasonName, event.message);
  }

  private postOnPods(event: gitWorker.VolumeEvent): void {
    for (const pod of this.pods) this.ctx.events?.record({ kind: "Pod", namespace: pod.namespace, name: pod.name, uid: pod.uid || undefined }, event.type as EventType, event.reason as ReasonName, event.message);
  }

  private fail(operation: string, err: unknown): void {
    const message = err instanceof RemoteError || err instanceof Error ? err.message : String(err);
    this.ctx.logger.error(`${operation} failed: ${message}`, { volume: this.ctx.volumeId, operation });
  }

  abnormal(): string[] {
    const reasons: string[] = [];
    const lease = this.lease.state();
    if (!lease.held) reasons.push(`the mount epoch does not hold the volume: ${lease.message}`);
    if (this.waitingForCredential) reasons.push("waits for its credential: the driver restarted, and the next publish brings the Secret");
    if (this.onSideBranch) reasons.push(`diverged: pushes go to ${this.sideBranch} until it is merged into ${this.ctx.branch}`);
    if (this.refDeleted) reasons.push(`${this.ctx.branch} was deleted upstream`);
    if (this.lastCommitError) reasons.push(`the last commit failed, ${this.pending.size} path(s) wait for it: ${this.lastCommitError}`);
    if (this.lastPushError) reasons.push(`the last push failed: ${this.lastPushError}`);
    if (this.upstreamMovedOverWrites) reasons.push(`${this.ctx.branch} moved upstream while the tree held uncommitted writes; the tree was left as it is`);
    if (this.skipped.size > 0) reasons.push(`${this.skipped.size} file(s) over commit.maxFileSize are not committed`);
    return reasons;
  }

  /** Set at stage when upstream moved and the tree holds writes no commit has. */
  noteUpstreamMoved(): void {
    this.upstreamMovedOverWrites = true;
    this.emit(Reason.UpstreamMoved, "Warning", `${this.ctx.branch} moved upstream while the tree holds writes no commit has yet: the tree is left as it is; the next push rebases onto upstream`);
  }

  report(): gitWorker.VolumeReport {
    const waitingFor: string[] = [];
    if (this.policy && this.pending.size > 0) waitingFor.push(`${formatDuration(this.policy.quiesceMs)} of quiet before committing ${this.pending.size} path(s)`);
    if (this.unpushed > 0) waitingFor.push(`a push of ${this.unpushed} commit(s) to ${this.pushBranch}`);
    if (this.waitingForCredential) waitingFor.push("its credential, from the next publish");
    return {
      volumeId: this.ctx.volumeId,
      claim: this.claim,
      armed: this.policy !== undefined,
      className: this.className,
      pendingPaths: [...this.pending].sort(),
      unpushedCommits: this.unpushed,
      lastPushUnixMs: this.lastPushAt,
      pushFailures: this.pushFailures,
      skippedPaths: [...this.skipped.keys()].sort(),
      sideBranch: this.onSideBranch ? this.sideBranch : "",
      pushBranch: this.pushBranch,
      waitingFor,
      abnormal: this.abnormal(),
      recentEvents: [...this.events],
    };
  }

  private publishMetrics(): void {
    const m = this.ctx.metrics;
    const l = this.labels;
    m.armed.set(l, this.policy ? 1 : 0);
    m.pendingPaths.set(l, this.pending.size);
    m.unpushedCommits.set(l, this.unpushed);
    m.skippedFiles.set(l, this.skipped.size);
    m.diverged.set(l, this.onSideBranch ? 1 : 0);
    m.abnormal.set(l, this.abnormal().length > 0 ? 1 : 0);
    if (this.lastPushAt > 0) m.lastPush.set(l, this.lastPushAt / 1000);
    m.pushFailures.inc(l, 0);
  }
}

function keepRecent(events: gitWorker.VolumeEvent[], event: gitWorker.VolumeEvent): void {
  events.push(event);
  if (events.length > RECENT_EVENTS) events.shift();
}
