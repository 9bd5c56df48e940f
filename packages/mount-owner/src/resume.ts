import { failedPrecondition, gitWorker, isReader, unavailable } from "@git-csi/protos";
import type { Owner, StagedMount } from "./context";
import type { EpochFence } from "./fuse/binding";
import { resumeReader } from "./reader";
import { readSession } from "./session";
import { servingDeadline } from "./sessions";
import { startSession } from "./stage";

/** Where a staged volume is mounted, and the tree it serves. */
export interface StagedPaths {
  stagingPath: string;
  treePath: string;
}

/**
 * A staged volume's FUSE connection, kept across a restart of this mount
 * owner, served again. Spec 000: the epoch is checked and the lease renewed
 * before the first operation is served; an epoch that no longer holds the
 * volume (or `lost`, when it could not be checked) serves nothing but EIO.
 * True when the epoch holds the volume.
 */
export async function resume(owner: Owner, volumeId: string, serve: (paths: StagedPaths, fence: EpochFence) => Promise<StagedMount>, lost?: string): Promise<boolean> {
  return owner.perVolume.run(volumeId, async () => {
    const record = await owner.state.volume(volumeId);
    if (record?.stagingPath && record.treePath && isReader(record.accessMode)) return resumeReader(owner, record, { stagingPath: record.stagingPath, treePath: record.treePath }, serve);
    const session = record?.stagingPath ? await readSession(record.stagingPath, { volumeId, node: owner.deps.nodeId }) : undefined;
    if (!record?.stagingPath || !record.treePath || !session) throw failedPrecondition(`volume ${volumeId} has a kept FUSE connection but no stage on this node`);
    const instance = lost ? "" : (await owner.link.probe()).instance;
    const lease = lost ? undefined : await owner.link.renewNow(record, session.epoch);
    // Neither held nor refused (a restarted worker without the Secret): not checked yet, so not served yet.
    if (lease && !lease.held && lease.refusal === gitWorker.LeaseRefusal.LEASE_REFUSAL_NONE) throw unavailable(`volume ${volumeId}: the epoch is not checked yet: ${lease.message}`);
    const held = lease?.held === true;
    const paths = { stagingPath: record.stagingPath, treePath: record.treePath };
    const begun = { stagingPath: paths.stagingPath, epoch: session.epoch, workerInstance: instance, serveUntil: held ? servingDeadline(lease) : 0 };
    const live = await startSession(owner, volumeId, begun, (fence) => serve(paths, fence));
    if (!held) owner.sessions.lose(volumeId, live, lost ?? (lease?.message || "the lease was not renewed when the mount owner restarted"));
    return held;
  });
}
