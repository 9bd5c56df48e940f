import { randomUUID } from "node:crypto";
import { branchOf, ClassParameterError, KeyedSerial } from "@git-csi/config";
import type { Logger } from "@git-csi/logging";
import type { DriverMetrics } from "@git-csi/metrics";
import { failedPrecondition, type gitWorker, invalidArgument, notFound, required, unary } from "@git-csi/protos";
import { rememberSource, removeTree } from "./gc";
import { RemoteAccess } from "./access";
import type { CredentialBroker } from "./broker";
import { fingerprint, parseCredential } from "./credential";
import { prepareTree } from "./stage";
import type { Store } from "./store";
import { VolumeSync } from "./sync";

/** The volumes this worker watches, by volume id. */
export type Syncs = Map<string, VolumeSync>;

/**
 * Git operations on one bare repository run one at a time: fetches and
 * worktree changes of two volumes of one URL would race for its locks.
 */
export type PerRepository = KeyedSerial;

export function gitWorkerService(store: Store, syncs: Syncs, broker: CredentialBroker, metrics: DriverMetrics, logger: Logger, perRepository: PerRepository, collect: () => Promise<void>): gitWorker.GitWorkerServer {
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
      required(source.url, "source.url");
      const data = request.credential?.data;
      const openAccess = async (secret: Record<string, string> | undefined) => RemoteAccess.open(parseCredential(secret), store.volumeDir(volumeId), store.socketDir(), broker);
      const existing = syncs.get(volumeId);
      const access = await openAccess(data);
      const credentialExpected = request.credentialExpected || fingerprint(data) !== "";
      try {
        const tree = await perRepository.run(store.repoDir(source.url), async () => {
          await rememberSource(store, volumeId, source);
          return prepareTree(store, volumeId, source, access, credentialExpected && !access.hasCredential);
        });
        logger.info(tree.reused ? "reused the work tree the node kept" : "cloned the work tree", { volume: volumeId, operation: "prepare_tree", head: tree.head });
        if (existing) {
          access.close();
        } else {
          const sync = new VolumeSync({
            store,
            volumeId,
            source,
            branch: branchOf(source.ref)!,
            claim: request.claim ?? { namespace: "", name: "" },
            logger,
            metrics,
            access,
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
        return { treePath: tree.treePath, head: tree.head, reused: tree.reused, workerInstance: instance };
      } catch (err) {
        if (!existing) access.close();
        throw err;
      }
    }),

    setCredential: unary("set_credential", logger, async (request: gitWorker.SetCredentialRequest) => {
      await syncOf(required(request.volumeId, "volume_id")).setCredential(request.credential?.data ?? {});
      return {};
    }),

    setClass: unary("set_class", logger, async (request: gitWorker.SetClassRequest) => {
      const sync = syncOf(required(request.volumeId, "volume_id"));
      await sync.setClass(request.class).catch((err: unknown) => {
        throw classError(err);
      });
      return {};
    }),

    flushVolume: unary("flush", logger, async (request: gitWorker.FlushVolumeRequest) => {
      const sync = syncs.get(required(request.volumeId, "volume_id"));
      return sync ? sync.flush() : { pushed: false, message: "the volume is not staged on this node" };
    }),

    releaseTree: unary("release_tree", logger, async (request: gitWorker.ReleaseTreeRequest) => {
      const volumeId = required(request.volumeId, "volume_id");
      await syncs.get(volumeId)?.stop();
      syncs.delete(volumeId);
      return {};
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
