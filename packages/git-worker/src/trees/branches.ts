import * as fs from "node:fs/promises";
import * as path from "node:path";
import { status } from "@grpc/grpc-js";
import { defaultPolicy, sideBranchOf } from "@git-csi/config";
import { alreadyExists, CsiError, gitcsi, type gitWorker, invalidArgument, required, unavailable } from "@git-csi/protos";
import type { SimpleGit } from "simple-git";
import { RemoteAccess } from "../remote/access";
import { parseCredential } from "../remote/credential";
import { gitMessage, runGit } from "../remote/git";
import { fetchBranch, type PushResult, pushUpdates, type RefUpdate } from "../remote/remote";
import { revParse } from "../remote/tree";
import type { GitWorkerDeps } from "../service";
import { markerDeletion, metadataUpdates, startPoint, type VolumePoint } from "./snapshots";
import { archiveRef, branchOfRef, checkRemoteUrl, upstreamRef } from "./store";

/** git's tree with nothing in it, which every repository knows without storing it. */
const EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904";

/**
 * ProvisionBranch: the volume's branch on the remote, made at its base (or,
 * for a restore or a clone, at its start, with the start's metadata listing)
 * unless it exists. Two controllers making it at once agree: the push is a
 * compare-and-swap from "absent", and the loser finds the winner's branch.
 */
export async function provisionBranch(deps: GitWorkerDeps, request: gitWorker.ProvisionBranchRequest): Promise<gitWorker.ProvisionBranchResponse> {
  const { volumeId, source, branch } = branchRequestOf(request);
  const base = request.baseRef === "" ? undefined : branchOfRef(request.baseRef);
  return onRemote(deps, volumeId, source, request.credential, async (repo) => {
    const heads = await listHeads(repo, source.url);
    const point = request.start && (await startPoint(repo, source.url, request.start, volumeId));
    const existing = heads.branches.get(branch);
    // A clone's retry after its branch was made finds the source's flushed marker gone: the branch is the clone's.
    if (point && "heldBy" in point) return existing ? { created: false, commit: existing, heldBy: "" } : { created: false, commit: "", heldBy: point.heldBy };
    if (existing) return { created: false, commit: checkStarts(existing, branch, point), heldBy: "" };
    const start = point ? point.data : await startOf(repo, heads, base, source.url);
    const metadata = point ? await metadataUpdates(repo, deps.store.repoDir(source.url), branch, point) : [];
    const pushed = await pushUpdates(repo, [{ ref: `refs/heads/${branch}`, expected: "", next: start }, ...metadata, ...(point ? markerDeletion(point) : [])]);
    if (pushed.outcome === "pushed") {
      deps.logger.info(`made the branch ${branch} at ${start.slice(0, 12)}`, { volume: volumeId, operation: "provision_branch" });
      return { created: true, commit: start, heldBy: "" };
    }
    const raced = pushed.outcome === "rejected" && (await listHeads(repo, source.url)).branches.get(branch);
    if (raced) return { created: false, commit: checkStarts(raced, branch, point), heldBy: "" };
    // refs/git-csi/metadata moved under a restore: the provisioner's retry lists it again.
    if (pushed.outcome === "rejected") throw new CsiError(status.ABORTED, `making the branch ${branch} in ${source.url} raced another push: ${pushed.message}`);
    throw unavailable(`making the branch ${branch} in ${source.url} failed: ${pushed.message}`);
  });
}

/** A restore or a clone makes a new branch: one already elsewhere would be served as if it were the source's. */
function checkStarts(commit: string, branch: string, point: VolumePoint | undefined): string {
  if (point && commit !== point.data) {
    throw alreadyExists(`parameters.ref: the branch ${branch} exists at ${commit.slice(0, 12)}; a restore or a clone makes a new branch at ${point.data.slice(0, 12)}`);
  }
  return commit;
}

/**
 * RetireBranch: the deleted volume's branch and side branch, archived or
 * deleted, each a compare-and-swap from what the listing saw; the archive
 * and the deletion land in one atomic push or not at all.
 */
