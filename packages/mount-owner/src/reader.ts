import * as fs from "node:fs/promises";
import * as path from "node:path";
import { parseClassParameters, readerKeyOf, readerRefOf } from "@git-csi/config";
import { failedPrecondition, type gitcsi, type mountOwner, required } from "@git-csi/protos";
import type { Owner, StagedMount } from "./context";
import type { EpochFence } from "./fuse/binding";
import { bindMount, isMountPoint, remountReadOnly, unmountAll } from "./mounts";
import { withMaterial } from "./sessions";
import type { StagedPaths } from "./resume";
import { plannedRecord } from "./stage";
import { checkIdentity, checkMode, type VolumeRecord } from "./state";

/**
 * A read-only volume's mount on this node, serving its group's checkout
 * read-only. It has no epoch, so nothing is claimed, renewed or released,
 * and any number of nodes serve the volume at once.
 */
export interface ReaderMount {
  stagingPath: string;
  mount: StagedMount;
  /** Its URL and ref (readerKeyOf): the group whose checkout it serves. */
  key: string;
  /** The stage's Secret, in memory only, for the fetches that follow the ref. */
  credential?: gitcsi.Credential;
  /** The class's follow.interval; unset, the volume asks for no fetch after its stage. */
  intervalMs?: number;
}

/**
 * The read-only volumes of one URL and ref on this node: one checked-out
 * commit serves every one of them, and one fetch per interval (the shortest
 * any of them asks for) moves them all, however many pods mount them.
 */
export interface ReaderGroup {
  key: string;
  /** The checked-out commit's directory every member's mount serves, and the commit. */
  treePath: string;
  commit: string;
  /** A tag or a commit: fetched at stage only, whatever the classes say. */
  pinned: boolean;
  /** The members, by volume id. */
  volumes: Set<string>;
  /** The interval the group follows at; unset, it does not fetch. */
  intervalMs?: number;
  /** The next fetch, while none runs. */
  next?: NodeJS.Timeout;
}

/** A kept connection of a read-only volume, served again after a restart: it has no epoch to check, and it follows as its class says. */
export async function resumeReader(owner: Owner, record: VolumeRecord, paths: StagedPaths, serve: (paths: StagedPaths, fence: EpochFence) => Promise<StagedMount>): Promise<true> {
  const { volumeId } = record;
  const { stagingPath } = paths;
  const key = keyOf(record.source!);
  const mount = await serve(paths, NO_EPOCH);
  // The group's checkout, when a member resumed before: a restart between a switch and its record leaves this one behind it.
  const group = owner.readerGroups.get(key) ?? newGroup(owner, key, paths.treePath, record.source);
  // A new server: it caches no entry either.
  mount.switchRoot(group.treePath);
  if (group.treePath !== paths.treePath) await owner.state.recordStaged({ ...record, treePath: group.treePath });
  // The Secret comes back with the kubelet's next publish; until then a private remote's fetch fails and says so.
  const reader: ReaderMount = { stagingPath, mount, key, intervalMs: followInterval(record.volumeClass) };
  join(owner, volumeId, reader, group);
  owner.logger.info("resumed read-only", { volume: volumeId, claim: record.claim?.name, operation: "fuse_resume", head: group.commit });
  return true;
}

/** A reader's mount serves until it is unmounted: no lease ends it. */
const NO_EPOCH = { serveUntilMs: Infinity, onFenced: () => undefined };

/** The key of a reader's URL and ref; the stage checked the ref before it got here. */
function keyOf(source: gitcsi.VolumeSource): string {
  return readerKeyOf(source.url, source.ref)!;
}

function newGroup(owner: Owner, key: string, treePath: string, source: gitcsi.VolumeSource | undefined): ReaderGroup {
  const group: ReaderGroup = { key, treePath, commit: path.basename(treePath), pinned: isPinned(source), volumes: new Set() };
  owner.readerGroups.set(key, group);
  return group;
}

