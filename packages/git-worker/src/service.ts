import { randomUUID } from "node:crypto";
import { ClassParameterError, KeyedSerial } from "@git-csi/config";
import type { Logger } from "@git-csi/logging";
import type { DriverMetrics } from "@git-csi/metrics";
import { failedPrecondition, gitcsi, type gitWorker, invalidArgument, notFound, required, unary } from "@git-csi/protos";
import { rememberSource, removeTree } from "./gc";
import { RemoteAccess } from "./access";
import type { CredentialBroker } from "./broker";
import { fingerprint, parseCredential } from "./credential";
import { MountLease, type OnRemote } from "./lease";
import type { AccessModeName, Holder } from "./ownership";
import { prepareTree } from "./stage";
import { branchOfRef, checkRemoteUrl, type Store } from "./store";
import { VolumeSync } from "./sync";
import type { EventSink } from "./volume";

/** The volumes this worker watches, by volume id. */
export type Syncs = Map<string, VolumeSync>;

/**
 * Git operations on one bare repository run one at a time: fetches and
 * worktree changes of two volumes of one URL would race for its locks.
 */
export type PerRepository = KeyedSerial;

export interface GitWorkerDeps {
  store: Store;
  syncs: Syncs;
  broker: CredentialBroker;
  metrics: DriverMetrics;
  logger: Logger;
  perRepository: PerRepository;
  collect: () => Promise<void>;
  /** Kubernetes' event recorder in a cluster; none in standalone mode. */
  events?: EventSink;
}

