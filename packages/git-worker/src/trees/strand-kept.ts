import * as fs from "node:fs/promises";
import * as path from "node:path";
import { branchOf, orAbsent, Reason, sideBranchOf } from "@git-csi/config";
import type { Logger } from "@git-csi/logging";
import type { gitcsi } from "@git-csi/protos";
import type { SimpleGit } from "simple-git";
import type { OnRemote } from "../lease/lease";
import { fetchBranch, fetchStranded, pushStranded, RemoteError } from "../remote/remote";
import { GitCommandError } from "../remote/git";
import { countCommits, holdsChanges, revParse } from "../remote/tree";
import type { EventSink } from "../sync/volume";
import type { StrandPolicy } from "./collect-remote";
import { volumeBranchRef } from "./stage";
import { type Store, strandedRef, upstreamRef } from "./store";

/**
 * Commits a kept tree holds that no push landed: an unstage that could not
 * reach the remote, or a node that restarted before the unstage, leaves them
 * on the node's disk only. The node's collection sends them to the volume's
 * stranded ref once it reaches the remote, so the volume's next stage, on any
 * node, brings them in (sync/stranded.ts). The commits stay in the tree: this
 * only copies them to the remote.
 */

/** What a stage told of the volume that its kept tree needs later: whether its remote wants a credential, and the claim to tell. */
export interface StageRecord {
  credentialExpected: boolean;
  claim?: gitcsi.Claim;
}

const STAGE_RECORD = "stage.json";
/** The tree's HEAD the remote holds on a stranded ref or a branch, as the node last saw: never sent again. */
const STRANDED_MARK = "stranded";

/** Remembers, at each stage, what the collection needs of the volume once it is unstaged; no credential, which is never on disk. */
export async function rememberStage(store: Store, volumeId: string, record: StageRecord): Promise<void> {
  await fs.writeFile(path.join(store.volumeDir(volumeId), STAGE_RECORD), `${JSON.stringify(record)}\n`);
}

async function readStage(store: Store, volumeId: string): Promise<StageRecord | undefined> {
  // A tree kept from before the record existed, or one whose record cannot be read, is reached only with a credential.
  return orAbsent(fs.readFile(path.join(store.volumeDir(volumeId), STAGE_RECORD), "utf8").then((t) => JSON.parse(t) as StageRecord)).catch(() => undefined);
}

/** Notes that the remote holds `head`, so no collection sends it again (once another node landed it, its ref goes, and the branch moves on). */
export async function markStranded(volumeDir: string, head: string): Promise<void> {
  await fs.mkdir(volumeDir, { recursive: true });
  await fs.writeFile(path.join(volumeDir, STRANDED_MARK), `${head}\n`);
}

async function markedHead(store: Store, volumeId: string): Promise<string> {
  return ((await orAbsent(fs.readFile(path.join(store.volumeDir(volumeId), STRANDED_MARK), "utf8"))) ?? "").trim();
}

/** The commits of the volume's tree that neither its side branch nor its branch held when the node last saw them. */
export async function unpushedOf(repo: SimpleGit, volumeId: string, branch: string, head: string): Promise<number> {
  const pushed = (await revParse(repo, upstreamRef(sideBranchOf(branch, volumeId)))) || (await revParse(repo, upstreamRef(branch)));
  return countCommits(repo, pushed, head);
}

/** True when one of the commits or refs holds every change `head` made. */
async function heldBy(repo: SimpleGit, refs: string[], head: string): Promise<boolean> {
  for (const ref of refs) {
    const oid = await revParse(repo, ref);
    if (oid !== "" && (await holdsChanges(repo, oid, head))) return true;
  }
  return false;
}

/** A kept tree the collection looks at. */
export interface KeptTree {
  volumeId: string;
  source: gitcsi.VolumeSource;
}

/**
 * Sends the commits of each kept tree no stage serves on this node that its
 * branch and side branch lack, and no stranded ref holds, to the volume's
 * stranded ref. A remote that wants a credential is reached only while a
 * volume of the same URL is staged here with one: the node keeps none on
 * disk. A remote that is away, or that cannot be reached, leaves the commits
 * in the tree for the next collection.
 */
export async function strandKept(store: Store, trees: KeptTree[], viaStaged: OnRemote | undefined, policy: StrandPolicy, logger: Logger): Promise<void> {
  for (const tree of trees) {
    if (policy.staged(tree.volumeId)) continue;
    try {
      await strandOne(store, tree, viaStaged ?? policy.anonymous(tree.source.url), viaStaged !== undefined, logger, policy.events);
    } catch (err) {
      // One tree git fails on leaves the others, and the rest of the collection, to go on.
      if (!(err instanceof GitCommandError)) throw err;
      logger.warn(`the kept work tree's commits were not looked at: ${err.message}`, { volume: tree.volumeId, operation: "strand" });
    }
  }
}

async function strandOne(store: Store, tree: KeptTree, reachable: OnRemote, throughStaged: boolean, logger: Logger, events?: EventSink): Promise<void> {
  const { volumeId, source } = tree;
  const branch = branchOf(source.ref);
  if (branch === undefined) return;
  const repo = store.repo(source.url);
  const head = await revParse(repo, volumeBranchRef(volumeId));
  if (head === "" || (await markedHead(store, volumeId)) === head) return;
  const side = sideBranchOf(branch, volumeId);
  if (await heldBy(repo, [upstreamRef(branch), upstreamRef(side)], head)) return;
  const stage = await readStage(store, volumeId);
  const remote = throughStaged || stage?.credentialExpected === false ? reachable : undefined;
  const unpushed = await unpushedOf(repo, volumeId, branch, head);
  const fields = { volume: volumeId, operation: "strand" };
  if (!remote) {
    logger.warn(
      `${unpushed} commit(s) no push landed stay in the node's kept work tree: its remote wants a credential and no volume of it is staged here with one; the volume's next stage on this node pushes them`,
      fields,
    );
    return;
  }
  try {
    const sent = await remote(async (r) => {
      for (const b of [branch, side]) await fetchBranch(r, b);
      const stranded = await fetchStranded(r, volumeId);
      if (await heldBy(r, [upstreamRef(branch), upstreamRef(side), ...stranded.values()], head)) return false;
      await pushStranded(r, volumeId, head);
      return true;
    });
    await markStranded(store.volumeDir(volumeId), head);
    if (!sent) {
      logger.info(`the remote holds the kept work tree's commits already; none is sent again`, fields);
      return;
    }
  } catch (err) {
    if (!(err instanceof RemoteError)) throw err;
    logger.warn(`${unpushed} commit(s) no push landed stay in the node's kept work tree until a collection reaches the remote: ${err.message}`, fields);
    return;
  }
  const message = `${unpushed} commit(s) no push landed on ${branch} before the volume was unstaged wait on ${strandedRef(volumeId, head)}: the volume's next stage, on any node, brings them in`;
  const claim = stage?.claim;
  logger.warn(message, { volume: volumeId, claim: claim?.name || volumeId, operation: "event", reason: Reason.Stranded });
  if (claim?.name) events?.record({ kind: "PersistentVolumeClaim", namespace: claim.namespace, name: claim.name, uid: claim.uid || undefined }, "Warning", Reason.Stranded, message);
}
