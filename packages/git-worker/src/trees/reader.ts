import { randomBytes } from "node:crypto";
import * as fs from "node:fs/promises";
import * as path from "node:path";
import { type EventType, METADATA_REF, type ReaderRef, Reason, type ReasonName } from "@git-csi/config";
import type { SimpleGit } from "simple-git";
import type { ClaimLabels } from "@git-csi/metrics";
import { type CsiError, failedPrecondition, type gitcsi, type gitWorker, required, unavailable } from "@git-csi/protos";
import { replayMetadata } from "../metadata/replay";
import { RemoteAccess } from "../remote/access";
import { parseCredential } from "../remote/credential";
import { gitMessage, runGit } from "../remote/git";
import { revParse } from "../remote/tree";
import type { GitWorkerDeps } from "../service";
import { checkRemoteUrl, exists, missingRef, readerTargetOf, type Store } from "./store";

/** What the worker knows of a read-only volume on this node: its ref, the commit it last checked out, and why its last fetch failed. */
export interface ReaderState {
  claim?: gitcsi.Claim;
  /** The branch, `refs/tags/<tag>` or the commit id. */
  ref: string;
  commit: string;
  fetchFailed?: string;
}

/** The read-only volumes this worker checked out, by volume id. */
export type Readers = Map<string, ReaderState>;

/**
 * The node's own view of a read-only volume's ref. It is outside
 * refs/git-csi/upstream/, so a writer's view of the same branch never moves
 * under it, and it is never pushed.
 */
export function readerRef(volumeId: string): string {
  return `refs/git-csi/reader/${volumeId}`;
}

/** The node's view of refs/git-csi/metadata as a reader of a branch last fetched it, with its branch: the volume's own, as readerRef is. */
export function readerMetadataRef(volumeId: string): string {
  return `refs/git-csi/reader-metadata/${volumeId}`;
}

/**
 * CheckoutReader: the ref fetched (incrementally, into the URL's bare
 * repository) and its commit checked out into a directory of its own. No
 * ref on the remote is read for ownership or written: a fetch-only
 * credential serves.
 */
export async function checkoutReader(deps: GitWorkerDeps, request: gitWorker.CheckoutReaderRequest): Promise<gitWorker.CheckoutReaderResponse> {
  const volumeId = required(request.volumeId, "volume_id");
  const source = required(request.source, "source");
  checkRemoteUrl(required(source.url, "source.url"));
  const target = readerTargetOf(source.ref);
  const ref = shownRef(target);
  const { store } = deps;
  const access = await RemoteAccess.open(parseCredential(request.credential?.data), store.volumeDir(volumeId), store.socketDir(), deps.broker);
  try {
    return await deps.perRepository.run(store.repoDir(source.url), async () => {
      await store.ensureRepo(source.url);
      const commit = await fetchReader(store, source.url, target, volumeId, access).catch((err: CsiError) => {
        if (request.serving) behind(deps, request, `${err.message}; the volume keeps serving commit ${path.basename(request.serving)} and is behind its ref`);
        throw err;
      });
      const treePath = await checkedOut(store, source.url, volumeId, commit, (dir) => replayBranchMetadata(deps, request, target, dir));
      await removeCheckouts(store, volumeId, [treePath, request.serving]);
      if (request.serving && treePath !== request.serving) tell(deps, request, "Normal", Reason.Updated, `serves commit ${commit} of ${ref}, was ${path.basename(request.serving)}`);
      served(deps, volumeId, { claim: request.claim, ref, commit });
      return { treePath, commit };
    });
  } finally {
    access.close();
  }
}

function labelsOf(volumeId: string, claim: gitcsi.Claim | undefined): ClaimLabels {
  return { namespace: claim?.namespace ?? "", claim: claim?.name || volumeId };
}

/** The commit checked out is the one the mount serves from now on: in the report and the metric's label. */
function served(deps: GitWorkerDeps, volumeId: string, state: ReaderState): void {
  const labels = labelsOf(volumeId, state.claim);
  unlabel(deps, volumeId);
  deps.metrics.servedCommit.set({ ...labels, commit: state.commit }, 1);
  deps.metrics.abnormal.set(labels, 0);
  deps.readers.set(volumeId, state);
}

