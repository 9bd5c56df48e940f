// Test helper: the life of a test server's process and its temporary root,
// shared by the ssh:// and http:// servers: it starts on a free port, stops
// with every process below it, and is never left behind by a test process
// that exits without stopping it.

import type { ChildProcess } from "node:child_process";
import { readdirSync, readFileSync, rmSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import * as os from "node:os";
import * as path from "node:path";
import { setTimeout as sleep } from "node:timers/promises";

import { freePort } from "./git-server";

/** A server process a test started; exited once it is gone. */
export interface ServedProcess {
  child: ChildProcess;
  exited: boolean;
}

/** One start of a server on a port: ready, or why not (what it printed). */
export interface Launch {
  process: ServedProcess;
  ready: boolean;
  why: string;
}

/** The root's path ends up inside the servers' config files. */
const SAFE_PATH = /^\/[A-Za-z0-9._/-]+$/;
/** What a server says when another process took its port between freePort and its bind. */
const BIND_RACE = /Address already in use|can't bind|cannot bind/i;

/** A test server's temporary root and, once launched, its process. */
export class ServerRoot {
  private served?: ServedProcess;
  private stopped = false;
  private readonly onExit = () => {
    // the test process is exiting without stop(): kill everything, drop the temp dir
    if (this.served?.child.pid !== undefined && !this.served.exited) killProcessTreeSync(this.served.child.pid);
    rmSync(this.dir, { recursive: true, force: true });
  };

  private constructor(readonly dir: string) {
    process.once("exit", this.onExit);
  }

  /** A new temporary root, named from `prefix`, whose path `configName` can hold unquoted. */
  static async create(prefix: string, configName: string): Promise<ServerRoot> {
    const dir = await mkdtemp(path.join(os.tmpdir(), prefix));
    if (!SAFE_PATH.test(dir)) {
      await rm(dir, { recursive: true, force: true });
      throw new Error(`temp dir ${JSON.stringify(dir)} has characters unsafe for ${configName}`);
    }
    return new ServerRoot(dir);
  }

  /**
   * Starts the server on a free port, and again on another when it lost the
   * port to a bind race, five tries at most. Resolves to the port and the
   * server's pid.
   */
  async launch(name: string, host: string, start: (port: number) => Promise<Launch>): Promise<{ port: number; pid: number }> {
    for (let attempt = 1; ; attempt++) {
      const port = await freePort();
      const launched = await start(port);
      this.served = launched.process;
      if (launched.ready) return { port, pid: launched.process.child.pid as number };
      await stopProcessTree(launched.process.child, 500);
      this.served = undefined;
      if (!BIND_RACE.test(launched.why) || attempt >= 5) throw new Error(`${name} did not start on ${host}:${port}: ${launched.why}`);
    }
  }

  /** Stops the server and every process below it, and removes the root. Idempotent. */
  async stop(): Promise<void> {
    if (this.stopped) return;
    this.stopped = true;
    if (this.served && !this.served.exited) await stopProcessTree(this.served.child);
    process.removeListener("exit", this.onExit);
    await rm(this.dir, { recursive: true, force: true });
  }
}

/** Live (non-zombie) descendants of `root`, from /proc (Linux only). */
function liveDescendants(root: number): { pid: number; ppid: number }[] {
  const procs: { pid: number; ppid: number }[] = [];
  for (const ent of readdirSync("/proc")) {
    if (!/^[0-9]+$/.test(ent)) continue;
    try {
      const stat = readFileSync(`/proc/${ent}/stat`, "utf8");
      // "pid (comm) state ppid ...": comm may contain spaces and parens
      const [state, ppid] = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
      if (state !== "Z" && state !== "X") procs.push({ pid: Number(ent), ppid: Number(ppid) });
    } catch {
      /* exited meanwhile */
    }
  }
  const inTree = new Set([root]);
  const out: { pid: number; ppid: number }[] = [];
  for (let grew = true; grew;) {
    grew = false;
    for (const p of procs) {
      if (!inTree.has(p.pid) && inTree.has(p.ppid)) {
        inTree.add(p.pid);
        out.push(p);
        grew = true;
      }
    }
  }
  return out;
}

function signal(pid: number, sig: NodeJS.Signals): void {
  try {
    process.kill(pid, sig);
  } catch {
    /* already gone */
  }
}

/**
 * Stop a server process and every process below it, even ones that left its
 * process group (sshd puts each connection in its own session). The server is
 * frozen (SIGSTOP: no new connections or forks), its subtree is killed leaves
 * first so that every process is reaped by its own (running) parent, then the
 * server gets SIGTERM+SIGCONT (SIGKILL after `graceMs`) and is reaped by us.
 */
async function stopProcessTree(child: ChildProcess, graceMs = 3_000): Promise<void> {
  const pid = child.pid;
  if (pid === undefined || child.exitCode !== null || child.signalCode !== null) return;
  const gone = new Promise<void>((r) => child.once("exit", () => r()));
  signal(pid, "SIGSTOP");
  for (let round = 0; round < 200; round++) {
    const desc = liveDescendants(pid);
    if (desc.length === 0) break;
    const parents = new Set(desc.map((p) => p.ppid));
    for (const p of desc) if (!parents.has(p.pid)) signal(p.pid, "SIGKILL");
    await sleep(10);
  }
  signal(pid, "SIGTERM");
  signal(pid, "SIGCONT");
  const t = setTimeout(() => signal(pid, "SIGKILL"), graceMs);
  await gone;
  clearTimeout(t);
}

/** Synchronous last resort (process "exit" hook): SIGKILL the process and its whole tree. */
function killProcessTreeSync(pid: number): void {
  signal(pid, "SIGSTOP");
  for (const p of liveDescendants(pid)) signal(p.pid, "SIGKILL");
  signal(pid, "SIGKILL");
}
