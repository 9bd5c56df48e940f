// Test helper: a REAL local git server (`git daemon`) serving bare
// repositories from a private temp dir over git:// on 127.0.0.1.
//
//   const srv = await startGitDaemon();
//   await srv.createRepo("demo.git", { files: { "a.txt": "A\n" } });
//   // clone/push srv.url("demo.git") ...
//   await srv.git("demo.git", "rev-parse", "refs/heads/main");
//   await srv.stop();
//
// Every git invocation uses child_process.spawn with an argv array (never a
// shell) and an isolated environment (no system/global git config, fixed
// author/committer identity, no terminal prompts).

import { spawn, type ChildProcess } from "node:child_process";
import { mkdtemp, mkdir, readFile, rm, writeFile } from "node:fs/promises";
import * as net from "node:net";
import * as os from "node:os";
import * as path from "node:path";
import { setTimeout as sleep } from "node:timers/promises";

export interface CreateRepoOptions {
  /** Branch of the initial commit; also becomes HEAD. Default "main". */
  branch?: string;
  /** path -> content of the initial commit. Default { "README.md": ... }. `{}` makes an empty-tree commit. */
  files?: Record<string, string | Uint8Array>;
  /** Commit message. Default "initial commit". */
  message?: string;
}

export interface CommitFilesOptions {
  /** Branch to advance (created if missing). Default "main". */
  branch?: string;
  /** Paths to delete in the new commit. */
  remove?: string[];
  /** path -> commit sha: gitlinks, as a submodule's entry is in its superproject (the .gitmodules is one of `files`). */
  gitlinks?: Record<string, string>;
  /** Commit message. Default "update". */
  message?: string;
}

export interface GitServer {
  /** Directory passed as --base-path; repo `r` lives at path.join(baseDir, r). */
  readonly baseDir: string;
  readonly port: number;
  /** git://127.0.0.1:<port>/<repo> */
  url(repo: string): string;
  /** Absolute path of the bare repository on disk. */
  repoPath(repo: string): string;
  /** Create a bare repo with one commit on `branch`. Resolves to the commit sha. */
  createRepo(repo: string, opts?: CreateRepoOptions): Promise<string>;
  /**
   * Server-side commit on top of `branch` (no clone needed): writes `files`,
   * deletes `remove`, advances the branch. Resolves to the new commit sha.
   */
  commitFiles(repo: string, files: Record<string, string | Uint8Array>, opts?: CommitFilesOptions): Promise<string>;
  /** `git --git-dir=<bare repo> ...args`; resolves to stdout minus one trailing "\n". Rejects on non-zero exit. */
  git(repo: string, ...args: string[]): Promise<string>;
  /** Kill the daemon (whole process group) and remove the temp dir. Idempotent. */
  stop(): Promise<void>;
}

export interface RunGitOptions {
  cwd?: string;
  input?: string | Uint8Array;
  env?: NodeJS.ProcessEnv;
  /** Default 60 s. */
  timeoutMs?: number;
}

export interface RunGitResult {
  stdout: string;
  stderr: string;
  code: number | null;
  signal: NodeJS.Signals | null;
}

export class GitCommandError extends Error {
  constructor(
    readonly args: readonly string[],
    readonly result: RunGitResult,
  ) {
    super(`git ${args.join(" ")} failed (code ${String(result.code)}${result.signal ? `, signal ${result.signal}` : ""}): ` + result.stderr.trim());
    this.name = "GitCommandError";
  }
}

/** Environment for every git invocation made by this module (and handy for tests). */
export function gitEnv(extra?: NodeJS.ProcessEnv): NodeJS.ProcessEnv {
  return {
    ...process.env,
    GIT_CONFIG_NOSYSTEM: "1",
    GIT_CONFIG_GLOBAL: os.devNull,
    GIT_TERMINAL_PROMPT: "0",
    GIT_AUTHOR_NAME: "git-csi e2e",
    GIT_AUTHOR_EMAIL: "e2e@git.liken.sh",
    GIT_COMMITTER_NAME: "git-csi e2e",
    GIT_COMMITTER_EMAIL: "e2e@git.liken.sh",
    LANG: "C",
    LC_ALL: "C",
    ...extra,
  };
}

