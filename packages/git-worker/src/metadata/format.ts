import { createHash } from "node:crypto";
import type { Stats } from "node:fs";

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

/** A listing larger than this is refused: no directory's metadata is that large. */
export const MAX_LISTING_BYTES = 64 * 1024 * 1024;
const MAX_NAME_BYTES = 255;
const MAX_ID = 2 ** 32;

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
export function badName(name: unknown): string | undefined {
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

export function parentOf(p: string): string {
  const i = p.lastIndexOf("/");
  return i < 0 ? "" : p.slice(0, i);
}

export function baseName(p: string): string {
  return p.slice(p.lastIndexOf("/") + 1);
}

export function joinRel(dir: string, name: string): string {
  return dir === "" ? name : `${dir}/${name}`;
}

export function depthOf(dir: string): number {
  return dir === "" ? 0 : dir.split("/").length;
}

export function byteOrder(a: string, b: string): number {
  return Buffer.compare(Buffer.from(a, "utf8"), Buffer.from(b, "utf8"));
}

/** A changed path as a clean tree-relative path ("" is the root), or undefined when it cannot be one. */
export function normalizeChanged(p: string): string | undefined {
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

export function entryOf(name: string, st: Stats): MetadataEntry | undefined {
  const type: MetadataType | undefined = st.isSymbolicLink() ? "symlink" : st.isDirectory() ? "dir" : st.isFile() ? "file" : undefined;
  if (!type) return undefined;
  return { name, type, mode: st.mode & 0o7777, uid: st.uid, gid: st.gid };
}

export function sameEntry(a: MetadataEntry | undefined, b: MetadataEntry | undefined): boolean {
  if (!a || !b) return a === b;
  return a.name === b.name && a.type === b.type && a.mode === b.mode && a.uid === b.uid && a.gid === b.gid;
}
