import * as fs from "node:fs/promises";
import * as os from "node:os";
import * as path from "node:path";
import { status } from "@grpc/grpc-js";
import { defaultPolicy, METADATA_REF, sideBranchOf } from "@git-csi/config";
import { alreadyExists, CsiError, failedPrecondition, type gitWorker, notFound, required, unavailable } from "@git-csi/protos";
import type { SimpleGit } from "simple-git";
import { RecordError, parseRecord } from "../lease/ownership";
import { branchTreeName } from "../metadata/format";
import { writeObjects } from "../metadata/plumbing";
import { converse, runGit } from "../remote/git";
import { deleteRefs, fetchBranch, fetchMetadata, fetchOwner, fetchRef, pushUpdates, type ReadRef, RemoteError, type RefUpdate } from "../remote/remote";
import { revParse } from "../remote/tree";
import type { GitWorkerDeps } from "../service";
import { branchRequestOf, onRemote } from "./branches";
import { branchOfRef, flushedRef, snapshotRef, UPSTREAM_PREFIX, upstreamFlushedRef, upstreamRef, upstreamSnapshotRef } from "./store";

/** A volume's content at one moment: the commit the remote holds for it, and the metadata commit that lists its modes, owners and empty directories. */
export interface VolumePoint {
  data: string;
  /** refs/git-csi/metadata's commit of the moment; "" when the remote has none. */
  metadata: string;
  /** The branch the metadata lists the data under: the volume's ref, never its side branch. */
  branch: string;
  /** The flushed marker the point was read from: it goes in the push that uses the point. */
  marker?: RefUpdate;
}

/** No point yet: a node holds the volume and has not pushed the flushed marker for this request. */
export interface Held {
  heldBy: string;
}

/**
 * MakeSnapshot: refs/git-csi/snapshots/<id> at a commit with the volume's
 * tree whose parents are its pushed commit and the metadata commit, unless
 * the ref exists. The push is a compare-and-swap from "absent", so two
 * controllers making one snapshot agree on the first one's.
 */
export async function makeSnapshot(deps: GitWorkerDeps, request: gitWorker.MakeSnapshotRequest): Promise<gitWorker.MakeSnapshotResponse> {
  const snapshotId = required(request.snapshotId, "snapshot_id");
  const { volumeId, source, branch } = branchRequestOf(request);
  return onRemote(deps, volumeId, source, request.credential, async (repo) => {
    const existing = await onUrl(source.url, fetchSnapshot(repo, snapshotId));
    if (existing !== "") return describeSnapshot(repo, snapshotId, existing, volumeId);
    const point = await volumePoint(repo, source.url, volumeId, branch, snapshotId);
    if ("heldBy" in point) return { commit: "", dataCommit: "", sizeBytes: 0, creationTimeUnixMs: 0, heldBy: point.heldBy };
    const tag = request.tag === "" ? undefined : await tagUpdate(repo, source.url, request.tag, snapshotId, volumeId, point);
    const commit = await snapshotCommit(repo, snapshotId, volumeId, point, tag?.ref);
    const pushed = await pushUpdates(repo, [{ ref: snapshotRef(snapshotId), expected: "", next: commit }, ...(tag ? [tag] : []), ...markerDeletion(point)]);
    if (pushed.outcome !== "pushed") {
      const raced = pushed.outcome === "rejected" ? await onUrl(source.url, fetchSnapshot(repo, snapshotId)) : "";
      if (raced !== "") return describeSnapshot(repo, snapshotId, raced, volumeId);
      throw unavailable(`pushing ${snapshotRef(snapshotId)} to ${source.url} failed: ${pushed.message}`);
    }
    deps.logger.info(`made ${snapshotRef(snapshotId)} at ${point.data.slice(0, 12)}`, { volume: volumeId, snapshot: snapshotId, operation: "create_snapshot" });
    return describeSnapshot(repo, snapshotId, commit, volumeId);
  });
}

/**
 * RemoveSnapshot: the ref goes, a compare-and-swap from what the fetch saw,
 * and its tag with it while the tag is still the one the snapshot made; an
 * absent one is no error.
 */
