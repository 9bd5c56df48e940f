import { constants as fsConstants, type Stats } from "node:fs";
import * as fs from "node:fs/promises";
import * as path from "node:path";
import { METADATA_REF, orAbsent } from "@git-csi/config";
import type { SimpleGit } from "simple-git";
import { runGit } from "../remote/git";
import { branchTreeName, byteOrder, depthOf, entryOf, joinRel, listingKey, MAX_LISTING_BYTES, type MetadataEntry, parentOf, parseListing } from "./format";
import { parseLsTree, readBlobs, type TreeBlob } from "./plumbing";
import { inBatches } from "./tree";

export interface ReplayOptions {
  repo: SimpleGit;
  treeDir: string;
  branch: string;
  /** The metadata commit to replay. */
  metadata: string;
  log: (message: string, fields: Record<string, unknown>) => void;
}

export interface ReplayResult {
  /** Entries whose owner and mode were applied, created directories included. */
  applied: number;
  /** The tree-relative paths (or listing locations) that were refused, each logged once. */
  refused: string[];
}

interface Pending {
  rel: string;
  entry: MetadataEntry;
  /** What lstat saw before the replay; undefined for a directory the replay created. */
  st?: Stats;
}

/** A directory's listing as the metadata commit holds it. */
interface StoredListing {
  dir: string;
  entries: MetadataEntry[];
}

type Refuse = (path: string, reason: string) => void;

/**
 * Replays a branch's listings from a metadata commit onto a tree: creates the
 * empty directories, then gives each entry its owner and then its mode
 * (chown clears setuid, so the mode comes last). Runs before the pod starts,
 * so nothing else writes the tree meanwhile.
 *
 * Nothing is done through a symlink: every directory on an entry's way must be
 * a real directory (lstat), a symlink's own owner is set with lchown and its
 * mode never, and files and directories are opened with O_NOFOLLOW and
 * changed through the descriptor. A listing or entry that fails a rule (see
 * docs/metadata.md) is refused and logged once with its path; the replay goes
 * on with the rest. An entry the tree lacks, or holds with another type, is
 * left alone: the metadata and the checkout disagree, which is not hostile.
 */
export async function replayMetadata(opts: ReplayOptions): Promise<ReplayResult> {
  const refused: string[] = [];
  const refuse: Refuse = (p, reason) => {
    refused.push(p);
    opts.log("refused a metadata entry", { path: p, reason, branch: opts.branch, metadata: opts.metadata });
  };
  const rootStat = await fs.lstat(opts.treeDir);
  if (!rootStat.isDirectory()) throw new Error(`the tree ${opts.treeDir} is not a directory`);
  const listings = await readStoredListings(opts, refuse);
  const toApply = await planEntries(opts, listings, refuse);
  return { applied: await applyAll(opts, toApply), refused };
}

/** The branch's listings in the metadata commit, shallowest first; whatever breaks a rule is refused. */
async function readStoredListings(opts: ReplayOptions, refuse: Refuse): Promise<StoredListing[]> {
  const commit = (await runGit(opts.repo, ["rev-parse", "--verify", "--quiet", `${opts.metadata}^{commit}`])).trim();
  if (commit === "") throw new Error(`the metadata ${opts.metadata} is not a commit`);
  const branchTree = branchTreeName(opts.branch);
  const records = parseLsTree(await runGit(opts.repo, ["--literal-pathspecs", "ls-tree", "-r", "-l", "-z", commit, "--", branchTree]));
  const wanted: (TreeBlob & { key: string })[] = [];
  for (const r of records) {
    if (!r.path.startsWith(`${branchTree}/`)) continue;
    const key = r.path.slice(branchTree.length + 1);
    const m = /^([0-9a-f]{2})\/([0-9a-f]{40})$/.exec(key);
    if (!m || m[1] !== m[2]!.slice(0, 2) || r.type !== "blob" || r.mode !== "100644") refuse(`${METADATA_REF}:${r.path}`, "not a listing: the metadata tree holds only <2 hex>/<40 hex> blobs");
    else if (r.size > MAX_LISTING_BYTES) refuse(`${METADATA_REF}:${r.path}`, `the listing is over ${MAX_LISTING_BYTES} bytes`);
    else wanted.push({ ...r, key: m[2]! });
  }
  const contents = await readBlobs(opts.repo, wanted);
  const listings: StoredListing[] = [];
  for (const r of wanted) {
    const parsed = parseListing(contents.get(r.oid)!);
    if (parsed.problem !== undefined || parsed.dir === undefined) {
      refuse(parsed.dir ?? `${METADATA_REF}:${r.path}`, parsed.problem ?? "the listing names no directory");
      continue;
    }
    if (listingKey(parsed.dir) !== `${r.key.slice(0, 2)}/${r.key}`) {
      refuse(parsed.dir, `the listing is stored under ${r.path}, not under the hash of its directory`);
      continue;
    }
    for (const { path: p, reason } of parsed.refused) refuse(p, reason);
    listings.push({ dir: parsed.dir, entries: parsed.entries });
  }
  return listings.sort((a, b) => depthOf(a.dir) - depthOf(b.dir) || byteOrder(a.dir, b.dir));
}

