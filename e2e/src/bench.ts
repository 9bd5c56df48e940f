// make bench: three sections, in one run on this machine.
//
//   node e2e/dist/src/bench.js [--quick] [--passthrough-only | --commit-only | --commit-path | --scale-only | --no-scale] [--out DIR]
//
// 1. The driver's FUSE passthrough against a plain directory and against
//    bindfs (skipped with --commit-only or --scale-only).
// 2. Commit cost: one changed file in a small and a large tree, committed and
//    pushed by the driver, by hand with git on that one path, and by a full
//    scan (git add --all); see bench/commit.ts (skipped with
//    --passthrough-only or --scale-only; --commit-path runs it alone, on the
//    small tree only).
// 3. Scale: many volumes staged on one node, idle and then written once each
//    (skipped with --passthrough-only, --commit-only or --no-scale).
//
// The parts live in bench/: config (the command line), passthrough and its
// workloads, commit and its ways, scale, and report (results.json and .md).
// Every workload runs in its own process (dd, python3, sh): the bench process
// never makes a file call into a FUSE mount. Results: results.json and
// results.md in --out; the sections a run skips are kept as the last run
// wrote them.
import * as fs from "node:fs/promises";
import * as os from "node:os";
import * as path from "node:path";
import { mountsUnder } from "./driver";
import { runCommitCost } from "./bench/commit";
import { parseConfig } from "./bench/config";
import { runPassthrough } from "./bench/passthrough";
import { cleanUp, exec, interruption, log, stopOnSignals } from "./bench/process";
import { environment, previousResults, type Results, writeResults } from "./bench/report";
import { runScale } from "./bench/scale";

async function main(): Promise<void> {
  const config = parseConfig(process.argv.slice(2));
  stopOnSignals();

  // Up front, so a bad --out fails before the run, and by mkdir(1): Node 20's
  // recursive fs.mkdir spins forever on a path under /proc.
  await exec("mkdir", ["-p", "--", config.out]);
  const dir = await fs.mkdtemp(path.join(os.tmpdir(), "git-csi-bench-"));

  try {
    log(
      `bench: ${config.quick ? "quick" : "full"} run${config.passthroughOnly ? ", passthrough only" : ""}${config.commitOnly ? `, commit cost only${config.commitPath ? " (small tree)" : ""}` : ""}${config.scaleOnly ? ", scale only" : ""}${config.noScale ? ", no scale" : ""}; scratch ${dir}`,
    );
    const env = await environment(config);
    const results = await previousResults(config.out);
    const kept = (name: keyof Results) => results[name] && log(`keeping section ${name} from ${String(results[name].environment.date)} in ${path.join(config.out, "results.json")}`);
    if (config.commitOnly || config.scaleOnly) kept("passthrough");
    else results.passthrough = await runPassthrough(config, path.join(dir, "passthrough"), env);
    if (config.passthroughOnly || config.scaleOnly) kept("commitCost");
    else results.commitCost = await runCommitCost(config, path.join(dir, "commit"), env);
    if (config.passthroughOnly || config.commitOnly || config.noScale) kept("scale");
    else results.scale = await runScale(config.scale, path.join(dir, "scale"), env);
    process.stdout.write(`\n${await writeResults(config.out, results)}`);
  } finally {
    await cleanUp([
      // Whatever a failed step left mounted goes before the scratch directory does.
      [
        "unmount leftovers",
        async () => {
          for (const mountPoint of (await mountsUnder(dir)).reverse()) await exec("umount", ["-l", mountPoint]);
        },
      ],
      ["remove the scratch directory", () => fs.rm(dir, { recursive: true, force: true })],
    ]);
  }
}

main().then(
  () => {
    if (interruption()) process.exit(130);
  },
  (err: unknown) => {
    process.stderr.write(`bench failed: ${err instanceof Error ? err.stack : String(err)}\n`);
    process.exit(interruption() ? 130 : 1);
  },
);
