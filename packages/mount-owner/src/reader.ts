import * as fs from "node:fs/promises";
import * as path from "node:path";
import { parseClassParameters, readerRefOf } from "@git-csi/config";
import { failedPrecondition, type gitcsi, type mountOwner, required } from "@git-csi/protos";
import type { Owner, StagedMount } from "./context";
import type { EpochFence } from "./fuse/binding";
import { bindMount, isMountPoint, remountReadOnly, unmountAll } from "./mounts";
import { withMaterial } from "./sessions";
import type { StagedPaths } from "./resume";
import { plannedRecord } from "./stage";
import { checkIdentity, checkMode, type VolumeRecord } from "./state";

/**
 * A read-only volume's mount on this node: one checked-out commit served
 * read-only. It has no epoch, so nothing is claimed, renewed or released,
 * and any number of nodes serve the volume at once.
 */
export interface ReaderMount {
  stagingPath: string;
  mount: StagedMount;
  /** The checked-out commit's directory the mount serves, and the commit. */
  treePath: string;
  commit: string;
  /** The stage's Secret, in memory only, for the fetches that follow the ref. */
  credential?: gitcsi.Credential;
  /** A tag or a commit: fetched at stage only, whatever the class says. */
  pinned: boolean;
  /** The class's follow.interval; unset, the mount serves the commit of its stage. */
  intervalMs?: number;
  /** The next fetch, while none runs. */
  next?: NodeJS.Timeout;
}

/** A kept connection of a read-only volume, served again after a restart: it has no epoch to check, and it follows as its class says. */
export async function resumeReader(owner: Owner, record: VolumeRecord, paths: StagedPaths, serve: (paths: StagedPaths, fence: EpochFence) => Promise<StagedMount>): Promise<true> {
  const { volumeId } = record;
  const { stagingPath, treePath } = paths;
  const mount = await serve(paths, NO_EPOCH);
  // A new server: it caches no entry either.
  mount.switchRoot(treePath);
  // The Secret comes back with the kubelet's next publish; until then a private remote's fetch fails and says so.
  const reader: ReaderMount = { stagingPath, mount, treePath, commit: path.basename(treePath), pinned: isPinned(record.source) };
  owner.readers.set(volumeId, reader);
  follow(owner, volumeId, reader, followInterval(record.volumeClass));
  owner.logger.info("resumed read-only", { volume: volumeId, claim: record.claim?.name, operation: "fuse_resume", head: reader.commit });
  return true;
}

/** A reader's mount serves until it is unmounted: no lease ends it. */
const NO_EPOCH = { serveUntilMs: Infinity, onFenced: () => undefined };

/** NodeStageVolume of a read-only volume: the ref's commit checked out and served read-only at the staging path. */
export async function stageReader(owner: Owner, request: mountOwner.StageVolumeRequest, volumeId: string): Promise<mountOwner.StageVolumeResponse> {
  const stagingPath = required(request.stagingPath, "staging_target_path");
  const source = required(request.source, "volume_context");
  const existing = await owner.state.volume(volumeId);
  if (existing) checkIdentity(existing, source, request.accessMode);
  const live = owner.readers.get(volumeId);
  if (live) return continueStaged(volumeId, stagingPath, live);
  const planned = await plannedRecord(owner, request, volumeId, existing, 0);
  // A bad class refuses the stage before anything is fetched or mounted.
  const intervalMs = followInterval(planned.volumeClass);
  const credential = withMaterial(request.credential);
  const checkout = await owner.link.checkoutReader(planned, credential, "");
  await unmountAll(stagingPath);
  await fs.mkdir(stagingPath, { recursive: true });
  const mount = await owner.deps.mountTree(volumeId, checkout.treePath, stagingPath, NO_EPOCH);
  await readOnlyOrUnmounted(stagingPath, mount);
  // From the stage on the kernel caches no entry, so a class that makes it follow later finds none.
  mount.switchRoot(checkout.treePath);
  const reader: ReaderMount = { stagingPath, mount, treePath: checkout.treePath, commit: checkout.commit, credential, pinned: isPinned(planned.source) };
  owner.readers.set(volumeId, reader);
  await owner.state.recordStaged({ ...planned, treePath: checkout.treePath });
  follow(owner, volumeId, reader, intervalMs);
  owner.logger.info("staged read-only", { volume: volumeId, claim: planned.claim?.name, operation: "stage", head: checkout.commit, followMs: intervalMs });
  return {};
}

/** The class's follow.interval; a bad class throws InvalidArgument naming the parameter, and nothing changes. */
function followInterval(volumeClass: gitcsi.VolumeClass | undefined): number | undefined {
  return volumeClass ? parseClassParameters(volumeClass.parameters).followMs : undefined;
}

/** A staged reader takes its class: it follows at the class's interval from now on, or stops following. */
export function setReaderClass(owner: Owner, volumeId: string, volumeClass: gitcsi.VolumeClass | undefined): void {
  const reader = owner.readers.get(volumeId);
  if (reader) follow(owner, volumeId, reader, followInterval(volumeClass));
}

/** A tag or a commit never moves, so a reader of one never fetches after its stage. */
function isPinned(source: gitcsi.VolumeSource | undefined): boolean {
  return readerRefOf(source?.ref ?? "")?.kind !== "branch";
}

