import { randomUUID } from "node:crypto";
import * as fs from "node:fs/promises";
import { KeyedSerial, parseClassParameters } from "@git-csi/config";
import type { Logger } from "@git-csi/logging";
import type { OperationMetrics } from "@git-csi/metrics";
import { status } from "@grpc/grpc-js";
import { alreadyExists, call, type CsiError, describeAccessMode, failedPrecondition, gitcsi, gitWorker, mountOwner, notFound, required, unary, unavailable } from "@git-csi/protos";
import type { EpochFence } from "./fuse/binding";
import { bindMount, fuseSource, isMountPoint, readMountTable, unmountAll } from "./mounts";
import { newSession, readSession, removeSession, writeSession } from "./session";
import { applyVolumeMountGroup } from "./volume-group";
import type { State, VolumeRecord } from "./state";

/** A staged volume's FUSE session, as the mount owner holds it. */
export interface StagedMount {
  unmount(): Promise<void>;
  /** A renewal moved the lease's end. */
  serveUntil(ms: number): void;
  /** Every operation of the mount answers EIO from now on, its kernel caches dropped. */
  fence(): void;
}

export interface MountOwnerDeps {
  state: State;
  nodeId: string;
  /** This mount owner's and its git worker's sockets, recorded in each .rwo-session. */
  endpoints: { mountOwner: string; gitWorker: string };
  worker: gitWorker.GitWorkerClient;
  logger: Logger;
  metrics: OperationMetrics;
  /** Spec 000's lease: 90 s from the record's time, renewed every 20 s. */
  lease: { durationMs: number; renewMs: number };
  /**
   * Serves the volume's work tree through FUSE at the staging path; the
   * server refuses every operation itself once the epoch's lease ran out or
   * the mount was fenced, and tells `epoch.onFenced`.
   */
  mountTree(volumeId: string, treePath: string, stagingPath: string, epoch: EpochFence): Promise<StagedMount>;
}

/** A staged volume's FUSE session, its mount epoch, and the git worker instance that watches its tree. */
interface LiveSession {
  stagingPath: string;
  mount: StagedMount;
  workerInstance: string;
  epoch: string;
  /** Until when the mount may serve without another renewal, by this node's clock. */
  serveUntil: number;
  /** Why the epoch no longer holds the volume; once set, the mount never serves again. */
  lost?: string;
  renewal: NodeJS.Timeout;
}

const WORKER_TIMEOUT_MS = 5 * 60_000;
/** The unstage pushes what the tree holds, but does not wait without end on a worker that hangs. */
const UNSTAGE_FLUSH_BUDGET_MS = 60_000;
/** Spec 000: remote release gets five seconds; then the lease runs out by itself. */
const RELEASE_BUDGET_MS = 5_000;
/** DeleteVolume does not wait long for a worker that is down: its tree goes when the worker answers. */
const REMOVE_TIMEOUT_MS = 10_000;

/** What the Kubernetes watch resolved for a volume: PersistentVolume → claim → VolumeAttributesClass. */
export interface WatchedVolume {
  claim?: gitcsi.Claim;
  volumeClass?: gitcsi.VolumeClass;
  /** The PersistentVolume is gone; with reclaim policy Delete its tree goes too. */
  deleted: boolean;
  reclaimPolicy: string;
}

export interface MountOwner {
  service: mountOwner.MountOwnerServer;
  /** The Kubernetes watch's word on a volume: arms, re-arms or unarms it, labels it, or removes a deleted one's tree. */
  applyWatched(volumeId: string, watched: WatchedVolume): Promise<void>;
  /**
   * After the watch listed every PersistentVolume: a Delete volume whose
   * PersistentVolume went while the node plugin was down loses its tree now.
   */
  removeVolumesDeletedWhileDown(existing: Set<string>): Promise<void>;
  /** Hands every staged volume to a git worker that restarted and knows none of them. */
  watchWorker(intervalMs: number): NodeJS.Timeout;
}

