import * as path from "node:path";
import type { SimpleGit } from "simple-git";
import type { Author } from "../remote/git";
import { runGit } from "../remote/git";
import { baseName, byteOrder, formatListing, joinRel, listingPath, type MetadataEntry, normalizeChanged, parentOf, sameEntry } from "./format";
import { BaseListings, type ListingCache, leftOutAmong, type ListingWrite, privateGit, writeMetadataCommit } from "./plumbing";
import { inBatches, TreeView, vanished } from "./tree";

export interface RecordOptions {
  /** The repository that holds the metadata commits (the store's bare repository). */
  gitDir: string;
  /** Listings known from earlier records and reads. */
  cache: ListingCache;
  /** The volume's work tree. */
  treeDir: string;
  branch: string;
  /** The metadata commit to build on, "" for none. */
  base: string;
  /** Tree-relative paths the commit touched: files or directories, existing or deleted. */
  changedPaths: string[];
  /**
   * A private index file the caller owns. It is rebuilt from base on every
   * call, so reuse between calls is allowed and nothing depends on it; calls
   * that share one index file must not run at the same time.
   */
  indexFile: string;
  author: Author;
  /**
   * git in the volume's work tree (Store.tree). When given, what git ignores
   * there (the repository's .gitignore and the class's ignore), and what lies
   * inside a submodule, is not recorded: neither its modes nor its names
   * reach the remote.
   */
  tree?: SimpleGit;
  /** Paths the caller knows git does not ignore (git status listed them): nobody asks git again. */
  notIgnored?: Set<string>;
  /** Told of each path left out because it lies inside a submodule, with the submodule. */
  inSubmodule?: (path: string, submodule: string) => void;
}

/**
 * Records the modes, owners and directories of the directories a commit
 * touched, on top of the metadata commit `base`, and returns the new metadata
 * commit (or base when nothing changed). Listings are recomputed with lstat
 * and never through a symlink:
 *
 * - a directory named in changedPaths, or one that appeared, is listed afresh
 *   (one that appeared is walked down, since its content is new too);
 * - the parent of a changed path re-reads only the changed names, on top of
 *   its listing in base (afresh when base has none);
 * - a directory that vanished (or became a file, a symlink, or ignored) drops
 *   its listing and those of every directory base had below it;
 * - a directory whose own entry changed updates its parent, and so on up.
 *
 * So the cost follows the changed paths (and the listings of the directories
 * they sit in, read from git as text), never the tree. The first record of a
 * branch walks the whole tree. The same tree, base and changed paths always
 * give the same tree oid. The caller moves METADATA_REF to the result (as a
 * compare-and-swap from base) and pushes it; when the ref moved meanwhile,
 * record again on top of where it is now with the same changed paths.
 */
export async function recordMetadata(opts: RecordOptions): Promise<string> {
  const writer = { gitDir: opts.gitDir, indexFile: path.resolve(opts.indexFile), author: opts.author, cache: opts.cache };
  const git = privateGit(writer.gitDir, writer.indexFile, opts.author);
  // A commit the cache knows was read or written here already.
  if (opts.base !== "" && !opts.cache.knows(opts.base) && (await runGit(git, ["rev-parse", "--verify", "--quiet", `${opts.base}^{commit}`])).trim() === "") {
    throw new Error(`the metadata base ${opts.base} is not a commit`);
  }
  const view = new TreeView(opts.treeDir);
  await view.stat("");
  const base = new BaseListings(git, opts.base, opts.branch, opts.cache);
  const listings = await new Recording(view, base, opts.tree, opts.notIgnored ?? new Set(), opts.inSubmodule).run(opts.changedPaths);
  const { writes, removes } = changedListings(listings, base, opts.branch);
  if (writes.length === 0 && removes.length === 0) return opts.base;
  return writeMetadataCommit(writer, opts.base, opts.branch, writes, removes);
}

/** A directory's new listing; null: it has none. */
type Listing = Map<string, MetadataEntry> | null;

/** A wave's directories listed afresh: their recordable entries, or null where there is no directory. */
type Listed = Map<string, MetadataEntry[] | null>;

/**
 * One record's walk, in waves: each wave lists some directories afresh and
 * patches others for some names, and what it finds (a directory that
 * appeared or vanished, a directory's own entry that changed) makes the next.
 */
class Recording {
  /** Directories to list afresh. */
  private readonly full = new Set<string>();
  /** Directories to update for some of their names. */
  private readonly patch = new Map<string, Set<string>>();
  /** The new listing of each directory visited. */
  private readonly result = new Map<string, Listing>();
  private readonly listedAfresh = new Set<string>();

  constructor(
    private readonly view: TreeView,
    private readonly base: BaseListings,
    private readonly tree: SimpleGit | undefined,
    private readonly notIgnored: Set<string>,
    private readonly inSubmodule?: (path: string, submodule: string) => void,
  ) {}

  async run(changedPaths: string[]): Promise<Map<string, Listing>> {
    await this.seed(changedPaths);
    while (this.full.size > 0 || this.patch.size > 0) await this.wave();
    return this.result;
  }

  /** A changed path is listed afresh and patched into its parent; a branch's first record walks the tree. */
  private async seed(changedPaths: string[]): Promise<void> {
    for (const changed of changedPaths) {
      const p = normalizeChanged(changed);
      if (p === undefined) continue;
      this.full.add(p);
      if (p !== "") this.addPatch(parentOf(p), baseName(p));
    }
    await this.base.load([""]);
    if (this.base.get("") === null) this.full.add(""); // first record of this branch (or an empty root): walk the tree.
  }

  private addPatch(dir: string, name: string): void {
    const names = this.patch.get(dir) ?? new Set<string>();
    names.add(name);
    this.patch.set(dir, names);
  }

