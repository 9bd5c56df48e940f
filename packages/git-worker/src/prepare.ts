import { accessModeName, gitWorker, invalidArgument, required } from "@git-csi/protos";
import { RemoteAccess } from "./access";
import { fingerprint, parseCredential } from "./credential";
import { rememberSource } from "./gc";
import { MountLease, type OnRemote } from "./lease";
import type { Holder } from "./ownership";
import type { GitWorkerDeps } from "./service";
import { prepareTree } from "./stage";
import { branchOfRef, checkRemoteUrl } from "./store";
import { VolumeSync } from "./sync";

/**
 * PrepareTree: the volume's tree cloned, or the one the node kept reused;
 * claim_mount of spec 000 before the worker pushes anything; then the tree
 * is watched, by a new sync or by the one that already watches it.
 */
export async function prepareVolume(deps: GitWorkerDeps, instance: string, request: gitWorker.PrepareTreeRequest): Promise<gitWorker.PrepareTreeResponse> {
  const { store, syncs, logger } = deps;
  const volumeId = required(request.volumeId, "volume_id");
  const source = required(request.source, "source");
  // Checked again here, before any file is written: the mount owner's socket is not the only way in.
  checkRemoteUrl(required(source.url, "source.url"));
  const branch = branchOfRef(source.ref);
  const holder = holderOf(volumeId, request.mount);
  const data = request.credential?.data;
  const openAccess = async (secret: Record<string, string> | undefined) => RemoteAccess.open(parseCredential(secret), store.volumeDir(volumeId), store.socketDir(), deps.broker);
  const existing = syncs.get(volumeId);
  const access = await openAccess(data);
  const credentialExpected = request.credentialExpected || fingerprint(data) !== "";
  // The same epoch again continues the lease the worker holds; anything else is a fresh claim.
  const lease = existing?.epoch === holder.epoch ? existing.mountLease : new MountLease(holder, (env = {}) => store.repo(source.url, { config: [], env }));
  try {
    const { tree, claimed } = await deps.perRepository.run(store.repoDir(source.url), async () => {
      await rememberSource(store, volumeId, source);
      const prepared = await prepareTree(store, volumeId, source, access, credentialExpected && !access.hasCredential);
      // claim_mount before the worker pushes anything for the volume. A restarted worker without
      // the Secret claims when the next publish brings it; until then the lease is not renewed.
      const viaAccess: OnRemote = (operation) => access.run((options) => operation(store.repo(source.url, options)));
      const claimed = access.hasCredential || !credentialExpected ? await lease.claim(viaAccess) : lease.state();
      return { tree: prepared, claimed };
    });
    logger.info(tree.reused ? "reused the work tree the node kept" : "cloned the work tree", { volume: volumeId, operation: "prepare_tree", head: tree.head });
    const response = { treePath: tree.treePath, head: tree.head, reused: tree.reused, workerInstance: instance, lease: claimed };
    if (!claimed.held && claimed.refusal !== gitWorker.LeaseRefusal.LEASE_REFUSAL_NONE) {
      logger.warn(`the mount epoch does not hold the volume: ${claimed.message}`, { volume: volumeId, operation: "claim_mount", refusal: gitWorker.leaseRefusalToJSON(claimed.refusal) });
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
        metrics: deps.metrics,
        access,
        lease,
        events: deps.events,
        credentialExpected,
        published: request.published,
        stageFingerprint: fingerprint(data),
        openAccess,
        onRepository: (work) => deps.perRepository.run(store.repoDir(source.url), work),
      });
      await sync.start(request.class, tree.fetched, tree.reused);
      syncs.set(volumeId, sync);
    }
    return response;
  } catch (err) {
    if (!existing) access.close();
    throw err;
  }
}

function holderOf(volumeId: string, claim: gitWorker.MountClaim | undefined): Holder {
  const mount = required(claim, "mount");
  const accessMode = accessModeName(mount.accessMode);
  if (!accessMode) throw invalidArgument("mount.access_mode must be ReadWriteOnce or ReadWriteOncePod");
  if (!(mount.leaseMs > 0)) throw invalidArgument("mount.lease_ms must be a positive number of milliseconds");
  return { volumeId, node: required(mount.node, "mount.node"), epoch: required(mount.epoch, "mount.epoch"), accessMode, leaseMs: Number(mount.leaseMs), continues: mount.continues };
}
