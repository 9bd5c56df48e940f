import * as fs from "node:fs/promises";
import * as path from "node:path";
import { branchOf, orAbsent, sideBranchOf } from "@git-csi/config";
import type { Logger } from "@git-csi/logging";
import type { gitcsi, gitWorker } from "@git-csi/protos";
import { volumeBranchRef } from "./stage";
import type { SimpleGit } from "simple-git";
import { COLLECTED_OWNERS, type CollectionPolicy, collectRemote, expireDeletions, readDeletions, rememberDeleted } from "./collect-remote";
import { branchOfRef, exists, type Store, UPSTREAM_METADATA, upstreamOwnerRef, upstreamRef, upstreamStrandedRef } from "./store";
import { revParse } from "../remote/tree";
import { type KeptTree, strandKept, unpushedOf } from "./strand-kept";
import { runGit } from "../remote/git";
import { readerMetadataRef, readerRef } from "./reader";

/** What the worker remembers of a volume whose tree it keeps: the source it follows. */
export async function rememberSource(store: Store, volumeId: string, source: gitcsi.VolumeSource): Promise<void> {
  await fs.mkdir(store.volumeDir(volumeId), { recursive: true });
  await fs.writeFile(path.join(store.volumeDir(volumeId), "source.json"), `${JSON.stringify(source)}\n`);
}

