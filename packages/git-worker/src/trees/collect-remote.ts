import * as fs from "node:fs/promises";
import * as path from "node:path";
import { formatDuration, orAbsent } from "@git-csi/config";
import type { Logger } from "@git-csi/logging";
import type { SimpleGit } from "simple-git";
import type { OnRemote, OwnerWatch } from "../lease/lease";
import type { EventSink } from "../sync/volume";
import { mayHold, type OwnerRecord, parseRecord, pastRetention, RecordError } from "../lease/ownership";
import { deleteRefs, type ReadRef, RemoteError } from "../remote/remote";
import { ownerRef, type Store } from "./store";
import { gitMessage, runGit } from "../remote/git";

/**
 * The remote's side of the collection: the driver's refs on a remote that no
 * epoch needs any more. Staging refs a push left, and owner refs of volumes
 * deleted, or released and not staged again for a retention. Whether an
 * epoch may still use them is judged as a claim judges it, by how long this
 * node watched the owner ref unchanged on its own monotonic clock, never by
 * the record's times. Every deletion is a compare-and-swap from the oid read,
 * so a claim or a push that races in keeps its ref.
 */

/** How the collection reaches a URL's remote: with the credential of a volume staged here, the only credential the node holds. */
export interface RemoteReach {
  remote: OnRemote;
  /** The mount epoch of each volume of the URL this worker serves: their pushes wait while the collection holds the repository. */
  served: Map<string, string>;
}

export interface CollectionPolicy {
  /** The remote of a URL, when a volume of it is staged here with its credential. */
  reach(url: string): RemoteReach | undefined;
  /** How long an owner ref stays once no epoch holds it (the chart's node.ownerRefRetention). */
  ownerRefRetentionMs: number;
  /** What this worker watched of the owner refs: the claims' own watch. */
  watch: OwnerWatch;
  /** How kept trees of unstaged volumes send their commits to stranded refs; none strands nothing. */
  strand?: StrandPolicy;
}

export interface StrandPolicy {
  /** True while a stage of the volume serves it on this node, or its unstage is under way: its own sync pushes its commits. */
  staged(volumeId: string): boolean;
  /** A URL's remote reached with no credential, for a kept tree whose stage carried none. */
  anonymous(url: string): OnRemote;
  /** Where a stranded kept tree is told of, on its claim; none outside a cluster. */
  events?: EventSink;
}

/** What the remote holds of one volume: its owner ref with the record it read (none when it is not one), its staging refs. */
interface RemoteVolume {
  owner?: ReadRef & { record?: OwnerRecord };
  staging: ReadRef[];
}

/** A ref the collection deletes, and why, for the log. */
interface Doomed extends ReadRef {
  volumeId: string;
  why: string;
}

interface CollectionRules {
  retentionMs: number;
  served: Map<string, string>;
  watch: OwnerWatch;
  /** Volumes whose tree this node removed (DeleteVolume), and the owner ref's oid the first collection after saw. */
  deleted: Map<string, string>;
}

/**
 * The refs to delete. A volume whose owner ref holds no record the worker can
 * read keeps everything: the ref is not the driver's. Staging refs go unless
 * the record names an epoch that may still hold the volume (unreleased and
 * not watched unchanged for a lease) which this worker does not serve: only
 * that epoch's push could still use them. An owner ref goes once no epoch
 * may hold it, when it is still the one seen after the volume was deleted or
 * when it is past the retention.
 */
function refsToCollect(volumes: Map<string, RemoteVolume>, rules: CollectionRules): Doomed[] {
  const doomed: Doomed[] = [];
  for (const [volumeId, { owner, staging }] of volumes) {
    const record = owner?.record;
    if (owner && !record) continue;
    const watchedMs = owner ? rules.watch.watched(volumeId, owner.expected) : 0;
    const held = record !== undefined && mayHold(record, watchedMs);
    if (!held || rules.served.get(volumeId) === record?.epoch) {
      doomed.push(...staging.map((s) => ({ ...s, volumeId, why: "no push uses it: its push is over, or was cut short" })));
    }
    if (owner === undefined || record === undefined || held) continue;
    if (rules.deleted.get(volumeId) === owner.expected) doomed.push({ ...owner, volumeId, why: "the volume was deleted" });
    else if (pastRetention(record, watchedMs, rules.retentionMs)) {
      doomed.push({ ...owner, volumeId, why: `no mount epoch held the volume for ${formatDuration(rules.retentionMs)}` });
    }
  }
  return doomed;
}

