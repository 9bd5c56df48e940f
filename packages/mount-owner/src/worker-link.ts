import type { KeyedSerial } from "@git-csi/config";
import { connectivityState, status } from "@grpc/grpc-js";
import { call, CsiError, type gitcsi, gitWorker, type mountOwner, unavailable } from "@git-csi/protos";
import type { MountOwnerDeps } from "./context";
import { renewEvery } from "./renewals";
import { epochLost, type LiveSession, type MountSessions, servingLeft, withMaterial } from "./sessions";
import type { VolumeRecord } from "./state";

const WORKER_TIMEOUT_MS = 5 * 60_000;
/** The unstage pushes what the tree holds, but does not wait without end on a worker that hangs. */
const UNSTAGE_FLUSH_BUDGET_MS = 60_000;
/** Spec 000: remote release gets five seconds; then the lease runs out by itself. */
const RELEASE_BUDGET_MS = 5_000;
/** DeleteVolume does not wait long for a worker that is down: its tree goes when the worker answers. */
const REMOVE_TIMEOUT_MS = 10_000;
const PROBE_TIMEOUT_MS = 5_000;
/** The report is the worker's memory: an answer slower than this is a worker in trouble. */
const REPORT_TIMEOUT_MS = 10_000;

/** The prepared tree and the claim_mount's outcome for it. */
export type ClaimedTree = gitWorker.PrepareTreeResponse & gitWorker.ClaimMountResponse;

/**
 * The mount owner's side of the git worker: claim_mount, renew_mount and
 * release_mount of spec 000, the flushes, and the hand-over of staged
 * volumes to a worker that restarted.
 */
export class WorkerLink {
  private readonly worker: gitWorker.GitWorkerClient;
  /** How often the worker's connection left READY, and the count at the last complete hand-over (-1: none yet). */
  private connectionChanges = 0;
  private caughtUpAt = -1;

  constructor(
    private readonly deps: MountOwnerDeps,
    private readonly sessions: MountSessions,
  ) {
    this.worker = deps.worker;
  }

  /**
   * PrepareTree, then ClaimMount for the epoch; `continues` when the epoch may
   * have served already. `live`, the session this process serves the epoch
   * with, tells the worker how much longer its mount may serve.
   */
  async claim(record: VolumeRecord, epoch: string, credential: gitcsi.Credential | undefined, continues: boolean, live?: LiveSession): Promise<ClaimedTree> {
    const tree = await call(
      this.worker.prepareTree.bind(this.worker),
      {
        volumeId: record.volumeId,
        source: record.source,
        credential,
        class: record.volumeClass,
        claim: record.claim,
        credentialExpected: record.credentialExpected ?? false,
        published: record.targets.length > 0,
      },
      WORKER_TIMEOUT_MS,
    );
    // Read after PrepareTree, just before the call: the worker's end comes after the mount's by the call's transit alone.
    const mount = { node: this.deps.nodeId, epoch, accessMode: record.accessMode, leaseMs: this.deps.lease.durationMs, continues, servingLeftMs: servingLeft(live) };
    const claimed = await call(this.worker.claimMount.bind(this.worker), { volumeId: record.volumeId, mount }, WORKER_TIMEOUT_MS);
    return { ...tree, ...claimed };
  }

  /**
   * A read-only volume's ref fetched and its commit checked out, once for it
   * and the volumes `sharing` its URL and ref; `serving`, the directory a
   * mount serves now, is kept.
   */
  checkoutReader(record: VolumeRecord, credential: gitcsi.Credential | undefined, serving: string, sharing: VolumeRecord[] = []): Promise<gitWorker.CheckoutReaderResponse> {
    const others = sharing.map((r) => ({ volumeId: r.volumeId, claim: r.claim, pods: Object.values(r.pods ?? {}), serving: r.treePath ?? "" }));
    const request = { volumeId: record.volumeId, source: record.source, credential, serving, claim: record.claim, pods: Object.values(record.pods ?? {}), sharing: others };
    return call(this.worker.checkoutReader.bind(this.worker), request, WORKER_TIMEOUT_MS);
  }

  /** A read-only volume left the node; the last of its URL and ref takes their checkouts with it. */
  async releaseReader(volumeId: string, source: gitcsi.VolumeSource, last: boolean): Promise<void> {
    await call(this.worker.releaseReader.bind(this.worker), { volumeId, source, last }, REMOVE_TIMEOUT_MS);
  }