/** The volumes whose tree the node keeps, or is making: a stage records the source before it clones. */
async function keptTrees(store: Store): Promise<KeptTree[]> {
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
 * Removes a deleted volume's work tree and everything the node kept for it,
 * its record of the source last: a removal cut short is done again. The log
 * says whether the tree held a commit no push sent or a side branch, since
 * those are lost with it. The remote's data is never touched; the volume's
 * owner ref there goes at the next collection that reaches the remote.
 */
export async function removeTree(store: Store, volumeId: string, source: gitcsi.VolumeSource, logger: Logger): Promise<gitWorker.RemoveTreeResponse> {
  const treePath = store.treeDir(volumeId);
  if (!(await exists(treePath)) && !(await exists(store.volumeDir(volumeId)))) return { removed: false, unpushedCommits: 0, hadSideBranch: false };
  await rememberDeleted(store, volumeId, source.url);
  const repo = store.repo(source.url);
  const branch = branchOfRef(source.ref);
  const side = sideBranchOf(branch, volumeId);
  const head = await revParse(repo, volumeBranchRef(volumeId));
  const sidePushed = await revParse(repo, upstreamRef(side));
  const unpushedCommits = head === "" ? 0 : await unpushedOf(repo, volumeId, branch, head);
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
 * The node's views a kept tree follows: its branch, its side branch and its
 * owner ref. A source recorded before the node took its ref for no branch
 * (such as "--help") follows no branch; it never fetched one.
 */
function followedViews(tree: KeptTree): string[] {
  const branch = branchOf(tree.source.ref);
  const branches = branch === undefined ? [] : [branch, sideBranchOf(branch, tree.volumeId)];
  return [...branches.map(upstreamRef), upstreamOwnerRef(tree.volumeId)];
}

/**
 * How old an object no ref reaches must be before gc deletes it. git's two
 * weeks would keep every owner record a renewal replaced: 100 volumes on one
 * URL write 18,000 such loose objects an hour. An hour still covers any
 * object a step of the worker wrote and has yet to name by a ref.
 */
const PRUNE_AFTER = "1.hour.ago";

/** The node's views of every volume's stranded refs. */
const STRANDED_VIEWS = upstreamStrandedRef("").slice(0, -1);

/**
 * Spec 004, "Work trees the node keeps": deletes the driver's refs no volume
 * needs, on each remote a staged volume reaches (collect-remote.ts) and in
 * the node's store, removes each bare repository that no work tree names, and
 * runs git gc in each one that stays, so neither grows with every volume ever
 * staged. Commits a kept tree of an unstaged volume holds and the remote
 * lacks go to the volume's stranded ref (strand-kept.ts).
 */
export async function collectGarbage(store: Store, logger: Logger, onRepository: <T>(repoDir: string, work: () => Promise<T>) => Promise<T>, policy: CollectionPolicy): Promise<void> {
  const reposDir = path.join(store.stateDir, "repos");
  const deletions = await readDeletions(store, logger);
  for (const name of (await orAbsent(fs.readdir(reposDir))) ?? []) {
    const repoDir = path.join(reposDir, name);
    // Under the repository's lock: a stage of a new volume of this URL must not find its repository gone, and no push of it is half done.
    await onRepository(repoDir, async () => {
      const users = (await keptTrees(store)).filter((t) => store.repoDir(t.source.url) === repoDir);
      const readers = await stagedReaderViews(store, store.repoAt(repoDir));
      if (users.length === 0 && readers.length === 0) {
        await fs.rm(repoDir, { recursive: true, force: true });
        logger.info(`removed the bare repository ${repoDir}: no work tree or read-only volume follows it`, { operation: "gc" });
        return;
      }
      const url = users[0]?.source.url;
      if (url !== undefined) {
        await collectRemote(store, url, policy, deletions, logger);
        if (policy.strand) await strandKept(store, users, policy.reach(url)?.remote, policy.strand, logger);
      }
      const stale = await deleteStaleViews(store.repoAt(repoDir), new Set([...users.flatMap(followedViews), ...readers]), logger);
      await runGit(store.repoAt(repoDir), ["worktree", "prune"]);
      await runGit(store.repoAt(repoDir), ["gc", "--quiet", `--prune=${PRUNE_AFTER}`]);
      logger.info(`collected ${repoDir}`, { operation: "gc", staleViews: stale, trees: users.length, readerViews: readers.length });
    });
  }
  await expireDeletions(store, deletions, Date.now(), policy.ownerRefRetentionMs);
}

/**
 * The views of the URLs and refs read-only volumes staged here serve, of the
 * ref and of the metadata (their checkouts, readers/<key>, are on the node;
 * the last volume's ReleaseReader removes all): kept, so each fetch stays
 * incremental and the repository is not cloned again.
 */
async function stagedReaderViews(store: Store, repo: SimpleGit): Promise<string[]> {
  const views: string[] = [];
  for (const prefix of [readerRef(""), readerMetadataRef("")]) {
    const refs = (await runGit(repo, ["for-each-ref", "--format=%(refname)", prefix])).split("\n").filter(Boolean);
    const staged = await Promise.all(refs.map((ref) => exists(store.readerDir(ref.slice(prefix.length)))));
    views.push(...refs.filter((_, i) => staged[i]));
  }
  return views;
}

/**
 * Deletes the node's refs under refs/git-csi/ that no kept tree follows: the
 * views of removed volumes and of branches no volume follows any more, and
 * what the remote's collection fetched. The view of refs/git-csi/metadata
 * stays while any tree does. Answers how many views went.
 */
async function deleteStaleViews(repo: SimpleGit, followed: Set<string>, logger: Logger): Promise<number> {
  const refs = (await runGit(repo, ["for-each-ref", "--format=%(refname)", "refs/git-csi/"])).split("\n").filter(Boolean);
  let views = 0;
  for (const ref of refs.filter((r) => !followed.has(r) && !r.startsWith(UPSTREAM_METADATA))) {
    await runGit(repo, ["update-ref", "-d", ref]);
    // What the remote's collection fetched goes every time, and so do the stranded refs a look at a kept tree fetched: only a view's deletion is news.
    if (ref.startsWith(COLLECTED_OWNERS) || ref.startsWith(STRANDED_VIEWS)) continue;
    views++;
    const volumeId = ref.startsWith(upstreamOwnerRef("")) ? ref.slice(upstreamOwnerRef("").length) : undefined;
    logger.info(`deleted the node's view ${ref}: no kept tree follows it`, { volume: volumeId, operation: "gc", ref });
  }
  return views;
}
