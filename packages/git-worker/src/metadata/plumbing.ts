/** The git side of refs/git-csi/metadata: reading listings from a metadata commit, git's ignores, and writing a new commit. */
import * as fs from "node:fs/promises";
import * as path from "node:path";
import type { SimpleGit } from "simple-git";
import { ARGV_BATCH, type Author, authorEnv, chunks, gitIn, gitMessage, runGit, traced } from "../remote/git";
import { baseName, listingPath, MAX_LISTING_BYTES, type MetadataEntry, parentOf, parseListing } from "./format";

export interface TreeBlob {
  path: string;
  mode: string;
  type: string;
  oid: string;
  size: number;
}

/** `ls-tree -l -z` output: `<mode> <type> <oid> <size>\t<path>\0`. */
export function parseLsTree(text: string): TreeBlob[] {
  const out: TreeBlob[] = [];
  for (const record of text.split("\0")) {
    const m = /^(\d+) (\w+) ([0-9a-f]+) +(-|\d+)\t([\s\S]*)$/.exec(record);
    if (m) out.push({ mode: m[1]!, type: m[2]!, oid: m[3]!, size: m[4] === "-" ? 0 : Number(m[4]), path: m[5]! });
  }
  return out;
}

/**
 * The contents of many blobs in a few processes: `git show` prints blobs one
 * after the other with nothing between them, so ls-tree's sizes cut them
 * apart. A total that does not add up falls back to one `cat-file` a blob.
 */
export async function readBlobs(git: SimpleGit, blobs: { oid: string; size: number }[]): Promise<Map<string, Buffer>> {
  const out = new Map<string, Buffer>();
  const unique = [...new Map(blobs.map((b) => [b.oid, b])).values()];
  let batch: { oid: string; size: number }[] = [];
  let bytes = 0;
  const flush = async () => {
    if (batch.length === 0) return;
    const buf = await git.showBuffer(batch.map((b) => b.oid));
    if (buf.length === bytes) {
      let at = 0;
      for (const b of batch) {
        out.set(b.oid, buf.subarray(at, at + b.size));
        at += b.size;
      }
    } else {
      for (const b of batch) out.set(b.oid, await git.binaryCatFile(["blob", b.oid]));
    }
    batch = [];
    bytes = 0;
  };
  for (const b of unique) {
    if (batch.length >= ARGV_BATCH || (batch.length > 0 && bytes + b.size > 32 * 1024 * 1024)) await flush();
    batch.push(b);
    bytes += b.size;
  }
  await flush();
  return out;
}

export interface BaseListing {
  oid: string;
  raw: Buffer;
  entries: Map<string, MetadataEntry>;
}

/** How many metadata commits the listing cache remembers. */
const CACHED_COMMITS = 64;
/** A record that writes more than this (a branch's first, which walks the tree) leaves its listings to be read from git. */
const CACHED_WRITE_BYTES = 1024 * 1024;

/**
 * Listings already read from git or written to it, by metadata commit and
 * listing path (null: the commit has none). A commit's listings never
 * change, and a commit the worker writes shares every listing it did not
 * write with its base: the next record on it reads nothing from git.
 */
export class ListingCache {
  private readonly commits = new Map<string, Map<string, BaseListing | null>>();

  /** Whether a listing of this commit was read or written here: the commit is known to exist. */
  knows(commit: string): boolean {
    return this.commits.has(commit);
  }

  get(commit: string, key: string): BaseListing | null | undefined {
    return this.commits.get(commit)?.get(key);
  }

  set(commit: string, key: string, listing: BaseListing | null): void {
    this.listings(commit).set(key, listing);
  }

  /** commit is base with these listings written and these removed. */
  derive(base: string, commit: string, written: Map<string, BaseListing>, removed: string[]): void {
    const listings = this.listings(commit);
    for (const [key, listing] of this.commits.get(base) ?? []) if (!listings.has(key)) listings.set(key, listing);
    for (const key of removed) listings.set(key, null);
    let bytes = 0;
    for (const listing of written.values()) bytes += listing.raw.length;
    if (bytes > CACHED_WRITE_BYTES) {
      for (const key of written.keys()) listings.delete(key);
      return;
    }
    for (const [key, listing] of written) listings.set(key, listing);
  }