  /** renew_mount of every session's epoch, in one call per renewal interval (renewals.ts). */
  renewLeases(): NodeJS.Timeout {
    return renewEvery({
      worker: this.worker,
      logger: this.deps.logger,
      metrics: this.deps.metrics,
      intervalMs: this.deps.lease.renewMs,
      sessions: () => this.sessions.renewed(),
      apply: (volumeId, session: LiveSession, lease) => this.sessions.applyLease(volumeId, session, lease),
      ranOut: (volumeId, session: LiveSession) => this.sessions.lose(volumeId, session, "the lease ran out unrenewed"),
    });
  }

  /** renew_mount now; a git worker that restarted too and does not know the volume is handed it with the same epoch. */
  async renewNow(record: VolumeRecord, epoch: string): Promise<gitWorker.MountLease | undefined> {
    const { mounts } = await call(this.worker.renewMounts.bind(this.worker), { mounts: [{ volumeId: record.volumeId, epoch }] }, this.deps.lease.renewMs);
    const [renewed] = mounts;
    if (renewed?.lease) return renewed.lease;
    if (renewed?.code === status.NOT_FOUND) return (await this.claim(record, epoch, undefined, true)).lease;
    throw new CsiError(renewed?.code || status.UNKNOWN, `renew_mount of volume ${record.volumeId}: ${renewed?.error ?? "the git worker answered no renewal"}`);
  }

  /** release_mount with spec 000's budget; local cleanup never waits on a worker or remote that is gone. */
  async release(volumeId: string, epoch: string): Promise<void> {
    const answer = await call(this.worker.releaseMount.bind(this.worker), { volumeId, epoch }, RELEASE_BUDGET_MS).catch((err: Error) => ({ released: false, message: err.message }));
    if (answer.released || epoch === "") return;
    this.deps.metrics.count("mount_release_deferred");
    this.deps.logger.warn(`the mount epoch was not released on the remote; its lease runs out by itself: ${answer.message}`, { volume: volumeId, operation: "mount_release_deferred" });
  }

  /** A snapshot or a clone of the volume asked for a flush: push what the tree holds now, then the flushed marker. */
  markFlushed(volumeId: string, requestId: string): Promise<gitWorker.FlushVolumeResponse> {
    return call(this.worker.markFlushed.bind(this.worker), { volumeId, requestId }, WORKER_TIMEOUT_MS);
  }

  /** The last pod stopped: push what the tree holds now. The unstage after it is what insists on the commit. */
  async flushAtPodStop(volumeId: string): Promise<void> {
    const result = await call(this.worker.flushVolume.bind(this.worker), { volumeId }, WORKER_TIMEOUT_MS).catch((err: Error) => ({ pushed: false, message: err.message }));
    this.logFlush(volumeId, result);
  }

  /**
   * The unstage answers only once every write the tree holds is in a commit:
   * pushed, or kept and reported as unpushed. A worker that restarted is
   * handed the volume first, with the serving time `live` has left: a lost
   * epoch's commits are stranded, never pushed, and it gets no Secret. A
   * commit that fails, or a worker that does not answer, fails the unstage,
   * and the kubelet retries it.
   */
  async commitBeforeLeaving(record: VolumeRecord, epoch: string, live: LiveSession | undefined): Promise<void> {
    const { volumeId } = record;
    const credential = live?.lost ? undefined : live?.credential;
    const flushNow = () => call(this.worker.flushVolume.bind(this.worker), { volumeId }, UNSTAGE_FLUSH_BUDGET_MS);
    try {
      const result = await flushNow().catch(async (err: CsiError) => {
        if (err.code !== status.NOT_FOUND || epoch === "") throw err;
        await this.claim(record, epoch, credential, true, live);
        return flushNow();
      });
      this.logFlush(volumeId, result);
    } catch (err) {
      throw unavailable(
        `volume ${volumeId}: the unstage waits until every write in the node's tree is in a commit, and the git worker could not commit them: ${(err as Error).message}. The writes stay in the tree; the kubelet retries the unstage`,
      );
    }
  }

  private logFlush(volumeId: string, result: gitWorker.FlushVolumeResponse): void {
    this.deps.logger.log(result.pushed ? "info" : "warn", result.pushed ? "flushed" : `flush did not push: ${result.message}`, { volume: volumeId, operation: "flush" });
  }

