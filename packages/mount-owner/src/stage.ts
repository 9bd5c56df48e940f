import * as fs from "node:fs/promises";
import { failedPrecondition, type gitcsi, gitWorker, type mountOwner, required } from "@git-csi/protos";
import { flushIfAsked } from "./class-watch";
import type { Owner, StagedMount } from "./context";
import type { EpochFence } from "./fuse/binding";
import { fuseSource, readMountTable, unmountAll } from "./mounts";
import { newSession, readSession, removeSession, type SessionRecord, writeSession } from "./session";
import { epochLost, type LiveSession, servingDeadline, withMaterial } from "./sessions";
import { checkIdentity, type VolumeRecord } from "./state";
import { applyVolumeMountGroup } from "./volume-group";
import type { ClaimedTree } from "./worker-link";

/** NodeStageVolume: claim_mount for the session's epoch, the record, then the FUSE mount; the session completed last. */
export async function stage(owner: Owner, request: mountOwner.StageVolumeRequest, volumeId: string): Promise<mountOwner.StageVolumeResponse> {
  const stagingPath = required(request.stagingPath, "staging_target_path");
  const source = required(request.source, "volume_context");
  const existing = await owner.state.volume(volumeId);
  if (existing) checkIdentity(existing, source, request.accessMode);
  // A retry continues the session its record names; a refused record stops the stage before anything happens.
  const previous = await readSession(stagingPath, { volumeId, node: owner.deps.nodeId, accessMode: request.accessMode });
  const live = owner.sessions.get(volumeId);
  if (live) return continueStaged(volumeId, stagingPath, live, previous);
  let session = previous ?? newSession(sessionBase(owner, volumeId, request.accessMode), existing?.generation ?? 0);
  // Written before acquisition: a restart finds the epoch it may have claimed.
  if (!previous) await writeSession(stagingPath, session);
  const planned = await plannedRecord(owner, request, volumeId, existing, session.generation);
  const claimed = await claimForStage(owner, planned, session, request.credential);
  session = claimed.session;
  const { tree } = claimed;
  if (!tree.lease?.held) throw failedPrecondition(tree.lease?.message || `the git worker could not claim volume ${volumeId} for this node`);
  const record: VolumeRecord = { ...planned, generation: session.generation, treePath: tree.treePath, volumeMountGroup: request.volumeMountGroup || undefined };
  if (record.volumeMountGroup) await applyGroup(owner, volumeId, tree.treePath, record.volumeMountGroup);
  await owner.state.recordStaged(record);
  await serve(owner, volumeId, stagingPath, tree, session.epoch, request.credential);
  // Durable before the stage reports success.
  if (!session.completed) await writeSession(stagingPath, { ...session, completed: true });
  owner.logger.info("staged", { volume: volumeId, operation: "stage", reused: tree.reused, head: tree.head });
  // A snapshot or a clone asked for while another node held the volume (a dead one this stage took over from) waits for this node's flush.
  void owner.perVolume
    .run(volumeId, () => flushIfAsked(owner, volumeId, owner.watched.get(volumeId)?.flushRequest))
    .catch((err: Error) => owner.logger.warn(`a snapshot or a clone asked for waits: ${err.message}`, { volume: volumeId, operation: "mark_flushed" }));
  return {};
}

/** A retry of a stage this process serves: the same staging path, an epoch that still holds the volume. */
async function continueStaged(volumeId: string, stagingPath: string, live: LiveSession, previous: SessionRecord | undefined): Promise<mountOwner.StageVolumeResponse> {
  if (live.stagingPath !== stagingPath) throw failedPrecondition(`volume ${volumeId} is staged at ${live.stagingPath} already; unstage it there first`);
  if (live.lost) throw epochLost(volumeId, live.lost, "stage");
  // A retry after the completed flag failed to write: still durable before success.
  if (previous && !previous.completed) await writeSession(stagingPath, { ...previous, completed: true });
  return {};
}

function sessionBase(owner: Owner, volumeId: string, accessMode: gitcsi.AccessMode): Omit<SessionRecord, "epoch" | "completed" | "generation"> {
  return { volumeId, node: owner.deps.nodeId, endpoints: owner.deps.endpoints, accessMode };
}

