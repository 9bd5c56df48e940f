import type { Stats } from "node:fs";
import * as fs from "node:fs/promises";
import * as path from "node:path";
import { formatDuration, orAbsent, Reason } from "@git-csi/config";
import { type CsiError, internal } from "@git-csi/protos";
import { type FastCommit, commitFiles, type FileNow } from "./fast-commit";
import { ARGV_BATCH, runGit, traced } from "../remote/git";
import type { VolumeReporter } from "../report";
import type { SyncScheduler } from "./schedule";
import { changedBetween, lfsTracked, type PathStatus, stageChanges, statusOf, updatePaths } from "../remote/tree";
import type { VolumeState } from "./volume";

/** A commit made on HEAD, the commit it sits on, and the paths it changed. */
export interface Committed {
  commit: string;
  parent: string;
  changed: PathStatus[];
}

/** Paths the driver never commits: libfuse's names for open, unlinked files. */
const ALWAYS_IGNORED = [".fuse_hidden*"];
/** How many of a commit's paths its message lists. */
const PATHS_LISTED = 50;
/** The Warning's words after a Git LFS file's path. */
const LFS_NOT_SERVED = "is a Git LFS file (filter=lfs in .gitattributes), which the driver does not serve: it is committed as the application wrote it, as an ordinary blob, not as an LFS object";
/** Up to this many bytes, a commit's files are hashed for it straight from the tree (see fastCommit). */
const FAST_COMMIT_BYTES = 1024 * 1024;

type Sized = { tooLarge: Map<string, number>; bytes: number };

/**
 * Committing, spec 004 "What happens after a write": which written paths
 * are pending, and a commit of them as they are now. A path leaves the
 * pending set only once a commit holds it or git shows it unchanged.
 */
export class VolumeCommitter {
  constructor(
    private readonly s: VolumeState,
    private readonly report: VolumeReporter,
    private readonly scheduler: SyncScheduler,
    /** Counts again what the remote lacks, after a commit. */
    private readonly refreshUnpushed: () => Promise<void>,
  ) {}

  /** A path the watcher saw written. */
  noteChange(relative: string): void {
    // The tree's root itself (an fsGroup applied, a chmod of the mount): the volume's, never committed or recorded.
    if (relative === "") return;
    this.s.changed.add(relative);
    this.s.metadataChanged.add(relative);
  }

  /** The class's ignore list, and libfuse's, as the tree's excludes file. */
  async writeExcludes(): Promise<void> {
    const file = this.s.ctx.store.excludesFile(this.s.volumeId);
    await fs.mkdir(path.dirname(file), { recursive: true });
    await fs.writeFile(file, [...ALWAYS_IGNORED, ...(this.s.policy?.ignore ?? [])].map((p) => `${p}\n`).join(""));
  }

  /** Asks git which of the watcher's paths changed and are not ignored. */
  async refreshPending(): Promise<void> {
    const s = this.s;
    const scanAll = s.fullScan;
    const asked = scanAll ? undefined : [...s.changed];
    s.fullScan = false;
    s.changed.clear();
    if (asked?.length === 0) return;
    const statuses = await statusOf(s.tree, asked);
    if (scanAll) s.pending.clear();
    for (const p of asked ?? []) s.pending.delete(p);
    const before = s.pending.size;
    for (const status of statuses) s.pending.add(status.path);
    if (s.policy && before === 0 && s.pending.size > 0) {
      this.report.emit(Reason.Pending, "Normal", `${s.pending.size} changed path(s) wait for ${formatDuration(s.policy.quiesceMs)} of quiet before the commit`);
    }
    this.report.publishMetrics();
  }

  /**
   * A commit that fails keeps every path pending, turns the volume abnormal
   * and is tried again with backoff; the caller sees the failure, so an
   * unstage never answers over writes no commit holds. Answers the commit
   * HEAD now names, when this made one.
   */
  async commitOrRetry(trigger: string): Promise<Committed | undefined> {
    let head: Committed | undefined;
    try {
      head = await this.commit(trigger);
    } catch (err) {
      throw this.commitFailed(err);
    }
    if (this.s.lastCommitError !== "") {
      this.s.lastCommitError = "";
      this.s.commitFailures = 0;
      this.s.log("info", "committed again after failed commits", "commit");
    }
    return head;
  }

