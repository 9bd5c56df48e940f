import { spawn } from "node:child_process";
import * as fs from "node:fs/promises";
import * as path from "node:path";
import * as readline from "node:readline";
import { REMOTE_TRANSPORTS } from "@git-csi/config";
import type { Logger } from "@git-csi/logging";
import { GitError, simpleGit, type SimpleGit } from "simple-git";

/*
 * The git worker's one way to run git: the environment every command gets
 * (gitIn), the author a commit names (authorEnv), and the runner that logs
 * each command and raises its failure with argv and stderr (runGit).
 */

/** How many of a command's arguments an error shows: a pathspec list can hold thousands. */
const ARGV_SHOWN = 12;

/** A git command that failed, with its argv and git's own words: what an operator needs to act. */
export class GitCommandError extends Error {
  constructor(
    readonly argv: string[],
    readonly stderr: string,
  ) {
    const shown = (argv.length > ARGV_SHOWN ? [...argv.slice(0, ARGV_SHOWN), `… (${argv.length - ARGV_SHOWN} more)`] : argv).map(withoutUserinfo);
    super(`git ${shown.join(" ")}: ${stderr}`);
  }
}

/** An https URL's user:password is a secret: an error never shows it. */
function withoutUserinfo(arg: string): string {
  return arg.replace(/^([a-z]+:\/\/)[^@/\s]+@/i, "$1…@");
}

/**
 * Runs one git command. git says "absent" by an exit code with nothing on
 * stderr, which simple-git answers as empty output; every other failure
 * rejects, and carries the argv.
 */
export async function runGit(git: SimpleGit, argv: string[]): Promise<string> {
  const started = Date.now();
  try {
    const out = await git.raw(argv);
    log?.debug(`git ${subcommand(argv)}`, { operation: "git", ms: Date.now() - started });
    return out;
  } catch (err) {
    const failed = new GitCommandError(argv, gitMessage(err));
    log?.debug(`git ${subcommand(argv)} failed`, { operation: "git", ms: Date.now() - started, error: failed.stderr });
    throw failed;
  }
}

/** The command git runs, past the options before it (`-c key=value` takes two arguments). */
function subcommand(argv: string[]): string {
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === "-c") i++;
    else if (!argv[i]!.startsWith("-")) return argv[i]!;
  }
  return argv[0] ?? "";
}

/** git's own words in a failure, without what simple-git, the runner or GIT_TRACE (see traced) added. */
export function gitMessage(err: unknown): string {
  if (err instanceof GitCommandError) return err.stderr;
  return (err instanceof GitError ? err.message : String(err)).replace(TRACE_LINE, "").trim();
}

/** A line GIT_TRACE writes: time, source file and line, then the trace. */
const TRACE_LINE = /^\d\d:\d\d:\d\d\.\d+ [\w./-]+:\d+ +trace: .*\n?/gm;

/**
 * git with its trace on stderr, for a command that prints nothing when it
 * succeeds: simple-git waits 50 ms more for a process that wrote no output
 * (its completion plugin's deferClose), and the trace line spares that wait.
 * It changes the instance it is given, so pass one made for the command.
 */
export function traced(git: SimpleGit): SimpleGit {
  return git.env("GIT_TRACE", "1");
}

let log: Logger | undefined;

/**
 * Where runGit logs, at debug: the subcommand and its time, never its argv,
 * which can hold a remote URL's userinfo.
 */
export function logGitTo(logger: Logger): void {
  log = logger;
}

/**
 * Only the transports forges serve, in git's own configuration of every
 * command the worker runs: a remote URL, a redirect or a submodule that names
 * a local path, file://, ext:: or another helper transport is refused by git
 * too, not only by the CSI frontend's check of the volume's URL. file and ext
 * are named as well: a protocol.file.allow=always in a user's or the system's
 * configuration (common since git made submodules ask for it) would win over
 * protocol.allow.
 */
const REMOTE_ONLY = ["protocol.allow=never", "protocol.file.allow=never", "protocol.ext.allow=never", ...REMOTE_TRANSPORTS.map((transport) => `protocol.${transport}.allow=always`)];

/**
 * git:// remotes through the worker's relay (native/tcp-relay.c), which turns
 * Nagle off: on git's own connection every push waits for the server's
 * delayed ACK, 40 ms. core.gitProxy touches no other transport.
 */
export const TCP_RELAY = path.join(__dirname, "..", "..", "native", "git-csi-tcp-relay");

/** Every command's configuration: the transports, and the relay. */
const WORKER_CONFIG = [...REMOTE_ONLY, `core.gitProxy=${TCP_RELAY}`];

/** A worker without its relay could reach no git:// remote: it says so at startup, not at the first push. */
export async function checkRelay(): Promise<void> {
  await fs.access(TCP_RELAY, fs.constants.X_OK).catch((err: Error) => {
    throw new Error(`the git:// relay ${TCP_RELAY} cannot run (${err.message}); \`make build\` builds it`);
  });
}