const OWNER_PREFIX = ownerRef("");
const STAGING = /^refs\/git-csi\/staging\/([^/]+)\/\d+$/;
/** Where the collection fetches the owner refs to read their records; the node's collection deletes them after. */
export const COLLECTED_OWNERS = "refs/git-csi/collect/owner/";

/** The driver's volumes on the remote: one fetch of every owner ref, one listing of the staging refs. */
async function readRemoteVolumes(repo: SimpleGit): Promise<Map<string, RemoteVolume>> {
  const volumes = new Map<string, RemoteVolume>();
  const volume = (id: string) => volumes.get(id) ?? volumes.set(id, { staging: [] }).get(id)!;
  try {
    await runGit(repo, ["fetch", "--quiet", "--prune", "--no-tags", "--no-write-fetch-head", "origin", `+${OWNER_PREFIX}*:${COLLECTED_OWNERS}*`]);
    for (const line of (await runGit(repo, ["ls-remote", "origin", "refs/git-csi/staging/*"])).split("\n")) {
      const [oid, ref] = line.split("\t");
      const id = ref && STAGING.exec(ref)?.[1];
      if (id) volume(id).staging.push({ ref, expected: oid! });
    }
  } catch (err) {
    throw new RemoteError(`reading the driver's refs failed: ${gitMessage(err)}`);
  }
  const listed = await runGit(repo, ["for-each-ref", "--format=%(objectname) %(refname)%00%(contents)%00", COLLECTED_OWNERS]);
  for (const entry of listed.split("\0\n").filter(Boolean)) {
    const [head, message] = entry.split("\0") as [string, string];
    const [oid, local] = head.split(" ") as [string, string];
    const id = local.slice(COLLECTED_OWNERS.length);
    volume(id).owner = { ref: ownerRef(id), expected: oid, record: recordOrNone(message) };
  }
  return volumes;
}

function recordOrNone(message: string): OwnerRecord | undefined {
  try {
    return parseRecord(message);
  } catch (err) {
    if (err instanceof RecordError) return undefined;
    throw err;
  }
}

/**
 * Collects the driver's refs on one URL's remote, when a volume staged here
 * reaches it; each deletion is logged. A remote that does not answer is
 * logged, and the next collection tries again.
 */
export async function collectRemote(store: Store, url: string, policy: CollectionPolicy, deletions: Deletions, logger: Logger): Promise<void> {
  const reach = policy.reach(url);
  if (!reach) return;
  try {
    const volumes = await reach.remote((repo) => readRemoteVolumes(repo));
    const deleted = await noteOwners(store, url, deletions, volumes);
    for (const [volumeId, v] of volumes) {
      if (v.owner && !v.owner.record) logger.warn(`${v.owner.ref} on the remote holds no owner record; the collection leaves the volume's refs`, { volume: volumeId, operation: "gc" });
    }
    const doomed = refsToCollect(volumes, { retentionMs: policy.ownerRefRetentionMs, served: reach.served, watch: policy.watch, deleted });
    const outcome = doomed.length === 0 ? { deleted: [], kept: [] } : await reach.remote((repo) => deleteRefs(repo, doomed));
    for (const d of doomed) {
      const gone = outcome.deleted.includes(d.ref);
      logger.log(gone ? "info" : "warn", gone ? `deleted ${d.ref} on the remote: ${d.why}` : `kept ${d.ref}: it moved since the collection read it`, {
        volume: d.volumeId,
        operation: "gc",
        ref: d.ref,
      });
    }
    for (const [volumeId, noted] of deleted) if (settled(volumes.get(volumeId), noted, outcome.deleted)) await forgetDeleted(store, volumeId);
  } catch (err) {
    if (!(err instanceof RemoteError)) throw err;
    logger.warn(`the driver's refs on the remote stay until the next collection: ${err.message}`, { operation: "gc" });
  }
}