/** The record the stage will write: the watch's class and claim override what the node recorded. */
export async function plannedRecord(owner: Owner, request: mountOwner.StageVolumeRequest, volumeId: string, existing: VolumeRecord | undefined, generation: number): Promise<VolumeRecord> {
  const watched = owner.watched.get(volumeId);
  const volumeClass = watched ? watched.volumeClass : (existing?.volumeClass ?? (await provisionedClass(owner, volumeId)));
  return {
    ...(existing ?? { volumeId, source: request.source!, accessMode: request.accessMode, targets: [] }),
    stagingPath: request.stagingPath,
    volumeClass,
    claim: watched?.claim ?? existing?.claim,
    reclaimPolicy: watched?.reclaimPolicy ?? existing?.reclaimPolicy,
    credentialExpected: withMaterial(request.credential) !== undefined,
    generation,
  };
}

/** In standalone mode the controller's record carries the class ControllerModifyVolume applied. */
async function provisionedClass(owner: Owner, volumeId: string): Promise<gitcsi.VolumeClass | undefined> {
  const provisioned = await owner.state.provisionedVolume(volumeId);
  return provisioned && Object.keys(provisioned.classParameters).length > 0 ? { name: "", parameters: provisioned.classParameters } : undefined;
}

/**
 * claim_mount for the session's epoch. An epoch whose stage once succeeded
 * may have served: it only continues. A pending one never served: when it
 * ran out or was released and no mount of the volume exists, a fresh epoch
 * claims instead of the dead one.
 */
async function claimForStage(owner: Owner, planned: VolumeRecord, session: SessionRecord, credential: gitcsi.Credential | undefined): Promise<{ tree: ClaimedTree; session: SessionRecord }> {
  const tree = await owner.link.claim(planned, session.epoch, credential, session.completed);
  const refusal = tree.lease?.refusal ?? gitWorker.LeaseRefusal.LEASE_REFUSAL_NONE;
  const ranOut = refusal === gitWorker.LeaseRefusal.LEASE_REFUSAL_EXPIRED || refusal === gitWorker.LeaseRefusal.LEASE_REFUSAL_RELEASED;
  if (!ranOut || session.completed || (await mountsOf(planned.volumeId)).length > 0) return { tree, session };
  owner.logger.warn("the pending mount epoch of a stage that never succeeded ran out or was released; staging with a fresh epoch", { volume: planned.volumeId, operation: "claim_mount" });
  const fresh = newSession(sessionBase(owner, planned.volumeId, session.accessMode), session.generation);
  await writeSession(planned.stagingPath!, fresh);
  return { tree: await owner.link.claim({ ...planned, generation: fresh.generation }, fresh.epoch, credential, false), session: fresh };
}

/** The pod's fsGroup on the backing tree, before the mount serves it. */
async function applyGroup(owner: Owner, volumeId: string, treePath: string, group: string): Promise<void> {
  const changed = await applyVolumeMountGroup(treePath, Number(group));
  owner.logger.info(changed ? `applied volume_mount_group ${group} to the tree` : `the tree's root already matches volume_mount_group ${group}`, { volume: volumeId, operation: "stage" });
}

/** The FUSE session at the staging path, renewed from now on; a mount that fails leaves no session. */
async function serve(owner: Owner, volumeId: string, stagingPath: string, tree: ClaimedTree, epoch: string, credential: gitcsi.Credential | undefined): Promise<void> {
  // A mount a dead mount owner left behind answers ENOTCONN; it goes before the new session.
  await unmountAll(stagingPath);
  await fs.mkdir(stagingPath, { recursive: true });
  const begun = { stagingPath, workerInstance: tree.workerInstance, epoch, serveUntil: servingDeadline(tree.lease!), credential: withMaterial(credential) };
  await startSession(owner, volumeId, begun, (fence) => owner.deps.mountTree(volumeId, tree.treePath, stagingPath, fence));
}

/** A live session for the epoch, its mount served by `mount` and its lease renewed from now on. */
export async function startSession(owner: Owner, volumeId: string, begun: Omit<LiveSession, "mount">, mount: (fence: EpochFence) => Promise<StagedMount>): Promise<LiveSession> {
  const started: LiveSession = {
    ...begun,
    // Until the mount is made nothing is mounted, so no page waits for a sync.
    mount: { unmount: async () => undefined, serveUntil: () => undefined, fence: () => undefined, sync: async () => false, invalidate: () => undefined, switchRoot: () => undefined },
  };
  owner.sessions.add(volumeId, started);
  try {
    started.mount = await mount({ serveUntilMs: started.serveUntil, onFenced: (refused) => owner.sessions.fenced(volumeId, started, refused) });
  } catch (err) {
    owner.sessions.end(volumeId);
    throw err;
  }
  return started;
}

