import type { Stats } from "node:fs";
import { type Author, type Conversation, converse, type GitSetting } from "../remote/git";
import type { PathStatus } from "../remote/tree";

/** A path as the commit takes it: a regular file as lstat saw it, or absent. */
export interface FileNow {
  path: string;
  stat: Stats | undefined;
}

/** A commit fast-import wrote on HEAD, and the commit it sits on. */
export interface FastCommit {
  commit: string;
  parent: string;
  changed: PathStatus[];
}

/**
 * Commits these files onto `parent`, HEAD's commit, as they are in the work
 * tree, without the index: hash-object writes their blobs (with the tree's
 * attributes, as git add does) while fast-import starts and looks up what
 * the parent holds at their paths; fast-import then writes the commit and
 * the trees on the way to them, reading only those directories, and moves
 * HEAD to it. write-tree reads the whole index instead: 12 ms at 100,000
 * files; the caller stages the same files in the index meanwhile, for git
 * status. "unchanged" when HEAD holds them already; undefined where git
 * must decide through the index (a path HEAD holds as a directory or a
 * submodule).
 */
export async function commitFiles(at: GitSetting, parent: string, files: FileNow[], author: Author, message: (changed: PathStatus[]) => string): Promise<FastCommit | "unchanged" | undefined> {
  const present = files.filter((f) => f.stat !== undefined).map((f) => f.path);
  const blobs = hashFiles(at, present);
  // Awaited below unless fast-import fails or git must decide first: never a rejection nobody handles.
  blobs.catch(() => undefined);
  return converse(at, ["fast-import", "--quiet", "--done"], async (io) => {
    for (const f of files) io.write(`ls ${parent} ${quoted(f.path)}\n`);
    const held: (Held | undefined)[] = [];
    for (let i = 0; i < files.length; i++) held.push(await heldAs(io));
    if (held.some((h) => h !== undefined && h.type !== "blob")) {
      io.write("done\n");
      return undefined;
    }
    const oids = await blobs;
    const wanted = files.map((f) => (f.stat ? `${fileMode(f.stat)} ${oids.get(f.path)!}` : undefined));
    const changed = files.filter((_, i) => (held[i] && `${held[i].mode} ${held[i].oid}`) !== wanted[i]);
    if (changed.length === 0) {
      io.write("done\n");
      return "unchanged";
    }
    const statuses = changed.map((f) => ({ path: f.path, deleted: f.stat === undefined }));
    const text = message(statuses);
    const signature = `${author.name} <${author.email}> ${Math.floor(Date.now() / 1000)} ${utcOffset()}`;
    const entries = changed.map((f) => (f.stat ? `M ${wanted[files.indexOf(f)]!} ${quoted(f.path)}` : `D ${quoted(f.path)}`));
    // HEAD moves at the end, through the branch it names, only from a commit the new one contains.
    const commit = ["commit HEAD", "mark :1", `author ${signature}`, `committer ${signature}`, `data ${Buffer.byteLength(text)}`, text, `from ${parent}`, ...entries, ""];
    io.write([...commit, "get-mark :1", "done", ""].join("\n"));
    return { commit: (await io.line()).trim(), parent, changed: statuses };
  });
}

/** The blobs of these files, written as git add writes them. */
async function hashFiles(at: GitSetting, paths: string[]): Promise<Map<string, string>> {
  if (paths.length === 0) return new Map();
  // In the tree's own directory: the paths are the tree's, and so are the attributes they are hashed with.
  const oids = await converse(at, ["hash-object", "-w", "--", ...paths], async (io) => {
    const out: string[] = [];
    for (let i = 0; i < paths.length; i++) out.push((await io.line()).trim());
    return out;
  });
  return new Map(paths.map((p, i) => [p, oids[i]!]));
}

interface Held {
  mode: string;
  type: string;
  oid: string;
}

/** fast-import's answer to ls: what the commit holds at the path, or undefined for nothing. */
async function heldAs(io: Conversation): Promise<Held | undefined> {
  const answer = await io.line();
  if (answer.startsWith("missing ")) return undefined;
  const [mode, type, oid] = answer.split("\t")[0]!.split(" ");
  return { mode: mode!, type: type!, oid: oid! };
}

/** The mode git add gives a regular file: executable when its owner may execute it. */
function fileMode(stat: Stats): string {
  return stat.mode & 0o100 ? "100755" : "100644";
}

/** A path in fast-import's C-style quotes: any name passes, a line break or a quote in it too. */
function quoted(p: string): string {
  let out = "";
  for (const c of p) {
    const code = c.charCodeAt(0);
    if (c === "\\" || c === '"') out += `\\${c}`;
    else if (code < 0x20 || code === 0x7f) out += `\\${code.toString(8).padStart(3, "0")}`;
    else out += c;
  }
  return `"${out}"`;
}

/** The local time zone as git writes it (+0100), as commit-tree dates a commit. */
function utcOffset(): string {
  const minutes = -new Date().getTimezoneOffset();
  const abs = Math.abs(minutes);
  return `${minutes < 0 ? "-" : "+"}${String(Math.floor(abs / 60)).padStart(2, "0")}${String(abs % 60).padStart(2, "0")}`;
}
