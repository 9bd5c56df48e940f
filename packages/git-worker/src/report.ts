import { type EventType, formatDuration, Reason, type ReasonName } from "@git-csi/config";
import type { gitcsi, gitWorker } from "@git-csi/protos";
import type { VolumeState } from "./sync/volume";

const RECENT_EVENTS = 50;

/**
 * What a volume tells: its events (spec 004, on the pod and the claim, in
 * the report and the log), its metrics, and `git-csi report`'s answer.
 */
export class VolumeReporter {
  private readonly events: gitWorker.VolumeEvent[] = [];
  /**
   * Events from before the first pod, or before the claim, was known (the
   * stage has neither): posted on them when they are, so the pod's and the
   * claim's events tell what the stage found.
   */
  private readonly unposted: { pods?: gitWorker.VolumeEvent[]; claim?: gitWorker.VolumeEvent[] } = { pods: [], claim: [] };

  constructor(private readonly s: VolumeState) {}

  /** The claim bound to the volume, learned from the API after the stage: the metrics move to its labels. */
  setClaim(claim: gitcsi.Claim): void {
    const known = this.s.claim;
    if (claim.namespace === known.namespace && claim.name === known.name && claim.uid === known.uid) return;
    this.s.ctx.metrics.forget(this.s.labels);
    this.s.claim = claim;
    this.publishMetrics();
    if (claim.name) for (const event of this.takeUnposted("claim")) this.postOnClaim(event);
  }

  setPods(pods: gitcsi.Pod[]): void {
    this.s.pods = pods;
    if (pods.length > 0) for (const event of this.takeUnposted("pods")) this.postOnPods(event);
  }

  private takeUnposted(on: "pods" | "claim"): gitWorker.VolumeEvent[] {
    const events = this.unposted[on] ?? [];
    this.unposted[on] = undefined;
    return events;
  }

  emit(reason: ReasonName, type: EventType, message: string): void {
    const event = { reason, type, message, timeUnixMs: Date.now() };
    keepRecent(this.events, event);
    this.s.ctx.logger.log(type === "Warning" ? "warn" : "info", message, { volume: this.s.volumeId, claim: this.s.labels.claim, operation: "event", reason });
    // Spec 004: the pod's events and the claim's.
    if (this.s.claim.name) this.postOnClaim(event);
    else if (this.unposted.claim) keepRecent(this.unposted.claim, event);
    if (this.s.pods.length > 0) this.postOnPods(event);
    else if (this.unposted.pods) keepRecent(this.unposted.pods, event);
  }

  /** A write to what the driver does not serve (spec 004), named once a path: `why` follows the path in the Warning. */
  notServed(p: string, why: string): void {
    if (this.s.notServed.has(p)) return;
    this.s.notServed.add(p);
    this.emit(Reason.NotServed, "Warning", `${p} ${why}`);
  }

  private postOnClaim(event: gitWorker.VolumeEvent): void {
    const claim = this.s.claim;
    this.s.ctx.events?.record(
      { kind: "PersistentVolumeClaim", namespace: claim.namespace, name: claim.name, uid: claim.uid || undefined },
      event.type as EventType,
      event.reason as ReasonName,
      event.message,
    );
  }

  private postOnPods(event: gitWorker.VolumeEvent): void {
    for (const pod of this.s.pods)
      this.s.ctx.events?.record({ kind: "Pod", namespace: pod.namespace, name: pod.name, uid: pod.uid || undefined }, event.type as EventType, event.reason as ReasonName, event.message);
  }

  fail(operation: string, err: unknown): void {
    const message = err instanceof Error ? err.message : String(err);
    this.s.log("error", `${operation} failed: ${message}`, operation);
  }

  abnormal(): string[] {
    const s = this.s;
    const reasons: string[] = [];
    const lease = s.lease.state();
    if (!lease.held) reasons.push(`the mount epoch does not hold the volume: ${lease.message}`);
    if (s.waitingForCredential) reasons.push("waits for its credential: the driver restarted, and the next publish brings the Secret");
    if (s.onSideBranch) reasons.push(`on its side branch: ${s.branch} diverged, and pushes go to ${s.sideBranch} until it is merged into ${s.branch}`);
    if (s.refDeleted) reasons.push(`${s.branch} was deleted upstream`);
    if (s.lastCommitError) reasons.push(`the last commit failed, ${s.pending.size} path(s) wait for it: ${s.lastCommitError}`);
    if (s.lastPushError) reasons.push(`the last push failed: ${s.lastPushError}`);
    if (s.upstreamMovedOverWrites) reasons.push(`${s.branch} moved upstream while the tree held uncommitted writes; the tree was left as it is`);
    if (s.skipped.size > 0) reasons.push(`${s.skipped.size} file(s) over commit.maxFileSize are not committed`);
    return reasons;
  }

  report(): gitWorker.VolumeReport {
    const s = this.s;
    const waitingFor: string[] = [];
    if (s.policy && s.pending.size > 0) waitingFor.push(`${formatDuration(s.policy.quiesceMs)} of quiet before committing ${s.pending.size} path(s)`);
    if (s.unpushed > 0) waitingFor.push(`a push of ${s.unpushed} commit(s) to ${s.pushBranch}`);
    if (s.waitingForCredential) waitingFor.push("its credential, from the next publish");
    return {
      volumeId: s.volumeId,
      claim: s.claim,
      armed: s.policy !== undefined,
      className: s.className,
      pendingPaths: [...s.pending].sort(),
      unpushedCommits: s.unpushed,
      lastPushUnixMs: s.lastPushAt,
      pushFailures: s.pushFailures,
      skippedPaths: [...s.skipped.keys()].sort(),
      sideBranch: s.onSideBranch ? s.sideBranch : "",
      pushBranch: s.pushBranch,
      waitingFor,
      abnormal: this.abnormal(),
      recentEvents: [...this.events],
      // A writer serves its own tree, not a commit.
      servedCommit: "",
      followsBranch: "",
    };
  }

  publishMetrics(): void {
    const s = this.s;
    const m = s.ctx.metrics;
    const l = s.labels;
    m.armed.set(l, s.policy ? 1 : 0);
    m.pendingPaths.set(l, s.pending.size);
    m.unpushedCommits.set(l, s.unpushed);
    m.skippedFiles.set(l, s.skipped.size);
    m.diverged.set(l, s.onSideBranch ? 1 : 0);
    m.abnormal.set(l, this.abnormal().length > 0 ? 1 : 0);
    if (s.lastPushAt > 0) m.lastPush.set(l, s.lastPushAt / 1000);
    m.pushFailures.inc(l, 0);
  }

  /** Set at stage when upstream moved and the tree holds writes no commit has. */
  noteUpstreamMoved(): void {
    this.s.upstreamMovedOverWrites = true;
    this.emit(Reason.UpstreamMoved, "Warning", `${this.s.branch} moved upstream while the tree holds writes no commit has yet: the tree is left as it is; the next push rebases onto upstream`);
  }
}

function keepRecent(events: gitWorker.VolumeEvent[], event: gitWorker.VolumeEvent): void {
  events.push(event);
  if (events.length > RECENT_EVENTS) events.shift();
}