/** The metric's series of the commit served until now goes: one series per volume. */
function unlabel(deps: GitWorkerDeps, volumeId: string): void {
  const before = deps.readers.get(volumeId);
  if (before) deps.metrics.servedCommit.remove({ ...labelsOf(volumeId, before.claim), commit: before.commit });
}

/** A fetch failed: the volume serves an older commit than its ref may hold, and is abnormal until a fetch works. */
function behind(deps: GitWorkerDeps, request: gitWorker.CheckoutReaderRequest, message: string): void {
  const state = deps.readers.get(request.volumeId);
  if (state) state.fetchFailed = message;
  deps.metrics.abnormal.set(labelsOf(request.volumeId, request.claim), 1);
  tell(deps, request, "Warning", Reason.FetchFailed, message);
}

/** The report of a read-only volume: what it serves, and whether it is behind. */
export function readerReport(volumeId: string, state: ReaderState): gitWorker.VolumeReport {
  return {
    volumeId,
    claim: state.claim,
    armed: false,
    className: "",
    pendingPaths: [],
    unpushedCommits: 0,
    lastPushUnixMs: 0,
    pushFailures: 0,
    skippedPaths: [],
    sideBranch: "",
    pushBranch: "",
    waitingFor: [],
    abnormal: state.fetchFailed ? [state.fetchFailed] : [],
    recentEvents: [],
    servedCommit: state.commit,
    followsBranch: state.ref,
  };
}

/** A following volume's event, on its claim and pods and in the log. */
function tell(deps: GitWorkerDeps, request: gitWorker.CheckoutReaderRequest, type: EventType, reason: ReasonName, message: string): void {
  const { claim, pods, volumeId } = request;
  deps.logger.log(type === "Warning" ? "warn" : "info", message, { volume: volumeId, claim: claim?.name, operation: "follow", reason });
  if (claim?.name) deps.events?.record({ kind: "PersistentVolumeClaim", namespace: claim.namespace, name: claim.name, uid: claim.uid || undefined }, type, reason, message);
  for (const pod of pods) deps.events?.record({ kind: "Pod", namespace: pod.namespace, name: pod.name, uid: pod.uid || undefined }, type, reason, message);
}

/** A reader's ref as its messages and report name it: the branch, `refs/tags/<tag>` or the commit id. */
function shownRef(target: ReaderRef): string {
  if (target.kind === "branch") return target.branch;
  return target.kind === "tag" ? `refs/tags/${target.tag}` : target.commit;
}

/**
 * What the fetch asks the remote for: a commit by its id, which protocol v2
 * allows and v0 servers may refuse. A branch brings refs/git-csi/metadata in
 * the same fetch; the pattern matches nothing on a remote without it.
 */
function refspecs(target: ReaderRef, volumeId: string): string[] {
  if (target.kind === "branch") return [`+refs/heads/${target.branch}:${readerRef(volumeId)}`, `+${METADATA_REF}*:${readerMetadataRef(volumeId)}*`];
  return [`+${target.kind === "tag" ? `refs/tags/${target.tag}` : target.commit}:${readerRef(volumeId)}`];
}