export async function removeSnapshot(deps: GitWorkerDeps, request: gitWorker.RemoveSnapshotRequest): Promise<gitWorker.RemoveSnapshotResponse> {
  const snapshotId = required(request.snapshotId, "snapshot_id");
  const source = required(request.source, "source");
  return onRemote(deps, `snapshot-${snapshotId}`, source, request.credential, async (repo) => {
    const expected = await onUrl(source.url, fetchSnapshot(repo, snapshotId));
    if (expected === "") return { deleted: false };
    const tag = await madeTag(repo, source.url, snapshotId, expected);
    const { kept } = await onUrl(source.url, deleteRefs(repo, [{ ref: snapshotRef(snapshotId), expected }, ...(tag ? [tag] : [])]));
    if (kept.includes(snapshotRef(snapshotId))) throw new CsiError(status.ABORTED, `${snapshotRef(snapshotId)} moved in ${source.url} while it was deleted; DeleteSnapshot is retried`);
    deps.logger.info(`deleted ${snapshotRef(snapshotId)}`, { snapshot: snapshotId, operation: "delete_snapshot" });
    return { deleted: true };
  });
}

/**
 * Where a restore or a clone starts: a snapshot's point as its commit records
 * it, or the source volume's point for the clone `volumeId`.
 */
export async function startPoint(repo: SimpleGit, url: string, start: gitWorker.BranchStart, volumeId: string): Promise<VolumePoint | Held> {
  if (start.snapshotId === "") return volumePoint(repo, url, required(start.volumeId, "start.volume_id"), branchOfRef(start.ref), volumeId);
  const commit = await onUrl(url, fetchSnapshot(repo, start.snapshotId));
  if (commit === "") throw notFound(`volume_content_source.snapshot ${start.snapshotId}: ${snapshotRef(start.snapshotId)} is not in ${url}`);
  return pointOf(await snapshotMessage(repo, commit));
}

/**
 * The ref updates that list the new branch in refs/git-csi/metadata as the
 * point's branch was listed, so the stage replays its modes, owners and empty
 * directories: a compare-and-swap from the metadata commit the remote holds
 * now. None when the listing would not change.
 */
export async function metadataUpdates(repo: SimpleGit, gitDir: string, branch: string, point: VolumePoint): Promise<RefUpdate[]> {
  const current = await fetchMetadata(repo);
  const named = branchTreeName(branch);
  const listing = point.metadata === "" ? "" : await runGit(repo, ["ls-tree", point.metadata, "--", branchTreeName(point.branch)]);
  // Branch names hold no whitespace or quotes (git's ref rules), so ls-tree's lines need no -z.
  const entries = current === "" ? [] : (await runGit(repo, ["ls-tree", current])).split("\n").filter(Boolean);
  const others = entries.filter((e) => e.split("\t")[1] !== named);
  const wanted = listing === "" ? others : [...others, `${listing.split("\t")[0]}\t${named}`];
  if (wanted.length === entries.length && wanted.every((e) => entries.includes(e))) return [];
  const tree = await converse({ cwd: gitDir, env: { GIT_DIR: gitDir }, config: [] }, ["mktree", "--batch"], async (io) => {
    io.write(`${wanted.join("\n")}\n\n`);
    return io.line();
  });
  const message = `git.liken.sh: ${branch} starts with the modes, owners and empty directories of ${point.branch} at ${point.data.slice(0, 12)}`;
  const commit = await commitTree(repo, tree.trim(), current === "" ? [] : [current], message);
  return [{ ref: METADATA_REF, expected: current, next: commit }];
}

/** The marker's deletion, a compare-and-swap from where it was read, for the push that used it. */
export function markerDeletion(point: VolumePoint): RefUpdate[] {
  return point.marker ? [point.marker] : [];
}

/** The node whose mount epoch holds the volume, "" when none does: a holder may have writes the remote lacks. */
async function holderOf(repo: SimpleGit, url: string, volumeId: string): Promise<string> {
  const oid = await onUrl(url, fetchOwner(repo, volumeId));
  if (oid === "") return "";
  let record;
  try {
    record = parseRecord(await runGit(repo, ["show", "-s", "--format=%B", oid]));
  } catch (err) {
    if (err instanceof RecordError) throw failedPrecondition(`refs/git-csi/owner/${volumeId} in ${url} is no owner record (${err.message})`);
    throw err;
  }
  return record.released ? "" : record.node;
}