/** Run git without a shell; never rejects on non-zero exit (see runGitOk). */
export function runGitRaw(args: readonly string[], opts: RunGitOptions = {}): Promise<RunGitResult> {
  return new Promise((resolve, reject) => {
    const child = spawn("git", [...args], {
      cwd: opts.cwd,
      env: opts.env ?? gitEnv(),
      stdio: ["pipe", "pipe", "pipe"],
    });
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    child.stdout.on("data", (b: Buffer) => out.push(b));
    child.stderr.on("data", (b: Buffer) => err.push(b));
    const timer = setTimeout(() => child.kill("SIGKILL"), opts.timeoutMs ?? 60_000);
    child.on("error", (e) => {
      clearTimeout(timer);
      reject(e);
    });
    child.on("close", (code, signal) => {
      clearTimeout(timer);
      resolve({
        stdout: Buffer.concat(out).toString("utf8"),
        stderr: Buffer.concat(err).toString("utf8"),
        code,
        signal,
      });
    });
    child.stdin.on("error", () => {
      /* EPIPE if git exits early; the exit code reports the failure */
    });
    child.stdin.end(opts.input ?? "");
  });
}

/** Run git; resolve to stdout minus one trailing newline; reject with GitCommandError on failure. */
export async function runGit(args: readonly string[], opts: RunGitOptions = {}): Promise<string> {
  const r = await runGitRaw(args, opts);
  if (r.code !== 0) throw new GitCommandError(args, r);
  return r.stdout.endsWith("\n") ? r.stdout.slice(0, -1) : r.stdout;
}

const REPO_NAME = /^[A-Za-z0-9._-]+(\/[A-Za-z0-9._-]+)*$/;

function checkRepoName(repo: string): void {
  if (!REPO_NAME.test(repo) || repo.split("/").some((seg) => seg === "." || seg === "..")) {
    throw new Error(`invalid repo name ${JSON.stringify(repo)}`);
  }
}

function checkBranch(branch: string): void {
  if (!/^[A-Za-z0-9._/-]+$/.test(branch) || branch.startsWith("-") || branch.includes("..")) {
    throw new Error(`invalid branch name ${JSON.stringify(branch)}`);
  }
}

function checkFilePath(p: string): void {
  if (p === "" || p.startsWith("/") || p.endsWith("/") || p.includes("\0") || p.split("/").some((seg) => seg === "" || seg === "." || seg === ".." || seg === ".git")) {
    throw new Error(`invalid file path ${JSON.stringify(p)}`);
  }
}

/** A TCP port that was free on 127.0.0.1 a moment ago (callers retry on a bind race). */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.unref();
    srv.on("error", reject);
    srv.listen(0, "127.0.0.1", () => {
      const addr = srv.address();
      const port = typeof addr === "object" && addr ? addr.port : 0;
      srv.close(() => (port ? resolve(port) : reject(new Error("no port"))));
    });
  });
}

