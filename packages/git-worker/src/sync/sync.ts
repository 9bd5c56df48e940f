import * as fs from "node:fs/promises";
import * as path from "node:path";
import watcher from "@parcel/watcher";
import { formatDuration, orAbsent, parseClassParameters, Reason, Serial } from "@git-csi/config";
import { type gitcsi, gitWorker } from "@git-csi/protos";
import { VolumeCommitter } from "./commit";
import type { MountLease, OnRemote } from "../lease/lease";
import { VolumeCredential } from "../remote/publish-credential";
import { GitCommandError } from "../remote/git";
import { RemoteError } from "../remote/remote";
import { VolumePush } from "./push";
import { FLUSH_ASKED, POD_STOPPED, type SyncOutcome } from "./push-decisions";
import type { RenewalMember } from "../lease/renewal";
import { VolumeReporter } from "../report";
import { SyncScheduler, systemClock } from "./schedule";
import { VolumeRecovery } from "./recovery";
import { VolumeStranded } from "./stranded";
import type { PreparedTree } from "../trees/stage";
import { flushedRef } from "../trees/store";
import { VolumeUpstream } from "./upstream";
import { type SyncContext, VolumeState } from "./volume";
import { WatchBatches } from "./watch-batches";

/**
 * One staged volume's write path, spec 004 "What happens after a write" and
 * "When upstream moves": it watches the backing tree, and its scheduler runs
 * a sync (commit, then push) once the tree is quiet for push.quiesce, within
 * push.maxLatency, and after a failure. Every step runs on one Serial, so two
 * never interleave on the same tree.
 */
export class VolumeSync {
  private readonly s: VolumeState;
  private readonly reporter: VolumeReporter;
  private readonly scheduler: SyncScheduler;
  private readonly committer: VolumeCommitter;
  private readonly upstream: VolumeUpstream;
  private readonly pusher: VolumePush;
  private readonly stranded: VolumeStranded;
  private readonly recovery: VolumeRecovery;
  private subscription?: watcher.AsyncSubscription;
  private readonly batches = new WatchBatches();
  private readonly credential: VolumeCredential;
  private readonly steps = new Serial();
  private stopped = false;
  private cancelLeaseWatch?: () => void;

  constructor(private readonly ctx: SyncContext) {
    const s = new VolumeState(ctx);
    this.s = s;
    this.reporter = new VolumeReporter(s);
    const hasWork = () => s.pending.size > 0 || s.changed.size > 0 || s.unpushed > 0;
    this.scheduler = new SyncScheduler(systemClock, hasWork, (trigger) => void this.sync(trigger).catch((err: unknown) => this.reporter.fail("sync", err)));
    this.upstream = new VolumeUpstream(s, this.reporter, this.scheduler);
    this.committer = new VolumeCommitter(s, this.reporter, this.scheduler, () => this.upstream.refreshUnpushed());
    this.stranded = new VolumeStranded(s, this.reporter, this.upstream);
    this.recovery = new VolumeRecovery(s, this.reporter);
    this.pusher = new VolumePush(s, this.reporter, this.scheduler, this.upstream, this.stranded);
    this.credential = new VolumeCredential(s, this.reporter, (trigger) => this.sync(trigger));
  }

  /** The claim bound to the volume, learned from the API after the stage: the metrics move to its labels. */
  setClaim(claim: gitcsi.Claim): void {
    this.reporter.setClaim(claim);
  }

  setPods(pods: gitcsi.Pod[]): void {
    this.reporter.setPods(pods);
  }

  get epoch(): string {
    return this.s.lease.holder.epoch;
  }

  get mountLease(): MountLease {
    return this.s.lease;
  }

  /** A new mount session of the volume on this node took ownership while the worker kept watching. */
  useLease(lease: MountLease): void {
    this.s.lease = lease;
    this.watchLease();
  }

  /** What a batch renewal needs of the volume (renewal.ts). */
  renewalMember(): RenewalMember {
    const s = this.s;
    return {
      lease: s.lease,
      key: `${s.ctx.source.url}\n${s.access.identity}`,
      remote: (operation) => s.remote(operation),
      local: () => s.repo,
      renewed: () => this.watchLease(),
    };
  }

  /** How the collection reaches the volume's remote with its credential (none while it waits for one), and the epoch it serves. */
  collectionMember(): { url: string; volumeId: string; epoch: string; remote?: OnRemote } {
    const s = this.s;
    return { url: s.ctx.source.url, volumeId: s.volumeId, epoch: this.epoch, remote: s.waitingForCredential ? undefined : (operation) => s.remote(operation) };
  }