  private async wave(): Promise<void> {
    const fullWave = [...this.full].filter((d) => !this.listedAfresh.has(d));
    const patchWave = [...this.patch].filter(([d]) => !this.full.has(d));
    this.full.clear();
    this.patch.clear();
    await this.base.load([...fullWave, ...patchWave.map(([d]) => d)].flatMap((d) => (d === "" ? [d] : [d, parentOf(d)])));
    // lstat what the wave needs, then ask git once which of it is ignored.
    const listed = await this.listAfresh(fullWave);
    const patched = await this.patchable(patchWave);
    const asked = (await this.askedAbout(listed, patched)).filter((p) => !this.notIgnored.has(p));
    const { ignored, inSubmodule } = await leftOutAmong(this.tree, asked);
    for (const [p, submodule] of inSubmodule) this.inSubmodule?.(p, submodule);
    this.takeListed(listed, ignored);
    await this.takePatched(patched, ignored);
    await this.updateParents(listed, ignored);
  }

  private async listAfresh(dirs: string[]): Promise<Listed> {
    const lists = await inBatches(dirs, async (d) => ((await this.view.isDir(d)) ? this.view.list(d).catch(vanished) : null), 16);
    return new Map(dirs.map((d, i) => [d, lists[i]!]));
  }

  /** The patches that have a listing to build on, their names lstat-ed; the others are listed afresh in the next wave. */
  private async patchable(patchWave: [string, Set<string>][]): Promise<[string, Set<string>][]> {
    const patched: [string, Set<string>][] = [];
    for (const [d, names] of patchWave) {
      const usable = this.result.get(d) ?? this.base.get(d)?.entries;
      if (!(await this.view.isDir(d)) || !usable) {
        if (!this.listedAfresh.has(d)) this.full.add(d);
        continue;
      }
      for (const n of names) await this.view.stat(joinRel(d, n));
      patched.push([d, names]);
    }
    return patched;
  }

  /** Only paths whose way is real directories: check-ignore refuses a path beyond a symlink. */
  private async askedAbout(listed: Listed, patched: [string, Set<string>][]): Promise<string[]> {
    const asked: string[] = [];
    for (const [d, entries] of listed) {
      if (await this.view.stat(d)) asked.push(d);
      for (const e of entries ?? []) asked.push(joinRel(d, e.name));
    }
    for (const [d, names] of patched) for (const n of names) if (await this.view.stat(joinRel(d, n))) asked.push(joinRel(d, n));
    return asked;
  }

  /** A directory that vanished drops its listings below; one that appeared is walked. */
  private compareSubdirs(d: string, before: MetadataEntry | undefined, after: MetadataEntry | undefined): void {
    const wasDir = before?.type === "dir";
    const isDir = after?.type === "dir";
    if (wasDir !== isDir && !this.listedAfresh.has(joinRel(d, (before ?? after)!.name))) this.full.add(joinRel(d, (before ?? after)!.name));
  }

  private takeListed(listed: Listed, ignored: Set<string>): void {
    for (const [d, entries] of listed) {
      this.listedAfresh.add(d);
      const before = this.base.get(d)?.entries ?? new Map<string, MetadataEntry>();
      if (entries === null || ignored.has(d)) {
        this.result.set(d, null);
        for (const e of before.values()) this.compareSubdirs(d, e, undefined);
        continue;
      }
      const now = new Map(entries.filter((e) => !ignored.has(joinRel(d, e.name))).map((e) => [e.name, e]));
      this.result.set(d, now);
      for (const name of new Set([...before.keys(), ...now.keys()])) this.compareSubdirs(d, before.get(name), now.get(name));
    }
  }

  private async takePatched(patched: [string, Set<string>][], ignored: Set<string>): Promise<void> {
    for (const [d, names] of patched) {
      const listing = new Map(this.result.get(d) ?? this.base.get(d)!.entries);
      for (const n of names) {
        const prev = listing.get(n);
        const rel = joinRel(d, n);
        const now = ignored.has(rel) ? undefined : await this.view.entry(rel);
        if (now) listing.set(n, now);
        else listing.delete(n);
        this.compareSubdirs(d, prev, now);
      }
      this.result.set(d, listing);
    }
  }

  /** A directory whose own entry changed (it appeared, vanished, or took a new mode or owner) updates its parent. */
  private async updateParents(listed: Listed, ignored: Set<string>): Promise<void> {
    for (const d of listed.keys()) {
      if (d === "") continue;
      const parent = parentOf(d);
      const self = ignored.has(d) ? undefined : await this.view.entry(d);
      const parentListing = this.result.has(parent) ? this.result.get(parent) : this.base.get(parent)?.entries;
      if (sameEntry(parentListing?.get(baseName(d)), self)) continue;
      const computed = this.result.get(parent);
      if (computed) {
        if (self) computed.set(self.name, self);
        else computed.delete(baseName(d));
      } else if (!this.result.has(parent)) {
        this.addPatch(parent, baseName(d));
      }
    }
  }
}

/** The blobs that change: a listing with no entries has no blob. */
function changedListings(result: Map<string, Listing>, base: BaseListings, branch: string): { writes: ListingWrite[]; removes: string[] } {
  const writes: ListingWrite[] = [];
  const removes: string[] = [];
  for (const [dir, listing] of [...result].sort(([a], [b]) => byteOrder(a, b))) {
    const before = base.get(dir);
    if (listing === null || listing.size === 0) {
      if (before) removes.push(listingPath(branch, dir));
      continue;
    }
    const text = formatListing(dir, listing.values());
    if (!before || !before.raw.equals(Buffer.from(text, "utf8"))) writes.push({ dir, text });
  }
  return { writes, removes };
}