/**
 * The volume's point for the request (a snapshot's id, a clone's volume id):
 * the commit its node's flush for the request pushed, when the flushed marker
 * is there; else, while no epoch holds the volume, its side branch while it
 * has one (it holds what the branch refused), else its branch. Held while a
 * node serves it and has not flushed for the request.
 */
async function volumePoint(repo: SimpleGit, url: string, volumeId: string, branch: string, requestId: string): Promise<VolumePoint | Held> {
  const flushed = flushedRef(volumeId, requestId);
  const marked = await onUrl(url, fetchRef(repo, flushed, upstreamFlushedRef(volumeId, requestId)));
  if (marked !== "") return { data: marked, metadata: await onUrl(url, fetchMetadata(repo)), branch, marker: { ref: flushed, expected: marked, next: "" } };
  const heldBy = await holderOf(repo, url, volumeId);
  if (heldBy !== "") return { heldBy };
  const side = sideBranchOf(branch, volumeId);
  const pushed = (await onUrl(url, fetchBranch(repo, side))) === "fetched" ? side : branch;
  if (pushed === branch && (await onUrl(url, fetchBranch(repo, branch))) === "missing") throw failedPrecondition(`volume ${volumeId}'s branch ${branch} is not in ${url}`);
  const metadata = await onUrl(url, fetchMetadata(repo));
  return { data: await revParse(repo, upstreamRef(pushed)), metadata, branch };
}

/** The snapshot's commit: the volume's tree, so a person checks it out as it was; its trailers say what it holds. */
async function snapshotCommit(repo: SimpleGit, snapshotId: string, volumeId: string, point: VolumePoint, tag: string | undefined): Promise<string> {
  const tree = (await runGit(repo, ["rev-parse", `${point.data}^{tree}`])).trim();
  const message = [
    `git.liken.sh: snapshot ${snapshotId} of volume ${volumeId} at ${new Date().toISOString()}`,
    "",
    `Snapshot: ${snapshotId}`,
    `Volume: ${volumeId}`,
    `Branch: ${point.branch}`,
    `Data: ${point.data}`,
    `Metadata: ${point.metadata || "none"}`,
    ...(tag ? [`Tag: ${tag}`] : []),
  ].join("\n");
  return commitTree(repo, tree, point.metadata === "" ? [point.data] : [point.data, point.metadata], message);
}

/** A commit by the driver's default author. */
async function commitTree(repo: SimpleGit, tree: string, parents: string[], message: string): Promise<string> {
  const { name, email } = defaultPolicy().author;
  const argv = ["-c", `user.name=${name}`, "-c", `user.email=${email}`, "commit-tree", tree, ...parents.flatMap((p) => ["-p", p]), "-m", message];
  return (await runGit(repo, argv)).trim();
}

/** What a snapshot commit answers; AlreadyExists when the name is another volume's snapshot. */
async function describeSnapshot(repo: SimpleGit, snapshotId: string, commit: string, volumeId: string): Promise<gitWorker.MakeSnapshotResponse> {
  const message = await snapshotMessage(repo, commit);
  const of = trailer(message, "Volume");
  if (of !== volumeId) throw alreadyExists(`snapshot ${snapshotId} exists already, of volume ${of}, not ${volumeId}`);
  const data = pointOf(message).data;
  const seconds = Number((await runGit(repo, ["show", "-s", "--format=%ct", commit])).trim());
  return { commit, dataCommit: data, sizeBytes: await treeSize(repo, data), creationTimeUnixMs: seconds * 1000, heldBy: "" };
}

async function snapshotMessage(repo: SimpleGit, commit: string): Promise<string> {
  return runGit(repo, ["show", "-s", "--format=%B", commit]);
}

function pointOf(message: string): VolumePoint {
  const metadata = trailer(message, "Metadata");
  return { data: trailer(message, "Data"), metadata: metadata === "none" ? "" : metadata, branch: trailer(message, "Branch") };
}

