import { createHash } from "node:crypto";
import { constants as fsConstants, type Stats } from "node:fs";
import * as fs from "node:fs/promises";
import * as path from "node:path";
import type { SimpleGit } from "simple-git";
import { isAbsent, METADATA_REF, orAbsent } from "@git-csi/config";
import { type Author, authorEnv, gitIn, runGit } from "./git";

/**
 * Spec 004: "The driver records modes, owners, and empty directories on a ref
 * of its own, refs/git-csi/metadata." Git keeps only a file's executable bit
 * and never an empty directory, so the driver keeps them beside the branch, on
 * a ref no forge shows in its file view. docs/metadata.md is the format.
 *
 * The ref names a commit (its parent: the previous metadata commit) whose tree
 * holds, per branch, one blob per data directory that has entries:
 *
 *   <branch, "%" and "/" escaped>/<sha1(dir)[0..2]>/<sha1(dir)>
 *
 * Each blob is JSON lines: `{"dir":"a/b"}`, then one line per entry of that
 * directory, sorted by name. A name is only ever hashed, so no data path can
 * collide with a metadata path, and a commit rewrites only the blobs of the
 * directories it touched: the cost follows the change, not the tree.
 */

export type MetadataType = "file" | "dir" | "symlink";

export interface MetadataEntry {
  name: string;
  type: MetadataType;
  /** Permission bits with setuid, setgid and sticky: 0..0o7777. */
  mode: number;
  uid: number;
  gid: number;
}

export interface RecordOptions {
  /** git in the repository that holds the metadata commits (the store's bare repository). */
  repo: SimpleGit;
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
   * there (the repository's .gitignore and the class's ignore) is not
   * recorded: neither its modes nor its names reach the remote.
   */
  tree?: SimpleGit;
}

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

const MAX_LISTING_BYTES = 64 * 1024 * 1024;
const MAX_NAME_BYTES = 255;
const MAX_ID = 2 ** 32;
const ARG_BATCH = 500;
const FS_BATCH = 256;

// ---- names and keys ---------------------------------------------------

