import * as fs from "node:fs/promises";
import { failedPrecondition, type gitcsi, type mountOwner, required } from "@git-csi/protos";
import type { Owner, StagedMount } from "./context";
import { bindMount, isMountPoint, remountReadOnly, unmountAll } from "./mounts";
import { withMaterial } from "./sessions";
import { checkIdentity, checkMode, type VolumeRecord } from "./state";

/**
 * A read-only volume's mount on this node: one checked-out commit served
 * read-only. It has no epoch, so nothing is claimed, renewed or released,
 * and any number of nodes serve the volume at once.
 */
export interface ReaderMount {
  stagingPath: string;
  mount: StagedMount;
  /** The checked-out commit's directory the mount serves, and the commit. */
  treePath: string;
  commit: string;
  /** The stage's Secret, in memory only, for the fetches that follow the ref. */
  credential?: gitcsi.Credential;
}

/** A reader's mount serves until it is unmounted: no lease ends it. */
const NO_EPOCH = { serveUntilMs: Infinity, onFenced: () => undefined };

/** NodeStageVolume of a read-only volume: the ref's commit checked out and served read-only at the staging path. */
export async function stageReader(owner: Owner, request: mountOwner.StageVolumeRequest, volumeId: string): Promise<mountOwner.StageVolumeResponse> {
  const stagingPath = required(request.stagingPath, "staging_target_path");
  const source = required(request.source, "volume_context");
  const existing = await owner.state.volume(volumeId);
  if (existing) checkIdentity(existing, source, request.accessMode);
  const live = owner.readers.get(volumeId);
  if (live) return continueStaged(volumeId, stagingPath, live);
  const credential = withMaterial(request.credential);
  const checkout = await owner.link.checkoutReader(volumeId, source, credential, "");
  await unmountAll(stagingPath);
  await fs.mkdir(stagingPath, { recursive: true });
  const mount = await owner.deps.mountTree(volumeId, checkout.treePath, stagingPath, NO_EPOCH);
  await readOnlyOrUnmounted(stagingPath, mount);
  owner.readers.set(volumeId, { stagingPath, mount, treePath: checkout.treePath, commit: checkout.commit, credential });
  const record: VolumeRecord = { ...(existing ?? { volumeId, source, accessMode: request.accessMode, targets: [] }), stagingPath, treePath: checkout.treePath };
  await owner.state.recordStaged(record);
  owner.logger.info("staged read-only", { volume: volumeId, operation: "stage", head: checkout.commit });
  return {};
}

/** A mount that could not be made read-only is not served at all: no write may be taken and dropped. */
async function readOnlyOrUnmounted(stagingPath: string, mount: StagedMount): Promise<void> {
  try {
    await remountReadOnly(stagingPath);
  } catch (err) {
    await mount.unmount();
    throw err;
  }
}

function continueStaged(volumeId: string, stagingPath: string, live: ReaderMount): mountOwner.StageVolumeResponse {
  if (live.stagingPath !== stagingPath) throw failedPrecondition(`volume ${volumeId} is staged at ${live.stagingPath} already; unstage it there first`);
  return {};
}

/** NodeUnstageVolume of a read-only volume: its mount and its checkouts go; there is nothing to push or release. */
export async function unstageReader(owner: Owner, record: VolumeRecord, stagingPath: string): Promise<mountOwner.UnstageVolumeResponse> {
  const { volumeId } = record;
  await owner.readers.get(volumeId)?.mount.unmount();
  await unmountAll(stagingPath);
  owner.readers.delete(volumeId);
  await owner.link.releaseReader(volumeId, record.source);
  await owner.state.recordUnstaged(volumeId);
  owner.logger.info("unstaged read-only", { volume: volumeId, operation: "unstage" });
  return {};
}

/** NodePublishVolume of a read-only volume: always a read-only bind, whatever the publish asked. */
export async function publishReader(owner: Owner, record: VolumeRecord, request: mountOwner.PublishVolumeRequest): Promise<mountOwner.PublishVolumeResponse> {
  const { volumeId } = record;
  const targetPath = required(request.targetPath, "target_path");
  checkMode(record, request.accessMode);
  const live = owner.readers.get(volumeId);
  if (!live || live.stagingPath !== request.stagingPath) throw failedPrecondition(`volume ${volumeId} is not staged at ${request.stagingPath}; stage it before publishing`);
  if (record.targets.includes(targetPath) && (await isMountPoint(targetPath))) return {};
  await fs.mkdir(targetPath, { recursive: true });
  await bindMount(live.stagingPath, targetPath, true);
  const pods = { ...record.pods, ...(request.pod ? { [targetPath]: request.pod } : {}) };
  await owner.state.recordPublished(volumeId, targetPath, pods);
  owner.logger.info("published read-only", { volume: volumeId, operation: "publish", target: targetPath });
  return {};
}
