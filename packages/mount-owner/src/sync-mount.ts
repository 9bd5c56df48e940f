import { failedPrecondition, internal, unavailable } from "@git-csi/protos";
import type { Owner } from "./context";

/**
 * SyncMount: the kernel's dirty pages of the volume's mount reach its tree
 * before the git worker moves the tree in one step. Not under the volume's
 * lock: a stage waits for the worker, which may ask this meanwhile. True
 * when a mount was synced, false when this node serves none of the volume.
 */
export async function syncMount(owner: Owner, volumeId: string): Promise<boolean> {
  if (owner.sessions.awaitsResume(volumeId)) {
    throw unavailable(`volume ${volumeId}: its FUSE connection, kept across the mount owner's restart, is not served yet; pages written to it wait in the kernel until it is`);
  }
  const live = owner.sessions.get(volumeId);
  if (!live) return false;
  if (live.lost) throw failedPrecondition(`volume ${volumeId}: the mount epoch no longer holds the volume (${live.lost}); its mount refuses every write`);
  try {
    return await live.mount.sync();
  } catch (err) {
    throw internal(`volume ${volumeId}: syncing its mount at ${live.stagingPath} failed: ${(err as Error).message}`);
  }
}

/**
 * InvalidateMount: the git worker moved the volume's tree, and the kernel
 * forgets what it cached of the mount before the move is reported. A
 * connection that waits to be resumed is invalidated whole as it resumes.
 * True when a mount was invalidated.
 */
export function invalidateMount(owner: Owner, volumeId: string): boolean {
  const live = owner.sessions.get(volumeId);
  if (!live) return false;
  live.mount.invalidate();
  return true;
}