/** The top-level tree of a branch: `%` and `/` escaped, so `feature/x` is `feature%2Fx`. */
export function branchTreeName(branch: string): string {
  if (branch === "") throw new Error("metadata needs a branch name");
  return branch.replace(/%/g, "%25").replace(/\//g, "%2F");
}

/** The key of a directory's listing inside its branch tree: `<2 hex>/<40 hex>`. */
export function listingKey(dir: string): string {
  const hash = createHash("sha1").update(dir, "utf8").digest("hex");
  return `${hash.slice(0, 2)}/${hash}`;
}

/** Where a directory's listing lives in a metadata commit: `<branch tree>/<key>`. */
export function listingPath(branch: string, dir: string): string {
  return `${branchTreeName(branch)}/${listingKey(dir)}`;
}

/** Why a name cannot be a directory entry the driver records or replays, or undefined when it can. */
function badName(name: unknown): string | undefined {
  if (typeof name !== "string") return "the name is not a string";
  if (name === "" || name === "." || name === "..") return `the name ${JSON.stringify(name)} is not a file name`;
  if (name.includes("/") || name.includes("\0")) return "the name holds / or a NUL byte";
  if (name.toLowerCase() === ".git") return "the name is .git";
  if (Buffer.from(name, "utf8").toString("utf8") !== name) return "the name is not valid Unicode";
  if (Buffer.byteLength(name, "utf8") > MAX_NAME_BYTES) return `the name is over ${MAX_NAME_BYTES} bytes`;
  return undefined;
}

/** Why a directory path cannot be replayed, or undefined when it can: "" is the root, anything else relative and clean. */
function badDir(dir: unknown): string | undefined {
  if (typeof dir !== "string") return "the listing names no directory";
  if (dir === "") return undefined;
  if (dir.startsWith("/")) return "the directory path is absolute";
  for (const segment of dir.split("/")) {
    if (segment === "..") return "the directory path climbs with ..";
    const why = badName(segment);
    if (why) return `a segment of the directory path is refused: ${why}`;
  }
  return undefined;
}

function parentOf(p: string): string {
  const i = p.lastIndexOf("/");
  return i < 0 ? "" : p.slice(0, i);
}

function baseName(p: string): string {
  return p.slice(p.lastIndexOf("/") + 1);
}

function joinRel(dir: string, name: string): string {
  return dir === "" ? name : `${dir}/${name}`;
}

function depthOf(dir: string): number {
  return dir === "" ? 0 : dir.split("/").length;
}

function byteOrder(a: string, b: string): number {
  return Buffer.compare(Buffer.from(a, "utf8"), Buffer.from(b, "utf8"));
}

/** A changed path as a clean tree-relative path ("" is the root), or undefined when it cannot be one. */
function normalizeChanged(p: string): string | undefined {
  if (p.startsWith("/") || p.includes("\0")) return undefined;
  const segments = p.split("/").filter((s) => s !== "" && s !== ".");
  if (segments.some((s) => s === "..")) return undefined;
  return segments.join("/");
}

// ---- the listing format -------------------------------------------------

/** Why a parsed line cannot be an entry, or the entry. */
function checkEntry(raw: unknown): MetadataEntry | string {
  if (typeof raw !== "object" || raw === null || Array.isArray(raw)) return "the line is not a JSON object";
  const r = raw as Record<string, unknown>;
  const nameProblem = badName(r.name);
  if (nameProblem) return nameProblem;
  if (r.type !== "file" && r.type !== "dir" && r.type !== "symlink") return `the type ${JSON.stringify(r.type)} is unknown`;
  if (typeof r.mode !== "number" || !Number.isInteger(r.mode) || r.mode < 0 || r.mode > 0o7777) return `the mode ${JSON.stringify(r.mode)} is not within 0..0o7777`;
  for (const key of ["uid", "gid"] as const) {
    const v = r[key];
    if (typeof v !== "number" || !Number.isInteger(v) || v < 0 || v >= MAX_ID) return `the ${key} ${JSON.stringify(v)} is not an integer from 0 to 2^32-1`;
  }
  return { name: r.name as string, type: r.type, mode: r.mode, uid: (r.uid as number) + 0, gid: (r.gid as number) + 0 };
}

/** One directory's listing as the blob holds it: JSON lines, entries sorted by the bytes of their names. */
export function formatListing(dir: string, entries: Iterable<MetadataEntry>): string {
  const sorted = [...entries].sort((a, b) => byteOrder(a.name, b.name));
  const lines = [JSON.stringify({ dir })];
  for (const e of sorted) lines.push(JSON.stringify({ name: e.name, type: e.type, mode: e.mode, uid: e.uid, gid: e.gid }));
  return `${lines.join("\n")}\n`;
}

export interface ParsedListing {
  /** The directory the listing names; undefined when its first line is not a usable `{"dir":...}`. */
  dir?: string;
  /** Why the listing as a whole is refused. */
  problem?: string;
  entries: MetadataEntry[];
  /** Lines refused one by one: the path they name (or the listing and line number) and why. */
  refused: { path: string; reason: string }[];
}

/** Reads one listing blob strictly: whatever does not pass is refused, the rest stands. Unknown fields are ignored. */
export function parseListing(blob: Buffer | string): ParsedListing {
  const text = typeof blob === "string" ? blob : blob.toString("utf8");
  if (typeof blob !== "string" && !Buffer.from(text, "utf8").equals(blob)) return { problem: "the listing is not UTF-8", entries: [], refused: [] };
  const lines = text.split("\n");
  let header: unknown;
  try {
    header = JSON.parse(lines[0] ?? "");
  } catch {
    return { problem: "the first line is not JSON", entries: [], refused: [] };
  }
  const dir = typeof header === "object" && header !== null && !Array.isArray(header) ? (header as Record<string, unknown>).dir : undefined;
  const dirProblem = badDir(dir);
  if (dirProblem) return { problem: dirProblem, entries: [], refused: [], ...(typeof dir === "string" ? { dir } : {}) };
  const out: ParsedListing = { dir: dir as string, entries: [], refused: [] };
  const seen = new Set<string>();
  for (let i = 1; i < lines.length; i++) {
    const line = lines[i]!;
    if (line.trim() === "") continue;
    let raw: unknown;
    try {
      raw = JSON.parse(line);
    } catch {
      out.refused.push({ path: `${out.dir || "."}:${i + 1}`, reason: "the line is not JSON" });
      continue;
    }
    const entry = checkEntry(raw);
    const rawName = (raw as { name?: unknown } | null)?.name;
    const where = typeof rawName === "string" ? (out.dir === "" ? rawName : `${out.dir}/${rawName}`) : `${out.dir || "."}:${i + 1}`;
    if (typeof entry === "string") {
      out.refused.push({ path: where, reason: entry });
    } else if (seen.has(entry.name)) {
      out.refused.push({ path: where, reason: "the name is listed twice" });
    } else {
      seen.add(entry.name);
      out.entries.push(entry);
    }
  }
  return out;
}

function entryOf(name: string, st: Stats): MetadataEntry | undefined {
  const type: MetadataType | undefined = st.isSymbolicLink() ? "symlink" : st.isDirectory() ? "dir" : st.isFile() ? "file" : undefined;
  if (!type) return undefined;
  return { name, type, mode: st.mode & 0o7777, uid: st.uid, gid: st.gid };
}

function sameEntry(a: MetadataEntry | undefined, b: MetadataEntry | undefined): boolean {
  if (!a || !b) return a === b;
  return a.name === b.name && a.type === b.type && a.mode === b.mode && a.uid === b.uid && a.gid === b.gid;
}

// ---- reading metadata commits ---------------------------------------------

interface TreeBlob {
  path: string;
  mode: string;
  type: string;
  oid: string;
  size: number;
}

/** `ls-tree -l -z` output: `<mode> <type> <oid> <size>\t<path>\0`. */
function parseLsTree(text: string): TreeBlob[] {
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
async function readBlobs(git: SimpleGit, blobs: { oid: string; size: number }[]): Promise<Map<string, Buffer>> {
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
    if (batch.length >= ARG_BATCH || (batch.length > 0 && bytes + b.size > 32 * 1024 * 1024)) await flush();
    batch.push(b);
    bytes += b.size;
  }
  await flush();
  return out;
}

interface BaseListing {
  oid: string;
  raw: Buffer;
  entries: Map<string, MetadataEntry>;
}

/** The listings of one branch in the base metadata commit, read on demand and in batches. */
class BaseListings {
  private readonly cache = new Map<string, BaseListing | null>();

  constructor(
    private readonly git: SimpleGit,
    private readonly commit: string,
    private readonly branch: string,
  ) {}

  get(dir: string): BaseListing | null {
    return this.cache.get(dir) ?? null;
  }

  async load(dirs: Iterable<string>): Promise<void> {
    const wanted = [...new Set(dirs)].filter((d) => !this.cache.has(d));
    for (const d of wanted) this.cache.set(d, null);
    if (this.commit === "" || wanted.length === 0) return;
    const byPath = new Map(wanted.map((d) => [listingPath(this.branch, d), d]));
    const found: (TreeBlob & { dir: string })[] = [];
    const paths = [...byPath.keys()];
    for (let i = 0; i < paths.length; i += ARG_BATCH) {
      const text = await runGit(this.git, ["--literal-pathspecs", "ls-tree", "-l", "-z", this.commit, "--", ...paths.slice(i, i + ARG_BATCH)]);
      for (const b of parseLsTree(text)) {
        const dir = byPath.get(b.path);
        if (dir !== undefined && b.type === "blob" && b.size <= MAX_LISTING_BYTES) found.push({ ...b, dir });
      }
    }
    const contents = await readBlobs(this.git, found);
    for (const b of found) {
      const raw = contents.get(b.oid)!;
      const parsed = parseListing(raw);
      // A listing under the wrong key, or one that does not parse, is replaced by what the tree holds.
      const entries = parsed.problem === undefined && parsed.dir === b.dir ? new Map(parsed.entries.map((e) => [e.name, e])) : new Map<string, MetadataEntry>();
      this.cache.set(b.dir, { oid: b.oid, raw, entries });
    }
  }
}

// ---- the tree as lstat sees it ----------------------------------------------

/**
 * lstat of tree-relative paths, never through a symlink: a path is seen only
 * when each directory on its way is a real directory. Cached for one call.
 */
class TreeView {
  private readonly stats = new Map<string, Promise<Stats | null>>();

  constructor(readonly root: string) {}

  abs(rel: string): string {
    return rel === "" ? this.root : path.join(this.root, rel);
  }

  stat(rel: string): Promise<Stats | null> {
    let p = this.stats.get(rel);
    if (!p) {
      p = this.statUncached(rel);
      this.stats.set(rel, p);
    }
    return p;
  }

  seed(rel: string, st: Stats): void {
    this.stats.set(rel, Promise.resolve(st));
  }

  private async statUncached(rel: string): Promise<Stats | null> {
    if (rel === "") {
      const st = await fs.lstat(this.root);
      if (!st.isDirectory()) throw new Error(`the tree ${this.root} is not a directory`);
      return st;
    }
    if (badName(baseName(rel))) return null;
    const parent = await this.stat(parentOf(rel));
    if (!parent?.isDirectory()) return null;
    return (await orAbsent(fs.lstat(this.abs(rel)))) ?? null;
  }

  async isDir(rel: string): Promise<boolean> {
    return (await this.stat(rel))?.isDirectory() ?? false;
  }

  /** The recordable entries of a real directory, each lstat-ed. */
  async list(rel: string): Promise<MetadataEntry[]> {
    const names: string[] = [];
    for (const raw of await fs.readdir(this.abs(rel), { encoding: "buffer" })) {
      const name = raw.toString("utf8");
      // A name that is not UTF-8 cannot be written in the format: it is not recorded.
      if (Buffer.from(name, "utf8").equals(raw) && !badName(name)) names.push(name);
    }
    const out: MetadataEntry[] = [];
    for (let i = 0; i < names.length; i += FS_BATCH) {
      const stats = await Promise.all(names.slice(i, i + FS_BATCH).map(async (n) => (await orAbsent(fs.lstat(path.join(this.abs(rel), n)))) ?? null));
      stats.forEach((st, j) => {
        const name = names[i + j]!;
        if (!st) return;
        this.seed(joinRel(rel, name), st);
        const entry = entryOf(name, st);
        if (entry) out.push(entry);
      });
    }
    return out;
  }

  async entry(rel: string): Promise<MetadataEntry | undefined> {
    const st = await this.stat(rel);
    return st ? entryOf(baseName(rel), st) : undefined;
  }
}

/** A directory that vanished between lstat and readdir has no listing; any other error is the caller's. */
function vanished(err: unknown): null {
  if (isAbsent(err)) return null;
  throw err;
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
 * The paths among these that git ignores in the work tree; tracked paths are
 * never ignored. check-ignore takes no literal pathspecs (the store's tree git
 * sets GIT_LITERAL_PATHSPECS), so it runs without them, each path behind "./"
 * so that a leading ":" is no pathspec magic. A name with glob characters may
 * then be taken for tracked and recorded: the error is on the side of keeping.
 */
async function ignoredAmong(tree: SimpleGit | undefined, paths: string[]): Promise<Set<string>> {
  const out = new Set<string>();
  if (!tree) return out;
  const asked = paths.filter((p) => p !== "");
  if (asked.length > ARG_BATCH) {
    // Many paths (a branch's first record walks the whole tree): one listing of what git
    // ignores, rather than one check-ignore per batch that each reads the whole index.
    const listed = (await runGit(tree, ["ls-files", "-z", "--others", "--ignored", "--exclude-standard", "--directory"])).split("\0").filter((p) => p !== "");
    const files = new Set(listed);
    const dirs = listed.filter((p) => p.endsWith("/"));
    for (const p of asked) if (files.has(p) || files.has(`${p}/`) || dirs.some((d) => p.startsWith(d))) out.add(p);
    return out;
  }
  for (let i = 0; i < asked.length; i += ARG_BATCH) {
    // Exit status 1 with nothing on stderr means none is ignored: simple-git resolves it with "".
    const text = await runGit(tree, ["--no-literal-pathspecs", "check-ignore", "--", ...asked.slice(i, i + ARG_BATCH).map((p) => `./${p}`)]);
    for (const line of text.split("\n")) {
      const p = unquoteGitPath(line);
      if (p !== "") out.add(p.startsWith("./") ? p.slice(2) : p);
    }
  }
  return out;
}

// ---- recording ------------------------------------------------------------------

/** git in the same repository as `repo`, with its own index and the metadata author. */
function privateGit(gitDir: string, indexFile: string, author: Author, env: Record<string, string> = {}): SimpleGit {
  return gitIn(gitDir, { GIT_DIR: gitDir, GIT_INDEX_FILE: indexFile, ...authorEnv(author), ...env });
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
  const gitDir = (await runGit(opts.repo, ["rev-parse", "--absolute-git-dir"])).trim();
  const indexFile = path.resolve(opts.indexFile);
  const git = privateGit(gitDir, indexFile, opts.author);
  if (opts.base !== "" && (await runGit(git, ["rev-parse", "--verify", "--quiet", `${opts.base}^{commit}`])).trim() === "") {
    throw new Error(`the metadata base ${opts.base} is not a commit`);
  }
  const view = new TreeView(opts.treeDir);
  await view.stat("");
  const base = new BaseListings(git, opts.base, opts.branch);

  /** Directories to list afresh. */
  const full = new Set<string>();
  /** Directories to update for some of their names. */
  const patch = new Map<string, Set<string>>();
  const addPatch = (dir: string, name: string) => {
    const names = patch.get(dir) ?? new Set<string>();
    names.add(name);
    patch.set(dir, names);
  };
  /** The new listing of each directory visited; null: it has none. */
  const result = new Map<string, Map<string, MetadataEntry> | null>();
  const listedAfresh = new Set<string>();

  for (const changed of opts.changedPaths) {
    const p = normalizeChanged(changed);
    if (p === undefined) continue;
    full.add(p);
    if (p !== "") addPatch(parentOf(p), baseName(p));
  }
  await base.load([""]);
  if (base.get("") === null) full.add(""); // first record of this branch (or an empty root): walk the tree.

  while (full.size > 0 || patch.size > 0) {
    const fullWave = [...full].filter((d) => !listedAfresh.has(d));
    const patchWave = [...patch].filter(([d]) => !full.has(d));
    full.clear();
    patch.clear();
    await base.load([...fullWave, ...patchWave.map(([d]) => d)].flatMap((d) => (d === "" ? [d] : [d, parentOf(d)])));

    // lstat what the wave needs, then ask git once which of it is ignored.
    const listed = new Map<string, MetadataEntry[] | null>();
    const lists = await inBatches(fullWave, async (d) => ((await view.isDir(d)) ? view.list(d).catch(vanished) : null), 16);
    fullWave.forEach((d, i) => listed.set(d, lists[i]!));
    const patched: [string, Set<string>][] = [];
    for (const [d, names] of patchWave) {
      const usable = result.get(d) ?? base.get(d)?.entries;
      if (!(await view.isDir(d)) || !usable) {
        // No listing to build on, or no directory: list it afresh in the next wave.
        if (!listedAfresh.has(d)) full.add(d);
        continue;
      }
      for (const n of names) await view.stat(joinRel(d, n));
      patched.push([d, names]);
    }
    // Only paths whose way is real directories: check-ignore refuses a path beyond a symlink.
    const asked: string[] = [];
    for (const [d, entries] of listed) {
      if (await view.stat(d)) asked.push(d);
      for (const e of entries ?? []) asked.push(joinRel(d, e.name));
    }
    for (const [d, names] of patched) for (const n of names) if (await view.stat(joinRel(d, n))) asked.push(joinRel(d, n));
    const ignored = await ignoredAmong(opts.tree, asked);

    const compareSubdirs = (d: string, before: MetadataEntry | undefined, after: MetadataEntry | undefined) => {
      const wasDir = before?.type === "dir";
      const isDir = after?.type === "dir";
      // A directory that vanished drops its listings below; one that appeared is walked.
      if (wasDir !== isDir && !listedAfresh.has(joinRel(d, (before ?? after)!.name))) full.add(joinRel(d, (before ?? after)!.name));
    };

    for (const [d, entries] of listed) {
      listedAfresh.add(d);
      const before = base.get(d)?.entries ?? new Map<string, MetadataEntry>();
      if (entries === null || ignored.has(d)) {
        result.set(d, null);
        for (const e of before.values()) compareSubdirs(d, e, undefined);
        continue;
      }
      const now = new Map(entries.filter((e) => !ignored.has(joinRel(d, e.name))).map((e) => [e.name, e]));
      result.set(d, now);
      for (const name of new Set([...before.keys(), ...now.keys()])) compareSubdirs(d, before.get(name), now.get(name));
    }
    for (const [d, names] of patched) {
      const listing = new Map(result.get(d) ?? base.get(d)!.entries);
      for (const n of names) {
        const prev = listing.get(n);
        const rel = joinRel(d, n);
        const now = ignored.has(rel) ? undefined : await view.entry(rel);
        if (now) listing.set(n, now);
        else listing.delete(n);
        compareSubdirs(d, prev, now);
      }
      result.set(d, listing);
    }

    // A directory whose own entry changed (it appeared, vanished, or took a new mode or owner) updates its parent.
    for (const d of listed.keys()) {
      if (d === "") continue;
      const parent = parentOf(d);
      const self = ignored.has(d) ? undefined : await view.entry(d);
      const parentListing = result.has(parent) ? result.get(parent) : base.get(parent)?.entries;
      if (sameEntry(parentListing?.get(baseName(d)), self)) continue;
      const computed = result.get(parent);
      if (computed) {
        if (self) computed.set(self.name, self);
        else computed.delete(baseName(d));
      } else if (!result.has(parent)) {
        addPatch(parent, baseName(d));
      }
    }
  }

  // The blobs that change: a listing with no entries has no blob.
  const writes: { dir: string; text: string }[] = [];
  const removes: string[] = [];
  for (const [dir, listing] of [...result].sort(([a], [b]) => byteOrder(a, b))) {
    const before = base.get(dir);
    if (listing === null || listing.size === 0) {
      if (before) removes.push(listingPath(opts.branch, dir));
      continue;
    }
    const text = formatListing(dir, listing.values());
    if (!before || !before.raw.equals(Buffer.from(text, "utf8"))) writes.push({ dir, text });
  }
  if (writes.length === 0 && removes.length === 0) return opts.base;

  const near = path.dirname(indexFile);
  await fs.mkdir(near, { recursive: true });
  const scratch = await fs.mkdtemp(path.join(near, ".metadata-"));
  try {
    const oids = await writeBlobs(git, scratch, writes.map((w) => w.text));
    // The index is the caller's own and rebuilt from base: a lock left by a crash is stale.
    await fs.rm(`${indexFile}.lock`, { force: true });
    await runGit(git, opts.base === "" ? ["read-tree", "--empty"] : ["read-tree", opts.base]);
    for (let i = 0; i < writes.length; i += ARG_BATCH) {
      const args = writes.slice(i, i + ARG_BATCH).flatMap((w, j) => ["--cacheinfo", `100644,${oids[i + j]},${listingPath(opts.branch, w.dir)}`]);
      await runGit(git, ["update-index", "--add", ...args]);
    }
    if (removes.length > 0) {
      // update-index takes paths only with a work tree: an empty one it never reads.
      const emptyTree = path.join(scratch, "work-tree");
      await fs.mkdir(emptyTree);
      const remover = privateGit(gitDir, indexFile, opts.author, { GIT_WORK_TREE: emptyTree });
      for (let i = 0; i < removes.length; i += ARG_BATCH) {
        await runGit(remover, ["update-index", "--force-remove", "--", ...removes.slice(i, i + ARG_BATCH)]);
      }
    }
    const tree = (await runGit(git, ["write-tree"])).trim();
    if (opts.base !== "" && tree === (await runGit(git, ["rev-parse", `${opts.base}^{tree}`])).trim()) return opts.base;
    const message = `git-csi metadata: ${opts.branch}: ${writes.length} listing(s) written, ${removes.length} dropped`;
    return (await runGit(git, ["commit-tree", tree, ...(opts.base === "" ? [] : ["-p", opts.base]), "-m", message])).trim();
  } finally {
    await fs.rm(scratch, { recursive: true, force: true });
  }
}

/** Writes blobs through files in a scratch directory: simple-git gives no stdin, and hash-object takes many files in one process. */
async function writeBlobs(git: SimpleGit, scratch: string, texts: string[]): Promise<string[]> {
  const oids: string[] = [];
  for (let i = 0; i < texts.length; i += ARG_BATCH) {
    const files = texts.slice(i, i + ARG_BATCH).map((_, j) => path.join(scratch, `listing-${i + j}`));
    await Promise.all(files.map((f, j) => fs.writeFile(f, texts[i + j]!, { mode: 0o600 })));
    const out = (await runGit(git, ["hash-object", "-w", "--no-filters", "--", ...files])).split("\n").filter((l) => l !== "");
    if (out.length !== files.length) throw new Error(`git hash-object wrote ${out.length} object(s) for ${files.length} listing(s)`);
    oids.push(...out);
  }
  return oids;
}

// ---- replay ------------------------------------------------------------------

interface Pending {
  rel: string;
  entry: MetadataEntry;
  /** What lstat saw before the replay; undefined for a directory the replay created. */
  st?: Stats;
}

/** fn over items, `size` at a time, results in order. */
async function inBatches<T, R>(items: T[], fn: (item: T) => Promise<R>, size = FS_BATCH): Promise<R[]> {
  const out: R[] = [];
  for (let i = 0; i < items.length; i += size) out.push(...(await Promise.all(items.slice(i, i + size).map(fn))));
  return out;
}

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
  const refuse = (p: string, reason: string) => {
    refused.push(p);
    opts.log("refused a metadata entry", { path: p, reason, branch: opts.branch, metadata: opts.metadata });
  };
  const rootStat = await fs.lstat(opts.treeDir);
  if (!rootStat.isDirectory()) throw new Error(`the tree ${opts.treeDir} is not a directory`);
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

  const listings: { dir: string; entries: MetadataEntry[] }[] = [];
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
  listings.sort((a, b) => depthOf(a.dir) - depthOf(b.dir) || byteOrder(a.dir, b.dir));

  /** Whether each directory on the way is a real directory: "ok", "symlink", or "absent" (missing or not a directory). */
  const way = new Map<string, "ok" | "symlink" | "absent">();
  way.set("", "ok");
  const wayTo = async (dir: string): Promise<"ok" | "symlink" | "absent"> => {
    const known = way.get(dir);
    if (known) return known;
    const up = await wayTo(parentOf(dir));
    let state: "ok" | "symlink" | "absent" = up;
    if (up === "ok") {
      const st = await orAbsent(fs.lstat(path.join(opts.treeDir, dir)));
      state = st?.isDirectory() ? "ok" : st?.isSymbolicLink() ? "symlink" : "absent";
    }
    way.set(dir, state);
    return state;
  };

  const toApply: Pending[] = [];
  for (const { dir, entries } of listings) {
    const state = await wayTo(dir);
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
      const rel = joinRel(dir, entry.name);
      const st = stats[i]!;
      if (!st) {
        if (entry.type !== "dir") continue; // not in this checkout (ignored, or too large to commit)
        try {
          await fs.mkdir(path.join(opts.treeDir, rel), { mode: 0o700 });
        } catch (err) {
          opts.log("could not create a directory the metadata names", { path: rel, error: err instanceof Error ? err.message : String(err) });
          continue;
        }
        way.set(rel, "ok");
      } else if (entryOf(entry.name, st)?.type !== entry.type) {
        opts.log("metadata and the tree disagree on an entry's type; left as it is", { path: rel, metadata: entry.type });
        if (entry.type === "dir") way.set(rel, st.isSymbolicLink() ? "symlink" : "absent");
        continue;
      }
      toApply.push({ rel, entry, st: st ?? undefined });
    }
  }

  // Files and symlinks first, then directories from the deepest up.
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
  return { applied, refused };
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
