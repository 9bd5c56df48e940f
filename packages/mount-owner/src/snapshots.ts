import { status } from "@grpc/grpc-js";
import { alreadyExists, CsiError, type gitcsi, type gitWorker, invalidArgument, type mountOwner, notFound, required } from "@git-csi/protos";
import type { Owner } from "./context";

/**
 * CreateSnapshot: the snapshot's ref on the volume's remote, then the
 * controller's record. The same name again answers the recorded snapshot;
 * the name of another volume's snapshot is AlreadyExists. While a node
 * holds the volume and has not flushed for the snapshot, nothing is made or
 * recorded, and held_by names the node.
 */
export async function createSnapshot(owner: Owner, request: mountOwner.CreateSnapshotRequest): Promise<mountOwner.CreateSnapshotResponse> {
  const name = required(request.name, "name");
  const sourceVolumeId = required(request.sourceVolumeId, "source_volume_id");
  return owner.perVolume.run(snapshotKey(name), async () => {
    const recorded = await owner.state.snapshot(name);
    if (recorded) return { snapshot: sameSource(recorded, sourceVolumeId), heldBy: "" };
    const volume = await knownOr(owner, sourceVolumeId, () => invalidArgument(`source_volume_id ${sourceVolumeId}: the controller knows no such volume; a snapshot is of a volume it created`));
    const { heldBy, ...made } = await owner.link.makeSnapshot(name, volume, request.credential, request.tag);
    if (heldBy !== "") return { snapshot: undefined, heldBy };
    const snapshot: mountOwner.Snapshot = { snapshotId: name, sourceVolumeId, source: volume.source, ...made };
    await owner.state.recordSnapshot(snapshot);
    owner.logger.info(`snapshot at ${made.dataCommit.slice(0, 12)}`, { volume: sourceVolumeId, snapshot: name, operation: "create_snapshot" });
    return { snapshot, heldBy: "" };
  });
}

/** DeleteSnapshot: the ref, then the record; a snapshot the controller does not know is deleted already. */
export async function deleteSnapshot(owner: Owner, snapshotId: string, credential: gitcsi.Credential | undefined): Promise<void> {
  await owner.perVolume.run(snapshotKey(snapshotId), async () => {
    const recorded = await owner.state.snapshot(snapshotId);
    if (!recorded) return;
    const deleted = await owner.link.removeSnapshot(recorded, credential);
    await owner.state.forgetSnapshot(snapshotId);
    owner.logger.info(deleted ? "snapshot deleted" : "snapshot deleted; its ref was gone already", { volume: recorded.sourceVolumeId, snapshot: snapshotId, operation: "delete_snapshot" });
  });
}

/** The recorded snapshots, by id; each filter narrows them when set. */
export async function listSnapshots(owner: Owner, request: mountOwner.ListSnapshotsRequest): Promise<mountOwner.ListSnapshotsResponse> {
  const all = await owner.state.allSnapshots();
  const snapshots = all.filter((s) => (request.snapshotId === "" || s.snapshotId === request.snapshotId) && (request.sourceVolumeId === "" || s.sourceVolumeId === request.sourceVolumeId));
  return { snapshots };
}

/**
 * Where a restored or cloned volume's branch starts: a recorded snapshot, or
 * a volume the controller knows, of the same repository. NotFound for an
 * unknown source, as CSI asks.
 */
export async function branchStartOf(owner: Owner, wanted: mountOwner.Volume, source: mountOwner.ContentSource): Promise<gitWorker.BranchStart> {
  const url = wanted.source!.url;
  if (source.snapshotId !== "") {
    const snapshot = await owner.state.snapshot(source.snapshotId);
    if (!snapshot) throw notFound(`volume_content_source.snapshot ${source.snapshotId} does not exist`);
    checkSameRepository(`volume_content_source.snapshot ${source.snapshotId}`, snapshot.source!.url, url);
    return { snapshotId: source.snapshotId, volumeId: "", ref: "" };
  }
  const volume = await knownOr(owner, required(source.volumeId, "volume_content_source.volume.volume_id"), () => notFound(`volume_content_source.volume ${source.volumeId} does not exist`));
  checkSameRepository(`volume_content_source.volume ${source.volumeId}`, volume.source!.url, url);
  return { snapshotId: "", volumeId: source.volumeId, ref: volume.source!.ref };
}

/** A restore or a clone is a new branch of the source's repository: git has no cheaper copy, and the credential is one repository's. */
function checkSameRepository(field: string, sourceUrl: string, url: string): void {
  if (sourceUrl !== url) throw invalidArgument(`${field} is of ${sourceUrl}; a restore or a clone is a branch of the same repository, and parameters.url names ${url}`);
}

function sameSource(recorded: mountOwner.Snapshot, sourceVolumeId: string): mountOwner.Snapshot {
  if (recorded.sourceVolumeId !== sourceVolumeId) throw alreadyExists(`snapshot ${recorded.snapshotId} exists already, of volume ${recorded.sourceVolumeId}, not ${sourceVolumeId}`);
  return recorded;
}

/** The volume the controller knows, or `unknown`'s error in place of NotFound: the field to name is the caller's. */
async function knownOr(owner: Owner, volumeId: string, unknown: () => CsiError): Promise<mountOwner.Volume> {
  try {
    return await owner.state.knownVolume(volumeId);
  } catch (err) {
    if (err instanceof CsiError && err.code === status.NOT_FOUND) throw unknown();
    throw err;
  }
}

/** Snapshots and volumes share the per-name lock; a volume id holds no "/". */
function snapshotKey(name: string): string {
  return `snapshot/${name}`;
}