/** The ref's commit on the remote now (a tag peeled); a ref the remote lacks is the stage's FailedPrecondition. */
async function fetchReader(store: Store, url: string, target: ReaderRef, volumeId: string, access: RemoteAccess): Promise<string> {
  const ref = shownRef(target);
  await access
    .run((remote) => runGit(store.repo(url, remote), ["fetch", "--quiet", "--no-tags", "--no-write-fetch-head", "origin", ...refspecs(target, volumeId)]))
    .catch((err: unknown) => {
      // git says "couldn't find remote ref" for a name, and "not our ref" for a commit id the remote lacks.
      if (/couldn't find remote ref|not our ref/i.test(gitMessage(err))) throw target.kind === "branch" ? missingRef(url, ref) : missingPin(url, target.kind, ref);
      throw unavailable(`fetch of ${ref} failed: ${gitMessage(err)} (${url})`);
    });
  const commit = await revParse(store.repo(url), readerRef(volumeId));
  if (commit === "") throw failedPrecondition(`volume_context.ref: ${ref} in ${url} names no commit; a read-only volume serves a commit's tree`);
  return commit;
}

function missingPin(url: string, kind: "tag" | "commit", ref: string): Error {
  return failedPrecondition(`volume_context.ref: the ${kind} ${ref} does not exist in ${url}; push it, or name a ${kind} the remote holds, and stage again`);
}

/**
 * The commit's directory, checked out once: into a temporary directory with
 * an index of its own, finished by `finish`, then renamed into place, so a
 * directory named by a commit is always whole.
 */
async function checkedOut(store: Store, url: string, volumeId: string, commit: string, finish: (dir: string) => Promise<void>): Promise<string> {
  const dir = path.join(store.readerDir(volumeId), commit);
  if (await exists(dir)) return dir;
  const temp = path.join(store.readerDir(volumeId), `.${commit}.${randomBytes(4).toString("hex")}`);
  const index = `${temp}.index`;
  await fs.mkdir(temp, { recursive: true });
  try {
    const git = store.repo(url, { config: [], env: { GIT_INDEX_FILE: index, GIT_WORK_TREE: temp } });
    await runGit(git, ["read-tree", commit]);
    await runGit(git, ["checkout-index", "--all"]);
    await finish(temp);
    await fs.rename(temp, dir);
  } finally {
    await fs.rm(temp, { recursive: true, force: true });
    await fs.rm(index, { force: true });
  }
  return dir;
}

/**
 * A branch the driver's writers push has their modes, owners and empty
 * directories in refs/git-csi/metadata: the checkout takes them, as a
 * writer's restore does, so a reader sees the tree the writers' pods saw. A
 * pin takes none: the metadata holds each branch's present listings, and no
 * record says which commit they were made for.
 */
async function replayBranchMetadata(deps: GitWorkerDeps, request: gitWorker.CheckoutReaderRequest, target: ReaderRef, dir: string): Promise<void> {
  if (target.kind !== "branch") return;
  const repo = deps.store.repo(request.source!.url);
  const metadata = await revParse(repo, readerMetadataRef(request.volumeId));
  if (metadata === "") return;
  const fields = { volume: request.volumeId, claim: request.claim?.name, operation: "replay_metadata" };
  const result = await replayMetadata({ repo, treeDir: dir, branch: target.branch, metadata, log: (message, more) => deps.logger.warn(message, { ...fields, ...more }) });
  deps.logger.info("replayed modes, owners and empty directories", { ...fields, metadata, applied: result.applied, refused: result.refused.length });
}

/** Every checkout of the volume but those kept; a file a reader still holds open keeps its content. */
async function removeCheckouts(store: Store, volumeId: string, keep: string[]): Promise<void> {
  const dir = store.readerDir(volumeId);
  for (const name of await fs.readdir(dir)) {
    const entry = path.join(dir, name);
    if (!keep.includes(entry) && !name.startsWith(".")) await fs.rm(entry, { recursive: true, force: true });
  }
}

/** ReleaseReader: the volume's checkouts and its view of the ref go; the bare repository stays for the collection. */
export async function releaseReader(deps: GitWorkerDeps, request: gitWorker.ReleaseReaderRequest): Promise<gitWorker.ReleaseReaderResponse> {
  const volumeId = required(request.volumeId, "volume_id");
  const { url } = required(request.source, "source");
  unlabel(deps, volumeId);
  deps.metrics.forget(labelsOf(volumeId, deps.readers.get(volumeId)?.claim));
  deps.readers.delete(volumeId);
  const repo = deps.store.repoDir(url);
  if (await exists(repo)) await deps.perRepository.run(repo, () => deleteViews(deps.store.repo(url), volumeId));
  await fs.rm(deps.store.readerDir(volumeId), { recursive: true, force: true });
  await fs.rm(deps.store.volumeDir(volumeId), { recursive: true, force: true });
  return {};
}

/** The volume's views of its ref and of the metadata; one that is absent is already gone. */
async function deleteViews(repo: SimpleGit, volumeId: string): Promise<void> {
  for (const ref of [readerRef(volumeId), readerMetadataRef(volumeId)]) await runGit(repo, ["update-ref", "-d", ref]);
}
