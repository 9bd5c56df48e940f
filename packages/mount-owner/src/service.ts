import { randomUUID } from "node:crypto";
import * as fs from "node:fs/promises";
import { KeyedSerial } from "@git-csi/config";
import type { Logger } from "@git-csi/logging";
import { status } from "@grpc/grpc-js";
import {
  alreadyExists,
  call,
  type CsiError,
  failedPrecondition,
  gitcsi,
  gitWorker,
  mountOwner,
  notFound,
  required,
  unary,
} from "@git-csi/protos";
import { bindMount, isMountPoint, unmountAll } from "./mounts";
import { newSession, readSession, removeSession, writeSession } from "./session";
import type { State, VolumeRecord } from "./state";

/** A staged volume's FUSE session, as the mount owner holds it. */
export interface StagedMount {
  unmount(): Promise<void>;
}

export interface MountOwnerDeps {
  state: State;
  nodeId: string;
  /** This mount owner's and its git worker's sockets, recorded in each .rwo-session. */
  endpoints: { mountOwner: string; gitWorker: string };
  worker: gitWorker.GitWorkerClient;
  logger: Logger;
  /** Serves the volume's work tree through FUSE at the staging path. */
  mountTree(volumeId: string, treePath: string, stagingPath: string): Promise<StagedMount>;
}

const WORKER_TIMEOUT_MS = 5 * 60_000;
/** DeleteVolume does not wait long for a worker that is down: its tree goes when the worker answers. */
const REMOVE_TIMEOUT_MS = 10_000;

const MODE_NAMES: Record<gitcsi.AccessMode, string> = {
  [gitcsi.AccessMode.ACCESS_MODE_UNSPECIFIED]: "unspecified",
  [gitcsi.AccessMode.READ_WRITE_ONCE_POD]: "ReadWriteOncePod",
  [gitcsi.AccessMode.READ_WRITE_ONCE]: "ReadWriteOnce",
  [gitcsi.AccessMode.UNRECOGNIZED]: "unrecognized",
};

export interface MountOwner {
  service: mountOwner.MountOwnerServer;
  /** Hands every staged volume to a git worker that restarted and knows none of them. */
  watchWorker(intervalMs: number): NodeJS.Timeout;
}

