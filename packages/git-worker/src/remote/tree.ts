import * as fs from "node:fs/promises";
import * as path from "node:path";
import type { SimpleGit } from "simple-git";
import { chunks, GitCommandError, runGit } from "./git";

/** The commit a ref names, or "" when it names none; a git that fails is an error, never "absent". */
export async function revParse(git: SimpleGit, ref: string): Promise<string> {
  return (await runGit(git, ["rev-parse", "--verify", "--quiet", `${ref}^{commit}`])).trim();
}

/** merge-base answers nothing for unrelated histories: no ancestor. Any other failure throws. */
export async function isAncestor(git: SimpleGit, ancestor: string, descendant: string): Promise<boolean> {
  if (ancestor === descendant) return true;
  return (await runGit(git, ["merge-base", ancestor, descendant])).trim() === ancestor;
}

/**
 * Whether `into` holds every change `from` made since their merge base,
 * however it got there: a merge, a squash, a rebase. Merging `from` into
 * `into` then conflicts nowhere and leaves `into`'s tree as it is.
 */
export async function holdsChanges(git: SimpleGit, into: string, from: string): Promise<boolean> {
  if (await isAncestor(git, from, into)) return true;
  // A conflict is not an error here: git answers the tree and the conflicted paths with exit code 1.
  const merged = (await runGit(git, ["merge-tree", "--write-tree", "--no-messages", "--name-only", "--allow-unrelated-histories", into, from])).trim();
  return merged === (await runGit(git, ["rev-parse", "--verify", `${into}^{tree}`])).trim();
}

export async function countCommits(git: SimpleGit, from: string, to: string): Promise<number> {
  const argv = ["rev-list", "--count", ...(from === "" ? [to] : [`${from}..${to}`])];
  const out = (await runGit(git, argv)).trim();
  // An empty answer is a failure git did not explain, not "nothing to push".
  if (!/^\d+$/.test(out)) throw new GitCommandError(argv, `answered ${JSON.stringify(out)} where a count was expected`);
  return Number(out);
}

/** One changed path as `git status --porcelain -z` reports it. */
export interface PathStatus {
  path: string;
  deleted: boolean;
}

/**
 * The status of exactly these paths (or of the whole tree when paths is
 * undefined): changed, not ignored, files listed one by one. Asking git about
 * the watcher's paths only keeps the cost with the change, not the tree.
 */
export async function statusOf(git: SimpleGit, paths?: string[]): Promise<PathStatus[]> {
  const out: PathStatus[] = [];
  for (const batch of paths === undefined ? [undefined] : chunks(paths)) {
    const text = await runGit(git, ["status", "--porcelain=v1", "-z", "--untracked-files=all", "--no-renames", ...(batch ? ["--", ...batch] : [])]);
    for (const entry of text.split("\0")) {
      if (entry.length < 4) continue;
      out.push({ path: entry.slice(3), deleted: entry[0] === "D" || entry[1] === "D" });
    }
  }
  return out;
}

/** The paths among these that the work tree's .gitattributes hand to Git LFS (`filter=lfs`). */
export async function lfsTracked(git: SimpleGit, paths: string[]): Promise<string[]> {
  const out: string[] = [];
  for (const batch of chunks(paths)) {
    // `<path>\0filter\0<value>\0` for every path, set or not.
    const fields = (await runGit(git, ["check-attr", "-z", "filter", "--", ...batch])).split("\0");
    for (let i = 0; i + 2 < fields.length; i += 3) if (fields[i + 2] === "lfs") out.push(fields[i]!);
  }
  return out;
}

/** Tries of one staging: each asks git again which paths changed, so files that vanished drop out. */
const STAGE_ATTEMPTS = 5;

/**
 * Stages these paths as they are now: changed ones are added, deleted ones
 * removed, and one that vanished since the watcher saw it (a temp file, an
 * atomic save) is whatever git sees now, never a failure of the others.
 * Returns the statuses staged.
 */
export async function stageChanges(git: SimpleGit, pathspecFile: string, paths: string[], choose: (changed: PathStatus[]) => Promise<string[]>): Promise<void> {
  for (let attempt = 1; ; attempt++) {
    const toStage = await choose(await statusOf(git, paths));
    if (toStage.length === 0) return;
    try {
      return await stagePaths(git, pathspecFile, toStage);
    } catch (err) {
      if (attempt === STAGE_ATTEMPTS) throw err;
    }
  }
}

/**
 * Stages exactly these paths through a pathspec file: no command line limit,
 * and names with any byte in them pass unharmed. --ignore-errors keeps what
 * was hashed before a file vanished mid-way, so a retry does not hash it again.
 */
async function stagePaths(git: SimpleGit, pathspecFile: string, paths: string[]): Promise<void> {
  await fs.mkdir(path.dirname(pathspecFile), { recursive: true });
  await fs.writeFile(pathspecFile, paths.map((p) => `${p}\0`).join(""));
  await runGit(git, ["add", "-A", "--ignore-errors", `--pathspec-from-file=${pathspecFile}`, "--pathspec-file-nul"]);
}

/**
 * Stages exactly these paths as they are now, without asking git which
 * changed: present ones are added, absent ones removed, and one git never
 * tracked that vanished is nothing. Throws where a path is now a directory
 * or sits beyond a symlink: then ask git (stageChanges).
 */
export async function updatePaths(git: SimpleGit, paths: string[]): Promise<void> {
  // --verbose: a process that prints nothing costs 50 ms more under simple-git (see traced).
  for (const batch of chunks(paths)) await runGit(git, ["update-index", "--verbose", "--add", "--remove", "--replace", "--", ...batch]);
}

/**
 * The paths that differ between two trees, as statusOf answers: git reads
 * only the subtrees that differ. Ask a bare repository: in a work tree
 * diff-tree reads the whole index first, though it never uses it.
 */
export async function changedBetween(git: SimpleGit, from: string, to: string): Promise<PathStatus[]> {
  const fields = (await runGit(git, ["diff-tree", "-r", "--no-renames", "--name-status", "-z", from, to])).split("\0");
  const out: PathStatus[] = [];
  for (let i = 0; i + 1 < fields.length; i += 2) out.push({ path: fields[i + 1]!, deleted: fields[i] === "D" });
  return out;
}

/**
 * Whether the tree can move from one commit to another in one step: git
 * refuses where a file changed in the tree since its last commit was also
 * changed between the two commits.
 */
export async function canMoveTree(git: SimpleGit, from: string, to: string): Promise<boolean> {
  await runGit(git, ["update-index", "-q", "--refresh"]).catch(() => undefined);
  return runGit(git, ["read-tree", "-m", "-u", "-n", from, to]).then(
    () => true,
    () => false,
  );
}

/**
 * Brings the tree from one commit to another in one step that rewrites only
 * the files that differ between them, keeping the files the application
 * changed since its last commit. False, and nothing written, where git refuses.
 */
export async function moveTree(git: SimpleGit, branchRef: string, from: string, to: string): Promise<boolean> {
  if (!(await canMoveTree(git, from, to))) return false;
  await runGit(git, ["read-tree", "-m", "-u", from, to]);
  await runGit(git, ["update-ref", branchRef, to, from]);
  return true;
}