/**
 * The owner ref's oid each of the URL's deleted volumes had when a collection
 * first read it after the deletion ("" for none), noted in the deletion's
 * record: a later record (the volume staged again) is told by its oid, never
 * by comparing the time another node wrote in it with this node's clock.
 */
async function noteOwners(store: Store, url: string, deletions: Deletions, volumes: Map<string, RemoteVolume>): Promise<Map<string, string>> {
  const noted = new Map<string, string>();
  for (const [volumeId, d] of deletions) {
    if (d.url !== url) continue;
    if (d.owner === undefined) {
      d.owner = volumes.get(volumeId)?.owner?.expected ?? "";
      await writeDeletion(store, volumeId, d);
    }
    noted.set(volumeId, d.owner);
  }
  return noted;
}

/** A deleted volume's owner ref needs nothing more once it is gone, or moved from the one noted after the deletion (the volume was staged again). */
function settled(volume: RemoteVolume | undefined, noted: string, gone: string[]): boolean {
  const owner = volume?.owner;
  return owner === undefined || gone.includes(owner.ref) || owner.expected !== noted;
}

/** A volume whose tree the node removed, until the remote's owner ref of it goes. */
interface DeletedVolume {
  url: string;
  /** This node's wall clock at the deletion: only this node's own clock reads it, to forget the deletion. */
  deletedAt: number;
  /** The owner ref's oid the first collection after the deletion read ("" for none). */
  owner?: string;
}

/** The deleted volumes the node remembers, by volume id. */
export type Deletions = Map<string, DeletedVolume>;

function deletedDir(store: Store): string {
  return path.join(store.stateDir, "deleted-owner-refs");
}

function deletedFile(store: Store, volumeId: string): string {
  return path.join(deletedDir(store), `${volumeId}.json`);
}

/** Remembers that the volume was deleted: the next collection that reaches its remote deletes its owner ref. */
export function rememberDeleted(store: Store, volumeId: string, url: string): Promise<void> {
  return writeDeletion(store, volumeId, { url, deletedAt: Date.now() });
}

async function writeDeletion(store: Store, volumeId: string, record: DeletedVolume): Promise<void> {
  const file = deletedFile(store, volumeId);
  await fs.mkdir(deletedDir(store), { recursive: true });
  // Whole or absent: a crash never leaves a record the collection cannot read.
  await fs.writeFile(`${file}.tmp`, `${JSON.stringify(record)}\n`);
  await fs.rename(`${file}.tmp`, file);
}

/** The deletions the node remembers; a record that cannot be read is logged and left for an operator. */
export async function readDeletions(store: Store, logger: Logger): Promise<Deletions> {
  const dir = deletedDir(store);
  const out: Deletions = new Map();
  for (const name of (await orAbsent(fs.readdir(dir))) ?? []) {
    if (!name.endsWith(".json")) continue;
    const file = path.join(dir, name);
    try {
      out.set(name.slice(0, -".json".length), JSON.parse(await fs.readFile(file, "utf8")) as DeletedVolume);
    } catch (err) {
      logger.warn(`${file} cannot be read (${(err as Error).message}); remove it, and the volume's owner ref goes once it is past the retention`, { operation: "gc" });
    }
  }
  return out;
}

function forgetDeleted(store: Store, volumeId: string): Promise<void> {
  return fs.rm(deletedFile(store, volumeId), { force: true });
}

/**
 * Forgets deletions older than the retention, by this node's wall clock
 * against the time it wrote itself (the record outlives the process, which a
 * monotonic reading does not): a step of that clock forgets a deletion early
 * or late, and decides no more than whether the owner ref goes now or once a
 * node watched it unchanged for the retention.
 */
export async function expireDeletions(store: Store, deletions: Deletions, now: number, retentionMs: number): Promise<void> {
  for (const [volumeId, d] of deletions) if (now >= d.deletedAt + retentionMs) await forgetDeleted(store, volumeId);
}