  private listings(commit: string): Map<string, BaseListing | null> {
    let listings = this.commits.get(commit);
    if (!listings) {
      listings = new Map();
      this.commits.set(commit, listings);
      if (this.commits.size > CACHED_COMMITS) this.commits.delete(this.commits.keys().next().value!);
    }
    return listings;
  }
}

/** A listing as read from its blob; one under the wrong key, or one that does not parse, is taken as empty. */
export function baseListing(dir: string, oid: string, raw: Buffer): BaseListing {
  const parsed = parseListing(raw);
  const entries = parsed.problem === undefined && parsed.dir === dir ? new Map(parsed.entries.map((e) => [e.name, e])) : new Map<string, MetadataEntry>();
  return { oid, raw, entries };
}

/** The listings of one branch in the base metadata commit, read on demand, in batches, and through the cache. */
export class BaseListings {
  constructor(
    private readonly git: SimpleGit,
    private readonly commit: string,
    private readonly branch: string,
    private readonly cache: ListingCache,
  ) {}

  /** A record lists a directory only where its parent's listing names it as one: a changed file has no listing to read. */
  private notADirectory(dir: string): boolean {
    if (dir === "") return false;
    const parent = this.cache.get(this.commit, listingPath(this.branch, parentOf(dir)));
    return parent !== undefined && parent !== null && parent.entries.get(baseName(dir))?.type !== "dir";
  }

  get(dir: string): BaseListing | null {
    return this.commit === "" ? null : (this.cache.get(this.commit, listingPath(this.branch, dir)) ?? null);
  }

  async load(dirs: Iterable<string>): Promise<void> {
    if (this.commit === "") return;
    const wanted = [...new Set(dirs)].filter((d) => this.cache.get(this.commit, listingPath(this.branch, d)) === undefined && !this.notADirectory(d));
    if (wanted.length === 0) return;
    const byPath = new Map(wanted.map((d) => [listingPath(this.branch, d), d]));
    const found: (TreeBlob & { dir: string })[] = [];
    const paths = [...byPath.keys()];
    for (const batch of chunks(paths)) {
      const text = await runGit(this.git, ["--literal-pathspecs", "ls-tree", "-l", "-z", this.commit, "--", ...batch]);
      for (const b of parseLsTree(text)) {
        const dir = byPath.get(b.path);
        if (dir !== undefined && b.type === "blob" && b.size <= MAX_LISTING_BYTES) found.push({ ...b, dir });
      }
    }
    const contents = await readBlobs(this.git, found);
    for (const d of wanted) this.cache.set(this.commit, listingPath(this.branch, d), null);
    for (const b of found) this.cache.set(this.commit, b.path, baseListing(b.dir, b.oid, contents.get(b.oid)!));
  }
}

/** Undoes git's C-style quoting of a path in command output. */
function unquoteGitPath(line: string): string {
  if (!(line.length >= 2 && line.startsWith('"') && line.endsWith('"'))) return line;
  const bytes: number[] = [];
  const simple: Record<string, number> = { a: 7, b: 8, t: 9, n: 10, v: 11, f: 12, r: 13, '"': 34, "\\": 92 };
  const body = Buffer.from(line.slice(1, -1), "utf8");
  for (let i = 0; i < body.length; i++) {
    const c = body[i]!;
    if (c !== 92) {
      bytes.push(c);
      continue;
    }
    const next = String.fromCharCode(body[i + 1] ?? 0);
    if (/[0-7]/.test(next)) {
      bytes.push(parseInt(body.subarray(i + 1, i + 4).toString("latin1"), 8));
      i += 3;
    } else {
      bytes.push(simple[next] ?? body[i + 1]!);
      i += 1;
    }
  }
  return Buffer.from(bytes).toString("utf8");
}

/**
 * What a record leaves out among these paths: what git ignores in the work
 * tree (tracked paths are never ignored), and what lies inside a submodule,
 * which git never takes into this repository (spec 004: a submodule's
 * directory is not served). `ignored` holds both; `inSubmodule` names each
 * one's submodule.
 */
export interface LeftOut {
  ignored: Set<string>;
  inSubmodule: Map<string, string>;
}

/**
 * check-ignore takes no literal pathspecs (the store's tree git sets
 * GIT_LITERAL_PATHSPECS), so it runs without them, each path behind "./" so
 * that a leading ":" is no pathspec magic. A name with glob characters may
 * then be taken for tracked and recorded: the error is on the side of keeping.
 */
