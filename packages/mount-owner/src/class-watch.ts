import { parseClassParameters } from "@git-csi/config";
import { status } from "@grpc/grpc-js";
import type { CsiError } from "@git-csi/protos";
import type { Owner, WatchedVolume } from "./context";
import { deleteVolume, setVolumeClass } from "./controller";

/** The Kubernetes watch's word on a volume: arms, re-arms or unarms it, labels it, or removes a deleted one's tree. */
export async function applyWatched(owner: Owner, volumeId: string, watched: WatchedVolume): Promise<void> {
  await owner.perVolume.run(volumeId, async () => {
    if (watched.deleted) return forgetDeleted(owner, volumeId, watched);
    if (onlyFlushRequestChanged(owner.watched.get(volumeId), watched)) owner.watched.set(volumeId, watched);
    else await applyClass(owner, volumeId, watched);
    await owner.state.recordReclaimPolicy(volumeId, watched.reclaimPolicy);
    await flushIfAsked(owner, volumeId, watched.flushRequest);
  });
}

/** The class is applied already: applying it again would post Armed again and restart the volume's quiet time. */
function onlyFlushRequestChanged(previous: WatchedVolume | undefined, watched: WatchedVolume): boolean {
  const rest = (w: WatchedVolume) => JSON.stringify({ ...w, flushRequest: undefined });
  return previous !== undefined && rest(previous) === rest(watched);
}

/**
 * A snapshot or a clone asked for the volume this node serves: flush and
 * push the flushed marker the controller makes it from. A node that does not
 * serve the volume leaves it to the one that does, or to the controller once
 * the volume is released. A flush that did not push is tried again when the
 * request changes or the volume is staged again.
 */
export async function flushIfAsked(owner: Owner, volumeId: string, request: string | undefined): Promise<void> {
  if (!request || !owner.sessions.has(volumeId)) return;
  const record = await owner.state.volume(volumeId);
  if (record?.flushedRequest === request) return;
  const log = { volume: volumeId, claim: record?.claim?.name, snapshot: request, operation: "mark_flushed" };
  const result = await owner.link.markFlushed(volumeId, request).catch((err: Error) => ({ pushed: false, message: err.message }));
  if (!result.pushed) {
    owner.logger.warn(`a snapshot or a clone waits: the flush did not push (${result.message})`, log);
    return;
  }
  await owner.state.recordFlushed(volumeId, request);
  owner.logger.info("flushed for a snapshot or a clone", log);
}

async function forgetDeleted(owner: Owner, volumeId: string, watched: WatchedVolume): Promise<void> {
  owner.watched.delete(volumeId);
  if (watched.reclaimPolicy !== "Delete") return;
  await deleteVolume(owner, volumeId).catch((err: Error) => owner.logger.warn(`the deleted volume's tree stays for now: ${err.message}`, { volume: volumeId, operation: "delete_volume" }));
}

async function applyClass(owner: Owner, volumeId: string, watched: WatchedVolume): Promise<void> {
  try {
    // A staged volume's worker judges the class (and posts GitVolumeRefused); an unstaged one is judged here.
    if (!owner.sessions.has(volumeId) && watched.volumeClass) parseClassParameters(watched.volumeClass.parameters);
    await setVolumeClass(owner, volumeId, watched.volumeClass, watched.claim);
    owner.watched.set(volumeId, watched);
  } catch (err) {
    const log = { volume: volumeId, claim: watched.claim?.name, operation: "set_volume_class" };
    if ((err as CsiError).code !== status.INVALID_ARGUMENT) {
      // The worker did not answer, not refused: the node records the class, and the hand-over to a restarted worker or the next stage applies it.
      await owner.state.recordClass(volumeId, watched.volumeClass, watched.claim);
      owner.watched.set(volumeId, watched);
      owner.logger.warn(`the git worker did not take the claim's class now; it applies when the worker answers again or at the next stage: ${(err as Error).message}`, log);
    } else {
      // A bad class never unarms the volume: the next stage keeps the class it had.
      const kept = owner.watched.get(volumeId)?.volumeClass ?? (await owner.state.volume(volumeId))?.volumeClass;
      owner.watched.set(volumeId, { ...watched, volumeClass: kept });
      owner.logger.error(`the claim's class is not applied; the volume keeps the policy it had: ${(err as Error).message}`, log);
    }
  }
}

/**
 * After the watch listed every PersistentVolume: a Delete volume whose
 * PersistentVolume went while the node plugin was down loses its tree now.
 */
export async function removeVolumesDeletedWhileDown(owner: Owner, existing: Set<string>): Promise<void> {
  for (const volumeId of await owner.state.volumeIds()) {
    if (existing.has(volumeId)) continue;
    const record = await owner.state.volume(volumeId);
    // Retain trees stay, always; so does a volume this node never learned the policy of.
    if (record?.reclaimPolicy === "Delete") await applyWatched(owner, volumeId, { deleted: true, reclaimPolicy: "Delete" });
  }
}