export function createMountOwner(deps: MountOwnerDeps): MountOwner {
  const { state, worker, logger } = deps;
  const sessions = new Map<string, LiveSession>();
  /** The Kubernetes watch's view of each volume, which overrides what the node recorded. */
  const watchedVolumes = new Map<string, WatchedVolume>();
  const perVolume = new KeyedSerial();

  const serialized = <Req extends { volumeId: string }, Res>(operation: string, handler: (request: Req, volumeId: string) => Promise<Res>) =>
    unary<Req, Res>(operation, logger, (request) => {
      const volumeId = required(request.volumeId, "volume_id");
      return perVolume.run(volumeId, () => handler(request, volumeId));
    });

  async function stage(request: mountOwner.StageVolumeRequest, volumeId: string): Promise<mountOwner.StageVolumeResponse> {
    const stagingPath = required(request.stagingPath, "staging_target_path");
    const source = required(request.source, "volume_context");
    const existing = await state.volumes.get(volumeId);
    if (existing) checkIdentity(existing, source, request.accessMode);
    // A retry continues the session its record names; a refused record stops the stage before anything happens.
    const previous = await readSession(stagingPath, { volumeId, node: deps.nodeId, accessMode: request.accessMode });
    const live = sessions.get(volumeId);
    if (live) {
      if (live.stagingPath !== stagingPath) throw failedPrecondition(`volume ${volumeId} is staged at ${live.stagingPath} already; unstage it there first`);
      if (live.lost) throw epochLost(volumeId, live.lost);
      // A retry after the completed flag failed to write: still durable before success.
      if (previous && !previous.completed) await writeSession(stagingPath, { ...previous, completed: true });
      return {};
    }
    const base = { volumeId, node: deps.nodeId, endpoints: deps.endpoints, accessMode: request.accessMode };
    let session = previous ?? newSession(base, existing?.generation ?? 0);
    // Written before acquisition: a restart finds the epoch it may have claimed.
    if (!previous) await writeSession(stagingPath, session);
    const watched = watchedVolumes.get(volumeId);
    const volumeClass = watched ? watched.volumeClass : (existing?.volumeClass ?? (await provisionedClass(volumeId)));
    const claim = watched?.claim ?? existing?.claim;
    const credentialExpected = Object.keys(request.credential?.data ?? {}).length > 0;
    const reclaimPolicy = watched?.reclaimPolicy ?? existing?.reclaimPolicy;
    const planned: VolumeRecord = {
      ...(existing ?? { volumeId, source, accessMode: request.accessMode, targets: [] }),
      stagingPath,
      volumeClass,
      claim,
      reclaimPolicy,
      credentialExpected,
      generation: session.generation,
    };
    // An epoch whose stage once succeeded may have served: it only continues. A pending one never served.
    let tree = await prepare(planned, session.epoch, request.credential, session.completed);
    const refusal = tree.lease?.refusal ?? gitWorker.LeaseRefusal.LEASE_REFUSAL_NONE;
    const ranOut = refusal === gitWorker.LeaseRefusal.LEASE_REFUSAL_EXPIRED || refusal === gitWorker.LeaseRefusal.LEASE_REFUSAL_RELEASED;
    if (ranOut && !session.completed && !(await mountedAnywhere(volumeId))) {
      // An initial stage that never succeeded, its mount positively absent: a fresh epoch, not the dead one.
      logger.warn("the pending mount epoch of a stage that never succeeded ran out or was released; staging with a fresh epoch", { volume: volumeId, operation: "claim_mount" });
      session = newSession(base, session.generation);
      await writeSession(stagingPath, session);
      planned.generation = session.generation;
      tree = await prepare(planned, session.epoch, request.credential, false);
    }
    if (!tree.lease?.held) throw failedPrecondition(tree.lease?.message || `the git worker could not claim volume ${volumeId} for this node`);
    // The record is durable before the mount serves: a restarted mount owner finds every mount it made.
    const record: VolumeRecord = { ...planned, treePath: tree.treePath, volumeMountGroup: request.volumeMountGroup || undefined };
    if (record.volumeMountGroup) await applyGroup(volumeId, tree.treePath, record.volumeMountGroup);
    await state.volumes.put(volumeId, record);
    // A mount a dead mount owner left behind answers ENOTCONN; it goes before the new session.
    await unmountAll(stagingPath);
    await fs.mkdir(stagingPath, { recursive: true });
    const epoch = session.epoch;
    const renewal = setInterval(() => void renew(volumeId, epoch), deps.lease.renewMs);
    const started: LiveSession = {
      stagingPath,
      mount: { unmount: async () => undefined, serveUntil: () => undefined, fence: () => undefined },
      workerInstance: tree.workerInstance,
      epoch,
      serveUntil: tree.lease.serveUntilUnixMs,
      renewal,
    };
    sessions.set(volumeId, started);
    try {
      started.mount = await deps.mountTree(volumeId, tree.treePath, stagingPath, { serveUntilMs: started.serveUntil, onFenced: (refused) => fenced(volumeId, started, refused) });
    } catch (err) {
      clearInterval(renewal);
      sessions.delete(volumeId);
      throw err;
    }
    // Durable before the stage reports success.
    if (!session.completed) await writeSession(stagingPath, { ...session, completed: true });
    logger.info("staged", { volume: volumeId, operation: "stage", reused: tree.reused, head: tree.head });
    return {};
  }

  /** Any mount of the volume the kernel knows, the staging mount and its binds into pods alike. */
  async function mountsOf(volumeId: string, stagingPath?: string): Promise<string[]> {
    return (await readMountTable()).filter((m) => m.source === fuseSource(volumeId) || m.mountPoint === stagingPath).map((m) => m.mountPoint);
  }

  async function mountedAnywhere(volumeId: string): Promise<boolean> {
    return (await mountsOf(volumeId)).length > 0;
  }

  /**
   * The FUSE server fences by itself when the lease runs out unrenewed (a
   * renewal that finds a successor fences through lose); either way every
   * operation fails with EIO, for good, and each refusal is counted here.
   */
  function fenced(volumeId: string, session: LiveSession, refused: number): void {
    lose(volumeId, session, "the lease ran out unrenewed");
    for (let i = 0; i < refused; i++) deps.metrics.count("stale_epoch_refused");
  }

  /** Logged once: the state changes once. */
  function lose(volumeId: string, session: LiveSession, why: string): void {
    if (session.lost) return;
    session.lost = why;
    session.mount.fence();
    clearInterval(session.renewal);
    logger.error(`the mount epoch no longer holds the volume: ${why}. Every read and write of its mount fails with EIO until the volume is unpublished and unstaged on this node`, {
      volume: volumeId,
      operation: "epoch_lost",
    });
  }

  /** renew_mount, every renewal interval, through the git worker that holds the credential. */
  async function renew(volumeId: string, epoch: string): Promise<void> {
    const session = sessions.get(volumeId);
    if (!session || session.epoch !== epoch || session.lost) return;
    if (Date.now() >= session.serveUntil) return lose(volumeId, session, "the lease ran out unrenewed");
    try {
      const lease = await call(worker.renewMount.bind(worker), { volumeId, epoch }, deps.lease.renewMs);
      applyLease(volumeId, session, lease);
    } catch (err) {
      // A worker that restarted gets the volume back from watchWorker; a remote that is away may answer the next time.
      logger.warn(`renew_mount failed; the mount serves until ${new Date(session.serveUntil).toISOString()} unless a renewal succeeds: ${(err as Error).message}`, {
        volume: volumeId,
        operation: "renew_mount",
      });
    }
  }

  function applyLease(volumeId: string, session: LiveSession, lease: gitWorker.MountLease | undefined): void {
    if (!lease || session.lost) return;
    if (lease.held) {
      session.serveUntil = Number(lease.serveUntilUnixMs);
      session.mount.serveUntil(session.serveUntil);
    } else if (lease.refusal !== gitWorker.LeaseRefusal.LEASE_REFUSAL_NONE) lose(volumeId, session, lease.message);
  }

  async function unstage(request: mountOwner.UnstageVolumeRequest, volumeId: string): Promise<mountOwner.UnstageVolumeResponse> {
    const stagingPath = required(request.stagingPath, "staging_target_path");
    const record = await state.volumes.get(volumeId);
    if (record && record.targets.length > 0) {
      throw failedPrecondition(`volume ${volumeId} is still published at ${record.targets.join(", ")}; unpublish it first`);
    }
    // The persisted epoch serves a mount owner that restarted since the stage.
    const persisted = await readSession(stagingPath, { volumeId, node: deps.nodeId }).catch((err: Error) => {
      // A record a stage would refuse names no epoch this node may release: its lease runs out by itself.
      logger.warn(`the unstage does not use the session record: ${err.message}`, { volume: volumeId, operation: "unstage" });
      return undefined;
    });
    const live = sessions.get(volumeId);
    await live?.mount.unmount();
    await unmountAll(stagingPath);
    // The kernel's table, not this process's memory: a mount left from before a restart keeps the ownership too.
    const remaining = await mountsOf(volumeId, stagingPath);
    if (remaining.length > 0) throw failedPrecondition(`volume ${volumeId} is still mounted at ${remaining.join(", ")}; its ownership stays until every mount is gone`);
    if (live) {
      clearInterval(live.renewal);
      sessions.delete(volumeId);
    }
    const epoch = live?.epoch ?? persisted?.epoch ?? "";
    if (record?.stagingPath !== undefined) await commitBeforeLeaving(record, epoch);
    await release(volumeId, epoch);
    await removeSession(stagingPath);
    if (record) await state.volumes.put(volumeId, { ...record, stagingPath: undefined });
    logger.info("unstaged", { volume: volumeId, operation: "unstage" });
    return {};
  }

  /** The pod's fsGroup on the backing tree, before the mount serves it. */
  async function applyGroup(volumeId: string, treePath: string, group: string): Promise<void> {
    const changed = await applyVolumeMountGroup(treePath, Number(group));
    logger.info(changed ? `applied volume_mount_group ${group} to the tree` : `the tree's root already matches volume_mount_group ${group}`, { volume: volumeId, operation: "stage" });
  }

  /** release_mount with spec 000's budget; local cleanup never waits on a worker or remote that is gone. */
  async function release(volumeId: string, epoch: string): Promise<void> {
    const answer = await call(worker.releaseTree.bind(worker), { volumeId, epoch }, RELEASE_BUDGET_MS).catch((err: Error) => ({ released: false, message: err.message }));
    if (answer.released || epoch === "") return;
    deps.metrics.count("mount_release_deferred");
    logger.warn(`the mount epoch was not released on the remote; its lease runs out by itself: ${answer.message}`, { volume: volumeId, operation: "mount_release_deferred" });
  }

  async function publish(request: mountOwner.PublishVolumeRequest, volumeId: string): Promise<mountOwner.PublishVolumeResponse> {
    const stagingPath = required(request.stagingPath, "staging_target_path");
    const targetPath = required(request.targetPath, "target_path");
    const record = await state.volumes.get(volumeId);
    const live = sessions.get(volumeId);
    if (!record || !live || live.stagingPath !== stagingPath) {
      throw failedPrecondition(`volume ${volumeId} is not staged at ${stagingPath}; stage it before publishing`);
    }
    if (live.lost) throw epochLost(volumeId, live.lost);
    checkMode(record, request.accessMode);
    checkGroup(volumeId, record, request.volumeMountGroup);
    const others = record.targets.filter((t) => t !== targetPath);
    if (record.accessMode === gitcsi.AccessMode.READ_WRITE_ONCE_POD && others.length > 0) {
      throw failedPrecondition(`volume ${volumeId} is ReadWriteOncePod and already published at ${others.join(", ")}`);
    }
    // The Secret first, on every publish: the kubelet's republish is how a rotated
    // Secret arrives, and a publish the worker refuses mounts nothing.
    const pods = { ...record.pods, ...(request.pod ? { [targetPath]: request.pod } : {}) };
    // The worker posts this publish's events (a Secret refused or missing) on its pod too.
    await tellPods(volumeId, pods);
    const setCredential = () => call(worker.setCredential.bind(worker), { volumeId, credential: request.credential }, WORKER_TIMEOUT_MS);
    await setCredential()
      .catch(async (err: CsiError) => {
        // A worker that restarted since the stage knows nothing of the volume yet: hand it over with this Secret.
        if (err.code !== status.NOT_FOUND) throw err;
        await handOver(volumeId, live, { ...record, pods }, request.credential);
        return setCredential();
      })
      .then(({ lease }) => {
        // A worker that restarted without the Secret claims the lease with it now: the mount serves on from this claim.
        applyLease(volumeId, live, lease);
        if (live.lost) throw epochLost(volumeId, live.lost);
      })
      .catch(async (err: unknown) => {
        // A refused publish leaves the pods as they were: the pod gets this publish's events, not the volume's next ones.
        await tellPods(volumeId, record.pods ?? {});
        throw err;
      });
    if (record.targets.includes(targetPath) && (await isMountPoint(targetPath))) return {};
    await fs.mkdir(targetPath, { recursive: true });
    await bindMount(stagingPath, targetPath, request.readonly);
    await state.volumes.put(volumeId, { ...record, targets: [...others, targetPath], pods });
    logger.info("published", { volume: volumeId, operation: "publish", target: targetPath, pod: request.pod ? `${request.pod.namespace}/${request.pod.name}` : undefined });
    return {};
  }

  async function unpublish(request: mountOwner.UnpublishVolumeRequest, volumeId: string): Promise<mountOwner.UnpublishVolumeResponse> {
    const targetPath = required(request.targetPath, "target_path");
    await unmountAll(targetPath);
    await fs.rm(targetPath, { recursive: false, force: true }).catch(() => fs.rmdir(targetPath).catch(() => undefined));
    const record = await state.volumes.get(volumeId);
    if (record?.targets.includes(targetPath)) {
      const targets = record.targets.filter((t) => t !== targetPath);
      const { [targetPath]: _gone, ...pods } = record.pods ?? {};
      await state.volumes.put(volumeId, { ...record, targets, pods });
      // The last pod stopped: push what the tree holds, and tell that pod how it went.
      if (targets.length === 0) await flushAtPodStop(volumeId);
      await tellPods(volumeId, pods);
    }
    logger.info("unpublished", { volume: volumeId, operation: "unpublish", target: targetPath });
    return {};
  }

  /** The last pod stopped: push what the tree holds now. The unstage after it is what insists on the commit. */
  async function flushAtPodStop(volumeId: string): Promise<void> {
    const result = await call(worker.flushVolume.bind(worker), { volumeId }, WORKER_TIMEOUT_MS).catch((err: Error) => ({ pushed: false, message: err.message }));
    logFlush(volumeId, result);
  }

  function logFlush(volumeId: string, result: gitWorker.FlushVolumeResponse): void {
    logger.log(result.pushed ? "info" : "warn", result.pushed ? "flushed" : `flush did not push: ${result.message}`, { volume: volumeId, operation: "flush" });
  }

  /**
   * The unstage answers only once every write the tree holds is in a commit:
   * pushed, or kept and reported as unpushed. A worker that restarted is
   * handed the volume first. A commit that fails, or a worker that does not
   * answer, fails the unstage, and the kubelet retries it.
   */
  async function commitBeforeLeaving(record: VolumeRecord, epoch: string): Promise<void> {
    const { volumeId } = record;
    const flushNow = () => call(worker.flushVolume.bind(worker), { volumeId }, UNSTAGE_FLUSH_BUDGET_MS);
    try {
      logFlush(
        volumeId,
        await flushNow().catch(async (err: CsiError) => {
          if (err.code !== status.NOT_FOUND || epoch === "") throw err;
          await prepare(record, epoch, undefined, true);
          return flushNow();
        }),
      );
    } catch (err) {
      throw unavailable(
        `volume ${volumeId}: the unstage waits until every write in the node's tree is in a commit, and the git worker could not commit them: ${(err as Error).message}. The writes stay in the tree; the kubelet retries the unstage`,
      );
    }
  }

  /**
   * A volume the Controller service may modify: one this mount owner
   * created, or, in standalone mode where the node is the controller, one
   * staged here (a static volume staged over the CSI socket).
   */
  async function knownVolume(volumeId: string): Promise<mountOwner.Volume> {
    const provisioned = await state.provisioned.get(volumeId);
    if (provisioned) return provisioned;
    const record = await state.volumes.get(volumeId);
    if (!record) throw notFound(`volume ${volumeId} does not exist: it was neither created nor staged here`);
    return { volumeId, name: volumeId, capacityBytes: 0, source: record.source, accessMode: record.accessMode, classParameters: record.volumeClass?.parameters ?? {} };
  }

  /** In standalone mode the controller's record carries the class ControllerModifyVolume applied. */
  async function provisionedClass(volumeId: string): Promise<gitcsi.VolumeClass | undefined> {
    const provisioned = await state.provisioned.get(volumeId);
    return provisioned && Object.keys(provisioned.classParameters).length > 0 ? { name: "", parameters: provisioned.classParameters } : undefined;
  }

  /** Records the class on the node volume and arms or unarms a staged one at once. */
  async function setVolumeClass(volumeId: string, volumeClass: gitcsi.VolumeClass | undefined, claim?: gitcsi.Claim): Promise<void> {
    if (sessions.has(volumeId)) await call(worker.setClass.bind(worker), { volumeId, class: volumeClass, claim }, WORKER_TIMEOUT_MS);
    await recordClass(volumeId, volumeClass, claim);
  }

  async function recordClass(volumeId: string, volumeClass: gitcsi.VolumeClass | undefined, claim?: gitcsi.Claim): Promise<void> {
    const record = await state.volumes.get(volumeId);
    if (record) await state.volumes.put(volumeId, { ...record, volumeClass, claim: claim ?? record.claim });
  }

  /** The worker posts the volume's events on these pods; a failure costs events, never the publish. */
  async function tellPods(volumeId: string, pods: Record<string, gitcsi.Pod>): Promise<void> {
    await call(worker.setPods.bind(worker), { volumeId, pods: Object.values(pods) }, WORKER_TIMEOUT_MS).catch((err: Error) =>
      logger.warn(`the git worker does not know the volume's pods; their events wait for the next publish: ${err.message}`, { volume: volumeId, operation: "set_pods" }),
    );
  }

  async function applyWatched(volumeId: string, watched: WatchedVolume): Promise<void> {
    await perVolume.run(volumeId, async () => {
      if (watched.deleted) {
        watchedVolumes.delete(volumeId);
        if (watched.reclaimPolicy === "Delete")
          await deleteNodeVolume(volumeId).catch((err: Error) => logger.warn(`the deleted volume's tree stays for now: ${err.message}`, { volume: volumeId, operation: "delete_volume" }));
        return;
      }
      try {
        // A staged volume's worker judges the class (and posts GitVolumeRefused); an unstaged one is judged here.
        if (!sessions.has(volumeId) && watched.volumeClass) parseClassParameters(watched.volumeClass.parameters);
        await setVolumeClass(volumeId, watched.volumeClass, watched.claim);
        watchedVolumes.set(volumeId, watched);
      } catch (err) {
        const log = { volume: volumeId, claim: watched.claim?.name, operation: "set_volume_class" };
        if ((err as CsiError).code !== status.INVALID_ARGUMENT) {
          // The worker did not answer, not refused: the node records the class, and the hand-over to a restarted worker or the next stage applies it.
          await recordClass(volumeId, watched.volumeClass, watched.claim);
          watchedVolumes.set(volumeId, watched);
          logger.warn(`the git worker did not take the claim's class now; it applies when the worker answers again or at the next stage: ${(err as Error).message}`, log);
        } else {
          // A bad class never unarms the volume: the next stage keeps the class it had.
          const kept = watchedVolumes.get(volumeId)?.volumeClass ?? (await state.volumes.get(volumeId))?.volumeClass;
          watchedVolumes.set(volumeId, { ...watched, volumeClass: kept });
          logger.error(`the claim's class is not applied; the volume keeps the policy it had: ${(err as Error).message}`, log);
        }
      }
      const record = await state.volumes.get(volumeId);
      if (record && record.reclaimPolicy !== watched.reclaimPolicy) await state.volumes.put(volumeId, { ...record, reclaimPolicy: watched.reclaimPolicy });
    });
  }

  async function removeVolumesDeletedWhileDown(existing: Set<string>): Promise<void> {
    for (const volumeId of await state.volumes.keys()) {
      if (existing.has(volumeId)) continue;
      const record = await state.volumes.get(volumeId);
      // Retain trees stay, always; so does a volume this node never learned the policy of.
      if (record?.reclaimPolicy === "Delete") await applyWatched(volumeId, { deleted: true, reclaimPolicy: "Delete" });
    }
  }

  /** A provisioned volume deleted with reclaim policy Delete: this node's tree goes too. The remote never does. */
  async function deleteNodeVolume(volumeId: string): Promise<void> {
    const record = await state.volumes.get(volumeId);
    if (record?.stagingPath !== undefined) throw failedPrecondition(`volume ${volumeId} is staged at ${record.stagingPath}; unstage it before deleting it`);
    if (record) {
      // The deletion is durable first: a git worker that does not answer now removes the tree when it does.
      await state.deletions.put(volumeId, record);
      await state.volumes.remove(volumeId);
      await removeDeletedTree(volumeId);
    }
    await state.provisioned.remove(volumeId);
  }

  /** The staged volume to a git worker that restarted: the same epoch continues its lease, the events reach its pods. */
  async function handOver(volumeId: string, live: LiveSession, record: VolumeRecord, credential?: gitcsi.Credential): Promise<void> {
    const tree = await prepare(record, live.epoch, credential, true);
    live.workerInstance = tree.workerInstance;
    applyLease(volumeId, live, tree.lease);
    await tellPods(volumeId, record.pods ?? {});
  }

  /** Hands the worker the volume and claim_mount for the epoch; `continues` when the epoch may have served already. */
  async function prepare(record: VolumeRecord, epoch: string, credential: gitcsi.Credential | undefined, continues: boolean): Promise<gitWorker.PrepareTreeResponse> {
    return call(
      worker.prepareTree.bind(worker),
      {
        volumeId: record.volumeId,
        source: record.source,
        credential,
        class: record.volumeClass,
        claim: record.claim,
        credentialExpected: record.credentialExpected ?? false,
        published: record.targets.length > 0,
        mount: { node: deps.nodeId, epoch, accessMode: record.accessMode, leaseMs: deps.lease.durationMs, continues },
      },
      WORKER_TIMEOUT_MS,
    );
  }

  async function removeDeletedTree(volumeId: string): Promise<void> {
    const deleted = await state.deletions.get(volumeId);
    if (!deleted) return;
    try {
      await call(worker.removeTree.bind(worker), { volumeId, source: deleted.source }, REMOVE_TIMEOUT_MS);
      await state.deletions.remove(volumeId);
    } catch (err) {
      logger.warn(`the tree of deleted volume ${volumeId} stays until the git worker answers: ${(err as Error).message}`, { volume: volumeId, operation: "delete_volume" });
    }
  }

  const ownerInstance = randomUUID();
  function watchWorker(intervalMs: number): NodeJS.Timeout {
    return setInterval(() => {
      void call(worker.probe.bind(worker), {}, intervalMs)
        .then(async ({ instance }) => {
          for (const volumeId of await state.deletions.keys()) await perVolume.run(volumeId, () => removeDeletedTree(volumeId));
          for (const [volumeId, session] of sessions) {
            // A lost epoch never serves again: nothing to hand over, and its lease must run out.
            if (session.workerInstance === instance || session.lost) continue;
            logger.warn("the git worker restarted; handing it the staged volume again", { volume: volumeId, operation: "worker_restart" });
            await perVolume.run(volumeId, async () => {
              const record = await state.volumes.get(volumeId);
              if (record) await handOver(volumeId, session, record);
            });
          }
        })
        .catch((err: Error) => logger.warn(`the git worker does not answer: ${err.message}`, { operation: "worker_restart" }));
    }, intervalMs);
  }

  const service: mountOwner.MountOwnerServer = {
    probe: unary("probe", logger, async () => {
      const answer = await call(worker.probe.bind(worker), {}, 5000).catch((err: Error) => ({ ready: false, message: `git worker does not answer: ${err.message}`, instance: "" }));
      return { ready: answer.ready, message: answer.message, instance: ownerInstance };
    }),
    createVolume: unary("create_volume", logger, async (request: mountOwner.CreateVolumeRequest) => {
      const name = required(request.name, "name");
      const wanted: mountOwner.Volume = {
        volumeId: name,
        name,
        capacityBytes: request.capacityBytes,
        source: required(request.source, "parameters"),
        accessMode: request.accessMode,
        classParameters: request.classParameters,
      };
      return perVolume.run(name, async () => {
        const existing = await state.provisioned.get(name);
        if (existing) {
          if (!sameVolume(existing, wanted)) throw alreadyExists(`volume ${name} exists with other capacity, parameters or access mode`);
          return { volume: existing };
        }
        await state.provisioned.put(name, wanted);
        logger.info("volume created", { volume: name, operation: "create_volume" });
        return { volume: wanted };
      });
    }),
    deleteVolume: serialized("delete_volume", async (_request: mountOwner.DeleteVolumeRequest, volumeId) => {
      await deleteNodeVolume(volumeId);
      return {};
    }),
    getVolume: serialized("get_volume", async (_request: mountOwner.GetVolumeRequest, volumeId) => ({ volume: await knownVolume(volumeId) })),
    modifyVolume: serialized("modify_volume", async (request: mountOwner.ModifyVolumeRequest, volumeId) => {
      const volume = await knownVolume(volumeId);
      // Parameters a request does not name keep their values, as CSI asks of ControllerModifyVolume.
      const classParameters = { ...volume.classParameters, ...request.classParameters };
      await setVolumeClass(volumeId, { name: "", parameters: classParameters });
      if (await state.provisioned.get(volumeId)) await state.provisioned.put(volumeId, { ...volume, classParameters });
      logger.info("class applied", { volume: volumeId, operation: "modify_volume" });
      return {};
    }),
    setVolumeClass: serialized("set_volume_class", async (request: mountOwner.SetVolumeClassRequest, volumeId) => {
      await setVolumeClass(volumeId, request.class, request.claim);
      return {};
    }),
    stageVolume: serialized("stage", stage),
    unstageVolume: serialized("unstage", unstage),
    publishVolume: serialized("publish", publish),
    unpublishVolume: serialized("unpublish", unpublish),
  };
  return { service, watchWorker, applyWatched, removeVolumesDeletedWhileDown };
}