/** NodeStageVolume of a read-only volume: the ref's commit checked out and served read-only at the staging path, with the other volumes of its URL and ref. */
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
  const key = keyOf(planned.source!);
  // The group's turn through the mount: no fetch of the group may remove the checkout this one is about to serve.
  const commit = await owner.perReaderGroup.run(key, async () => {
    const group = owner.readerGroups.get(key);
    const members = group ? await memberRecords(owner, group) : [];
    const checkout = await owner.link.checkoutReader(planned, credential, "", members);
    if (group) switchGroup(owner, group, checkout, members);
    await unmountAll(stagingPath);
    await fs.mkdir(stagingPath, { recursive: true });
    const mount = await owner.deps.mountTree(volumeId, checkout.treePath, stagingPath, NO_EPOCH);
    await readOnlyOrUnmounted(stagingPath, mount);
    // From the stage on the kernel caches no entry, so a class that makes it follow later finds none.
    mount.switchRoot(checkout.treePath);
    join(owner, volumeId, { stagingPath, mount, key, credential, intervalMs }, group ?? newGroup(owner, key, checkout.treePath, planned.source));
    await owner.state.recordStaged({ ...planned, treePath: checkout.treePath });
    return checkout.commit;
  });
  // Not awaited: the members' records wait for their own turns, which may wait for this volume's.
  void recordMoved(owner, key).catch((err: Error) => owner.logger.error(`recording the checkout the group serves failed: ${err.message}`, { volume: volumeId, operation: "stage" }));
  owner.logger.info("staged read-only", { volume: volumeId, claim: planned.claim?.name, operation: "stage", head: commit, followMs: intervalMs });
  return {};
}

/** The class's follow.interval; a bad class throws InvalidArgument naming the parameter, and nothing changes. */
function followInterval(volumeClass: gitcsi.VolumeClass | undefined): number | undefined {
  return volumeClass ? parseClassParameters(volumeClass.parameters).followMs : undefined;
}

/** A staged reader takes its class: its group follows at the shortest interval its members ask for from now on. */
export function setReaderClass(owner: Owner, volumeId: string, volumeClass: gitcsi.VolumeClass | undefined): void {
  const reader = owner.readers.get(volumeId);
  const group = reader && owner.readerGroups.get(reader.key);
  if (!reader || !group) return;
  reader.intervalMs = followInterval(volumeClass);
  logIgnored(owner, volumeId, reader, group);
  follow(owner, group);
}

/** A tag or a commit never moves, so a reader of one never fetches after its stage. */
function isPinned(source: gitcsi.VolumeSource | undefined): boolean {
  return readerRefOf(source?.ref ?? "")?.kind !== "branch";
}

/** One class may serve branches and pins: its interval is not a pin's mistake, and the log says it does nothing. */
function logIgnored(owner: Owner, volumeId: string, reader: ReaderMount, group: ReaderGroup): void {
  if (group.pinned && reader.intervalMs !== undefined)
    owner.logger.info("follow.interval is ignored: the volume's ref is a tag or a commit, which never moves", { volume: volumeId, operation: "follow" });
}

function join(owner: Owner, volumeId: string, reader: ReaderMount, group: ReaderGroup): void {
  owner.readers.set(volumeId, reader);
  group.volumes.add(volumeId);
  logIgnored(owner, volumeId, reader, group);
  follow(owner, group);
}

/** The shortest interval a member asks for; none for a pin or when none asks. */
function groupInterval(owner: Owner, group: ReaderGroup): number | undefined {
  const asked = [...group.volumes].map((id) => owner.readers.get(id)?.intervalMs).filter((ms): ms is number => ms !== undefined);
  return group.pinned || asked.length === 0 ? undefined : Math.min(...asked);
}

/** One fetch every interval, never two at once, for the whole group. */
function follow(owner: Owner, group: ReaderGroup): void {
  clearTimeout(group.next);
  group.next = undefined;
  group.intervalMs = groupInterval(owner, group);
  if (group.intervalMs !== undefined) scheduleFetch(owner, group);
}

function scheduleFetch(owner: Owner, group: ReaderGroup): void {
  group.next = setTimeout(() => {
    group.next = undefined;
    void owner.perReaderGroup
      .run(group.key, () => fetchAndSwitch(owner, group))
      .then(() => recordMoved(owner, group.key))
      // A switch or a record that failed must not end the process that serves every mount: the last commit stays served.
      .catch((err: Error) => {
        for (const volumeId of group.volumes) owner.logger.error(`following failed; the mount keeps serving commit ${group.commit}: ${err.message}`, { volume: volumeId, operation: "follow" });
      })
      .finally(() => {
        // A class change or a join during the fetch scheduled the next one already; the last unstage ended the group.
        if (group.next === undefined && group.intervalMs !== undefined && owner.readerGroups.get(group.key) === group) scheduleFetch(owner, group);
      });
  }, group.intervalMs);
  group.next.unref();
}

