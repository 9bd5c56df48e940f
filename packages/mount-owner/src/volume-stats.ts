import * as fs from "node:fs/promises";
import * as path from "node:path";
import { type mountOwner, notFound, unavailable } from "@git-csi/protos";
import type { Owner } from "./context";
import { whyLost } from "./sessions";
import type { VolumeRecord } from "./state";

/**
 * GetVolumeStats (NodeGetVolumeStats): the tree's use, the room it has, and
 * the volume's condition. Not under the volume's lock, as it asks the git
 * worker; it only reads the record and the live session.
 */
export async function volumeStats(owner: Owner, request: mountOwner.GetVolumeStatsRequest, volumeId: string): Promise<mountOwner.GetVolumeStatsResponse> {
  const treePath = stagedTree(await owner.state.volume(volumeId), volumeId, request);
  const [use, room, abnormal] = await Promise.all([owner.usage.of(treePath), fs.statfs(treePath), abnormalReasons(owner, volumeId)]);
  // A tree has no quota of its own: it grows into the free space of the node's
  // filesystem that holds it, which is also what df answers in the pod (the
  // FUSE server's statfs is that filesystem's), so its free and total are
  // honest; what is used is the tree's own, from a walk.
  return {
    bytes: { used: use.bytes, available: room.bavail * room.bsize, total: room.blocks * room.bsize },
    inodes: { used: use.inodes, available: room.ffree, total: room.files },
    abnormal,
  };
}

/** The backing tree of a volume staged or published at the request's paths; NotFound where it is neither. */
function stagedTree(record: VolumeRecord | undefined, volumeId: string, request: mountOwner.GetVolumeStatsRequest): string {
  const { volumePath, stagingPath } = request;
  const at = (asked: string, where: string | undefined) => where !== undefined && path.isAbsolute(asked) && path.resolve(asked) === path.resolve(where);
  const paths = [record?.stagingPath, ...(record?.targets ?? [])];
  if (!record?.treePath || !paths.some((where) => at(volumePath, where))) throw notFound(`volume ${volumeId} is neither staged nor published at ${volumePath} on this node`);
  if (stagingPath !== "" && !at(stagingPath, record.stagingPath)) throw notFound(`volume ${volumeId} is not staged at ${stagingPath} on this node`);
  return record.treePath;
}

/**
 * Why the volume is abnormal. A fenced mount is abnormal whatever the git
 * worker says, and a worker that restarted is never handed a lost epoch's
 * volume, so it is not asked; otherwise the worker's report tells the rest.
 */
async function abnormalReasons(owner: Owner, volumeId: string): Promise<string[]> {
  if (owner.sessions.awaitsResume(volumeId)) throw unavailable(`volume ${volumeId}: its FUSE connection, kept across the mount owner's restart, is not served yet; ask again once it is`);
  // A read-only volume has no epoch: the worker's report (a fetch that failed) is all.
  if (owner.readers.has(volumeId)) return owner.link.abnormal(volumeId);
  const live = owner.sessions.get(volumeId);
  if (!live) return ["not served: the mount owner restarted and serves no mount of the volume on this node; its mount fails until the volume is unpublished and unstaged, then staged again"];
  const lost = whyLost(live);
  if (lost) return [`fenced: the mount epoch no longer holds the volume (${lost}); every read and write of its mount fails with EIO until the volume is unpublished and unstaged on this node`];
  return owner.link.abnormal(volumeId);
}
