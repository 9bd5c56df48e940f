// The bench's child processes: every workload and git command runs in its
// own process, and the one running now is killed on SIGINT/SIGTERM so that
// the cleanup of each section runs promptly.
import { type ChildProcess, spawn } from "node:child_process";
import { setTimeout as sleep } from "node:timers/promises";
import { gitEnv } from "../git-server";

export const log = (text: string) => process.stderr.write(`${text}\n`);

let current: ChildProcess | undefined;
let interrupted: NodeJS.Signals | undefined;

export function exec(file: string, args: readonly string[], env: NodeJS.ProcessEnv = { ...process.env, LC_ALL: "C", LANG: "C" }): Promise<{ stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(file, [...args], { stdio: ["ignore", "pipe", "pipe"], env });
    current = child;
    let stdout = "";
    let stderr = "";
    child.stdout!.on("data", (chunk: Buffer) => (stdout += chunk.toString()));
    child.stderr!.on("data", (chunk: Buffer) => (stderr += chunk.toString()));
    child.once("error", (err) => {
      current = undefined;
      reject(err);
    });
    child.once("close", (code, signal) => {
      current = undefined;
      if (code === 0) resolve({ stdout, stderr });
      else reject(new Error(`${file} ${args.join(" ")} failed (${signal ?? `exit ${String(code)}`})${interrupted ? ` after ${interrupted}` : ""}: ${stderr.trim()}`));
    });
  });
}

export const sh = (script: string, ...args: string[]) => exec("sh", ["-c", script, "sh", ...args]);
/** A shell script whose git runs with no system or global config and a fixed identity (git-server's gitEnv). */
export const gitSh = (script: string, ...args: string[]) => exec("sh", ["-c", script, "sh", ...args], gitEnv());

/** Kills the workload running now at the first SIGINT or SIGTERM; no new one starts after it. */
export function stopOnSignals(): void {
  process.once("SIGINT", onSignal);
  process.once("SIGTERM", onSignal);
}

function onSignal(signal: NodeJS.Signals): void {
  if (interrupted) return;
  interrupted = signal;
  log(`\n${signal}: stopping the current workload and cleaning up`);
  current?.kill("SIGKILL");
}

/** The signal that stopped the run, if one did. */
export function interruption(): NodeJS.Signals | undefined {
  return interrupted;
}

/** Between steps: after a signal no new workload starts (cleanup still runs its commands). */
export function checkInterrupted(): void {
  if (interrupted) throw new Error(`interrupted by ${interrupted}`);
}

/** Runs the cleanup steps in order; a failing step is logged and the next one still runs. */
export async function cleanUp(steps: Array<[string, () => Promise<unknown>]>): Promise<void> {
  for (const [name, step] of steps) {
    try {
      await step();
    } catch (err) {
      log(`cleanup: ${name} failed: ${err instanceof Error ? err.message : String(err)}`);
    }
  }
}

/** Polls until probe gives a value; stops at a signal. */
export async function until<T>(what: string, probe: () => Promise<T | undefined | false>, timeoutMs = 60_000, everyMs = 50): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    checkInterrupted();
    const value = await probe();
    if (value !== undefined && value !== false) return value;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await sleep(everyMs);
  }
}
