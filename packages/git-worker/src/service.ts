import { randomUUID } from "node:crypto";
import { status } from "@grpc/grpc-js";
import type { KeyedSerial } from "@git-csi/config";
import type { Logger } from "@git-csi/logging";
import type { DriverMetrics } from "@git-csi/metrics";
import { failedPrecondition, gitWorker, notFound, required, unary } from "@git-csi/protos";
import type { CredentialBroker } from "./remote/broker";
import { provisionBranch, retireBranch } from "./trees/branches";
import { makeSnapshot, removeSnapshot } from "./trees/snapshots";
import { removeTree } from "./trees/gc";
import { claimMount, dropPrepared, type Prepared, prepareVolume } from "./trees/prepare";
import { checkoutReader, type Readers, readerReport, releaseReader } from "./trees/reader";
import { type RenewalMember, renewMounts } from "./lease/renewal";
import type { Store } from "./trees/store";
import type { VolumeSync } from "./sync/sync";
import type { PodDeleter } from "./sync/recovery";
import type { EventSink } from "./sync/volume";

/** The volumes this worker watches, by volume id. */
export type Syncs = Map<string, VolumeSync>;

export interface GitWorkerDeps {
  store: Store;
  syncs: Syncs;
  readers: Readers;
  /** The volumes whose unstage is under way: out of syncs, and still pushing and stranding their commits. */
  unstaging: Set<string>;
  broker: CredentialBroker;
  metrics: DriverMetrics;
  logger: Logger;
  /**
   * Git operations on one bare repository run one at a time: fetches and
   * worktree changes of two volumes of one URL would race for its locks.
   */
  perRepository: KeyedSerial;
  collect: () => Promise<void>;
  /** Kubernetes' event recorder in a cluster; none in standalone mode. */
  events?: EventSink;
  /** Deletes a lost epoch's pods that a controller owns (--delete-fenced-pods); none when off or outside a cluster. */
  pods?: PodDeleter;
  /** Asks the mount owner to send the kernel's pages of the volume's mount to its tree; false when it serves no mount of it. */
  syncMount(volumeId: string): Promise<boolean>;
  /** Asks the mount owner to make the kernel forget what it cached of the volume's mount: its tree moved. */
  invalidateMount(volumeId: string): Promise<boolean>;
}