/** Each content as a blob, by one git process however many there are (a test's tree may hold thousands of files). */
async function writeBlobs(g: (args: string[], input?: string) => Promise<string>, tmpDir: string, contents: Array<string | Uint8Array>): Promise<string[]> {
  const dir = await mkdtemp(path.join(tmpDir, "blobs-"));
  try {
    const files = contents.map((_, i) => path.join(dir, String(i)));
    await Promise.all(contents.map((content, i) => writeFile(files[i], content)));
    const blobs = (await g(["hash-object", "-w", "--no-filters", "--stdin-paths"], files.join("\n") + "\n")).split("\n");
    if (blobs.length !== contents.length) throw new Error(`git hash-object wrote ${blobs.length} blobs for ${contents.length} files`);
    return blobs;
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

/** Write a commit into a bare repo via a throwaway index (supports nested paths). */
async function writeCommit(gitDir: string, tmpDir: string, parent: string | undefined, files: Record<string, string | Uint8Array>, opts: CommitFilesOptions & { message: string }): Promise<string> {
  const { remove = [], gitlinks = {}, message } = opts;
  const indexFile = path.join(tmpDir, `index-${process.pid}-${Math.random().toString(36).slice(2)}`);
  const env = gitEnv({ GIT_INDEX_FILE: indexFile });
  const g = (args: string[], input?: string | Uint8Array) => runGit([`--git-dir=${gitDir}`, ...args], { env, input });
  try {
    if (parent) await g(["read-tree", parent]);
    else await g(["read-tree", "--empty"]);
    if (remove.length > 0) {
      // mode 0 in --index-info removes the entry (works without a work tree)
      for (const p of remove) checkFilePath(p);
      const zero = "0".repeat(40);
      await g(["update-index", "--index-info"], remove.map((p) => `0 ${zero}\t${p}\n`).join(""));
    }
    const entries = Object.entries(files);
    for (const [p] of entries) checkFilePath(p);
    if (entries.length > 0) {
      const blobs = await writeBlobs(
        g,
        tmpDir,
        entries.map(([, content]) => content),
      );
      await g(["update-index", "-z", "--add", "--index-info"], entries.map(([p], i) => `100644 ${blobs[i]}\t${p}\0`).join(""));
    }
    for (const [p, commit] of Object.entries(gitlinks)) {
      checkFilePath(p);
      await g(["update-index", "--add", "--cacheinfo", `160000,${commit},${p}`]);
    }
    const tree = await g(["write-tree"]);
    const commitArgs = ["commit-tree", tree, "-m", message];
    if (parent) commitArgs.push("-p", parent);
    return await g(commitArgs);
  } finally {
    await rm(indexFile, { force: true });
  }
}

/** The repository half of GitServer, shared by the git://, ssh:// and http:// test servers. */
export type BareRepoOps = Pick<GitServer, "baseDir" | "repoPath" | "createRepo" | "commitFiles" | "git">;

/** Repo helpers over bare repos under `baseDir`; `workDir` holds throwaway index files. */
export function bareRepoOps(baseDir: string, workDir: string): BareRepoOps {
  const repoPath = (repo: string) => {
    checkRepoName(repo);
    return path.join(baseDir, repo);
  };
  return {
    baseDir,
    repoPath,
    async createRepo(repo, opts = {}) {
      const gitDir = repoPath(repo);
      const branch = opts.branch ?? "main";
      checkBranch(branch);
      const files = opts.files ?? { "README.md": `# ${repo}\n` };
      await mkdir(path.dirname(gitDir), { recursive: true });
      await runGit(["init", "--quiet", "--bare", `--initial-branch=${branch}`, gitDir]);
      const sha = await writeCommit(gitDir, workDir, undefined, files, { message: opts.message ?? "initial commit" });
      await runGit([`--git-dir=${gitDir}`, "update-ref", `refs/heads/${branch}`, sha, ""]);
      return sha;
    },
    async commitFiles(repo, files, opts = {}) {
      const gitDir = repoPath(repo);
      const branch = opts.branch ?? "main";
      checkBranch(branch);
      const ref = `refs/heads/${branch}`;
      const cur = await runGitRaw([`--git-dir=${gitDir}`, "rev-parse", "--verify", "--quiet", `${ref}^{commit}`]);
      const parent = cur.code === 0 ? cur.stdout.trim() : undefined;
      const sha = await writeCommit(gitDir, workDir, parent, files, { ...opts, message: opts.message ?? "update" });
      // compare-and-swap against the parent we built on ("" = must not exist yet)
      await runGit([`--git-dir=${gitDir}`, "update-ref", ref, sha, parent ?? ""]);
      return sha;
    },
    git(repo, ...args) {
      return runGit([`--git-dir=${repoPath(repo)}`, ...args]);
    },
  };
}

/** A git daemon that can also be taken down and brought back on its port: a remote that is away for a while. */
export interface GitDaemon extends GitServer {
  down(): Promise<void>;
  up(): Promise<void>;
  /** How many fetches (upload-pack requests) of the repository the daemon served; with `countFetches` only. */
  fetches(repo: string): Promise<number>;
}

export interface GitDaemonOptions {
  /** Log each request in an access hook, as a forge counts them: a process more per request, so only for tests that count. */
  countFetches?: boolean;
}

export async function startGitDaemon(options: GitDaemonOptions = {}): Promise<GitDaemon> {
  const tmpRoot = await mkdtemp(path.join(os.tmpdir(), "git-csi-gitd-"));
  const baseDir = path.join(tmpRoot, "repos");
  const workDir = path.join(tmpRoot, "work");
  await mkdir(baseDir);
  await mkdir(workDir);
  const requests = path.join(tmpRoot, "requests.log");
  const accessHook = options.countFetches ? await requestLogHook(tmpRoot, requests) : undefined;
  const daemon = new DaemonProcess(baseDir, accessHook);
  const onExit = () => daemon.killGroup("SIGKILL");
  process.once("exit", onExit);
  try {
    for (let attempt = 1; ; attempt++) {
      daemon.port = await freePort();
      if (await daemon.launch()) break;
      if (attempt >= 5) {
        throw new Error(`git daemon did not become ready on 127.0.0.1:${daemon.port}: ${daemon.stderrTail.trim()}`);
      }
    }
  } catch (e) {
    process.removeListener("exit", onExit);
    await rm(tmpRoot, { recursive: true, force: true });
    throw e;
  }
  const port = daemon.port;
  let stopped = false;
  return {
    ...bareRepoOps(baseDir, workDir),
    port,
    url(repo) {
      checkRepoName(repo);
      return `git://127.0.0.1:${port}/${repo}`;
    },
    down: () => daemon.halt(),
    async fetches(repo) {
      if (!accessHook) throw new Error("the daemon counts fetches only when started with countFetches");
      const lines = (await readFile(requests, "utf8")).split("\n");
      return lines.filter((line) => line === `upload-pack ${path.join(baseDir, repo)}`).length;
    },
    async up() {
      if (!(await daemon.launch())) throw new Error(`git daemon did not come back on 127.0.0.1:${port}: ${daemon.stderrTail.trim()}`);
    },
    async stop() {
      if (stopped) return;
      stopped = true;
      process.removeListener("exit", onExit);
      await daemon.halt();
      await rm(tmpRoot, { recursive: true, force: true });
    },
  };
}

/** git daemon's --access-hook, run before each request it serves: it logs the service and the repository's directory, and allows the request. */
async function requestLogHook(dir: string, log: string): Promise<string> {
  const hook = path.join(dir, "access-hook");
  await writeFile(log, "");
  await writeFile(hook, `#!/bin/sh\necho "$1 $2" >> '${log}'\n`, { mode: 0o755 });
  return hook;
}

/** One `git daemon` on a fixed port, which the tests stop and start again (down, up). */
class DaemonProcess {
  port = 0;
  stderrTail = "";
  private child?: ChildProcess;
  private exited = false;

  constructor(
    private readonly baseDir: string,
    private readonly accessHook?: string,
  ) {}

  killGroup(sig: NodeJS.Signals): void {
    if (this.child?.pid === undefined || this.exited) return;
    try {
      process.kill(-this.child.pid, sig); // detached => daemon leads its own group (incl. per-connection children)
    } catch {
      /* already gone */
    }
  }

  /** Starts the daemon on the port; true once it answers a git request. */
  async launch(): Promise<boolean> {
    this.exited = false;
    this.stderrTail = "";
    const child = spawn(
      "git",
      [
        "daemon",
        "--listen=127.0.0.1",
        `--port=${this.port}`,
        "--export-all",
        "--enable=receive-pack",
        `--base-path=${this.baseDir}`,
        "--reuseaddr",
        "--informative-errors",
        "--verbose",
        ...(this.accessHook ? [`--access-hook=${this.accessHook}`] : []),
        this.baseDir,
      ],
      { env: gitEnv(), stdio: ["ignore", "ignore", "pipe"], detached: true },
    );
    this.child = child;
    child.stderr?.on("data", (b: Buffer) => {
      this.stderrTail = (this.stderrTail + b.toString("utf8")).slice(-8192);
    });
    child.on("exit", () => {
      if (this.child === child) this.exited = true;
    });
    child.on("error", (e) => {
      if (this.child === child) this.exited = true;
      this.stderrTail += `\nspawn error: ${e.message}`;
    });
    if (await this.answers()) return true;
    this.killGroup("SIGKILL");
    this.child = undefined;
    return false;
  }

  /**
   * Ready when the daemon answers a git request: either success or a remote
   * error for the non-existent probe path (not "connection refused").
   */
  private async answers(): Promise<boolean> {
    const deadline = Date.now() + 10_000;
    while (!this.exited && Date.now() < deadline) {
      const r = await runGitRaw(["ls-remote", `git://127.0.0.1:${this.port}/.ready-probe`], { timeoutMs: 5_000 });
      if (r.code === 0 || /remote error|not exported|no such repository/i.test(r.stderr)) return !this.exited;
      await sleep(50);
    }
    return false;
  }

  /** Stops the daemon and every connection it serves. */
  async halt(): Promise<void> {
    const d = this.child;
    if (!d || this.exited) return;
    const gone = new Promise<void>((r) => d.once("exit", () => r()));
    this.killGroup("SIGTERM");
    const t = setTimeout(() => this.killGroup("SIGKILL"), 3_000);
    await gone;
    clearTimeout(t);
    // per-connection children share the group; make sure none linger
    try {
      process.kill(-(d.pid as number), "SIGKILL");
    } catch {
      /* none left */
    }
  }
}

/** A real push failure: the server's pre-receive hook declines every push to a branch until it is removed. */
export async function refusePushes(server: Pick<GitServer, "repoPath">, repo: string): Promise<() => Promise<void>> {
  // A protected branch, as a forge has: the branches refuse pushes; the driver's own refs (the owner ref's release) do not.
  const hook = await preReceive(
    server,
    repo,
    `#!/bin/sh
while read old new ref; do
  case "$ref" in refs/heads/*) echo 'the forge is read-only for this test' >&2; exit 1;; esac
done
exit 0
`,
  );
  return () => rm(hook);
}

/** The repository's pre-receive hook, replacing any other: a forge's rules for every push. Returns its path. */
export async function preReceive(server: Pick<GitServer, "repoPath">, repo: string, script: string): Promise<string> {
  const hook = path.join(server.repoPath(repo), "hooks", "pre-receive");
  await mkdir(path.dirname(hook), { recursive: true });
  await writeFile(hook, script, { mode: 0o755 });
  return hook;
}

/**
 * A fetch-only remote, as a read-only deploy key or token sees its forge:
 * every push is refused, whatever its refs, and logged. Returns the log's reader.
 */
export async function fetchOnly(server: Pick<GitServer, "repoPath">, repo: string): Promise<() => Promise<string[][]>> {
  const read = await logPushes(server, repo);
  const logging = await readFile(path.join(server.repoPath(repo), "hooks", "pre-receive"), "utf8");
  await preReceive(server, repo, `${logging}echo 'this credential may only fetch' >&2\nexit 1\n`);
  return read;
}

/**
 * A forge slow to take big uploads: each push that creates a staging ref (a
 * write's objects sent ahead) is held for `seconds` before it lands; the
 * fenced push after it, and the staging ref's deletion, are not.
 */
export async function slowUploads(server: Pick<GitServer, "repoPath">, repo: string, seconds: number): Promise<void> {
  await preReceive(
    server,
    repo,
    `#!/bin/sh
while read old new ref; do
  case "$ref" in refs/git-csi/staging/*) [ "$new" = 0000000000000000000000000000000000000000 ] || sleep ${seconds};; esac
done
exit 0
`,
  );
}

/**
 * Logs each push the repository receives, as its refs, from its pre-receive
 * hook: what a forge counts, over any transport. Returns the reader.
 */
export async function logPushes(server: Pick<GitServer, "repoPath">, repo: string): Promise<() => Promise<string[][]>> {
  const dir = server.repoPath(repo);
  const log = path.join(dir, "pushes.log");
  await writeFile(log, "");
  await preReceive(server, repo, `#!/bin/sh\nawk '{printf "%s ", $3} END {print ""}' >> '${log}'\n`);
  return async () =>
    (await readFile(log, "utf8"))
      .split("\n")
      .filter((line) => line.trim() !== "")
      .map((line) => line.trim().split(" "));
}

/** The ways a forge's merge button takes a branch into another: GitHub's and GitLab's three. */
export type ForgeMerge = "merge" | "squash" | "rebase";

/**
 * What a forge's merge button does, with a real git in a throwaway clone of
 * the repository: a merge commit, the branch's changes as one new commit, or
 * its commits replayed on top of `into`. Where they conflict, the branch's
 * side wins, as a person resolving them for it would choose.
 */
export async function forgeMerge(server: Pick<GitServer, "repoPath">, repo: string, branch: string, kind: ForgeMerge, into = "main"): Promise<void> {
  const dir = await mkdtemp(path.join(os.tmpdir(), "forge-merge-"));
  const git = (...args: string[]) => runGit(args, { cwd: dir });
  try {
    await git("clone", "--quiet", "--branch", into, server.repoPath(repo), ".");
    if (kind === "merge") await git("merge", "--quiet", "--no-ff", "-X", "theirs", "-m", `Merge ${branch}`, `origin/${branch}`);
    if (kind === "squash") {
      await git("merge", "--quiet", "--squash", "-X", "theirs", `origin/${branch}`);
      await git("commit", "--quiet", "-m", `${branch} (squashed)`);
    }
    if (kind === "rebase") {
      await git("checkout", "--quiet", "--detach", `origin/${branch}`);
      await git("rebase", "--quiet", "-X", "theirs", into);
    }
    await git("push", "--quiet", "origin", `HEAD:refs/heads/${into}`);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}
