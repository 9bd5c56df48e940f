import type { SimpleGit } from "simple-git";
import { METADATA_REF } from "@git-csi/config";
import { ownerRef, strandedRef, UPSTREAM_METADATA, upstreamOwnerRef, upstreamRef, upstreamStrandedRef } from "../trees/store";
import { isAncestor, revParse } from "./tree";
import { gitMessage, runGit } from "./git";

export type FetchResult = "fetched" | "missing";

export class RemoteError extends Error {}

/** refs/git-csi/metadata as a glob: a remote without it is no error, and --prune drops the node's stale view. */
const METADATA_REFSPEC = `+${METADATA_REF}*:${UPSTREAM_METADATA}*`;

/**
 * Fetches a branch into the node's view of it; "missing" when the remote has
 * no such branch. With metadata, refs/git-csi/metadata comes in the same
 * fetch: one round trip.
 */
export async function fetchBranch(repo: SimpleGit, branch: string, withMetadata = false): Promise<FetchResult> {
  try {
    await fetch(repo, [`+refs/heads/${branch}:${upstreamRef(branch)}`, ...(withMetadata ? [METADATA_REFSPEC] : [])]);
    return "fetched";
  } catch (err) {
    const message = gitMessage(err);
    if (/couldn't find remote ref/i.test(message)) {
      // The branch is gone upstream: so is what the node knew of it.
      await runGit(repo, ["update-ref", "-d", upstreamRef(branch)]).catch(() => undefined);
      return "missing";
    }
    throw new RemoteError(`fetch of ${branch} failed: ${message}`);
  }
}

/** The volume's stranded refs on the remote, ref → commit, fetched into the node's view of them (none is no error). */
export async function fetchStranded(repo: SimpleGit, volumeId: string): Promise<Map<string, string>> {
  const view = upstreamStrandedRef(volumeId);
  await fetch(repo, [`+${strandedRef(volumeId)}*:${view}*`]).catch((err: unknown) => {
    throw new RemoteError(`fetch of ${strandedRef(volumeId)}* failed: ${gitMessage(err)}`);
  });
  const listed = (await runGit(repo, ["for-each-ref", "--format=%(objectname) %(refname)", view])).split("\n").filter(Boolean);
  return new Map(listed.map((line) => line.split(" ") as [string, string]).map(([oid, ref]) => [strandedRef(volumeId, ref.slice(view.length)), oid]));
}

/** A lost epoch's commit to its stranded ref: no lease, since it moves no data branch; the same commit again is no change. */
export async function pushStranded(repo: SimpleGit, volumeId: string, commit: string): Promise<void> {
  await runGit(repo, ["push", "--quiet", "origin", `${commit}:${strandedRef(volumeId, commit)}`]).catch((err: unknown) => {
    throw new RemoteError(`the push of ${strandedRef(volumeId, commit)} failed: ${gitMessage(err)}`);
  });
}

/** Fetches refs/git-csi/metadata; "" when the remote has none yet. */
export async function fetchMetadata(repo: SimpleGit): Promise<string> {
  await fetch(repo, [METADATA_REFSPEC]).catch((err: unknown) => {
    throw new RemoteError(`fetch of ${METADATA_REF} failed: ${gitMessage(err)}`);
  });
  return revParse(repo, UPSTREAM_METADATA);
}

function fetch(repo: SimpleGit, refspecs: string[]): Promise<string> {
  return runGit(repo, ["fetch", "--quiet", "--prune", "--no-tags", "--no-write-fetch-head", "origin", ...refspecs]);
}

/**
 * git's words for a compare-and-swap that lost: refused by the client from
 * its view, or by the server, which found the ref moved since (a race the
 * client could not see: "cannot lock ref … is at X but expected Y", or, for
 * a ref the push creates, "reference already exists": two volumes making the
 * repository's first refs/git-csi/metadata at once).
 */
const REF_MOVED = /\[rejected\]|non-fast-forward|fetch first|\(stale info\)|atomic push failed|cannot lock ref '[^']+': (is at [0-9a-f]+ but expected|reference already exists)/;

export type PushResult = { outcome: "pushed" } | { outcome: "rejected"; message: string } | { outcome: "failed"; message: string };

/**
 * One ref's compare-and-swap in a push: it moves from `expected` ("" for a
 * ref that must not exist) to `next` ("" deletes it). `seen` is the node's
 * view of the ref, which takes `next` once it landed; an owner ref has none,
 * its MountLease keeps what it wrote.
 */
export interface RefUpdate {
  ref: string;
  expected: string;
  next: string;
  seen?: string;
}

/**
 * What goes with every push of a volume: the owner ref's renewal (spec 000's
 * fencing; the push is atomic, so it lands only while the ref still holds the
 * record the pusher last wrote), and the deletion of the staging refs its
 * objects went ahead to.
 */
export type Fence = RefUpdate[];

/** Over this many bytes to send, a push sends its objects ahead of the fenced update. */
export const STAGE_BYTES = 1024 * 1024;

