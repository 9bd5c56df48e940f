import { spawnSync, type SpawnSyncReturns } from "node:child_process";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import type { TestContext } from "node:test";

/**
 * git run outside any repository (so nothing is expanded against one) and
 * without a user's or the system's configuration: the oracle a rule is
 * compared with on generated input.
 */
export function gitOutsideRepository(t: TestContext): (...args: string[]) => SpawnSyncReturns<string> {
  const cwd = fs.mkdtempSync(path.join(os.tmpdir(), "config-test-"));
  t.after(() => fs.rmSync(cwd, { recursive: true, force: true }));
  const env = { PATH: process.env.PATH, HOME: cwd, GIT_CEILING_DIRECTORIES: path.dirname(cwd), GIT_CONFIG_NOSYSTEM: "1", GIT_TERMINAL_PROMPT: "0" };
  return (...args) => spawnSync("git", args, { cwd, env, encoding: "utf8", timeout: 10_000 });
}

/** A property's seed and run count, printed in the test's output; FC_SEED repeats a run. */
export function propertyRuns(t: TestContext, numRuns: number): { seed: number; numRuns: number } {
  const seed = Number(process.env.FC_SEED ?? Date.now() % 2 ** 31);
  t.diagnostic(`seed ${seed} numRuns ${numRuns}`);
  return { seed, numRuns };
}