export function gitWorkerService(deps: GitWorkerDeps): gitWorker.GitWorkerServer {
  const { store, syncs, broker, metrics, logger, perRepository, collect } = deps;
  const syncOf = (volumeId: string) => {
    const sync = syncs.get(volumeId);
    if (!sync) throw notFound(`volume ${volumeId} is not staged on this node`);
    return sync;
  };
  const instance = randomUUID();
  const classError = (err: unknown) => (err instanceof ClassParameterError ? invalidArgument(err.message) : err);

  return {
    probe: unary("probe", logger, async () => ({ ready: true, message: "", instance })),

    prepareTree: unary("prepare_tree", logger, async (request: gitWorker.PrepareTreeRequest) => {
      const volumeId = required(request.volumeId, "volume_id");
      const source = required(request.source, "source");
      // Checked again here, before any file is written: the mount owner's socket is not the only way in.
      checkRemoteUrl(required(source.url, "source.url"));
      const branch = branchOfRef(source.ref);
      const holder = holderOf(volumeId, request.mount);
      const data = request.credential?.data;
      const openAccess = async (secret: Record<string, string> | undefined) => RemoteAccess.open(parseCredential(secret), store.volumeDir(volumeId), store.socketDir(), broker);
      const existing = syncs.get(volumeId);
      const access = await openAccess(data);
      const credentialExpected = request.credentialExpected || fingerprint(data) !== "";
      const viaAccess: OnRemote = (operation) => access.run((options) => operation(store.repo(source.url, options)));
      // The same epoch again continues the lease the worker holds; anything else is a fresh claim.
      const lease = existing?.epoch === holder.epoch ? existing.mountLease : new MountLease(holder, (env = {}) => store.repo(source.url, { config: [], env }));
      try {
        const { tree, claimed } = await perRepository.run(store.repoDir(source.url), async () => {
          await rememberSource(store, volumeId, source);
          const prepared = await prepareTree(store, volumeId, source, access, credentialExpected && !access.hasCredential);
          // claim_mount before the worker pushes anything for the volume. A restarted worker without
          // the Secret claims when the next publish brings it; until then the lease is not renewed.
          const claimed = access.hasCredential || !credentialExpected ? await lease.claim(viaAccess) : lease.state();
          return { tree: prepared, claimed };
        });
        logger.info(tree.reused ? "reused the work tree the node kept" : "cloned the work tree", { volume: volumeId, operation: "prepare_tree", head: tree.head });
        const response = { treePath: tree.treePath, head: tree.head, reused: tree.reused, workerInstance: instance, lease: claimed };
        if (!claimed.held && claimed.refusal !== "") {
          logger.warn(`the mount epoch does not hold the volume: ${claimed.message}`, { volume: volumeId, operation: "claim_mount", refusal: claimed.refusal });
          if (!existing) access.close();
          return response;
        }
        if (existing) {
          existing.useLease(lease);
          if (request.claim) existing.setClaim(request.claim);
          access.close();
        } else {
          const sync = new VolumeSync({
            store,
            volumeId,
            source,
            branch,
            claim: request.claim ?? { namespace: "", name: "", uid: "" },
            logger,
            metrics,
            access,
            lease,
            events: deps.events,
            credentialExpected,
            published: request.published,
            stageFingerprint: fingerprint(data),
            openAccess,
            onRepository: (work) => perRepository.run(store.repoDir(source.url), work),
          });
          await sync.start(request.class, tree.fetched, tree.reused).catch((err: unknown) => {
            throw classError(err);
          });
          syncs.set(volumeId, sync);
        }
        return response;
      } catch (err) {
        if (!existing) access.close();
        throw err;
      }
    }),

    setCredential: unary("set_credential", logger, async (request: gitWorker.SetCredentialRequest) => {
      const sync = syncOf(required(request.volumeId, "volume_id"));
      await sync.setCredential(request.credential?.data ?? {});
      return { lease: sync.mountLease.state() };
    }),

    setClass: unary("set_class", logger, async (request: gitWorker.SetClassRequest) => {
      const sync = syncOf(required(request.volumeId, "volume_id"));
      if (request.claim) sync.setClaim(request.claim);
      await sync.setClass(request.class).catch((err: unknown) => {
        throw classError(err);
      });
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

    renewMount: unary("renew_mount", logger, async (request: gitWorker.RenewMountRequest) => {
      const sync = syncOf(required(request.volumeId, "volume_id"));
      const epoch = required(request.epoch, "epoch");
      if (sync.epoch !== epoch) return { held: false, serveUntilUnixMs: 0, refusal: "superseded", message: `this node serves volume ${request.volumeId} with a later mount epoch than the one renewing` };
      return sync.renewMount();
    }),

    releaseTree: unary("release_tree", logger, async (request: gitWorker.ReleaseTreeRequest) => {
      const volumeId = required(request.volumeId, "volume_id");
      const sync = syncs.get(volumeId);
      syncs.delete(volumeId);
      if (!sync) return { released: false, message: `the git worker does not serve volume ${volumeId}: it restarted since the stage, and holds no credential to release the mount epoch` };
      const released = await sync.stop(request.epoch || undefined).catch((err: Error) => {
        logger.warn(`release_mount failed: ${err.message}`, { volume: volumeId, operation: "release_mount" });
        return false;
      });
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

    getReport: unary("report", logger, async (request: gitWorker.GetReportRequest) => syncOf(required(request.volumeId, "volume_id")).report()),
  };
}

const ACCESS_MODES: Partial<Record<gitcsi.AccessMode, AccessModeName>> = {
  [gitcsi.AccessMode.READ_WRITE_ONCE]: "ReadWriteOnce",
  [gitcsi.AccessMode.READ_WRITE_ONCE_POD]: "ReadWriteOncePod",
};

function holderOf(volumeId: string, claim: gitWorker.MountClaim | undefined): Holder {
  const mount = required(claim, "mount");
  const accessMode = ACCESS_MODES[mount.accessMode];
  if (!accessMode) throw invalidArgument("mount.access_mode must be ReadWriteOnce or ReadWriteOncePod");
  if (!(mount.leaseMs > 0)) throw invalidArgument("mount.lease_ms must be a positive number of milliseconds");
  return { volumeId, node: required(mount.node, "mount.node"), epoch: required(mount.epoch, "mount.epoch"), accessMode, leaseMs: Number(mount.leaseMs), continues: mount.continues };
}