/** The members' records, each with the directory its mount serves: the group's. */
async function memberRecords(owner: Owner, group: ReaderGroup): Promise<VolumeRecord[]> {
  const records = await Promise.all([...group.volumes].map((id) => owner.state.volume(id)));
  return records.filter((r): r is VolumeRecord => r !== undefined).map((r) => ({ ...r, treePath: group.treePath }));
}

/**
 * One fetch of a following group: a new commit is served at once by every
 * member, switched at each mount's root; a fetch that fails keeps the last
 * commit served (the worker posts GitVolumeFetchFailed on each member, and
 * GitVolumeUpdated for a new commit).
 */
async function fetchAndSwitch(owner: Owner, group: ReaderGroup): Promise<void> {
  const members = await memberRecords(owner, group);
  if (owner.readerGroups.get(group.key) !== group || members.length === 0) return;
  const credential = members.map((r) => owner.readers.get(r.volumeId)?.credential).find((c) => c !== undefined);
  const [first, ...sharing] = members;
  const checkout = await owner.link.checkoutReader(first!, credential, group.treePath, sharing).catch((err: Error) => {
    for (const r of members) owner.logger.warn(`the fetch failed; the mount keeps serving commit ${group.commit}: ${err.message}`, { volume: r.volumeId, claim: r.claim?.name, operation: "follow" });
    return undefined;
  });
  if (checkout) switchGroup(owner, group, checkout, members);
}

/** Every member's mount serves the new checkout, switched at its root in one step each. */
function switchGroup(owner: Owner, group: ReaderGroup, checkout: { treePath: string; commit: string }, members: VolumeRecord[]): void {
  if (checkout.treePath === group.treePath) return;
  for (const r of members) {
    owner.readers.get(r.volumeId)?.mount.switchRoot(checkout.treePath);
    owner.logger.info(`serves commit ${checkout.commit}, was ${group.commit}`, { volume: r.volumeId, claim: r.claim?.name, operation: "follow", head: checkout.commit });
  }
  Object.assign(group, { treePath: checkout.treePath, commit: checkout.commit });
}

/** Each member's record names the checkout it serves, for a restart: written in the volume's own turn, after the group's. */
async function recordMoved(owner: Owner, key: string): Promise<void> {
  const group = owner.readerGroups.get(key);
  for (const volumeId of group?.volumes ?? []) {
    await owner.perVolume.run(volumeId, async () => {
      const record = await owner.state.volume(volumeId);
      if (record && group!.volumes.has(volumeId) && record.treePath !== group!.treePath) await owner.state.recordStaged({ ...record, treePath: group!.treePath });
    });
  }
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

/** NodeUnstageVolume of a read-only volume: its mount goes, and with the last volume of its URL and ref their checkouts; there is nothing to push or release. */
export async function unstageReader(owner: Owner, request: mountOwner.UnstageVolumeRequest, volumeId: string): Promise<mountOwner.UnstageVolumeResponse> {
  const stagingPath = required(request.stagingPath, "staging_target_path");
  const record = (await owner.state.checkUnpublished(volumeId))!;
  const reader = owner.readers.get(volumeId);
  const key = keyOf(record.source!);
  // In the group's turn: no switch reaches a mount going away, and a volume staged meanwhile finds the group, or none and a checkout of its own, never one half released.
  await owner.perReaderGroup.run(key, async () => {
    owner.readers.delete(volumeId);
    const last = leave(owner, volumeId, key);
    await reader?.mount.unmount();
    await unmountAll(stagingPath);
    await owner.link.releaseReader(volumeId, record.source!, last);
  });
  await owner.state.recordUnstaged(volumeId);
  owner.logger.info("unstaged read-only", { volume: volumeId, operation: "unstage" });
  return {};
}

/** The volume leaves its group; answers whether it was the last, which ends the group and its following. */
function leave(owner: Owner, volumeId: string, key: string): boolean {
  const group = owner.readerGroups.get(key);
  group?.volumes.delete(volumeId);
  if (group && group.volumes.size > 0) {
    follow(owner, group);
    return false;
  }
  clearTimeout(group?.next);
  owner.readerGroups.delete(key);
  return true;
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