/** Where a volume's objects wait on the remote between the push that sends them and the fenced push that uses them. */
export function stagingRef(volumeId: string, n: number): string {
  return `refs/git-csi/staging/${volumeId}/${n}`;
}

/**
 * Sends the objects of these commits the remote lacks (by the node's view of
 * it) to the volume's staging refs, unfenced, when they are more than
 * STAGE_BYTES: staging refs are no data, so a stale epoch writing them lands
 * nothing. Answers the staging refs' deletions, each a compare-and-swap, for
 * the fenced push to carry: they go with it or not at all.
 */
export async function stageObjects(repo: SimpleGit, volumeId: string, changes: RefChange[]): Promise<RefUpdate[] | PushResult> {
  if (changes.length === 0) return [];
  const commits = changes.map((c) => c.commit);
  // Against what the node saw of the refs these commits go to: the walk stays with the change.
  const unsent = await runGit(repo, ["rev-list", "--objects", "--disk-usage", "--ignore-missing", ...commits, "--not", ...changes.map((c) => c.seen)]);
  if (Number(unsent.trim()) <= STAGE_BYTES) return [];
  try {
    await runGit(repo, ["push", "--porcelain", "--force", "origin", ...commits.map((c, n) => `${c}:${stagingRef(volumeId, n)}`)]);
  } catch (err) {
    return { outcome: "failed", message: `sending the objects ahead failed: ${gitMessage(err)}` };
  }
  return commits.map((c, n) => ({ ref: stagingRef(volumeId, n), expected: c, next: "" }));
}

/**
 * Pushes the updates in one atomic push, each a compare-and-swap. A ref that
 * moved or was deleted upstream is never overwritten or silently made again:
 * that is "rejected", and a fetch tells which. "failed" is anything else,
 * such as a refused credential. On success each `seen` takes its new value.
 */
export async function pushUpdates(repo: SimpleGit, updates: RefUpdate[]): Promise<PushResult> {
  const leases = updates.map((u) => `--force-with-lease=${u.ref}:${u.expected}`);
  const refspecs = updates.map((u) => `${u.next}:${u.ref}`);
  // A push moves the tracking ref its remote's fetch refspecs map a pushed ref to: git updates each `seen` in the same process.
  const tracking = updates.flatMap((u) => (u.seen ? ["-c", `remote.origin.fetch=+${u.ref}:${u.seen}`] : []));
  try {
    await runGit(repo, [...tracking, "push", "--porcelain", ...(updates.length > 1 ? ["--atomic"] : []), ...leases, "origin", ...refspecs]);
  } catch (err) {
    const message = gitMessage(err);
    if (REF_MOVED.test(message)) return { outcome: "rejected", message };
    return { outcome: "failed", message };
  }
  return { outcome: "pushed" };
}

/** A ref as last read on the remote: its deletion is a compare-and-swap from that oid. */
export interface ReadRef {
  ref: string;
  expected: string;
}

/** A line of `git push --porcelain`: flag, `from:to`, summary; "-" is a deleted ref. */
const PORCELAIN_LINE = /^(.)\t[^\t]*:(refs\/[^\t]+)\t/gm;

/**
 * Deletes refs in one push, each its own compare-and-swap and none bound to
 * another (not atomic): a ref that moved since it was read stays, the others
 * go. Answers the refs deleted and the refs kept; throws RemoteError when the
 * push failed as a whole (the remote did not answer, or refused the credential).
 */
export async function deleteRefs(repo: SimpleGit, refs: ReadRef[]): Promise<{ deleted: string[]; kept: string[] }> {
  const leases = refs.map((r) => `--force-with-lease=${r.ref}:${r.expected}`);
  // A push that kept some refs fails, and git's words then hold the porcelain lines.
  const report = await runGit(repo, ["push", "--porcelain", ...leases, "origin", ...refs.map((r) => `:${r.ref}`)]).catch((err: unknown) => gitMessage(err));
  const outcomes = new Map([...report.matchAll(PORCELAIN_LINE)].map((m) => [m[2]!, m[1] === "-"]));
  if (outcomes.size === 0) throw new RemoteError(`deleting ${refs.length} ref(s) failed: ${report.trim()}`);
  return { deleted: refs.filter((r) => outcomes.get(r.ref) === true).map((r) => r.ref), kept: refs.filter((r) => outcomes.get(r.ref) !== true).map((r) => r.ref) };
}

/**
 * A commit for a ref, pushed as a compare-and-swap from `seen`: the node's
 * ref holding its last view of `ref`. `base`, when given, is what the
 * compare-and-swap expects instead, a commit `commit` contains (where `seen`
 * stood when the caller made `commit` on top of it): nobody asks git for
 * either again, and a ref that moved from it is refused by the remote.
 */
export interface RefChange {
  ref: string;
  seen: string;
  commit: string;
  base?: string;
}