type Way = "ok" | "symlink" | "absent";

/** Whether each directory on the way is a real directory: "ok", "symlink", or "absent" (missing or not a directory). */
class Ways {
  private readonly known = new Map<string, Way>([["", "ok"]]);

  constructor(private readonly treeDir: string) {}

  set(dir: string, way: Way): void {
    this.known.set(dir, way);
  }

  async to(dir: string): Promise<Way> {
    const known = this.known.get(dir);
    if (known) return known;
    const up = await this.to(parentOf(dir));
    let state: Way = up;
    if (up === "ok") {
      const st = await orAbsent(fs.lstat(path.join(this.treeDir, dir)));
      state = st?.isDirectory() ? "ok" : st?.isSymbolicLink() ? "symlink" : "absent";
    }
    this.known.set(dir, state);
    return state;
  }
}

/** The entries to apply: each one's way is real directories and the tree holds it with its type; a missing directory is created. */
async function planEntries(opts: ReplayOptions, listings: StoredListing[], refuse: Refuse): Promise<Pending[]> {
  const ways = new Ways(opts.treeDir);
  const toApply: Pending[] = [];
  for (const { dir, entries } of listings) {
    const state = await ways.to(dir);
    if (state === "symlink") {
      refuse(dir, "the directory's path goes through a symlink");
      continue;
    }
    if (state === "absent") {
      if (entries.length > 0) opts.log("metadata names a directory the tree does not hold; left as it is", { path: dir, branch: opts.branch });
      continue;
    }
    const stats = await inBatches(entries, async (e) => (await orAbsent(fs.lstat(path.join(opts.treeDir, dir, e.name)))) ?? null);
    for (const [i, entry] of entries.entries()) {
      const pending = await planEntry(opts, ways, joinRel(dir, entry.name), entry, stats[i]!);
      if (pending) toApply.push(pending);
    }
  }
  return toApply;
}

async function planEntry(opts: ReplayOptions, ways: Ways, rel: string, entry: MetadataEntry, st: Stats | null): Promise<Pending | undefined> {
  if (!st) {
    if (entry.type !== "dir") return undefined; // not in this checkout (ignored, or too large to commit)
    try {
      await fs.mkdir(path.join(opts.treeDir, rel), { mode: 0o700 });
    } catch (err) {
      opts.log("could not create a directory the metadata names", { path: rel, error: err instanceof Error ? err.message : String(err) });
      return undefined;
    }
    ways.set(rel, "ok");
  } else if (entryOf(entry.name, st)?.type !== entry.type) {
    opts.log("metadata and the tree disagree on an entry's type; left as it is", { path: rel, metadata: entry.type });
    if (entry.type === "dir") ways.set(rel, st.isSymbolicLink() ? "symlink" : "absent");
    return undefined;
  }
  return { rel, entry, st: st ?? undefined };
}

/** Files and symlinks first, then directories from the deepest up; answers how many took (or had) their owner and mode. */
async function applyAll(opts: ReplayOptions, toApply: Pending[]): Promise<number> {
  let applied = 0;
  const apply = async ({ rel, entry, st }: Pending) => {
    if (st && (st.mode & 0o7777) === entry.mode && st.uid === entry.uid && st.gid === entry.gid) {
      applied++; // already as recorded
      return;
    }
    try {
      await applyEntry(path.join(opts.treeDir, rel), entry);
      applied++;
    } catch (err) {
      opts.log("could not apply a metadata entry", { path: rel, error: err instanceof Error ? err.message : String(err) });
    }
  };
  await inBatches(
    toApply.filter((p) => p.entry.type !== "dir"),
    apply,
  );
  const dirs = toApply.filter((p) => p.entry.type === "dir");
  for (const depth of [...new Set(dirs.map((p) => depthOf(p.rel)))].sort((a, b) => b - a)) {
    await inBatches(
      dirs.filter((p) => depthOf(p.rel) === depth),
      apply,
    );
  }
  return applied;
}

async function applyEntry(abs: string, entry: MetadataEntry): Promise<void> {
  if (entry.type === "symlink") {
    await fs.lchown(abs, entry.uid, entry.gid);
    return;
  }
  const flags = fsConstants.O_RDONLY | fsConstants.O_NOFOLLOW | fsConstants.O_NONBLOCK | (entry.type === "dir" ? fsConstants.O_DIRECTORY : 0);
  const fh = await fs.open(abs, flags);
  try {
    const st = await fh.stat();
    if (entry.type === "file" ? !st.isFile() : !st.isDirectory()) throw new Error(`${abs} is no longer a ${entry.type}`);
    await fh.chown(entry.uid, entry.gid);
    await fh.chmod(entry.mode);
  } finally {
    await fh.close();
  }
}