  /** The staged volume to a git worker that restarted: the same epoch continues its lease with the Secret kept for it, the events reach its pods. */
  async handOver(volumeId: string, live: LiveSession, record: VolumeRecord, credential?: gitcsi.Credential): Promise<void> {
    const tree = await this.claim(record, live.epoch, credential, true, live);
    live.workerInstance = tree.workerInstance;
    this.sessions.applyLease(volumeId, live, tree.lease);
    await this.tellPods(volumeId, record.pods ?? {});
  }

  /**
   * A publish's Secret. A worker that restarted since the stage knows nothing
   * of the volume yet: it is handed the volume with this Secret. A worker that
   * restarted without the Secret claims the lease with it now, and the mount
   * serves on from that claim. The Secret the worker accepted is kept for the
   * worker's next restart.
   */
  async setCredential(volumeId: string, live: LiveSession, record: VolumeRecord, credential: gitcsi.Credential | undefined): Promise<void> {
    const setCredential = () => call(this.worker.setCredential.bind(this.worker), { volumeId, credential }, WORKER_TIMEOUT_MS);
    const { lease } = await setCredential().catch(async (err: CsiError) => {
      if (err.code !== status.NOT_FOUND) throw err;
      await this.handOver(volumeId, live, record, credential);
      return setCredential();
    });
    live.credential = withMaterial(credential) ?? live.credential;
    this.sessions.applyLease(volumeId, live, lease);
    if (live.lost) throw epochLost(volumeId, live.lost, "renewal");
  }

  /** Arms or unarms a staged volume at once. */
  async setClass(volumeId: string, volumeClass: gitcsi.VolumeClass | undefined, claim?: gitcsi.Claim): Promise<void> {
    await call(this.worker.setClass.bind(this.worker), { volumeId, class: volumeClass, claim }, WORKER_TIMEOUT_MS);
  }

  /** The worker posts the volume's events on these pods; a failure costs events, never the publish. */
  async tellPods(volumeId: string, pods: Record<string, gitcsi.Pod>): Promise<void> {
    await call(this.worker.setPods.bind(this.worker), { volumeId, pods: Object.values(pods) }, WORKER_TIMEOUT_MS).catch((err: Error) =>
      this.deps.logger.warn(`the git worker does not know the volume's pods; their events wait for the next publish: ${err.message}`, { volume: volumeId, operation: "set_pods" }),
    );
  }

  /** CreateVolume's branch on the remote; the worker refuses a baseRef the remote lacks. */
  provisionBranch(volume: mountOwner.Volume, credential: gitcsi.Credential | undefined, start?: gitWorker.BranchStart): Promise<gitWorker.ProvisionBranchResponse> {
    const request = { volumeId: volume.volumeId, source: volume.source, baseRef: volume.baseRef, credential, start };
    return call(this.worker.provisionBranch.bind(this.worker), request, WORKER_TIMEOUT_MS);
  }

  /** CreateSnapshot's ref on the volume's remote; none, and held_by set, while a node holds the volume and has not flushed for it. */
  makeSnapshot(snapshotId: string, volume: mountOwner.Volume, credential: gitcsi.Credential | undefined, tag: string): Promise<gitWorker.MakeSnapshotResponse> {
    const request = { snapshotId, volumeId: volume.volumeId, source: volume.source, credential, tag };
    return call(this.worker.makeSnapshot.bind(this.worker), request, WORKER_TIMEOUT_MS);
  }

  /** DeleteSnapshot's ref; false when the remote had none. */
  async removeSnapshot(snapshot: mountOwner.Snapshot, credential: gitcsi.Credential | undefined): Promise<boolean> {
    const request = { snapshotId: snapshot.snapshotId, source: snapshot.source, credential };
    return (await call(this.worker.removeSnapshot.bind(this.worker), request, WORKER_TIMEOUT_MS)).deleted;
  }

  /** DeleteVolume's branch, as the volume's onDelete says. */
  async retireBranch(volume: mountOwner.Volume, credential: gitcsi.Credential | undefined): Promise<void> {
    const request = { volumeId: volume.volumeId, source: volume.source, onDelete: volume.onDelete, credential };
    const { outcome } = await call(this.worker.retireBranch.bind(this.worker), request, WORKER_TIMEOUT_MS);
    this.deps.logger.info(`the branch ${volume.source!.ref} of the deleted volume: ${outcome}`, { volume: volume.volumeId, operation: "delete_volume" });
  }