export async function leftOutAmong(tree: SimpleGit | undefined, paths: string[]): Promise<LeftOut> {
  const out: LeftOut = { ignored: new Set(), inSubmodule: new Map() };
  if (!tree) return out;
  const asked = paths.filter((p) => p !== "");
  if (asked.length > ARGV_BATCH) {
    // Many paths (a branch's first record walks the whole tree): one listing of what git
    // ignores, rather than one check-ignore per batch that each reads the whole index.
    const [text, gitlinks] = await Promise.all([runGit(tree, ["ls-files", "-z", "--others", "--ignored", "--exclude-standard", "--directory"]), gitlinksOf(tree)]);
    const listed = text.split("\0").filter((p) => p !== "");
    const files = new Set(listed);
    const dirs = listed.filter((p) => p.endsWith("/"));
    for (const p of asked) {
      const submodule = submoduleOf(p, gitlinks);
      if (submodule !== undefined) leaveOutOfSubmodule(out, p, submodule);
      else if (files.has(p) || files.has(`${p}/`) || dirs.some((d) => p.startsWith(d))) out.ignored.add(p);
    }
    return out;
  }
  for (const batch of chunks(asked)) await checkIgnore(tree, batch, out);
  return out;
}

/** git's refusal of a path inside a submodule: check-ignore answers no path of its batch then. */
const IN_SUBMODULE = /^fatal: Pathspec '.*' is in submodule '(.*)'$/m;

/** check-ignore of one batch; each submodule git refuses takes its paths out of the batch, and git is asked again. */
async function checkIgnore(tree: SimpleGit, batch: string[], out: LeftOut): Promise<void> {
  let left = batch;
  while (left.length > 0) {
    let text: string;
    try {
      // Every path gets a line, matched or not: a git that prints nothing costs 50 ms more under simple-git (see traced).
      text = await runGit(tree, ["--no-literal-pathspecs", "check-ignore", "--verbose", "--non-matching", "--", ...left.map((p) => `./${p}`)]);
    } catch (err) {
      const submodule = IN_SUBMODULE.exec(gitMessage(err))?.[1];
      const inside = submodule === undefined ? [] : left.filter((p) => p.startsWith(`${submodule}/`));
      if (inside.length === 0) throw err;
      for (const p of inside) leaveOutOfSubmodule(out, p, submodule!);
      left = left.filter((p) => !p.startsWith(`${submodule}/`));
      continue;
    }
    for (const line of text.split("\n")) {
      const p = ignoredPath(line);
      if (p !== undefined) out.ignored.add(p.startsWith("./") ? p.slice(2) : p);
    }
    return;
  }
}

function leaveOutOfSubmodule(out: LeftOut, p: string, submodule: string): void {
  out.ignored.add(p);
  out.inSubmodule.set(p, submodule);
}

/** The index's gitlinks: the submodules' paths. */
async function gitlinksOf(tree: SimpleGit): Promise<Set<string>> {
  const gitlinks = new Set<string>();
  for (const entry of (await runGit(tree, ["ls-files", "-z", "--stage"])).split("\0")) {
    if (entry.startsWith("160000 ")) gitlinks.add(entry.slice(entry.indexOf("\t") + 1));
  }
  return gitlinks;
}

/** The submodule a path lies inside, if any. */
function submoduleOf(p: string, gitlinks: Set<string>): string | undefined {
  for (let dir = parentOf(p); dir !== ""; dir = parentOf(dir)) if (gitlinks.has(dir)) return dir;
  return undefined;
}

/**
 * The path of a `check-ignore --verbose` line, `<source>:<line>:<pattern>TAB<path>`,
 * when its pattern ignores it: "::" matched nothing, and a negated pattern keeps the path.
 * A quoted path holds no tab, so the last one ends the pattern.
 */
function ignoredPath(line: string): string | undefined {
  const tab = line.lastIndexOf("\t");
  if (tab < 0) return undefined;
  const pattern = /^.*?:\d+:(.*)$/s.exec(line.slice(0, tab))?.[1];
  if (pattern === undefined || pattern.startsWith("!")) return undefined;
  return unquoteGitPath(line.slice(tab + 1));
}