  /**
   * The abnormal gauge turns when the lease runs out or is lost, even if
   * nothing else happens to the volume then; and a lost epoch starts its
   * recovery. Every way to lose one comes through here: a renewal refused
   * (renewed()), the serving time over (the timer), a push refused (sync()).
   * A stopped volume's release is no loss.
   */
  private watchLease(): void {
    this.cancelLeaseWatch?.();
    if (this.stopped) return;
    this.reporter.publishMetrics();
    const lease = this.s.lease.state();
    this.recovery.check(lease);
    if (lease.held) this.cancelLeaseWatch = systemClock.after(Math.max(0, Number(lease.serveUntilUnixMs) - systemClock.now()) + 1, () => this.watchLease());
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
    this.credential.warnIfHostKeyUnverified();
    await this.committer.writeExcludes();
    await this.steps.run(() => this.ctx.onRepository(() => (reused ? this.upstream.reconcileAtStage(fetched) : this.upstream.replayMetadata())));
    // A lost epoch's tree is stranded itself at the unstage: the next live stage brings in every stranded ref.
    if (this.s.lease.state().refusal === gitWorker.LeaseRefusal.LEASE_REFUSAL_NONE) await this.steps.run(() => this.ctx.onRepository(() => this.adoptStranded()));
    await this.catchUpOnWrites();
    const treeDir = this.s.treeDir;
    this.subscription = await watcher.subscribe(treeDir, (err, events) => {
      if (err) {
        this.s.log("warn", "the watcher lost events; the next commit scans the whole tree", "watch", { error: err.message });
        this.s.fullScan = true;
      }
      for (const event of events) this.committer.noteChange(path.relative(treeDir, event.path));
      this.onWrite(this.batches.writtenBy(systemClock.now()));
    });
    await this.steps.run(() => this.committer.refreshPending());
    await this.steps.run(() => this.upstream.refreshUnpushed());
    this.scheduler.restartQuiesce();
    this.scheduler.ensureLatency();
    this.watchLease();
  }

  /** What was written while nothing watched: from the last stop's snapshot, or one full scan without one. */
  private async catchUpOnWrites(): Promise<void> {
    const treeDir = this.s.treeDir;
    const snapshot = this.snapshotFile();
    const saved = await this.readSavedPending();
    if (
      saved &&
      (await fs.stat(snapshot).then(
        () => true,
        () => false,
      ))
    ) {
      for (const p of saved) this.s.changed.add(p);
      const since = await watcher.getEventsSince(treeDir, snapshot);
      for (const event of since) this.committer.noteChange(path.relative(treeDir, event.path));
      this.s.log("info", `${since.length} path(s) written while nothing watched, from the watcher's snapshot`, "watch");
    } else {
      this.s.fullScan = true;
      this.s.log("info", "no watcher snapshot: one full git status finds what changed while nothing watched", "watch");
    }
    // A snapshot serves one start: a crash after this must not reuse it.
    await Promise.all([fs.rm(snapshot, { force: true }), fs.rm(this.pendingFile(), { force: true })]);
  }

  /**
   * Stops watching and keeps what the watcher knew, for the next start on this
   * node; then release_mount of the epoch, when one is given. True when the
   * owner ref no longer names that epoch.
   */
  async stop(releaseEpoch?: string): Promise<boolean> {
    this.stopped = true;
    this.scheduler.stop();
    this.cancelLeaseWatch?.();
    await this.subscription?.unsubscribe();
    await this.steps.idle();
    await fs.mkdir(this.s.volumeDir, { recursive: true });
    await watcher.writeSnapshot(this.s.treeDir, this.snapshotFile());
    await fs.writeFile(this.pendingFile(), JSON.stringify([...this.s.changed, ...this.s.pending]));
    await this.ctx.onRepository(() => this.stranded.leave());
    const released = releaseEpoch === this.epoch ? await this.s.lease.release((operation) => this.s.remote(operation)) : false;
    this.s.access.close();
    this.ctx.metrics.forget(this.s.labels);
    return released;
  }

  /** A remote that cannot list or take the stranded refs now leaves them there for the next stage: the stage goes on. */
  private async adoptStranded(): Promise<void> {
    try {
      await this.stranded.adopt();
    } catch (err) {
      if (!(err instanceof RemoteError) && !(err instanceof GitCommandError)) throw err;
      this.s.log("warn", `the stranded refs of the volume wait for its next stage: ${err.message}`, "strand");
    }
  }

  /** What the last stop left pending; a record that cannot be read costs one full scan, never a path. */
  private async readSavedPending(): Promise<string[] | undefined> {
    const text = await orAbsent(fs.readFile(this.pendingFile(), "utf8"));
    if (text === undefined) return undefined;
    try {
      return JSON.parse(text) as string[];
    } catch (err) {
      this.s.log("warn", `${this.pendingFile()} cannot be read; one full git status finds what changed: ${(err as Error).message}`, "watch");
      return undefined;
    }
  }

