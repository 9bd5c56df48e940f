import { randomUUID } from "node:crypto";
import { KeyedSerial, refProblem } from "@git-csi/config";
import { invalidArgument, isReader, type mountOwner, required, unary } from "@git-csi/protos";
import { applyWatched, removeVolumesDeletedWhileDown } from "./class-watch";
import type { MountOwnerDeps, Owner, StagedMount, WatchedVolume } from "./context";
import { createVolume, deleteVolume, modifyVolume, setVolumeClass } from "./controller";
import type { EpochFence } from "./fuse/binding";
import { publish, unpublish } from "./publish";
import { stageReader, unstageReader } from "./reader";
import { resume, type StagedPaths } from "./resume";
import { MountSessions } from "./sessions";
import { createSnapshot, deleteSnapshot, listSnapshots } from "./snapshots";
import { stage, unstage } from "./stage";
import { invalidateMount, syncMount } from "./sync-mount";
import { TreeUsage } from "./tree-usage";
import { volumeStats } from "./volume-stats";
import { WorkerLink } from "./worker-link";

export type { MountOwnerDeps, StagedMount, WatchedVolume } from "./context";
export type { StagedPaths } from "./resume";

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
  /**
   * Serves a kept FUSE connection of a staged volume after a restart, once its
   * epoch is checked; true when it holds the volume, false when it serves only EIO.
   */
  resume(volumeId: string, serve: (paths: StagedPaths, fence: EpochFence) => Promise<StagedMount>, lost?: string): Promise<boolean>;
  /** A kept connection waits to be resumed: until the returned function is called, SyncMount of the volume answers UNAVAILABLE. */
  awaitResume(volumeId: string): () => void;
  /** renew_mount of every staged volume's epoch, every renewal interval (renewals.ts). */
  renewLeases(): NodeJS.Timeout;
}

/**
 * The mount owner's gRPC service. Each RPC reads top to bottom: check the
 * request, lock the volume, look up its records, act, update the records.
 * The parts: controller records (controller.ts), stage and unstage
 * (stage.ts), publish (publish.ts), the worker link (worker-link.ts), the
 * class watch (class-watch.ts), over the state layer (state.ts).
 */
export function createMountOwner(deps: MountOwnerDeps): MountOwner {
  const sessions = new MountSessions(deps.logger, deps.metrics);
  const owner: Owner = {
    deps,
    state: deps.state,
    logger: deps.logger,
    sessions,
    readers: new Map(),
    readerGroups: new Map(),
    perReaderGroup: new KeyedSerial(),
    link: new WorkerLink(deps, sessions),
    perVolume: new KeyedSerial(),
    watched: new Map(),
    usage: new TreeUsage(),
  };
  return {
    service: mountOwnerService(owner),
    watchWorker: (intervalMs) => owner.link.watch(intervalMs, owner.perVolume),
    renewLeases: () => owner.link.renewLeases(),
    applyWatched: (volumeId, watched) => applyWatched(owner, volumeId, watched),
    removeVolumesDeletedWhileDown: (existing) => removeVolumesDeletedWhileDown(owner, existing),
    resume: (volumeId, serve, lost) => resume(owner, volumeId, serve, lost),
    awaitResume: (volumeId) => sessions.awaitResume(volumeId),
  };
}

function mountOwnerService(owner: Owner): mountOwner.MountOwnerServer {
  const { logger, state } = owner;
  /** Checks the volume id, then runs the handler under the volume's lock. */
  const serialized = <Req extends { volumeId: string }, Res>(operation: string, handler: (request: Req, volumeId: string) => Promise<Res>) =>
    unary<Req, Res>(operation, logger, (request) => {
      const volumeId = required(request.volumeId, "volume_id");
      return owner.perVolume.run(volumeId, () => handler(request, volumeId));
    });
  const instance = randomUUID();
  return {
    probe: unary("probe", logger, async () => {
      const answer = await owner.link.probe();
      return { ready: answer.ready, message: answer.message, instance };
    }),
    createVolume: unary("create_volume", logger, (request: mountOwner.CreateVolumeRequest) => createVolume(owner, request)),
    deleteVolume: serialized("delete_volume", async (request: mountOwner.DeleteVolumeRequest, volumeId) => {
      await deleteVolume(owner, volumeId, request.credential);
      return {};
    }),
    createSnapshot: unary("create_snapshot", logger, (request: mountOwner.CreateSnapshotRequest) => createSnapshot(owner, request)),
    deleteSnapshot: unary("delete_snapshot", logger, async (request: mountOwner.DeleteSnapshotRequest) => {
      await deleteSnapshot(owner, required(request.snapshotId, "snapshot_id"), request.credential);
      return {};
    }),
    listSnapshots: unary("list_snapshots", logger, (request: mountOwner.ListSnapshotsRequest) => listSnapshots(owner, request)),
    getVolume: serialized("get_volume", async (_request: mountOwner.GetVolumeRequest, volumeId) => ({ volume: await state.knownVolume(volumeId) })),
    modifyVolume: serialized("modify_volume", (request: mountOwner.ModifyVolumeRequest, volumeId) => modifyVolume(owner, request, volumeId)),
    setVolumeClass: serialized("set_volume_class", async (request: mountOwner.SetVolumeClassRequest, volumeId) => {
      await setVolumeClass(owner, volumeId, request.class, request.claim);
      return {};
    }),
    stageVolume: serialized("stage", (request: mountOwner.StageVolumeRequest, volumeId) => {
      checkStageRef(request);
      return (isReader(request.accessMode) ? stageReader : stage)(owner, request, volumeId);
    }),
    unstageVolume: serialized("unstage", async (request: mountOwner.UnstageVolumeRequest, volumeId) => {
      const record = await state.volume(volumeId);
      return (record && isReader(record.accessMode) ? unstageReader : unstage)(owner, request, volumeId);
    }),
    publishVolume: serialized("publish", (request: mountOwner.PublishVolumeRequest, volumeId) => publish(owner, request, volumeId)),
    unpublishVolume: serialized("unpublish", (request: mountOwner.UnpublishVolumeRequest, volumeId) => unpublish(owner, request, volumeId)),
    syncMount: unary("sync_mount", logger, async (request: mountOwner.SyncMountRequest) => ({ mounted: await syncMount(owner, required(request.volumeId, "volume_id")) })),
    invalidateMount: unary("invalidate_mount", logger, async (request: mountOwner.InvalidateMountRequest) => ({ mounted: invalidateMount(owner, required(request.volumeId, "volume_id")) })),
    getVolumeStats: unary("volume_stats", logger, (request: mountOwner.GetVolumeStatsRequest) => volumeStats(owner, request, required(request.volumeId, "volume_id"))),
  };
}

/** Checked again before anything changes, as the frontend checked it: only a reader pins a tag or a commit. */
function checkStageRef(request: mountOwner.StageVolumeRequest): void {
  const ref = request.source?.ref ?? "";
  const problem = refProblem(ref, isReader(request.accessMode));
  if (problem !== undefined) throw invalidArgument(`volume_context.ref ${JSON.stringify(ref)} ${problem}`);
}