  /** The tree of a volume deleted with reclaim policy Delete; it stays, recorded, until the worker answers. */
  async removeDeletedTree(volumeId: string): Promise<void> {
    const { state, logger } = this.deps;
    const deleted = await state.deletedVolume(volumeId);
    if (!deleted) return;
    try {
      await call(this.worker.removeTree.bind(this.worker), { volumeId, source: deleted.source }, REMOVE_TIMEOUT_MS);
      await state.forgetDeleted(volumeId);
    } catch (err) {
      logger.warn(`the tree of deleted volume ${volumeId} stays until the git worker answers: ${(err as Error).message}`, { volume: volumeId, operation: "delete_volume" });
    }
  }

  /**
   * Every reason the git worker's report gives for the volume being abnormal.
   * A worker that cannot tell is an error, never "normal"; one that restarted
   * and does not know the volume yet is handed it within seconds (watch).
   */
  async abnormal(volumeId: string): Promise<string[]> {
    const report = await call(this.worker.getReport.bind(this.worker), { volumeId }, REPORT_TIMEOUT_MS).catch((err: CsiError) => {
      const restarted = err.code === status.NOT_FOUND;
      throw new CsiError(
        restarted ? status.UNAVAILABLE : err.code,
        `volume ${volumeId}: the git worker could not tell the volume's condition${restarted ? " (it restarted and is handed the volume again)" : ""}: ${err.message}`,
      );
    });
    return report.abnormal;
  }

  /** Whether the git worker is ready; a worker that does not answer is not. */
  probe(): Promise<gitcsi.ProbeResponse> {
    return call(this.worker.probe.bind(this.worker), {}, PROBE_TIMEOUT_MS).catch((err: Error) => ({ ready: false, message: `git worker does not answer: ${err.message}`, instance: "" }));
  }

  /**
   * Hands every staged volume to a git worker that restarted and knows none
   * of them, and removes deleted trees it could not. The worker is asked only
   * when its connection left READY since the last hand-over (a restart closes
   * it) or a deleted tree waits: a probe per interval was most of an idle
   * node's gRPC.
   */
  watch(intervalMs: number, perVolume: KeyedSerial): NodeJS.Timeout {
    this.followConnection();
    return setInterval(() => void this.checkWorker(intervalMs, perVolume), intervalMs);
  }

  private async checkWorker(intervalMs: number, perVolume: KeyedSerial): Promise<void> {
    const changes = this.connectionChanges;
    try {
      const deleted = await this.deps.state.deletedVolumeIds();
      if (deleted.length === 0 && changes === this.caughtUpAt) return;
      const { instance } = await call(this.worker.probe.bind(this.worker), {}, intervalMs);
      for (const volumeId of deleted) await perVolume.run(volumeId, () => this.removeDeletedTree(volumeId));
      await this.catchUp(instance, perVolume);
      this.caughtUpAt = changes;
    } catch (err) {
      this.deps.logger.warn(`the git worker does not answer: ${(err as Error).message}`, { operation: "worker_restart" });
    }
  }

  /** Counts the worker connection's departures from READY, for as long as the channel lives. */
  private followConnection(): void {
    const channel = this.worker.getChannel();
    const follow = (from: connectivityState): void =>
      channel.watchConnectivityState(from, Infinity, () => {
        const now = channel.getConnectivityState(false);
        if (now === connectivityState.SHUTDOWN) return;
        if (now !== connectivityState.READY) this.connectionChanges++;
        follow(now);
      });
    follow(channel.getConnectivityState(false));
  }

  private async catchUp(instance: string, perVolume: KeyedSerial): Promise<void> {
    const { state, logger } = this.deps;
    for (const [volumeId, session] of this.sessions.entries()) {
      // A lost epoch never serves again: nothing to hand over, and its lease must run out.
      if (session.workerInstance === instance || session.lost) continue;
      logger.warn("the git worker restarted; handing it the staged volume again", { volume: volumeId, operation: "worker_restart" });
      await perVolume.run(volumeId, async () => {
        const record = await state.volume(volumeId);
        if (record) await this.handOver(volumeId, session, record, session.credential);
      });
    }
  }
}