export async function retireBranch(deps: GitWorkerDeps, request: gitWorker.RetireBranchRequest): Promise<gitWorker.RetireBranchResponse> {
  const { volumeId, source, branch } = branchRequestOf(request);
  if (request.onDelete === gitcsi.OnDelete.ON_DELETE_KEEP) return { outcome: "kept" };
  const archive = request.onDelete === gitcsi.OnDelete.ON_DELETE_ARCHIVE;
  return onRemote(deps, volumeId, source, request.credential, async (repo) => {
    const heads = await listHeads(repo, source.url);
    const retiring = [branch, sideBranchOf(branch, volumeId)].filter((b) => heads.branches.has(b));
    if (retiring.length === 0) return { outcome: "absent" };
    const updates: RefUpdate[] = [];
    for (const b of retiring) {
      const oid = heads.branches.get(b)!;
      updates.push({ ref: `refs/heads/${b}`, expected: oid, next: "" });
      if (!archive) continue;
      // A push names its objects by what the node has: the archive's commit comes in first.
      await fetchBranch(repo, b);
      updates.push({ ref: archiveRef(volumeId, b), expected: heads.archived.get(archiveRef(volumeId, b)) ?? "", next: oid });
    }
    checkPushed(await pushUpdates(repo, updates), `retiring ${retiring.join(" and ")} in ${source.url}`);
    const outcome = archive ? `archived to ${retiring.map((b) => archiveRef(volumeId, b)).join(" and ")}` : `deleted ${retiring.join(" and ")}`;
    deps.logger.info(outcome, { volume: volumeId, operation: "retire_branch" });
    return { outcome };
  });
}

export function branchRequestOf(request: { volumeId: string; source?: gitcsi.VolumeSource }): { volumeId: string; source: gitcsi.VolumeSource; branch: string } {
  const volumeId = required(request.volumeId, "volume_id");
  const source = required(request.source, "source");
  checkRemoteUrl(required(source.url, "source.url"));
  return { volumeId, source, branch: branchOfRef(source.ref) };
}

/** One operation on the URL's bare repository with the request's credential, which goes when it ends. */
export async function onRemote<T>(deps: GitWorkerDeps, volumeId: string, source: gitcsi.VolumeSource, credential: gitcsi.Credential | undefined, work: (repo: SimpleGit) => Promise<T>): Promise<T> {
  const dir = path.join(deps.store.stateDir, "provision", volumeId);
  const access = await RemoteAccess.open(parseCredential(credential?.data), dir, deps.store.socketDir(), deps.broker);
  try {
    return await deps.perRepository.run(deps.store.repoDir(source.url), async () => {
      await deps.store.ensureRepo(source.url);
      return deps.store.through(source.url, access)(work);
    });
  } finally {
    access.close();
    await fs.rm(dir, { recursive: true, force: true });
  }
}

/** The remote's branches and archive refs by name, and the branch its HEAD names (none for an empty remote). */
interface Heads {
  branches: Map<string, string>;
  archived: Map<string, string>;
  head?: string;
}

async function listHeads(repo: SimpleGit, url: string): Promise<Heads> {
  const listing = await runGit(repo, ["ls-remote", "--symref", "origin", "HEAD", "refs/heads/*", "refs/git-csi/archive/*"]).catch((err: unknown) => {
    throw unavailable(`listing the branches of ${url} failed: ${gitMessage(err)}`);
  });
  const heads: Heads = { branches: new Map(), archived: new Map() };
  for (const line of listing.split("\n")) {
    const [oid, ref] = line.split("\t") as [string, string | undefined];
    if (oid.startsWith("ref: refs/heads/") && ref === "HEAD") heads.head = oid.slice("ref: refs/heads/".length);
    else if (ref?.startsWith("refs/heads/")) heads.branches.set(ref.slice("refs/heads/".length), oid);
    else if (ref?.startsWith("refs/git-csi/archive/")) heads.archived.set(ref, oid);
  }
  return heads;
}

/** The commit a new branch starts at: its base's, fetched so a push can name it, or a first commit on an empty remote. */
async function startOf(repo: SimpleGit, heads: Heads, base: string | undefined, url: string): Promise<string> {
  if (base !== undefined && !heads.branches.has(base)) throw invalidArgument(`parameters.baseRef ${JSON.stringify(base)} does not exist in ${url}`);
  const from = base ?? (heads.head !== undefined && heads.branches.has(heads.head) ? heads.head : undefined);
  if (from === undefined && heads.branches.size > 0) {
    throw invalidArgument(`parameters.baseRef is required: ${url} has branches but no default branch to start a new one from`);
  }
  if (from === undefined) return firstCommit(repo);
  if ((await fetchBranch(repo, from)) === "missing") throw unavailable(`the branch ${from} left ${url} while a new branch was made from it; CreateVolume is retried`);
  return revParse(repo, upstreamRef(from));
}

/** An empty root commit by the class's default author: an empty remote's first branch has nothing else to start at. */
async function firstCommit(repo: SimpleGit): Promise<string> {
  const { name, email } = defaultPolicy().author;
  const argv = ["-c", `user.name=${name}`, "-c", `user.email=${email}`, "commit-tree", EMPTY_TREE, "-m", "git.liken.sh: the repository's first commit"];
  return (await runGit(repo, argv)).trim();
}

function checkPushed(result: PushResult, what: string): void {
  if (result.outcome === "pushed") return;
  // A branch a node pushed to since the listing: the provisioner retries, and the next listing sees it.
  throw new CsiError(result.outcome === "rejected" ? status.ABORTED : status.UNAVAILABLE, `${what} failed: ${result.message}`);
}