  private snapshotFile(): string {
    return path.join(this.s.volumeDir, "watch.snapshot");
  }

  private pendingFile(): string {
    return path.join(this.s.volumeDir, "pending.json");
  }

  // ---- the class ------------------------------------------------------

  /** Arms with a class or unarms without one. A bad parameter throws before anything changes. */
  async setClass(volumeClass: gitcsi.VolumeClass | undefined): Promise<void> {
    const wasArmed = this.s.policy !== undefined;
    try {
      this.applyClass(volumeClass);
    } catch (err) {
      const name = volumeClass?.name ? `class ${volumeClass.name}` : "the class";
      this.reporter.emit(Reason.Refused, "Warning", `${name} is refused and the volume keeps the policy it had: ${(err as Error).message}`);
      throw err;
    }
    await this.committer.writeExcludes();
    await this.steps.run(async () => {
      this.s.fullScan = true;
      await this.committer.refreshPending();
    });
    if (this.s.policy) {
      if (!wasArmed || this.s.pending.size > 0) this.scheduler.restartQuiesce();
      this.scheduler.ensureLatency();
    } else {
      this.scheduler.disarm();
    }
    this.reporter.publishMetrics();
  }

  private applyClass(volumeClass: gitcsi.VolumeClass | undefined): void {
    const policy = volumeClass ? parseClassParameters(volumeClass.parameters) : undefined;
    const wasArmed = this.s.policy !== undefined;
    this.s.policy = policy;
    this.scheduler.arm(policy);
    this.s.className = volumeClass?.name ?? "";
    if (policy) {
      const name = this.s.className ? `class ${this.s.className}` : "its class";
      this.reporter.emit(
        Reason.Armed,
        "Normal",
        `armed by ${name}: commits after ${formatDuration(policy.quiesceMs)} of quiet, pushes within ${formatDuration(policy.maxLatencyMs)}, as ${policy.author.name} <${policy.author.email}>`,
      );
    } else if (wasArmed) {
      this.reporter.emit(Reason.Unarmed, "Normal", "unarmed: the claim names no class; the driver reports what it would commit and commits nothing");
    }
  }

  // ---- writes, commit and push ----------------------------------------

  private onWrite(at: number): void {
    if (this.stopped) return;
    void this.steps.run(() => this.committer.refreshPending()).catch((err: unknown) => this.reporter.fail("status", err));
    this.scheduler.wrote(at);
  }

  /**
   * The pod stopped: commit and push now, whatever the timers say. The
   * watcher holds a burst's later events up to 50 ms (500 ms while writes go
   * on), and the pod's last writes may not have come through it yet: the
   * flush asks git about the whole tree, once per stop.
   */
  flush(): Promise<SyncOutcome> {
    this.s.fullScan = true;
    return this.sync(POD_STOPPED);
  }

  /**
   * A snapshot or a clone of the volume asked for (request: its id): every
   * write the tree holds is committed and pushed as at a pod stop, then the
   * flushed marker names the commit the remote holds, in the same step, so
   * no later commit comes between.
   */
  markFlushed(requestId: string): Promise<SyncOutcome> {
    this.s.fullScan = true;
    return this.sync(FLUSH_ASKED, (flushed) => (flushed.pushed ? this.pusher.pushMarker(flushedRef(this.s.volumeId, requestId)) : Promise.resolve(flushed)));
  }

  /** `then`: what follows the push in the same step; an unarmed volume reaches neither. */
  private sync(trigger: string, then?: (pushed: SyncOutcome) => Promise<SyncOutcome>): Promise<SyncOutcome> {
    this.scheduler.syncStarts();
    return this.steps.run(async () => {
      await this.committer.refreshPending();
      if (!this.s.policy) return { pushed: !then && this.s.unpushed === 0, message: "unarmed: nothing is committed or pushed" };
      const head = await this.committer.commitOrRetry(trigger);
      // A push the owner ref refused (LeaseLost) lost the epoch.
      const pushed = await this.pusher.push(trigger, head).finally(() => this.watchLease());
      return then ? then(pushed) : pushed;
    });
  }

  // ---- the credential -------------------------------------------------

  /** A publish's Secret: see VolumeCredential. */
  setCredential(data: Record<string, string>): Promise<void> {
    return this.credential.set(data);
  }

  // ---- the report -----------------------------------------------------

  report(): gitWorker.VolumeReport {
    return this.reporter.report();
  }
}
