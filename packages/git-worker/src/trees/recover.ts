import * as fs from "node:fs/promises";
import * as path from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { isAbsent, orAbsent } from "@git-csi/config";
import type { Store } from "./store";

/** How long ended processes get to be gone before their locks are removed. */
const EXIT_WAIT_MS = 5_000;

export interface Recovered {
  /** git processes (and their helpers) a previous worker left running. */
  ended: number;
  /** Lock files those processes left, relative to the state directory. */
  locks: string[];
}

/**
 * A git worker that was killed leaves its git commands running, or their lock
 * files behind where they died too; every later command on that repository
 * would then fail with "index.lock: File exists". The worker is the only git
 * user of its state directory, so at start it ends what a previous worker
 * left and removes the locks, before it runs any git of its own.
 */
export async function recoverFromKill(store: Store): Promise<Recovered> {
  const orphans = await leftoverGitProcesses(store.stateDir);
  for (const pid of orphans) signal(pid);
  await waitUntilGone(orphans);
  const locks = [...(await locksUnder(path.join(store.stateDir, "repos"))), ...(await locksUnder(path.join(store.stateDir, "sync")))];
  for (const lock of locks) await fs.rm(lock, { force: true });
  return { ended: orphans.length, locks: locks.map((l) => path.relative(store.stateDir, l)) };
}

/**
 * Processes whose environment names a git directory of this state directory
 * (git, and what git started: ssh, credential helpers), and git commands run
 * inside it, such as a rebase in the scratch worktree.
 */
async function leftoverGitProcesses(stateDir: string): Promise<number[]> {
  const inside = `${stateDir}${path.sep}`;
  const found: number[] = [];
  for (const pid of await fs.readdir("/proc")) {
    if (!/^\d+$/.test(pid) || Number(pid) === process.pid) continue;
    const [environ, argv, cwd] = await Promise.all([
      ofProcess(fs.readFile(`/proc/${pid}/environ`, "utf8")),
      ofProcess(fs.readFile(`/proc/${pid}/cmdline`, "utf8")),
      ofProcess(fs.readlink(`/proc/${pid}/cwd`)),
    ]);
    const namesGitDir = environ?.split("\0").some((v) => v.startsWith(`GIT_DIR=${inside}`)) ?? false;
    const gitInside = argv?.startsWith("git\0") === true && cwd?.startsWith(inside) === true;
    if (namesGitDir || gitInside) found.push(Number(pid));
  }
  return found;
}

/**
 * What /proc says of a process: undefined for one that exited since the
 * listing, or one the worker may not inspect, which a worker of the same
 * user could not have started.
 */
async function ofProcess(read: Promise<string>): Promise<string | undefined> {
  try {
    return await read;
  } catch (err) {
    if (isAbsent(err) || ["EACCES", "EPERM", "ESRCH"].includes((err as NodeJS.ErrnoException).code ?? "")) return undefined;
    throw err;
  }
}

function signal(pid: number): void {
  try {
    process.kill(pid, "SIGKILL");
  } catch {
    // Gone already.
  }
}

async function waitUntilGone(pids: number[]): Promise<void> {
  const deadline = Date.now() + EXIT_WAIT_MS;
  for (const pid of pids) {
    while (Date.now() < deadline && (await isRunning(pid))) await sleep(20);
  }
}

/** A zombie is gone for this purpose: it holds no file. */
async function isRunning(pid: number): Promise<boolean> {
  const stat = await ofProcess(fs.readFile(`/proc/${pid}/stat`, "utf8"));
  return stat !== undefined && stat.slice(stat.lastIndexOf(")") + 2)[0] !== "Z";
}

/** Every *.lock file below a directory; loose objects hold none, so they are not walked. */
async function locksUnder(dir: string): Promise<string[]> {
  const entries = (await orAbsent(fs.readdir(dir, { withFileTypes: true }))) ?? [];
  const locks: string[] = [];
  for (const entry of entries) {
    const full = path.join(dir, entry.name);
    if (entry.isDirectory() && !(path.basename(dir) === "objects" && /^[0-9a-f]{2}$|^pack$/.test(entry.name))) locks.push(...(await locksUnder(full)));
    else if (entry.isFile() && entry.name.endsWith(".lock")) locks.push(full);
  }
  return locks;
}