/** The clean environment of every git the worker runs: no prompt ever waits for a terminal. */
function cleanEnv(env: Record<string, string>): Record<string, string> {
  return { PATH: process.env.PATH ?? "/usr/bin:/bin", HOME: process.env.HOME ?? "/", GIT_TERMINAL_PROMPT: "0", ...env };
}

/**
 * simple-git answers a git that a signal ended (no exit code) as a success
 * with whatever it printed: a push killed by SIGPIPE or the OOM killer would
 * read as landed. Such a git failed.
 */
function endedBySignal(error: Buffer | Error | undefined, result: { exitCode: number | null; stdErr: Buffer[] }): Buffer | Error | undefined {
  if (error !== undefined || result.exitCode !== null) return error;
  const stderr = Buffer.concat(result.stdErr).toString("utf8").trim();
  return Buffer.from(`git was ended by a signal before it exited${stderr === "" ? "" : `: ${stderr}`}`);
}

/** git run in an existing directory, with a clean environment. */
export function gitIn(cwd: string, env: Record<string, string>, config: string[] = []): SimpleGit {
  // The credential helper, ssh command and protocol settings are always the worker's own, never input.
  const unsafe = { allowUnsafeCredentialHelper: true, allowUnsafeSshCommand: true, allowUnsafeProtocolOverride: true, allowUnsafeGitProxy: true };
  return simpleGit({ baseDir: cwd, trimmed: false, config: [...WORKER_CONFIG, ...config], unsafe, errors: endedBySignal }).env(cleanEnv(env));
}

/** Where and how a git process runs, for the commands simple-git cannot run (see converse). */
export interface GitSetting {
  cwd: string;
  env: Record<string, string>;
  config: string[];
}

/** Writes to a git process's stdin, and reads its output line by line. */
export interface Conversation {
  write(text: string): void;
  line(): Promise<string>;
}

/**
 * Runs one git command that reads stdin while it answers on stdout
 * (fast-import): simple-git gives a command no stdin. `talk` writes and
 * reads; stdin closes when it returns, and a git that then fails rejects
 * with its argv and stderr, as runGit does.
 */
export async function converse<T>(at: GitSetting, argv: string[], talk: (io: Conversation) => Promise<T>): Promise<T> {
  const started = Date.now();
  const config = [...WORKER_CONFIG, ...at.config].flatMap((c) => ["-c", c]);
  const child = spawn("git", [...config, ...argv], { cwd: at.cwd, env: cleanEnv(at.env), stdio: ["pipe", "pipe", "pipe"] });
  let stderr = "";
  child.stderr.setEncoding("utf8").on("data", (text: string) => (stderr += text));
  // A git that stopped reading is told by its exit code, not by a write that failed.
  child.stdin.on("error", () => undefined);
  // A git that could not start is a failure like any other: its reason is what stderr would have said.
  const exited = new Promise<number | null>((resolve) =>
    child
      .once("error", (err) => {
        stderr += err.message;
        resolve(null);
      })
      .once("close", resolve),
  );
  const lines = readline.createInterface({ input: child.stdout })[Symbol.asyncIterator]();
  const failed = (message: string) => new GitCommandError(argv, message);
  try {
    const answer = await talk({
      write: (text) => child.stdin.write(text),
      line: async () => {
        const next = await lines.next();
        if (next.done) throw failed(stderr.trim() || "git ended its output before answering");
        return next.value as string;
      },
    });
    child.stdin.end();
    const code = await exited;
    if (code !== 0) throw failed(stderr.trim() || `git exited with ${String(code)}`);
    log?.debug(`git ${subcommand(argv)}`, { operation: "git", ms: Date.now() - started });
    return answer;
  } catch (err) {
    child.kill();
    const error = err instanceof GitCommandError ? err : failed(String(err));
    log?.debug(`git ${subcommand(argv)} failed`, { operation: "git", ms: Date.now() - started, error: error.stderr });
    throw error;
  }
}

/** Who a commit names: git reads author and committer from these, and the driver writes both as the class's author. */
export interface Author {
  name: string;
  email: string;
}

/** The environment that makes git write author as both author and committer. */
export function authorEnv(author: Author): Record<string, string> {
  return { GIT_AUTHOR_NAME: author.name, GIT_AUTHOR_EMAIL: author.email, GIT_COMMITTER_NAME: author.name, GIT_COMMITTER_EMAIL: author.email };
}

/** How many paths one command takes: a command line has a length limit. */
export const ARGV_BATCH = 500;

/** items, size at a time. */
export function chunks<T>(items: T[], size = ARGV_BATCH): T[][] {
  const out: T[][] = [];
  for (let i = 0; i < items.length; i += size) out.push(items.slice(i, i + size));
  return out;
}
