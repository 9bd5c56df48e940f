// Section 2: commit cost. Issue 3, item 4: "commit cost grows with the changed
// paths, not with the tree". One changed file, in a tree of FILES_PER_DIR
// files and in one of 10 (--quick) or 100 times that, committed and pushed
// three ways:
//   (a) driver     the application appends to one file through the volume's
//                  mount; the clock runs from the write's return to the moment
//                  the remote ref moves (inotify on the bare repository's
//                  refs/heads). The class's quiesce is idle waiting, so it is
//                  also reported subtracted: what is left is the git work,
//                  plus the watcher's latency.
//   (b) by hand    in a plain clone: git add <that path>; git commit; git push.
//   (c) full scan  the same clone: git add --all; git commit; git push; and
//                  (c') git status --porcelain alone.
//   (d) push alone the same clone, one file committed untimed: git push. The
//                  remote's share of a push, which grows with the tree (its
//                  connectivity check walks the parent's whole tree).
// Every directory holds FILES_PER_DIR files in both trees, so the directory of
// the changed file is the same size: only the tree around it grows. The trees
// are written into a bare repository by git fast-import (not timed). The
// driver's volume and the clone push to two copies of it, so they never race
// for one ref. The page cache stays warm here: the driver's tree is a warm
// tree in steady state, and a warm cache is the full scan's best case.
import * as fs from "node:fs/promises";
import * as path from "node:path";
import { type Driver, freePort, type PublishedVolume, startDriver, unpublishAndUnstage } from "../driver";
import { type GitServer, startGitDaemon } from "../git-server";
import { type Config, FILE_BYTES, FILES_PER_DIR } from "./config";
import { byHandOnce, driverOnce, type DriverSample, setUpTree, type Tree } from "./commit-ways";
import { cleanUp, log } from "./process";
import { medianOf } from "./stats";

/** The first push after the stage records metadata for the whole tree: over a minute at 100,000 files here. */
const FIRST_PUSH_TIMEOUT_MS = 15 * 60_000;

const DRIVER_PARTS = ["totalMs", "minusQuiesceMs", "pendingMs", "committedMs", "pushMs"] as const;

export interface TreeResult {
  files: number;
  directories: number;
  filesPerDirectory: number;
  fileBytes: number;
  /** The warm-up: the driver's first change after the stage, write → remote ref moved. */
  driverFirstChangeMs: number;
  samples: TreeSamples;
  median: { driver: DriverSample; byHand: number; fullScan: number; status: number; pushAlone: number };
  ratio: { driverMinusQuiesceOverByHand: number; fullScanOverByHand: number; statusOverByHand: number };
}

export interface CommitSection {
  config: { quick: boolean; repetitions: number; warmUps: number; quiesceMs: number; maxLatency: string; filesPerDirectory: number; fileBytes: number };
  environment: Record<string, unknown>;
  ways: Record<string, string>;
  trees: TreeResult[];
  /** Large tree over small tree, median over median; absent with one tree (--commit-path). */
  growth?: { driverTotal: number; driverMinusQuiesce: number; driverPending: number; driverCommitted: number; driverPush: number; byHand: number; fullScan: number; status: number; pushAlone: number };
}

type TreeSamples = { driver: DriverSample[]; byHand: number[]; fullScan: number[]; status: number[]; pushAlone: number[] };

/** The driver and git by hand on every tree, c.repetitions times. */
async function sampleTrees(server: GitServer, driver: Driver, trees: Tree[], c: Config["commit"]): Promise<Map<Tree, TreeSamples>> {
  const samples = new Map(trees.map((t): [Tree, TreeSamples] => [t, { driver: [], byHand: [], fullScan: [], status: [], pushAlone: [] }]));
  for (let rep = 1; rep <= c.repetitions; rep++) {
    // Trees and ways take turns within a repetition, so a drift of the machine touches all.
    for (const tree of trees) {
      const s = samples.get(tree)!;
      const d = await driverOnce(server, driver, tree, c.quiesceMs, rep);
      const h = await byHandOnce(server, tree, rep);
      s.driver.push(d);
      s.byHand.push(h.byHand);
      s.status.push(h.status);
      s.fullScan.push(h.fullScan);
      s.pushAlone.push(h.pushAlone);
      log(
        `  run ${rep}/${c.repetitions} ${tree.files.toLocaleString("en-US").padStart(7)} files: driver ${Math.round(d.totalMs)} ms (−quiesce ${Math.round(d.minusQuiesceMs)}: pending ${Math.round(d.pendingMs)}, committed ${Math.round(d.committedMs)}, push ${Math.round(d.pushMs)}), by hand ${Math.round(h.byHand)}, status ${Math.round(h.status)}, full scan ${Math.round(h.fullScan)}, push alone ${Math.round(h.pushAlone)}`,
      );
    }
  }
  return samples;
}