export function gitWorkerService(deps: GitWorkerDeps): gitWorker.GitWorkerServer {
  const { store, syncs, logger, perRepository, collect } = deps;
  const syncOf = (volumeId: string) => {
    const sync = syncs.get(volumeId);
    if (!sync) throw notFound(`volume ${volumeId} is not staged on this node`);
    return sync;
  };
  const instance = randomUUID();
  const prepared: Prepared = new Map();

  return {
    probe: unary("probe", logger, async () => ({ ready: true, message: "", instance })),

    prepareTree: unary("prepare_tree", logger, (request: gitWorker.PrepareTreeRequest) => prepareVolume(deps, prepared, request)),

    claimMount: unary("claim_mount", logger, (request: gitWorker.ClaimMountRequest) => claimMount(deps, prepared, instance, request)),

    setCredential: unary("set_credential", logger, async (request: gitWorker.SetCredentialRequest) => {
      const sync = syncOf(required(request.volumeId, "volume_id"));
      await sync.setCredential(request.credential?.data ?? {});
      return { lease: sync.mountLease.state() };
    }),

    setClass: unary("set_class", logger, async (request: gitWorker.SetClassRequest) => {
      const sync = syncOf(required(request.volumeId, "volume_id"));
      if (request.claim) sync.setClaim(request.claim);
      await sync.setClass(request.class);
      return {};
    }),

    setPods: unary("set_pods", logger, async (request: gitWorker.SetPodsRequest) => {
      syncOf(required(request.volumeId, "volume_id")).setPods(request.pods);
      return {};
    }),

    flushVolume: unary("flush", logger, async (request: gitWorker.FlushVolumeRequest) => {
      // NOT_FOUND tells a restarted worker from one that flushed: the unstage hands the volume over and asks again.
      return syncOf(required(request.volumeId, "volume_id")).flush();
    }),

    markFlushed: unary("mark_flushed", logger, async (request: gitWorker.MarkFlushedRequest) => syncOf(required(request.volumeId, "volume_id")).markFlushed(required(request.requestId, "request_id"))),

    renewMounts: unary("renew_mount", logger, (request: gitWorker.RenewMountsRequest) => renewMounts(request, (volumeId, epoch) => memberOf(syncs, volumeId, epoch))),

    releaseMount: unary("release_mount", logger, async (request: gitWorker.ReleaseMountRequest) => {
      const volumeId = required(request.volumeId, "volume_id");
      dropPrepared(prepared, volumeId);
      const sync = syncs.get(volumeId);
      syncs.delete(volumeId);
      if (!sync) return { released: false, message: `the git worker does not serve volume ${volumeId}: it restarted since the stage, and holds no credential to release the mount epoch` };
      deps.unstaging.add(volumeId);
      const released = await sync
        .stop(request.epoch || undefined)
        .catch((err: Error) => {
          logger.warn(`release_mount failed: ${err.message}`, { volume: volumeId, operation: "release_mount" });
          return false;
        })
        .finally(() => deps.unstaging.delete(volumeId));
      return { released, message: released ? "" : "the owner ref still names the epoch; its lease runs out by itself" };
    }),

    removeTree: unary("remove_tree", logger, async (request: gitWorker.RemoveTreeRequest) => {
      const volumeId = required(request.volumeId, "volume_id");
      const source = required(request.source, "source");
      if (syncs.has(volumeId)) throw failedPrecondition(`volume ${volumeId} is staged on this node; its tree is removed only after the unstage`);
      const removed = await perRepository.run(store.repoDir(source.url), () => removeTree(store, volumeId, source, logger));
      if (removed.removed) await collect();
      return removed;
    }),

    provisionBranch: unary("provision_branch", logger, (request: gitWorker.ProvisionBranchRequest) => provisionBranch(deps, request)),

    retireBranch: unary("retire_branch", logger, (request: gitWorker.RetireBranchRequest) => retireBranch(deps, request)),

    makeSnapshot: unary("create_snapshot", logger, (request: gitWorker.MakeSnapshotRequest) => makeSnapshot(deps, request)),

    removeSnapshot: unary("delete_snapshot", logger, (request: gitWorker.RemoveSnapshotRequest) => removeSnapshot(deps, request)),

    getReport: unary("report", logger, async (request: gitWorker.GetReportRequest) => {
      const volumeId = required(request.volumeId, "volume_id");
      const reader = deps.readers.get(volumeId);
      return reader ? readerReport(volumeId, reader) : syncOf(volumeId).report();
    }),

    checkoutReader: unary("checkout_reader", logger, (request: gitWorker.CheckoutReaderRequest) => checkoutReader(deps, request)),

    releaseReader: unary("release_reader", logger, (request: gitWorker.ReleaseReaderRequest) => releaseReader(deps, request)),
  };
}

/** The staged volume a renewal asks for, or the answer when there is nothing to renew. */
function memberOf(syncs: Syncs, volumeId: string, epoch: string): RenewalMember | gitWorker.RenewedMount {
  const sync = syncs.get(volumeId);
  if (!sync) return { volumeId, code: status.NOT_FOUND, error: `volume ${volumeId} is not staged on this node` };
  if (sync.epoch === epoch) return sync.renewalMember();
  const message = `this node serves volume ${volumeId} with a later mount epoch than the one renewing`;
  return { volumeId, lease: { held: false, serveUntilUnixMs: 0, refusal: gitWorker.LeaseRefusal.LEASE_REFUSAL_SUPERSEDED, message }, code: status.OK, error: "" };
}
