import { randomBytes } from "node:crypto";
import * as fs from "node:fs/promises";
import * as path from "node:path";
import { type EventType, METADATA_REF, type ReaderRef, readerKeyOf, Reason, type ReasonName } from "@git-csi/config";
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
 * The node's own view of a ref its read-only volumes serve, one for all the
 * volumes of that URL and ref (`key`, readerKeyOf). It is outside
 * refs/git-csi/upstream/, so a writer's view of the same branch never moves
 * under it, and it is never pushed.
 */
export function readerRef(key: string): string {
  return `refs/git-csi/reader/${key}`;
}

/** The node's view of refs/git-csi/metadata as the readers of a branch last fetched it, with their branch: theirs, as readerRef is. */
export function readerMetadataRef(key: string): string {
  return `refs/git-csi/reader-metadata/${key}`;
}

/** The key of a reader's URL and ref; the frontend refused any other ref before it got here. */
export function readerKeyOfSource(source: gitcsi.VolumeSource): string {
  readerTargetOf(source.ref);
  return readerKeyOf(source.url, source.ref)!;
}

/**
 * CheckoutReader: the ref fetched (incrementally, into the URL's bare
 * repository) and its commit checked out into a directory of its own, once
 * for every read-only volume of the URL and ref on the node (the request's
 * and those `sharing` it). No ref on the remote is read for ownership or
 * written: a fetch-only credential serves.
 */
export async function checkoutReader(deps: GitWorkerDeps, request: gitWorker.CheckoutReaderRequest): Promise<gitWorker.CheckoutReaderResponse> {
  const volumeId = required(request.volumeId, "volume_id");
  const source = required(request.source, "source");
  checkRemoteUrl(required(source.url, "source.url"));
  const target = readerTargetOf(source.ref);
  const key = readerKeyOfSource(source);
  const ref = shownRef(target);
  const volumes = [{ volumeId, claim: request.claim, pods: request.pods, serving: request.serving }, ...request.sharing];
  const { store } = deps;
  const access = await RemoteAccess.open(parseCredential(request.credential?.data), store.volumeDir(volumeId), store.socketDir(), deps.broker);
  try {
    return await deps.perRepository.run(store.repoDir(source.url), async () => {
      await store.ensureRepo(source.url);
      const commit = await fetchReader(store, source.url, target, key, access).catch((err: CsiError) => {
        for (const v of volumes) if (v.serving) behind(deps, v, `${err.message}; the volume keeps serving commit ${path.basename(v.serving)} and is behind its ref`);
        throw err;
      });
      const treePath = await checkedOut(store, source.url, key, commit, (dir) => replayBranchMetadata(deps, request, target, key, dir));
      await removeCheckouts(store, key, [treePath, ...volumes.map((v) => v.serving)]);
      for (const v of volumes) {
        if (v.serving && treePath !== v.serving) tell(deps, v, "Normal", Reason.Updated, `serves commit ${commit} of ${ref}, was ${path.basename(v.serving)}`);
        served(deps, v.volumeId, { claim: v.claim, ref, commit });
      }
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
function behind(deps: GitWorkerDeps, request: gitWorker.SharingReader, message: string): void {
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
function tell(deps: GitWorkerDeps, request: gitWorker.SharingReader, type: EventType, reason: ReasonName, message: string): void {
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
function refspecs(target: ReaderRef, key: string): string[] {
  if (target.kind === "branch") return [`+refs/heads/${target.branch}:${readerRef(key)}`, `+${METADATA_REF}*:${readerMetadataRef(key)}*`];
  return [`+${target.kind === "tag" ? `refs/tags/${target.tag}` : target.commit}:${readerRef(key)}`];
}

/** The ref's commit on the remote now (a tag peeled); a ref the remote lacks is the stage's FailedPrecondition. */
async function fetchReader(store: Store, url: string, target: ReaderRef, key: string, access: RemoteAccess): Promise<string> {
  const ref = shownRef(target);
  await access
    .run((remote) => runGit(store.repo(url, remote), ["fetch", "--quiet", "--no-tags", "--no-write-fetch-head", "origin", ...refspecs(target, key)]))
    .catch((err: unknown) => {
      // git says "couldn't find remote ref" for a name, and "not our ref" for a commit id the remote lacks.
      if (/couldn't find remote ref|not our ref/i.test(gitMessage(err))) throw target.kind === "branch" ? missingRef(url, ref) : missingPin(url, target.kind, ref);
      throw unavailable(`fetch of ${ref} failed: ${gitMessage(err)} (${url})`);
    });
  const commit = await revParse(store.repo(url), readerRef(key));
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
async function checkedOut(store: Store, url: string, key: string, commit: string, finish: (dir: string) => Promise<void>): Promise<string> {
  const dir = path.join(store.readerDir(key), commit);
  if (await exists(dir)) return dir;
  const temp = path.join(store.readerDir(key), `.${commit}.${randomBytes(4).toString("hex")}`);
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
async function replayBranchMetadata(deps: GitWorkerDeps, request: gitWorker.CheckoutReaderRequest, target: ReaderRef, key: string, dir: string): Promise<void> {
  if (target.kind !== "branch") return;
  const repo = deps.store.repo(request.source!.url);
  const metadata = await revParse(repo, readerMetadataRef(key));
  if (metadata === "") return;
  const fields = { volume: request.volumeId, claim: request.claim?.name, operation: "replay_metadata" };
  const result = await replayMetadata({ repo, treeDir: dir, branch: target.branch, metadata, log: (message, more) => deps.logger.warn(message, { ...fields, ...more }) });
  deps.logger.info("replayed modes, owners and empty directories", { ...fields, metadata, applied: result.applied, refused: result.refused.length });
}

/** Every checkout of the URL and ref but those kept; a file a reader still holds open keeps its content. */
async function removeCheckouts(store: Store, key: string, keep: string[]): Promise<void> {
  const dir = store.readerDir(key);
  for (const name of await fs.readdir(dir)) {
    const entry = path.join(dir, name);
    if (!keep.includes(entry) && !name.startsWith(".")) await fs.rm(entry, { recursive: true, force: true });
  }
}

/**
 * ReleaseReader: the volume's report and metric series go; with the last
 * volume of its URL and ref, their checkouts and view of the ref go too. The
 * bare repository stays for the collection.
 */
export async function releaseReader(deps: GitWorkerDeps, request: gitWorker.ReleaseReaderRequest): Promise<gitWorker.ReleaseReaderResponse> {
  const volumeId = required(request.volumeId, "volume_id");
  const source = required(request.source, "source");
  unlabel(deps, volumeId);
  deps.metrics.forget(labelsOf(volumeId, deps.readers.get(volumeId)?.claim));
  deps.readers.delete(volumeId);
  await fs.rm(deps.store.volumeDir(volumeId), { recursive: true, force: true });
  if (!request.last) return {};
  const key = readerKeyOfSource(source);
  const repo = deps.store.repoDir(source.url);
  // Under the repository's lock, as a fetch of it is: none may check the ref out while its directory goes.
  await deps.perRepository.run(repo, async () => {
    if (await exists(repo)) await deleteViews(deps.store.repo(source.url), key);
    await fs.rm(deps.store.readerDir(key), { recursive: true, force: true });
  });
  return {};
}

/** The views of a URL and ref and of the metadata; one that is absent is already gone. */
async function deleteViews(repo: SimpleGit, key: string): Promise<void> {
  for (const ref of [readerRef(key), readerMetadataRef(key)]) await runGit(repo, ["update-ref", "-d", ref]);
}