  private commitFailed(err: unknown): CsiError {
    const s = this.s;
    const message = err instanceof Error ? err.message : String(err);
    s.commitFailures++;
    if (message !== s.lastCommitError) {
      this.report.emit(Reason.CommitFailed, "Warning", `${s.pending.size} written path(s) could not be committed; they stay in the node's work tree and the driver retries: ${message}`);
    }
    s.lastCommitError = message;
    this.scheduler.failed(s.commitFailures);
    this.report.publishMetrics();
    return internal(`volume ${s.volumeId}: ${s.pending.size} written path(s) could not be committed, so they are not safe to leave the node yet; the driver retries: ${message}`);
  }

  /** Commits the pending paths; answers the commit, or undefined when nothing changed. */
  private async commit(trigger: string): Promise<Committed | undefined> {
    const asked = [...this.s.pending];
    if (asked.length === 0) return undefined;
    // Asked beside the commit, which changes no attribute: the files Git LFS would take.
    const lfs = lfsTracked(this.s.tree, asked).catch((err: Error) => err);
    const listed = await this.commitAsListed(asked, trigger);
    const { tooLarge, bytes } = listed ?? (await this.stage(asked));
    const committed = listed ? listed.committed : await this.writeCommit(trigger);
    if (committed) this.s.unpushedBytes += bytes;
    this.noteSkipped(asked, tooLarge);
    if (committed) this.noteLfs(await lfs, committed.changed);
    for (const p of asked) this.s.pending.delete(p);
    // A commit on HEAD is one more the remote lacks: counting again would cost three git processes on the way to the push.
    if (committed) this.report.publishMetrics();
    else await this.refreshUnpushed();
    return committed;
  }

  /**
   * Stages the pending paths as they are now in one git process, and
   * commits them: git status listed them when they were written, and every
   * write since went through the watcher's refresh, so git need not be asked
   * again. Small files go into the commit straight from the tree meanwhile
   * (commitFiles): the commit neither waits for the index nor reads it.
   * Undefined where that does not hold (a path became a directory, a
   * .gitignore changed and may ignore what was pending, more paths than one
   * command line takes): then git is asked.
   */
  private async commitAsListed(asked: string[], trigger: string): Promise<(Sized & { committed: Committed | undefined }) | undefined> {
    if (asked.length > ARGV_BATCH || asked.some((p) => path.posix.basename(p) === ".gitignore")) return undefined;
    const stats = await Promise.all(asked.map((p) => orAbsent(fs.lstat(path.join(this.s.treeDir, p)))));
    if (stats.some((stat) => stat?.isDirectory())) return undefined;
    const files = asked.map((p, i) => ({ path: p, stat: stats[i] }));
    const sized = this.sized(files);
    const staged = files.filter((f) => !sized.tooLarge.has(f.path));
    const fast = this.fastCommit(staged, sized.bytes, trigger);
    const indexed = updatePaths(
      this.s.tree,
      staged.map((f) => f.path),
    ).then(
      () => undefined,
      (err: Error) => err,
    );
    const [made, failed] = await Promise.all([fast, indexed]);
    // A commit fast-import made is HEAD's now, whatever the index did.
    const committed = made !== undefined && made !== "unchanged" ? this.noteCommitted(made, trigger) : undefined;
    if (failed) {
      this.s.log("info", `the pending paths are staged again after asking git which changed: ${failed.message}`, "commit");
      return undefined;
    }
    return { ...sized, committed: made === undefined ? await this.writeCommit(trigger) : committed };
  }

  /**
   * commitFiles, for a few small regular files (each is hashed twice: for
   * the commit and for the index). Undefined where the index decides,
   * through writeCommit; a failure here is one too.
   */
  private async fastCommit(files: FileNow[], bytes: number, trigger: string): Promise<FastCommit | "unchanged" | undefined> {
    if (files.length === 0 || bytes > FAST_COMMIT_BYTES || files.some((f) => f.stat !== undefined && !f.stat.isFile())) return undefined;
    try {
      return await commitFiles(this.s.treeSetting, await this.s.head(), files, this.s.policy!.author, (changed) => {
        const { subject, body } = this.message(
          trigger,
          changed.map((c) => c.path),
        );
        return `${subject}\n\n${body}\n`;
      });
    } catch (err) {
      this.s.log("info", `the commit is written through the index: ${(err as Error).message}`, "commit");
      return undefined;
    }
  }

