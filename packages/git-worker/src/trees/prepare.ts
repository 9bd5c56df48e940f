import { accessModeName, type gitcsi, gitWorker, invalidArgument, failedPrecondition, required } from "@git-csi/protos";
import { RemoteAccess } from "../remote/access";
import { fingerprint, parseCredential } from "../remote/credential";
import { rememberSource } from "./gc";
import { rememberStage } from "./strand-kept";
import { MountLease } from "../lease/lease";
import type { Holder } from "../lease/ownership";
import type { GitWorkerDeps } from "../service";
import { type PreparedTree, prepareTree } from "./stage";
import { branchOfRef, checkRemoteUrl } from "./store";
import { VolumeSync } from "../sync/sync";

/** A tree PrepareTree made ready, with the access that reached its remote, waiting for ClaimMount. */
export interface PreparedVolume {
  request: gitWorker.PrepareTreeRequest;
  source: gitcsi.VolumeSource;
  access: RemoteAccess;
  tree: PreparedTree;
  credentialExpected: boolean;
}

/** The prepared trees no ClaimMount took yet, by volume id. */
export type Prepared = Map<string, PreparedVolume>;

/**
 * PrepareTree: the volume's tree cloned, or the one the node kept reused.
 * Nothing is claimed or pushed: the tree waits for ClaimMount.
 */
export async function prepareVolume(deps: GitWorkerDeps, prepared: Prepared, request: gitWorker.PrepareTreeRequest): Promise<gitWorker.PrepareTreeResponse> {
  const { store, logger } = deps;
  const volumeId = required(request.volumeId, "volume_id");
  const source = required(request.source, "source");
  // Checked again here, before any file is written: the mount owner's socket is not the only way in.
  checkRemoteUrl(required(source.url, "source.url"));
  branchOfRef(source.ref);
  const access = await openAccess(deps, volumeId, request.credential?.data);
  const credentialExpected = request.credentialExpected || fingerprint(request.credential?.data) !== "";
  try {
    const tree = await deps.perRepository.run(store.repoDir(source.url), async () => {
      await rememberSource(store, volumeId, source);
      await rememberStage(store, volumeId, { credentialExpected, claim: request.claim });
      return prepareTree(store, volumeId, source, access, credentialExpected && !access.hasCredential);
    });
    logger.info(tree.reused ? "reused the work tree the node kept" : "cloned the work tree", { volume: volumeId, operation: "prepare_tree", head: tree.head });
    dropPrepared(prepared, volumeId);
    prepared.set(volumeId, { request, source, access, tree, credentialExpected });
    return { treePath: tree.treePath, head: tree.head, reused: tree.reused };
  } catch (err) {
    access.close();
    throw err;
  }
}

/** A prepared tree no ClaimMount will take: its access, and any ssh-agent with its key, goes. */
export function dropPrepared(prepared: Prepared, volumeId: string): void {
  prepared.get(volumeId)?.access.close();
  prepared.delete(volumeId);
}

function openAccess(deps: GitWorkerDeps, volumeId: string, secret: Record<string, string> | undefined): Promise<RemoteAccess> {
  return RemoteAccess.open(parseCredential(secret), deps.store.volumeDir(volumeId), deps.store.socketDir(), deps.broker);
}

/**
 * ClaimMount: claim_mount of spec 000 for the prepared tree, before the
 * worker pushes anything for the volume; then the tree is watched, by a new
 * sync or by the one that already watches it. A refused claim watches
 * nothing, but for a continuing epoch's lost one (keepsTree).
 */
export async function claimMount(deps: GitWorkerDeps, prepared: Prepared, instance: string, request: gitWorker.ClaimMountRequest): Promise<gitWorker.ClaimMountResponse> {
  const volumeId = required(request.volumeId, "volume_id");
  const holder = holderOf(volumeId, request.mount);
  const ready = prepared.get(volumeId);
  if (!ready) throw failedPrecondition(`volume ${volumeId} has no prepared tree on this git worker: PrepareTree comes first, and again after a worker restart`);
  prepared.delete(volumeId);
  const existing = deps.syncs.get(volumeId);
  try {
    const { lease, outcome } = await claimFor(deps, ready, holder, Number(request.mount?.servingLeftMs ?? 0), existing);
    const response = { workerInstance: instance, lease: outcome };
    if (!outcome.held && outcome.refusal !== gitWorker.LeaseRefusal.LEASE_REFUSAL_NONE) {
      deps.logger.warn(`the mount epoch does not hold the volume: ${outcome.message}`, { volume: volumeId, operation: "claim_mount", refusal: gitWorker.leaseRefusalToJSON(outcome.refusal) });
      if (!keepsTree(holder, outcome)) {
        if (!existing) ready.access.close();
        return response;
      }
    }
    await watch(deps, ready, existing, holder, lease);
    return response;
  } catch (err) {
    if (!existing) ready.access.close();
    throw err;
  }
}