/** Any mount of the volume the kernel knows, the staging mount and its binds into pods alike. */
async function mountsOf(volumeId: string, stagingPath?: string): Promise<string[]> {
  return (await readMountTable()).filter((m) => m.source === fuseSource(volumeId) || m.mountPoint === stagingPath).map((m) => m.mountPoint);
}

/**
 * NodeUnstageVolume: every mount of the volume gone, every write in a
 * commit, then release_mount; ownership stays while any mount remains.
 */
export async function unstage(owner: Owner, request: mountOwner.UnstageVolumeRequest, volumeId: string): Promise<mountOwner.UnstageVolumeResponse> {
  const stagingPath = required(request.stagingPath, "staging_target_path");
  const record = await owner.state.checkUnpublished(volumeId);
  // The persisted epoch serves a mount owner that restarted since the stage.
  const persisted = await readSession(stagingPath, { volumeId, node: owner.deps.nodeId }).catch((err: Error) => {
    // A record a stage would refuse names no epoch this node may release: its lease runs out by itself.
    owner.logger.warn(`the unstage does not use the session record: ${err.message}`, { volume: volumeId, operation: "unstage" });
    return undefined;
  });
  await leaveStage(owner, volumeId, stagingPath, record, persisted);
  owner.logger.info("unstaged", { volume: volumeId, operation: "unstage" });
  return {};
}

/** The stage's mount gone, its writes committed (pushed, or stranded for a lost epoch), its epoch released and its session record removed. */
async function leaveStage(owner: Owner, volumeId: string, stagingPath: string, record: VolumeRecord | undefined, persisted: SessionRecord | undefined): Promise<void> {
  await owner.sessions.get(volumeId)?.mount.unmount();
  await unmountAll(stagingPath);
  // The kernel's table, not this process's memory: a mount left from before a restart keeps the ownership too.
  const remaining = await mountsOf(volumeId, stagingPath);
  if (remaining.length > 0) throw failedPrecondition(`volume ${volumeId} is still mounted at ${remaining.join(", ")}; its ownership stays until every mount is gone`);
  // Renewed while the flush sends what the tree holds, however long past the lease that takes.
  const live = owner.sessions.leave(volumeId);
  const epoch = live?.epoch ?? persisted?.epoch ?? "";
  // A lost epoch pushes nothing: its commits go to a stranded ref, or stay in the node's tree, with or without the Secret.
  if (record?.stagingPath !== undefined) await owner.link.commitBeforeLeaving(record, epoch, live);
  owner.sessions.end(volumeId);
  await owner.link.release(volumeId, epoch);
  await removeSession(stagingPath);
  await owner.state.recordUnstaged(volumeId);
}

/**
 * The kubelet unstages a volume only once no pod on the node wants it, so a
 * pod started again on this node after the epoch was lost publishes onto
 * the dead stage. When no pod uses that stage, it is left and staged again
 * in place: a fresh epoch on the kept tree, which carries the lost epoch's
 * commits. A claim the remote refuses fails the publish, and the kubelet's
 * retry stages again.
 */
export async function stageAgain(owner: Owner, record: VolumeRecord, stagingPath: string, credential: gitcsi.Credential | undefined): Promise<void> {
  const volumeId = record.volumeId;
  const persisted = await readSession(stagingPath, { volumeId, node: owner.deps.nodeId });
  // A pending session (a stage again the remote refused) is continued by the stage, not left.
  if (owner.sessions.has(volumeId) || persisted?.completed) {
    owner.logger.warn("the volume's mount epoch was lost and no pod uses its stage: staging it again in place for the new pod", { volume: volumeId, operation: "stage_again" });
    await leaveStage(owner, volumeId, stagingPath, record, persisted);
  }
  const request = { volumeId, stagingPath, source: record.source, accessMode: record.accessMode, credential, volumeMountGroup: record.volumeMountGroup ?? "" };
  await stage(owner, request, volumeId);
}

/** A stage a publish may stage again: not awaiting a resume, published at no other target, and no kernel mount of the volume but the stage's own. */
export async function unpublishedStage(owner: Owner, record: VolumeRecord, stagingPath: string, targetPath: string): Promise<boolean> {
  if (owner.sessions.awaitsResume(record.volumeId)) return false;
  if (record.targets.some((t) => t !== targetPath)) return false;
  const mounts = await mountsOf(record.volumeId, stagingPath);
  return mounts.every((m) => m === stagingPath);
}
