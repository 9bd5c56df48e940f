import { clearFlushRequest, type KubeConfig, requestFlush } from "@git-csi/k8s";
import { ProvisionError, snapshotTagOf } from "@git-csi/config";
import type { Logger } from "@git-csi/logging";
import { status } from "@grpc/grpc-js";
import { call, CsiError, csi, failedPrecondition, invalidArgument, type mountOwner, unary, unavailable } from "@git-csi/protos";
import { credentialFrom, volumeIdOf } from "./validate";

const TIMEOUT_MS = 5 * 60_000;
/** Parameters the external-snapshotter adds on its own (the snapshot's Secret and names). */
const SNAPSHOTTER_PREFIX = "csi.storage.k8s.io/";

/**
 * The Controller service's snapshot RPCs. A snapshot is a ref on its volume's
 * remote, refs/git-csi/snapshots/<snapshot id>; its id is the
 * CO's name, so a retry finds it. A snapshot of a volume a node serves is
 * not ready until that node flushed for it: the controller asks it through
 * the API server (kubeConfig), and the csi-snapshotter asks again.
 */
export function snapshotMethods(owner: mountOwner.MountOwnerClient, logger: Logger, kubeConfig?: KubeConfig): Pick<csi.ControllerServer, "createSnapshot" | "deleteSnapshot" | "listSnapshots"> {
  return {
    createSnapshot: unary("create_snapshot", logger, async (request: csi.CreateSnapshotRequest) => {
      // The name becomes a ref component and a file name of the controller's records: the rules of a volume id hold.
      const name = volumeIdOf(request.name, "name");
      const sourceVolumeId = volumeIdOf(request.sourceVolumeId, "source_volume_id");
      const tag = tagOf(request.parameters);
      const credential = credentialFrom(request.secrets, "secrets");
      const { snapshot, heldBy } = await call(owner.createSnapshot.bind(owner), { name, sourceVolumeId, credential, tag }, TIMEOUT_MS);
      const log = { volume: sourceVolumeId, snapshot: name, operation: "create_snapshot" };
      if (heldBy !== "") {
        await askFlush(kubeConfig, sourceVolumeId, name, heldBy);
        logger.info(`not ready: waiting for node ${heldBy}, which serves the volume, to flush its writes`, log);
        return { snapshot: { snapshotId: name, sourceVolumeId, sizeBytes: 0, creationTime: new Date(), readyToUse: false, groupSnapshotId: "" } };
      }
      await servedFlush(kubeConfig, sourceVolumeId, name, logger, log);
      return { snapshot: csiSnapshotOf(snapshot!) };
    }),

    deleteSnapshot: unary("delete_snapshot", logger, async (request: csi.DeleteSnapshotRequest) => {
      const snapshotId = volumeIdOf(request.snapshotId, "snapshot_id");
      await call(owner.deleteSnapshot.bind(owner), { snapshotId, credential: credentialFrom(request.secrets, "secrets") }, TIMEOUT_MS);
      return {};
    }),

    listSnapshots: unary("list_snapshots", logger, async (request: csi.ListSnapshotsRequest) => {
      if (request.maxEntries < 0) throw invalidArgument(`max_entries ${request.maxEntries} must not be negative`);
      const { snapshots } = await call(owner.listSnapshots.bind(owner), { snapshotId: request.snapshotId, sourceVolumeId: request.sourceVolumeId }, TIMEOUT_MS);
      return pageOf(snapshots.map(csiSnapshotOf), request.startingToken, request.maxEntries);
    }),
  };
}

/**
 * The annotated tag a VolumeSnapshotClass asks for ("" for none): `tag` is
 * its only parameter; the snapshotter's own keys pass.
 */
function tagOf(parameters: Record<string, string>): string {
  const unknown = Object.keys(parameters).filter((k) => k !== "tag" && !k.startsWith(SNAPSHOTTER_PREFIX));
  if (unknown.length > 0) throw invalidArgument(`parameters ${unknown.join(", ")}: a VolumeSnapshotClass takes only tag; a snapshot is always refs/git-csi/snapshots/<id>`);
  try {
    return snapshotTagOf(parameters) ?? "";
  } catch (err) {
    if (err instanceof ProvisionError) throw invalidArgument(err.message);
    throw err;
  }
}

/**
 * Asks the node that serves the volume to flush for the request (a
 * snapshot's id, a clone's volume id): its PersistentVolume's annotation
 * names the request. Without an API server, or without a PersistentVolume,
 * no node can be asked: FailedPrecondition says so.
 */
export async function askFlush(kubeConfig: KubeConfig | undefined, volumeId: string, request: string, heldBy: string): Promise<void> {
  const held = `volume ${volumeId} is held by node ${heldBy}, which may have writes the remote lacks`;
  if (!kubeConfig) {
    throw failedPrecondition(`${held}; without a Kubernetes API server the controller cannot ask that node to push them first: stop its pods so the node unstages it, then try again`);
  }
  const pv = await requestFlush(kubeConfig, volumeId, request).catch((err: Error) => {
    throw unavailable(`${held}; the API server did not take the request for its flush: ${err.message}`);
  });
  if (!pv) throw failedPrecondition(`${held}; no PersistentVolume names it, and the node learns of a flush through its PersistentVolume: stop its pods so the node unstages it, then try again`);
}

/** The request is served: its annotation goes. One the API server keeps only costs the node a flush at its next stage. */
export async function servedFlush(kubeConfig: KubeConfig | undefined, volumeId: string, request: string, logger: Logger, log: Record<string, string>): Promise<void> {
  if (!kubeConfig) return;
  await clearFlushRequest(kubeConfig, volumeId, request).catch((err: Error) => logger.warn(`the PersistentVolume keeps its flush request: ${err.message}`, log));
}

/** A recorded snapshot as CSI has it: ready, since it is made only from what the remote holds. */
function csiSnapshotOf(snapshot: mountOwner.Snapshot): csi.Snapshot {
  return {
    snapshotId: snapshot.snapshotId,
    sourceVolumeId: snapshot.sourceVolumeId,
    sizeBytes: snapshot.sizeBytes,
    creationTime: new Date(snapshot.creationTimeUnixMs),
    readyToUse: true,
    groupSnapshotId: "",
  };
}

/**
 * One page of the list, sorted by id: the token is the index of the page's
 * first entry. A token that names no entry is ABORTED, as CSI asks: the
 * caller starts again.
 */
function pageOf(snapshots: csi.Snapshot[], token: string, maxEntries: number): csi.ListSnapshotsResponse {
  const start = token === "" ? 0 : Number(token);
  if (!/^(0|[1-9][0-9]*)$/.test(token || "0") || start > snapshots.length) {
    throw new CsiError(status.ABORTED, `starting_token ${JSON.stringify(token)} names no entry of the ${snapshots.length} snapshot(s); list again from the start`);
  }
  const end = maxEntries === 0 ? snapshots.length : Math.min(snapshots.length, start + maxEntries);
  return { entries: snapshots.slice(start, end).map((snapshot) => ({ snapshot })), nextToken: end < snapshots.length ? String(end) : "" };
}