/** One fetch every interval, never two at once; none without an interval, and none for a pin. */
function follow(owner: Owner, volumeId: string, reader: ReaderMount, intervalMs: number | undefined): void {
  clearTimeout(reader.next);
  reader.next = undefined;
  // One class may serve branches and pins: its interval is not a pin's mistake, and the log says it does nothing.
  if (reader.pinned && intervalMs !== undefined) owner.logger.info("follow.interval is ignored: the volume's ref is a tag or a commit, which never moves", { volume: volumeId, operation: "follow" });
  reader.intervalMs = reader.pinned ? undefined : intervalMs;
  if (reader.intervalMs !== undefined) scheduleFetch(owner, volumeId, reader);
}

function scheduleFetch(owner: Owner, volumeId: string, reader: ReaderMount): void {
  reader.next = setTimeout(() => {
    reader.next = undefined;
    void owner.perVolume
      .run(volumeId, () => fetchAndSwitch(owner, volumeId, reader))
      // A switch or a record that failed must not end the process that serves every mount: the last commit stays served.
      .catch((err: Error) => owner.logger.error(`following failed; the mount keeps serving commit ${reader.commit}: ${err.message}`, { volume: volumeId, operation: "follow" }))
      .finally(() => {
        // A class change during the fetch scheduled the next one already; an unstage ended the reader.
        if (reader.next === undefined && reader.intervalMs !== undefined && owner.readers.get(volumeId) === reader) scheduleFetch(owner, volumeId, reader);
      });
  }, reader.intervalMs);
  reader.next.unref();
}

/**
 * One fetch of a following reader: a new commit is served at once, switched
 * at the mount's root; a fetch that fails keeps the last commit served (the
 * worker posts GitVolumeFetchFailed, and GitVolumeUpdated for a new commit).
 */
async function fetchAndSwitch(owner: Owner, volumeId: string, reader: ReaderMount): Promise<void> {
  const record = await owner.state.volume(volumeId);
  if (owner.readers.get(volumeId) !== reader || !record) return;
  const log = { volume: volumeId, claim: record.claim?.name, operation: "follow" };
  const checkout = await owner.link.checkoutReader(record, reader.credential, reader.treePath).catch((err: Error) => {
    owner.logger.warn(`the fetch failed; the mount keeps serving commit ${reader.commit}: ${err.message}`, log);
    return undefined;
  });
  if (!checkout || checkout.treePath === reader.treePath) return;
  reader.mount.switchRoot(checkout.treePath);
  owner.logger.info(`serves commit ${checkout.commit}, was ${reader.commit}`, { ...log, head: checkout.commit });
  Object.assign(reader, { treePath: checkout.treePath, commit: checkout.commit });
  await owner.state.recordStaged({ ...record, treePath: checkout.treePath });
}

/** A mount that could not be made read-only is not served at all: no write may be taken and dropped. */
async function readOnlyOrUnmounted(stagingPath: string, mount: StagedMount): Promise<void> {
  try {
    await remountReadOnly(stagingPath);
  } catch (err) {
    await mount.unmount();
    throw err;
  }
}

function continueStaged(volumeId: string, stagingPath: string, live: ReaderMount): mountOwner.StageVolumeResponse {
  if (live.stagingPath !== stagingPath) throw failedPrecondition(`volume ${volumeId} is staged at ${live.stagingPath} already; unstage it there first`);
  return {};
}

/** NodeUnstageVolume of a read-only volume: its mount and its checkouts go; there is nothing to push or release. */
export async function unstageReader(owner: Owner, request: mountOwner.UnstageVolumeRequest, volumeId: string): Promise<mountOwner.UnstageVolumeResponse> {
  const stagingPath = required(request.stagingPath, "staging_target_path");
  const record = (await owner.state.checkUnpublished(volumeId))!;
  const reader = owner.readers.get(volumeId);
  if (reader) follow(owner, volumeId, reader, undefined);
  await reader?.mount.unmount();
  await unmountAll(stagingPath);
  owner.readers.delete(volumeId);
  await owner.link.releaseReader(volumeId, record.source);
  await owner.state.recordUnstaged(volumeId);
  owner.logger.info("unstaged read-only", { volume: volumeId, operation: "unstage" });
  return {};
}

/** NodePublishVolume of a read-only volume: always a read-only bind, whatever the publish asked. */
export async function publishReader(owner: Owner, record: VolumeRecord, request: mountOwner.PublishVolumeRequest): Promise<mountOwner.PublishVolumeResponse> {
  const { volumeId } = record;
  const targetPath = required(request.targetPath, "target_path");
  checkMode(record, request.accessMode);
  const live = owner.readers.get(volumeId);
  if (!live || live.stagingPath !== request.stagingPath) throw failedPrecondition(`volume ${volumeId} is not staged at ${request.stagingPath}; stage it before publishing`);
  // The kubelet's republish brings a rotated Secret, and the Secret back to a restarted mount owner.
  live.credential = withMaterial(request.credential) ?? live.credential;
  if (record.targets.includes(targetPath) && (await isMountPoint(targetPath))) return {};
  await fs.mkdir(targetPath, { recursive: true });
  await bindMount(live.stagingPath, targetPath, true);
  const pods = { ...record.pods, ...(request.pod ? { [targetPath]: request.pod } : {}) };
  await owner.state.recordPublished(volumeId, targetPath, pods);
  owner.logger.info("published read-only", { volume: volumeId, operation: "publish", target: targetPath });
  return {};
}
