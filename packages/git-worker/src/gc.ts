import * as fs from "node:fs/promises";
import * as path from "node:path";
import { branchOf, orAbsent, sideBranchOf } from "@git-csi/config";
import type { Logger } from "@git-csi/logging";
import type { gitcsi, gitWorker } from "@git-csi/protos";
import { volumeBranchRef } from "./stage";
import { branchOfRef, exists, type Store, UPSTREAM_PREFIX, upstreamRef } from "./store";
import { countCommits, revParse } from "./tree";
import { runGit } from "./git";

/** What the worker remembers of a volume whose tree it keeps: the source it follows. */
export async function rememberSource(store: Store, volumeId: string, source: gitcsi.VolumeSource): Promise<void> {
  await fs.mkdir(store.volumeDir(volumeId), { recursive: true });
  await fs.writeFile(path.join(store.volumeDir(volumeId), "source.json"), `${JSON.stringify(source)}\n`);
}

/** The volumes whose tree the node keeps, or is making: a stage records the source before it clones. */
async function keptTrees(store: Store): Promise<Array<{ volumeId: string; source: gitcsi.VolumeSource }>> {
  const trees = (await orAbsent(fs.readdir(path.join(store.stateDir, "sync")))) ?? [];
  const out = [];
  for (const volumeId of trees) {
    // A record that cannot be read stops the collection: its repository may be one a tree still needs.
    const source = await orAbsent(fs.readFile(path.join(store.volumeDir(volumeId), "source.json"), "utf8").then((t) => JSON.parse(t) as gitcsi.VolumeSource));
    if (source) out.push({ volumeId, source });
  }
  return out;
}

/**
 * Removes a volume's work tree and everything the node kept for it. The log
 * says whether it held a commit no push sent or a side branch, since those
 * are lost with it; the remote is never touched.
 */
export async function removeTree(store: Store, volumeId: string, source: gitcsi.VolumeSource, logger: Logger): Promise<gitWorker.RemoveTreeResponse> {
  const treePath = store.treeDir(volumeId);
  if (!(await exists(treePath))) return { removed: false, unpushedCommits: 0, hadSideBranch: false };
  const repo = store.repo(source.url);
  const branch = branchOfRef(source.ref);
  const side = sideBranchOf(branch, volumeId);
  const head = await revParse(repo, volumeBranchRef(volumeId));
  const sidePushed = await revParse(repo, upstreamRef(side));
  const unpushedCommits = head === "" ? 0 : await countCommits(repo, sidePushed || (await revParse(repo, upstreamRef(branch))), head);
  await fs.rm(treePath, { recursive: true, force: true });
  await fs.rm(store.scratchDir(volumeId), { recursive: true, force: true });
  await runGit(repo, ["worktree", "unlock", treePath]).catch(() => undefined);
  await runGit(repo, ["worktree", "prune"]);
  await runGit(repo, ["update-ref", "-d", volumeBranchRef(volumeId)]).catch(() => undefined);
  await fs.rm(store.volumeDir(volumeId), { recursive: true, force: true });
  const held = [unpushedCommits > 0 ? `${unpushedCommits} commit(s) no push sent` : "", sidePushed !== "" ? `the side branch ${side}` : ""].filter(Boolean);
  logger.log(held.length > 0 ? "warn" : "info", `removed the work tree ${treePath}${held.length > 0 ? `; it held ${held.join(" and ")}` : "; every commit in it was pushed"}`, {
    volume: volumeId,
    operation: "remove_tree",
    unpushedCommits,
    sideBranch: sidePushed !== "" ? side : undefined,
  });
  return { removed: true, unpushedCommits, hadSideBranch: sidePushed !== "" };
}

/**
 * The branches a kept tree follows. A source recorded before the node took
 * its ref for no branch (such as "--help") follows none; it never fetched one.
 */
function followedBranches(tree: { volumeId: string; source: gitcsi.VolumeSource }): string[] {
  const branch = branchOf(tree.source.ref);
  return branch === undefined ? [] : [branch, sideBranchOf(branch, tree.volumeId)];
}

/**
 * How old an object no ref reaches must be before gc deletes it. git's two
 * weeks would keep every owner record a renewal replaced: 100 volumes on one
 * URL write 18,000 such loose objects an hour. An hour still covers any
 * object a step of the worker wrote and has yet to name by a ref.
 */
const PRUNE_AFTER = "1.hour.ago";

/**
 * Spec 004, "Work trees the node keeps": deletes the node's refs under
 * refs/git-csi/ that no volume follows, removes each bare repository that no
 * work tree names, and runs git gc in each one that stays, so the node's
 * store does not grow with every ref a volume ever followed.
 */
export async function collectGarbage(store: Store, logger: Logger, onRepository: <T>(repoDir: string, work: () => Promise<T>) => Promise<T>): Promise<void> {
  const reposDir = path.join(store.stateDir, "repos");
  for (const name of (await orAbsent(fs.readdir(reposDir))) ?? []) {
    const repoDir = path.join(reposDir, name);
    // Under the repository's lock: a stage of a new volume of this URL must not find its repository gone.
    await onRepository(repoDir, async () => {
      const users = (await keptTrees(store)).filter((t) => store.repoDir(t.source.url) === repoDir);
      if (users.length === 0) {
        await fs.rm(repoDir, { recursive: true, force: true });
        logger.info(`removed the bare repository ${repoDir}: no work tree follows it`, { operation: "gc" });
        return;
      }
      const repo = store.repo(users[0]!.source.url);
      const followed = new Set(users.flatMap(followedBranches).map(upstreamRef));
      const refs = (await runGit(repo, ["for-each-ref", "--format=%(refname)", `${UPSTREAM_PREFIX}heads/`])).split("\n").filter(Boolean);
      const stale = refs.filter((r) => !followed.has(r));
      for (const ref of stale) await runGit(repo, ["update-ref", "-d", ref]);
      await runGit(repo, ["worktree", "prune"]);
      await runGit(repo, ["gc", "--quiet", `--prune=${PRUNE_AFTER}`]);
      logger.info(`collected ${repoDir}`, { operation: "gc", staleRefs: stale.length, trees: users.length });
    });
  }
}