function trailer(message: string, key: string): string {
  const value = new RegExp(`^${key}: (.+)$`, "m").exec(message)?.[1];
  if (value === undefined) throw failedPrecondition(`the snapshot commit has no ${key} line; it was not made by git.liken.sh`);
  return value;
}

/** The sum of the sizes of the commit's blobs: what a restore checks out. */
async function treeSize(repo: SimpleGit, commit: string): Promise<number> {
  const listing = await runGit(repo, ["ls-tree", "-r", "-l", "-z", commit]);
  return listing
    .split("\0")
    .map((line) => Number(line.split(/\s+/)[3]))
    .filter((n) => Number.isFinite(n))
    .reduce((a, b) => a + b, 0);
}

/**
 * The annotated tag a VolumeSnapshotClass asks for, at the volume's commit,
 * as a push from "absent": a tag that exists already is someone's, never
 * moved, and the snapshot is refused with AlreadyExists naming it.
 */
async function tagUpdate(repo: SimpleGit, url: string, tag: string, snapshotId: string, volumeId: string, point: VolumePoint): Promise<RefUpdate> {
  if ((await onUrl(url, fetchTag(repo, tag))) !== "") throw alreadyExists(`parameters.tag: ${tag} exists in ${url} already; a snapshot's tag is a new one, and an existing tag is never moved`);
  const { name, email } = defaultPolicy().author;
  const body = [
    `object ${point.data}`,
    "type commit",
    `tag ${tag.slice("refs/tags/".length)}`,
    `tagger ${name} <${email}> ${Math.floor(Date.now() / 1000)} +0000`,
    "",
    `git.liken.sh: snapshot ${snapshotId} of volume ${volumeId}`,
    "",
    `Snapshot: ${snapshotId}`,
    `Volume: ${volumeId}`,
    "",
  ].join("\n");
  return { ref: tag, expected: "", next: await writeTag(repo, body) };
}

/** The tag object, through writeObjects' scratch files: hash-object also checks a tag's format. */
async function writeTag(repo: SimpleGit, body: string): Promise<string> {
  const scratch = await fs.mkdtemp(path.join(os.tmpdir(), "git-csi-tag-"));
  try {
    return (await writeObjects(repo, scratch, "tag", [body]))[0]!;
  } finally {
    await fs.rm(scratch, { recursive: true, force: true });
  }
}

/**
 * The tag the snapshot made, as the remote holds it now, for its deletion;
 * none when the snapshot made none, or when the tag is gone or is another
 * object now (a person moved it: it is theirs).
 */
async function madeTag(repo: SimpleGit, url: string, snapshotId: string, commit: string): Promise<ReadRef | undefined> {
  const tag = /^Tag: (.+)$/m.exec(await snapshotMessage(repo, commit))?.[1];
  if (tag === undefined) return undefined;
  const oid = await onUrl(url, fetchTag(repo, tag));
  if (oid === "") return undefined;
  const text = await runGit(repo, ["cat-file", "-p", oid]);
  return text.includes(`\nSnapshot: ${snapshotId}\n`) ? { ref: tag, expected: oid } : undefined;
}

/** The tag's object as the remote holds it, "" when absent: fetchRef peels to the commit, and a deletion's compare-and-swap needs the tag object. */
async function fetchTag(repo: SimpleGit, tag: string): Promise<string> {
  const seen = `${UPSTREAM_PREFIX}${tag.slice("refs/".length)}`;
  if ((await fetchRef(repo, tag, seen)) === "") return "";
  return (await runGit(repo, ["rev-parse", "--verify", "--quiet", seen])).trim();
}

function fetchSnapshot(repo: SimpleGit, snapshotId: string): Promise<string> {
  return fetchRef(repo, snapshotRef(snapshotId), upstreamSnapshotRef(snapshotId));
}

/** A remote that did not answer is Unavailable, naming it. */
function onUrl<T>(url: string, operation: Promise<T>): Promise<T> {
  return operation.catch((err: unknown) => {
    throw err instanceof RemoteError ? unavailable(`${err.message} (${url})`) : err;
  });
}