function epochLost(volumeId: string, why: string): CsiError {
  return failedPrecondition(`volume ${volumeId}: the mount epoch no longer holds the volume (${why}); unstage it on this node, then stage it again`);
}

function checkMode(record: VolumeRecord, accessMode: gitcsi.AccessMode): void {
  if (record.accessMode !== accessMode) {
    throw alreadyExists(`volume ${record.volumeId} is ${describeAccessMode(record.accessMode)}; its access mode cannot change to ${describeAccessMode(accessMode)}`);
  }
}

/**
 * One staged tree has one group: a pod asking another fsGroup of an RWO volume
 * staged for the first pod's is refused, since regrouping the tree under a
 * running pod would take its access away. A pod without an fsGroup publishes.
 */
function checkGroup(volumeId: string, record: VolumeRecord, group: string): void {
  if (group === "" || group === record.volumeMountGroup) return;
  const staged = record.volumeMountGroup ? `volume_mount_group ${record.volumeMountGroup}` : "no volume_mount_group";
  throw failedPrecondition(`volume ${volumeId} is staged on this node with ${staged}; a pod with fsGroup ${group} cannot share it until the volume is unstaged`);
}

function checkIdentity(record: VolumeRecord, source: gitcsi.VolumeSource, accessMode: gitcsi.AccessMode): void {
  checkMode(record, accessMode);
  if (record.source.url !== source.url || record.source.ref !== source.ref) {
    throw alreadyExists(`volume ${record.volumeId} follows ${record.source.url} ref ${record.source.ref} on this node, not ${source.url} ref ${source.ref}`);
  }
}

function sameVolume(a: mountOwner.Volume, b: mountOwner.Volume): boolean {
  return JSON.stringify(a) === JSON.stringify(b);
}