export function branchChange(commit: string, branch: string, base?: string): RefChange {
  return { ref: `refs/heads/${branch}`, seen: upstreamRef(branch), commit, ...(base === undefined ? {} : { base }) };
}

export function metadataChange(commit: string, base: string): RefChange {
  return { ref: METADATA_REF, seen: UPSTREAM_METADATA, commit, base };
}

/**
 * Pushes commits to refs in one atomic push with the volume's fence, each a
 * compare-and-swap from the commit the node last saw there.
 */
export async function pushChanges(repo: SimpleGit, changes: RefChange[], fence: Fence): Promise<PushResult> {
  const updates: RefUpdate[] = [];
  for (const change of changes) {
    const expected = await expectedAt(repo, change);
    if (typeof expected !== "string") return expected;
    updates.push({ ref: change.ref, expected, next: change.commit, seen: change.seen });
  }
  return pushUpdates(repo, [...updates, ...fence]);
}

/**
 * What a change's compare-and-swap expects: the node's view of its ref, which
 * the commit must contain. The lease alone would let a push replace commits
 * it does not contain: volumes of one URL share the node's view of the
 * remote, so another volume's push moves it. Only a commit that descends
 * from what the remote holds is ever sent; anything else rebases first.
 */
async function expectedAt(repo: SimpleGit, { ref, seen, commit, base }: RefChange): Promise<string | PushResult> {
  if (base !== undefined) return base;
  // The common case in one process: the view, listed only when commit contains it.
  const listed = await runGit(repo, ["for-each-ref", `--merged=${commit}`, "--format=%(objectname) %(refname)", seen]);
  const contained = listed.split("\n").find((line) => line.endsWith(` ${seen}`));
  if (contained !== undefined) return contained.split(" ")[0]!;
  const expected = await revParse(repo, seen);
  if (expected !== "" && !(await isAncestor(repo, expected, commit))) {
    return { outcome: "rejected", message: `${ref} holds ${expected.slice(0, 12)}, which ${commit.slice(0, 12)} does not contain` };
  }
  return expected;
}

export function pushCommit(repo: SimpleGit, commit: string, branch: string, fence: Fence): Promise<PushResult> {
  return pushChanges(repo, [branchChange(commit, branch)], fence);
}

/**
 * Fetches the volume's owner ref into the node's view of it; "" when the
 * remote has none.
 */
export function fetchOwner(repo: SimpleGit, volumeId: string): Promise<string> {
  return fetchRef(repo, ownerRef(volumeId), upstreamOwnerRef(volumeId));
}

/** Fetches one remote ref into `seen`; "" when the remote has none, and then `seen` goes too. */
export async function fetchRef(repo: SimpleGit, ref: string, seen: string): Promise<string> {
  try {
    await fetch(repo, [`+${ref}:${seen}`]);
  } catch (err) {
    const message = gitMessage(err);
    if (!/couldn't find remote ref/i.test(message)) throw new RemoteError(`fetch of ${ref} failed: ${message}`);
    await runGit(repo, ["update-ref", "-d", seen]).catch(() => undefined);
  }
  return revParse(repo, seen);
}

/**
 * Where the remote's owner refs of these volumes are now, and their records
 * fetched into the node's views: one ls-remote, then one fetch of the refs
 * that exist (a fetch of one missing ref would fail them all). "" for none.
 */
export async function fetchOwners(repo: SimpleGit, volumeIds: string[]): Promise<Map<string, string>> {
  const listed = await runGit(repo, ["ls-remote", "origin", ...volumeIds.map(ownerRef)]).catch((err: unknown) => {
    throw new RemoteError(`ls-remote of the owner refs failed: ${gitMessage(err)}`);
  });
  const oids = new Map<string, string>(volumeIds.map((id) => [id, ""]));
  for (const line of listed.split("\n")) {
    const [oid, ref] = line.split("\t");
    const id = volumeIds.find((v) => ownerRef(v) === ref);
    if (id !== undefined && oid) oids.set(id, oid);
  }
  const present = volumeIds.filter((id) => oids.get(id) !== "");
  if (present.length > 0) {
    await fetch(
      repo,
      present.map((id) => `+${ownerRef(id)}:${upstreamOwnerRef(id)}`),
    ).catch((err: unknown) => {
      throw new RemoteError(`fetch of the owner refs failed: ${gitMessage(err)}`);
    });
    // A ref may have moved again between the listing and the fetch: the fetched record is the one to decide on.
    for (const id of present) oids.set(id, await revParse(repo, upstreamOwnerRef(id)));
  }
  return oids;
}

/** Deletes a branch the node last saw on the remote, with the volume's fence. */
export async function deleteBranch(repo: SimpleGit, branch: string, fence: Fence): Promise<PushResult> {
  const seen = upstreamRef(branch);
  const expected = await revParse(repo, seen);
  if (expected === "") return { outcome: "pushed" };
  return pushUpdates(repo, [{ ref: `refs/heads/${branch}`, expected, next: "", seen }, ...fence]);
}