/**
 * A continuing epoch that lost the volume here (a restarted worker handed a
 * mount whose serving time ran out, or one a successor took) still has its
 * tree watched: the mount may have written to it, so the unstage's flush
 * commits there and its release leaves the commits on a stranded ref, where
 * the push the lost epoch may not make never lands them.
 */
function keepsTree(holder: Holder, outcome: gitWorker.MountLease): boolean {
  return holder.continues && LOST.has(outcome.refusal);
}

const LOST = new Set([gitWorker.LeaseRefusal.LEASE_REFUSAL_EXPIRED, gitWorker.LeaseRefusal.LEASE_REFUSAL_SUPERSEDED, gitWorker.LeaseRefusal.LEASE_REFUSAL_RELEASED]);

/**
 * The same epoch again continues the lease the worker holds; anything else is
 * a fresh claim. The mount owner's word on its serving time bounds the lease
 * first. A restarted worker without the Secret claims when the next publish
 * brings it; until then the lease is not renewed.
 */
async function claimFor(
  deps: GitWorkerDeps,
  ready: PreparedVolume,
  holder: Holder,
  servingLeftMs: number,
  existing: VolumeSync | undefined,
): Promise<{ lease: MountLease; outcome: gitWorker.MountLease }> {
  const { store } = deps;
  const { source, access } = ready;
  const lease = existing?.epoch === holder.epoch ? existing.mountLease : new MountLease(holder, (env = {}) => store.repo(source.url, { config: [], env }));
  lease.servesAtMost(servingLeftMs);
  if (!access.hasCredential && ready.credentialExpected) return { lease, outcome: lease.state() };
  return { lease, outcome: await deps.perRepository.run(store.repoDir(source.url), () => lease.claim(store.through(source.url, access))) };
}

/** The sync that watches the tree: the existing one takes the lease, or a new one starts. */
async function watch(deps: GitWorkerDeps, ready: PreparedVolume, existing: VolumeSync | undefined, holder: Holder, lease: MountLease): Promise<void> {
  const { request, source, access, tree, credentialExpected } = ready;
  if (existing) {
    existing.useLease(lease);
    if (request.claim) existing.setClaim(request.claim);
    access.close();
    return;
  }
  const sync = new VolumeSync({
    store: deps.store,
    volumeId: holder.volumeId,
    source,
    branch: branchOfRef(source.ref),
    claim: request.claim ?? { namespace: "", name: "", uid: "" },
    logger: deps.logger,
    metrics: deps.metrics,
    access,
    lease,
    events: deps.events,
    pods: deps.pods,
    credentialExpected,
    published: request.published,
    stageFingerprint: fingerprint(request.credential?.data),
    openAccess: (secret) => openAccess(deps, holder.volumeId, secret),
    onRepository: (work) => deps.perRepository.run(deps.store.repoDir(source.url), work),
    syncMount: () => deps.syncMount(holder.volumeId),
    invalidateMount: () => deps.invalidateMount(holder.volumeId),
  });
  await sync.start(request.class, tree.fetched, tree.reused);
  deps.syncs.set(holder.volumeId, sync);
}

function holderOf(volumeId: string, claim: gitWorker.MountClaim | undefined): Holder {
  const mount = required(claim, "mount");
  const accessMode = accessModeName(mount.accessMode);
  if (!accessMode) throw invalidArgument("mount.access_mode must be ReadWriteOnce or ReadWriteOncePod");
  if (!(mount.leaseMs > 0)) throw invalidArgument("mount.lease_ms must be a positive number of milliseconds");
  return { volumeId, node: required(mount.node, "mount.node"), epoch: required(mount.epoch, "mount.epoch"), accessMode, leaseMs: Number(mount.leaseMs), continues: mount.continues };
}