/** git in the same repository as `repo`, with its own index and the metadata author. */
export function privateGit(gitDir: string, indexFile: string, author: Author, env: Record<string, string> = {}): SimpleGit {
  return gitIn(gitDir, { GIT_DIR: gitDir, GIT_INDEX_FILE: indexFile, ...authorEnv(author), ...env });
}

/** Writes objects through files in a scratch directory: simple-git gives no stdin, and hash-object takes many files in one process. */
export async function writeObjects(git: SimpleGit, scratch: string, type: "blob" | "commit" | "tag", texts: string[]): Promise<string[]> {
  const oids: string[] = [];
  for (const [n, batch] of chunks(texts).entries()) {
    const files = batch.map((_, j) => path.join(scratch, `object-${n * ARGV_BATCH + j}`));
    await Promise.all(files.map((f, j) => fs.writeFile(f, batch[j]!, { mode: 0o600 })));
    const out = (await runGit(git, ["hash-object", "-w", "-t", type, "--no-filters", "--", ...files])).split("\n").filter((l) => l !== "");
    if (out.length !== files.length) throw new Error(`git hash-object wrote ${out.length} object(s) for ${files.length} file(s)`);
    oids.push(...out);
  }
  return oids;
}

/** A listing's new text, by directory. */
export interface ListingWrite {
  dir: string;
  text: string;
}

/** Where a metadata commit is written: the repository, the caller's private index, its author, and the listing cache that learns the commit. */
export interface MetadataWriter {
  gitDir: string;
  indexFile: string;
  author: Author;
  cache: ListingCache;
}

/**
 * The metadata commit on top of base with these listings written and these
 * listing paths removed, built in a private index. Each write differs from
 * base's listing and each removal names one base has, so the tree always
 * differs from base's.
 */
export async function writeMetadataCommit(w: MetadataWriter, base: string, branch: string, writes: ListingWrite[], removes: string[]): Promise<string> {
  const { gitDir, indexFile, author } = w;
  const git = privateGit(gitDir, indexFile, author);
  const near = path.dirname(indexFile);
  await fs.mkdir(near, { recursive: true });
  const scratch = await fs.mkdtemp(path.join(near, ".metadata-"));
  try {
    const oids = await writeObjects(
      git,
      scratch,
      "blob",
      writes.map((w) => w.text),
    );
    // The index is the caller's own and rebuilt from base: a lock left by a crash is stale.
    await fs.rm(`${indexFile}.lock`, { force: true });
    // Each command prints something (a trace, --verbose): simple-git waits 50 ms more for a silent one (see traced).
    await runGit(traced(privateGit(gitDir, indexFile, author)), base === "" ? ["read-tree", "--empty"] : ["read-tree", base]);
    for (const [n, batch] of chunks(writes).entries()) {
      const args = batch.flatMap((w, j) => ["--cacheinfo", `100644,${oids[n * ARGV_BATCH + j]},${listingPath(branch, w.dir)}`]);
      await runGit(git, ["update-index", "--verbose", "--add", ...args]);
    }
    if (removes.length > 0) await removeFromIndex(gitDir, indexFile, author, scratch, removes);
    const tree = (await runGit(git, ["write-tree"])).trim();
    const message = `git-csi metadata: ${branch}: ${writes.length} listing(s) written, ${removes.length} dropped`;
    const commit = (await runGit(git, ["commit-tree", tree, ...(base === "" ? [] : ["-p", base]), "-m", message])).trim();
    const written = new Map(writes.map((write, n) => [listingPath(branch, write.dir), baseListing(write.dir, oids[n]!, Buffer.from(write.text, "utf8"))]));
    w.cache.derive(base, commit, written, removes);
    return commit;
  } finally {
    await fs.rm(scratch, { recursive: true, force: true });
  }
}

/** update-index takes paths only with a work tree: an empty one it never reads. */
async function removeFromIndex(gitDir: string, indexFile: string, author: Author, scratch: string, removes: string[]): Promise<void> {
  const emptyTree = path.join(scratch, "work-tree");
  await fs.mkdir(emptyTree);
  const remover = privateGit(gitDir, indexFile, author, { GIT_WORK_TREE: emptyTree });
  for (const batch of chunks(removes)) await runGit(remover, ["update-index", "--verbose", "--force-remove", "--", ...batch]);
}
