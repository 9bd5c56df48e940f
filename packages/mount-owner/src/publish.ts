import * as fs from "node:fs/promises";
import { type CsiError, failedPrecondition, gitcsi, isReader, type mountOwner, required } from "@git-csi/protos";
import type { Owner } from "./context";
import { bindMount, isMountPoint, unmountAll } from "./mounts";
import { publishReader } from "./reader";
import { epochLost, type LiveSession, withMaterial } from "./sessions";
import { stageAgain, unpublishedStage } from "./stage";
import { checkGroup, checkMode, type VolumeRecord } from "./state";

/**
 * NodePublishVolume: the staged mount bound into the pod's target. The
 * publish's Secret reaches the worker first, on every publish: the kubelet's
 * republish is how a rotated Secret arrives, and a publish the worker
 * refuses mounts nothing.
 */
export async function publish(owner: Owner, request: mountOwner.PublishVolumeRequest, volumeId: string): Promise<mountOwner.PublishVolumeResponse> {
  const stagingPath = required(request.stagingPath, "staging_target_path");
  const targetPath = required(request.targetPath, "target_path");
  const recorded = await owner.state.volume(volumeId);
  if (recorded && isReader(recorded.accessMode)) return publishReader(owner, recorded, request);
  const { record, live } = await servingStage(owner, request, volumeId, recorded);
  checkMode(record, request.accessMode);
  checkGroup(record, request.volumeMountGroup);
  const others = record.targets.filter((t) => t !== targetPath);
  if (record.accessMode === gitcsi.AccessMode.READ_WRITE_ONCE_POD && others.length > 0) {
    throw failedPrecondition(`volume ${volumeId} is ReadWriteOncePod and already published at ${others.join(", ")}`);
  }
  const pods = { ...record.pods, ...(request.pod ? { [targetPath]: request.pod } : {}) };
  // The worker posts this publish's events (a Secret refused or missing) on its pod too.
  await owner.link.tellPods(volumeId, pods);
  await owner.link.setCredential(volumeId, live, { ...record, pods }, request.credential).catch(async (err: unknown) => {
    // A refused publish leaves the pods as they were: the pod gets this publish's events, not the volume's next ones.
    await owner.link.tellPods(volumeId, record.pods ?? {});
    throw err;
  });
  if (record.targets.includes(targetPath) && (await isMountPoint(targetPath))) return {};
  await fs.mkdir(targetPath, { recursive: true });
  await bindMount(stagingPath, targetPath, request.readonly);
  await owner.state.recordPublished(volumeId, targetPath, pods);
  owner.logger.info("published", { volume: volumeId, operation: "publish", target: targetPath, pod: request.pod ? `${request.pod.namespace}/${request.pod.name}` : undefined });
  return {};
}

/**
 * The stage a publish binds from, with the record it was staged by. A stage
 * whose epoch was lost, or that a restarted mount owner did not resume, is
 * staged again in place when no pod uses it; otherwise the publish is refused.
 */
async function servingStage(owner: Owner, request: mountOwner.PublishVolumeRequest, volumeId: string, record: VolumeRecord | undefined): Promise<{ record: VolumeRecord; live: LiveSession }> {
  const { stagingPath, targetPath } = request;
  const live = owner.sessions.get(volumeId);
  if (record && live && live.stagingPath === stagingPath && !live.lost) return { record, live };
  const sameStage = record && (record.stagingPath === stagingPath || record.stagingPath === undefined);
  if (!sameStage || (live && live.stagingPath !== stagingPath)) throw notStaged(volumeId, stagingPath);
  if (!(await unpublishedStage(owner, record, stagingPath, targetPath))) throw live?.lost ? epochLost(volumeId, live.lost, "publish") : notStaged(volumeId, stagingPath);
  await stageAgain(owner, { ...record, volumeMountGroup: request.volumeMountGroup || record.volumeMountGroup }, stagingPath, withMaterial(request.credential) ?? live?.credential);
  const staged = await owner.state.volume(volumeId);
  const again = owner.sessions.get(volumeId);
  if (!staged || !again) throw notStaged(volumeId, stagingPath);
  return { record: staged, live: again };
}

function notStaged(volumeId: string, stagingPath: string): CsiError {
  return failedPrecondition(`volume ${volumeId} is not staged at ${stagingPath}; stage it before publishing`);
}

/** NodeUnpublishVolume: the target unmounted and gone; the last pod's stop pushes what the tree holds. */
export async function unpublish(owner: Owner, request: mountOwner.UnpublishVolumeRequest, volumeId: string): Promise<mountOwner.UnpublishVolumeResponse> {
  const targetPath = required(request.targetPath, "target_path");
  await unmountAll(targetPath);
  await fs.rm(targetPath, { recursive: false, force: true }).catch(() => fs.rmdir(targetPath).catch(() => undefined));
  const left = await owner.state.recordUnpublished(volumeId, targetPath);
  // A reader has nothing to push and no pods to tell.
  if (left && !isReader(left.accessMode)) {
    // The last pod stopped: push what the tree holds, and tell that pod how it went.
    if (left.targets.length === 0) await owner.link.flushAtPodStop(volumeId);
    await owner.link.tellPods(volumeId, left.pods ?? {});
  }
  owner.logger.info("unpublished", { volume: volumeId, operation: "unpublish", target: targetPath });
  return {};
}