  /**
   * Stages what changed of these paths as they are now, as git status lists
   * them; the ones over commit.maxFileSize stay out. Answers those, and the
   * bytes of the files staged.
   */
  private async stage(asked: string[]): Promise<Sized> {
    const pathspecFile = path.join(this.s.volumeDir, "pathspec");
    let sized = { tooLarge: new Map<string, number>(), bytes: 0 };
    await stageChanges(this.s.tree, pathspecFile, asked, async (changed) => {
      // A file that vanished since git listed it is staged as whatever git sees: never too large.
      const stats = await Promise.all(changed.map((status) => (status.deleted ? undefined : orAbsent(fs.lstat(path.join(this.s.treeDir, status.path))))));
      sized = this.sized(changed.map((status, i) => ({ path: status.path, stat: stats[i] })));
      return changed.filter((status) => !sized.tooLarge.has(status.path)).map((status) => status.path);
    });
    return sized;
  }

  /** The files over commit.maxFileSize, and the bytes of the others. */
  private sized(paths: { path: string; stat: Stats | undefined }[]): Sized {
    const maxFileSize = this.s.policy!.maxFileSizeBytes;
    const tooLarge = new Map<string, number>();
    let bytes = 0;
    for (const { path: p, stat } of paths) {
      if (stat?.isFile() && stat.size > maxFileSize) tooLarge.set(p, stat.size);
      else bytes += stat?.size ?? 0;
    }
    return { tooLarge, bytes };
  }

  /**
   * Commits the index when it differs from HEAD, and answers the commit.
   * Plumbing, not `git commit`: that re-checks every tracked file, and the
   * cost must follow the change. The paths come from the two trees, never
   * from the index.
   */
  private async writeCommit(trigger: string): Promise<Committed | undefined> {
    const s = this.s;
    const tree = s.tree;
    // Neither waits for the other: the machine has more than one core.
    const [written, heads] = await Promise.all([runGit(tree, ["write-tree"]), runGit(tree, ["rev-parse", "HEAD", "HEAD^{tree}"])]);
    const treeOid = written.trim();
    const [parent, parentTree] = heads.split("\n");
    if (treeOid === parentTree) return undefined;
    // In the bare repository: diff-tree in the work tree reads its index, 100,000 entries for nothing.
    const changed = await changedBetween(s.repo, parentTree!, treeOid);
    const { subject, body } = this.message(
      trigger,
      changed.map((c) => c.path),
    );
    const commit = (await runGit(tree, ["commit-tree", treeOid, "-p", parent!, "-m", subject, "-m", body])).trim();
    await runGit(traced(s.tree), ["update-ref", "-m", "git-csi: commit", "HEAD", commit, parent!]);
    return this.noteCommitted({ commit, parent: parent!, changed }, trigger);
  }

  /** A commit's message: who, how many paths and why, then the paths. */
  private message(trigger: string, staged: string[]): { subject: string; body: string } {
    const s = this.s;
    const subject = `${s.claim.name ? `${s.claim.namespace}/${s.claim.name}` : s.volumeId}: ${staged.length} path(s) after ${trigger}`;
    const more = staged.length > PATHS_LISTED ? `\n… and ${staged.length - PATHS_LISTED} more` : "";
    return { subject, body: staged.slice(0, PATHS_LISTED).join("\n") + more };
  }

  /** HEAD names a new commit: one more the remote lacks. */
  private noteCommitted({ commit, parent, changed }: FastCommit, trigger: string): Committed {
    const s = this.s;
    for (const c of changed) if (!c.deleted) s.committedPaths.add(c.path);
    s.unpushed++;
    this.scheduler.committed();
    s.log("info", "committed", "commit", { paths: changed.length, trigger });
    return { commit, parent, changed };
  }

  /** A committed file that Git LFS would have taken is named in a Warning: spec 004 does not serve LFS. */
  private noteLfs(tracked: string[] | Error, changed: PathStatus[]): void {
    if (tracked instanceof Error) {
      this.s.log("warn", `the commit holds every write, but which of its files Git LFS tracks is unknown: ${tracked.message}`, "commit");
      return;
    }
    const written = new Set(changed.filter((c) => !c.deleted).map((c) => c.path));
    for (const p of tracked) if (written.has(p)) this.report.notServed(p, LFS_NOT_SERVED);
  }

  private noteSkipped(asked: string[], tooLarge: Map<string, number>): void {
    const skipped = this.s.skipped;
    for (const p of asked) if (!tooLarge.has(p)) skipped.delete(p);
    for (const [p, size] of tooLarge) {
      if (!skipped.has(p)) {
        this.report.emit(
          Reason.FileSkipped,
          "Warning",
          `${p} is ${size} bytes, over commit.maxFileSize ${this.s.policy!.maxFileSizeBytes}: it is not committed; add it to the class's ignore or raise commit.maxFileSize`,
        );
      }
      skipped.set(p, size);
    }
  }
}