export function createMountOwner(deps: MountOwnerDeps): MountOwner {
  const { state, worker, logger } = deps;
  /** Each staged volume's FUSE session, and the git worker instance that watches its tree. */
  const sessions = new Map<string, { stagingPath: string; mount: StagedMount; workerInstance: string }>();
  const perVolume = new KeyedSerial();

  const serialized = <Req extends { volumeId: string }, Res>(operation: string, handler: (request: Req, volumeId: string) => Promise<Res>) =>
    unary<Req, Res>(operation, logger, (request) => {
      const volumeId = required(request.volumeId, "volume_id");
      return perVolume.run(volumeId, () => handler(request, volumeId));
    });

  async function stage(request: mountOwner.StageVolumeRequest, volumeId: string): Promise<mountOwner.StageVolumeResponse> {
    const stagingPath = required(request.stagingPath, "staging_target_path");
    const source = required(request.source, "volume_context");
    const existing = await state.volumes.get(volumeId);
    if (existing) checkIdentity(existing, source, request.accessMode);
    // A retry continues the session its record names; a refused record stops the stage before anything happens.
    const previous = await readSession(stagingPath, volumeId);
    const live = sessions.get(volumeId);
    if (live) {
      if (live.stagingPath !== stagingPath) throw failedPrecondition(`volume ${volumeId} is staged at ${live.stagingPath} already; unstage it there first`);
      return {};
    }
    const session = previous ?? newSession({ volumeId, node: deps.nodeId, endpoints: deps.endpoints, accessMode: request.accessMode }, existing?.generation ?? 0);
    if (!previous) await writeSession(stagingPath, session);
    const volumeClass = existing?.volumeClass ?? (await provisionedClass(volumeId));
    const credentialExpected = Object.keys(request.credential?.data ?? {}).length > 0;
    const planned: VolumeRecord = { ...(existing ?? { volumeId, source, accessMode: request.accessMode, targets: [] }), stagingPath, volumeClass, credentialExpected, generation: session.generation };
    const tree = await prepare(planned, request.credential);
    // The record is durable before the mount serves: a restarted mount owner finds every mount it made.
    const record: VolumeRecord = { ...planned, treePath: tree.treePath };
    await state.volumes.put(volumeId, record);
    // A mount a dead mount owner left behind answers ENOTCONN; it goes before the new session.
    await unmountAll(stagingPath);
    await fs.mkdir(stagingPath, { recursive: true });
    const mount = await deps.mountTree(volumeId, tree.treePath, stagingPath);
    sessions.set(volumeId, { stagingPath, mount, workerInstance: tree.workerInstance });
    // Durable before the stage reports success.
    if (!session.completed) await writeSession(stagingPath, { ...session, completed: true });
    logger.info("staged", { volume: volumeId, operation: "stage", reused: tree.reused, head: tree.head });
    return {};
  }

  async function unstage(request: mountOwner.UnstageVolumeRequest, volumeId: string): Promise<mountOwner.UnstageVolumeResponse> {
    const stagingPath = required(request.stagingPath, "staging_target_path");
    const record = await state.volumes.get(volumeId);
    if (record && record.targets.length > 0) {
      throw failedPrecondition(`volume ${volumeId} is still published at ${record.targets.join(", ")}; unpublish it first`);
    }
    const live = sessions.get(volumeId);
    if (live) {
      await live.mount.unmount();
      sessions.delete(volumeId);
    }
    await unmountAll(stagingPath);
    // The pod's unstage pushes before the volume leaves the node; a push that fails keeps its commits in the tree.
    await flush(volumeId);
    await call(worker.releaseTree.bind(worker), { volumeId }, WORKER_TIMEOUT_MS);
    await removeSession(stagingPath);
    if (record) await state.volumes.put(volumeId, { ...record, stagingPath: undefined });
    logger.info("unstaged", { volume: volumeId, operation: "unstage" });
    return {};
  }

  async function publish(request: mountOwner.PublishVolumeRequest, volumeId: string): Promise<mountOwner.PublishVolumeResponse> {
    const stagingPath = required(request.stagingPath, "staging_target_path");
    const targetPath = required(request.targetPath, "target_path");
    const record = await state.volumes.get(volumeId);
    const live = sessions.get(volumeId);
    if (!record || !live || live.stagingPath !== stagingPath) {
      throw failedPrecondition(`volume ${volumeId} is not staged at ${stagingPath}; stage it before publishing`);
    }
    checkMode(record, request.accessMode);
    const others = record.targets.filter((t) => t !== targetPath);
    if (record.accessMode === gitcsi.AccessMode.READ_WRITE_ONCE_POD && others.length > 0) {
      throw failedPrecondition(`volume ${volumeId} is ReadWriteOncePod and already published at ${others.join(", ")}`);
    }
    // The Secret first, on every publish: the kubelet's republish is how a rotated
    // Secret arrives, and a publish the worker refuses mounts nothing.
    await call(worker.setCredential.bind(worker), { volumeId, credential: request.credential }, WORKER_TIMEOUT_MS).catch(async (err: CsiError) => {
      // A worker that restarted since the stage knows nothing of the volume yet: hand it over with this Secret.
      if (err.code !== status.NOT_FOUND) throw err;
      live.workerInstance = (await prepare(record, request.credential)).workerInstance;
      await call(worker.setCredential.bind(worker), { volumeId, credential: request.credential }, WORKER_TIMEOUT_MS);
    });
    if (record.targets.includes(targetPath) && (await isMountPoint(targetPath))) return {};
    await fs.mkdir(targetPath, { recursive: true });
    await bindMount(stagingPath, targetPath, request.readonly);
    await state.volumes.put(volumeId, { ...record, targets: [...others, targetPath] });
    logger.info("published", { volume: volumeId, operation: "publish", target: targetPath, pod: request.pod ? `${request.pod.namespace}/${request.pod.name}` : undefined });
    return {};
  }

  async function unpublish(request: mountOwner.UnpublishVolumeRequest, volumeId: string): Promise<mountOwner.UnpublishVolumeResponse> {
    const targetPath = required(request.targetPath, "target_path");
    await unmountAll(targetPath);
    await fs.rm(targetPath, { recursive: false, force: true }).catch(() => fs.rmdir(targetPath).catch(() => undefined));
    const record = await state.volumes.get(volumeId);
    if (record?.targets.includes(targetPath)) {
      const targets = record.targets.filter((t) => t !== targetPath);
      await state.volumes.put(volumeId, { ...record, targets });
      // The last pod stopped: push what the tree holds.
      if (targets.length === 0) await flush(volumeId);
    }
    logger.info("unpublished", { volume: volumeId, operation: "unpublish", target: targetPath });
    return {};
  }

  async function flush(volumeId: string): Promise<void> {
    const result = await call(worker.flushVolume.bind(worker), { volumeId }, WORKER_TIMEOUT_MS).catch((err: Error) => ({ pushed: false, message: err.message }));
    logger.log(result.pushed ? "info" : "warn", result.pushed ? "flushed" : `flush did not push: ${result.message}`, { volume: volumeId, operation: "flush" });
  }

  /** In standalone mode the controller's record carries the class ControllerModifyVolume applied. */
  async function provisionedClass(volumeId: string): Promise<gitcsi.VolumeClass | undefined> {
    const provisioned = await state.provisioned.get(volumeId);
    return provisioned && Object.keys(provisioned.classParameters).length > 0 ? { name: "", parameters: provisioned.classParameters } : undefined;
  }

  /** Records the class on the node volume and arms or unarms a staged one at once. */
  async function setVolumeClass(volumeId: string, volumeClass: gitcsi.VolumeClass | undefined): Promise<void> {
    if (sessions.has(volumeId)) await call(worker.setClass.bind(worker), { volumeId, class: volumeClass }, WORKER_TIMEOUT_MS);
    const record = await state.volumes.get(volumeId);
    if (record) await state.volumes.put(volumeId, { ...record, volumeClass });
  }

  async function prepare(record: VolumeRecord, credential?: gitcsi.Credential): Promise<gitWorker.PrepareTreeResponse> {
    return call(
      worker.prepareTree.bind(worker),
      {
        volumeId: record.volumeId,
        source: record.source,
        credential,
        class: record.volumeClass,
        claim: undefined,
        credentialExpected: record.credentialExpected ?? false,
        published: record.targets.length > 0,
      },
      WORKER_TIMEOUT_MS,
    );
  }

  async function removeDeletedTree(volumeId: string): Promise<void> {
    const deleted = await state.deletions.get(volumeId);
    if (!deleted) return;
    try {
      await call(worker.removeTree.bind(worker), { volumeId, source: deleted.source }, REMOVE_TIMEOUT_MS);
      await state.deletions.remove(volumeId);
    } catch (err) {
      logger.warn(`the tree of deleted volume ${volumeId} stays until the git worker answers: ${(err as Error).message}`, { volume: volumeId, operation: "delete_volume" });
    }
  }

  const ownerInstance = randomUUID();
  function watchWorker(intervalMs: number): NodeJS.Timeout {
    return setInterval(() => {
      void call(worker.probe.bind(worker), {}, intervalMs)
        .then(async ({ instance }) => {
          for (const volumeId of await state.deletions.keys()) await perVolume.run(volumeId, () => removeDeletedTree(volumeId));
          for (const [volumeId, session] of sessions) {
            if (session.workerInstance === instance) continue;
            logger.warn("the git worker restarted; handing it the staged volume again", { volume: volumeId, operation: "worker_restart" });
            await perVolume.run(volumeId, async () => {
              const record = await state.volumes.get(volumeId);
              if (record) session.workerInstance = (await prepare(record)).workerInstance;
            });
          }
        })
        .catch((err: Error) => logger.warn(`the git worker does not answer: ${err.message}`, { operation: "worker_restart" }));
    }, intervalMs);
  }

  const service: mountOwner.MountOwnerServer = {
    probe: unary("probe", logger, async () => {
      const answer = await call(worker.probe.bind(worker), {}, 5000).catch((err: Error) => ({ ready: false, message: `git worker does not answer: ${err.message}`, instance: "" }));
      return { ready: answer.ready, message: answer.message, instance: ownerInstance };
    }),
    createVolume: unary("create_volume", logger, async (request: mountOwner.CreateVolumeRequest) => {
      const name = required(request.name, "name");
      const wanted: mountOwner.Volume = {
        volumeId: name,
        name,
        capacityBytes: request.capacityBytes,
        source: required(request.source, "parameters"),
        accessMode: request.accessMode,
        classParameters: request.classParameters,
      };
      return perVolume.run(name, async () => {
        const existing = await state.provisioned.get(name);
        if (existing) {
          if (!sameVolume(existing, wanted)) throw alreadyExists(`volume ${name} exists with other capacity, parameters or access mode`);
          return { volume: existing };
        }
        await state.provisioned.put(name, wanted);
        logger.info("volume created", { volume: name, operation: "create_volume" });
        return { volume: wanted };
      });
    }),
    // A provisioned volume is deleted with reclaim policy Delete: this node's tree goes too. The remote never does.
    deleteVolume: serialized("delete_volume", async (_request: mountOwner.DeleteVolumeRequest, volumeId) => {
      const record = await state.volumes.get(volumeId);
      if (record?.stagingPath !== undefined) throw failedPrecondition(`volume ${volumeId} is staged at ${record.stagingPath}; unstage it before deleting it`);
      if (record) {
        // The deletion is durable first: a git worker that does not answer now removes the tree when it does.
        await state.deletions.put(volumeId, record);
        await state.volumes.remove(volumeId);
        await removeDeletedTree(volumeId);
      }
      await state.provisioned.remove(volumeId);
      return {};
    }),
    getVolume: serialized("get_volume", async (_request: mountOwner.GetVolumeRequest, volumeId) => {
      const volume = await state.provisioned.get(volumeId);
      if (!volume) throw notFound(`volume ${volumeId} does not exist`);
      return { volume };
    }),
    modifyVolume: serialized("modify_volume", async (request: mountOwner.ModifyVolumeRequest, volumeId) => {
      const volume = await state.provisioned.get(volumeId);
      if (!volume) throw notFound(`volume ${volumeId} does not exist`);
      // Parameters a request does not name keep their values, as CSI asks of ControllerModifyVolume.
      const classParameters = { ...volume.classParameters, ...request.classParameters };
      await setVolumeClass(volumeId, { name: "", parameters: classParameters });
      await state.provisioned.put(volumeId, { ...volume, classParameters });
      logger.info("class applied", { volume: volumeId, operation: "modify_volume" });
      return {};
    }),
    setVolumeClass: serialized("set_volume_class", async (request: mountOwner.SetVolumeClassRequest, volumeId) => {
      await setVolumeClass(volumeId, request.class);
      return {};
    }),
    stageVolume: serialized("stage", stage),
    unstageVolume: serialized("unstage", unstage),
    publishVolume: serialized("publish", publish),
    unpublishVolume: serialized("unpublish", unpublish),
  };
  return { service, watchWorker };
}

function checkMode(record: VolumeRecord, accessMode: gitcsi.AccessMode): void {
  if (record.accessMode !== accessMode) {
    throw alreadyExists(`volume ${record.volumeId} is ${MODE_NAMES[record.accessMode]}; its access mode cannot change to ${MODE_NAMES[accessMode]}`);
  }
}

function checkIdentity(record: VolumeRecord, source: gitcsi.VolumeSource, accessMode: gitcsi.AccessMode): void {
  checkMode(record, accessMode);
  if (record.source.url !== source.url || record.source.ref !== source.ref) {
    throw alreadyExists(`volume ${record.volumeId} follows ${record.source.url} ref ${record.source.ref} on this node, not ${source.url} ref ${source.ref}`);
  }
}

function sameVolume(a: mountOwner.Volume, b: mountOwner.Volume): boolean {
  return JSON.stringify(a) === JSON.stringify(b);
}