function treeResult(tree: Tree, s: TreeSamples, driverFirstChangeMs: number): TreeResult {
  const m = {
    driver: Object.fromEntries(DRIVER_PARTS.map((k) => [k, medianOf(s.driver.map((d) => d[k]))])) as unknown as DriverSample,
    byHand: medianOf(s.byHand),
    fullScan: medianOf(s.fullScan),
    status: medianOf(s.status),
    pushAlone: medianOf(s.pushAlone),
  };
  return {
    files: tree.files,
    directories: tree.directories,
    filesPerDirectory: FILES_PER_DIR,
    fileBytes: FILE_BYTES,
    driverFirstChangeMs,
    samples: s,
    median: m,
    ratio: { driverMinusQuiesceOverByHand: m.driver.minusQuiesceMs / m.byHand, fullScanOverByHand: m.fullScan / m.byHand, statusOverByHand: m.status / m.byHand },
  };
}

/** How each way's cost grows from the small tree to the large one. */
function growthOf(small: TreeResult["median"], large: TreeResult["median"]): NonNullable<CommitSection["growth"]> {
  return {
    driverTotal: large.driver.totalMs / small.driver.totalMs,
    driverMinusQuiesce: large.driver.minusQuiesceMs / small.driver.minusQuiesceMs,
    driverPending: large.driver.pendingMs / small.driver.pendingMs,
    driverCommitted: large.driver.committedMs / small.driver.committedMs,
    driverPush: large.driver.pushMs / small.driver.pushMs,
    byHand: large.byHand / small.byHand,
    fullScan: large.fullScan / small.fullScan,
    status: large.status / small.status,
    pushAlone: large.pushAlone / small.pushAlone,
  };
}

export async function runCommitCost(config: Config, dir: string, baseEnv: Record<string, unknown>): Promise<CommitSection> {
  const c = config.commit;
  const quiesce = `${c.quiesceMs / 1000}s`;
  const classParameters = { "push.quiesce": quiesce, "push.maxLatency": "1m" };
  let server: GitServer | undefined;
  let driver: Driver | undefined;
  const volumes: PublishedVolume[] = [];
  let failed = false;

  try {
    log(`section 2, commit cost: trees of ${c.trees.map((n) => n.toLocaleString("en-US")).join(" and ")} files, ${c.repetitions} repetition(s) after one warm-up`);
    const env = { ...baseEnv, date: new Date().toISOString() };
    await fs.mkdir(dir, { recursive: true });
    server = await startGitDaemon();
    driver = await startDriver({ dir, nodeId: "bench-commit", metricsPort: await freePort() });
    const trees: Tree[] = [];
    for (const files of c.trees) trees.push(await setUpTree(server, driver, dir, files, classParameters, volumes));

    // The warm-up: the driver's first push records metadata for the whole tree once, and git settles its index.
    const first = new Map<Tree, number>();
    for (const tree of trees) {
      log(`  warm-up ${tree.files.toLocaleString("en-US")} files: the driver's first change after the stage (its push records metadata for the whole tree)`);
      first.set(tree, (await driverOnce(server, driver, tree, c.quiesceMs, 0, FIRST_PUSH_TIMEOUT_MS)).totalMs);
      await byHandOnce(server, tree, 0);
      log(`  warm-up ${tree.files.toLocaleString("en-US")} files: ${Math.round(first.get(tree)!)} ms`);
    }

    const samples = await sampleTrees(server, driver, trees, c);
    const results = trees.map((tree) => treeResult(tree, samples.get(tree)!, first.get(tree)!));
    const [small, large] = [results[0]!.median, results[1]?.median];
    return {
      config: { quick: config.quick, repetitions: c.repetitions, warmUps: 1, quiesceMs: c.quiesceMs, maxLatency: "1m", filesPerDirectory: FILES_PER_DIR, fileBytes: FILE_BYTES },
      environment: env,
      ways: {
        driver: `a volume armed with push.quiesce ${quiesce}, push.maxLatency 1m; one file appended through the publish target; write returned → the remote ref moved (inotify on the bare repository's refs/heads: no process spawned meanwhile)`,
        byHand: "a plain clone: append; git add <path>; git commit -q -m x; git push -q",
        status: "the same clone, one file appended: git status --porcelain",
        fullScan: "the same clone, that file appended: git add --all; git commit -q -m x; git push -q",
        pushAlone: "the same clone, one file appended and committed untimed: git push -q",
      },
      trees: results,
      ...(large ? { growth: growthOf(small, large) } : {}),
    };
  } catch (err) {
    failed = true;
    throw err;
  } finally {
    await cleanUp([
      ...volumes.map((v): [string, () => Promise<unknown>] => [`unpublish and unstage ${v.volumeId}`, async () => (driver ? unpublishAndUnstage(driver, v) : undefined)]),
      ["stop the driver", async () => driver?.stop()],
      ["stop the git server", async () => server?.stop()],
    ]);
    if (failed && driver) log(`driver logs (tail):\n${driver.logs().split("\n").slice(-40).join("\n")}`);
    // The services' own account (with GIT_CSI_LOG_LEVEL=debug, every git command and its time): what to profile.
    if (driver) await fs.writeFile(path.join(config.out, "commit-driver.log"), driver.logs());
  }
}
