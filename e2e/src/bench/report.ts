// The bench's report: the machine it ran on, and results.json and results.md
// in --out, where the sections a run skips are kept as the last run wrote them.
import * as fs from "node:fs/promises";
import * as os from "node:os";
import * as path from "node:path";
import type { CommitSection, TreeResult } from "./commit";
import { type Config, MiB, REPO_ROOT } from "./config";
import { num, type PassthroughSection } from "./passthrough";
import { exec, log } from "./process";
import { type ScaleSection, type Service, SERVICES } from "./scale";

export interface Results {
  passthrough?: PassthroughSection;
  commitCost?: CommitSection;
  scale?: ScaleSection;
}

export async function environment(config: Config): Promise<Record<string, unknown>> {
  const quiet = async (file: string, args: string[]) => (await exec(file, args).catch(() => ({ stdout: "", stderr: "" }))).stdout.trim();
  const bindfsVersion = (await exec("bindfs", ["--version"]).catch(() => ({ stdout: "", stderr: "" }))).stdout.trim();
  return {
    host: os.hostname(),
    kernel: os.release(),
    cpus: os.cpus().length,
    cpuModel: os.cpus()[0]?.model ?? "",
    memoryMiB: Math.round(os.totalmem() / MiB),
    node: process.version,
    python: await quiet("python3", ["--version"]),
    sqlite: await quiet("python3", ["-c", "import sqlite3; print(sqlite3.sqlite_version)"]),
    dd: (await quiet("dd", ["--version"])).split("\n")[0],
    git: await quiet("git", ["--version"]),
    bindfs: bindfsVersion,
    commit: await quiet("git", ["-C", REPO_ROOT, "rev-parse", "HEAD"]),
    dirty: (await quiet("git", ["-C", REPO_ROOT, "status", "--porcelain"])) !== "",
    quick: config.quick,
  };
}

/** The machine line of a section: CPUs, kernel, the tool compared against, the driver's commit, when. */
function machine(env: Record<string, unknown>, tool?: unknown): string {
  return `${String(env.cpus)} CPUs, kernel ${String(env.kernel)}${tool === undefined ? "" : `, ${String(tool)}`}; commit ${String(env.commit).slice(0, 12)}${env.dirty ? " (dirty)" : ""}; ${String(env.date)}.`;
}

/** The sections of an earlier results.json, for a run of fewer sections; older files held section 1 at the top level. */
export async function previousResults(out: string): Promise<Results> {
  try {
    const json = JSON.parse(await fs.readFile(path.join(out, "results.json"), "utf8")) as Results & Partial<PassthroughSection>;
    const passthrough = json.passthrough?.workloads
      ? json.passthrough
      : json.workloads && json.config && json.environment && json.paths
        ? { config: json.config, environment: json.environment, paths: json.paths, workloads: json.workloads }
        : undefined;
    return { passthrough, commitCost: json.commitCost, scale: json.scale };
  } catch {
    /* none, or unreadable: the sections not run are left out */
  }
  return {};
}

/** Writes results.json and results.md, and returns the markdown. */
export async function writeResults(out: string, results: Results): Promise<string> {
  const md = [
    "# git.liken.sh bench",
    "",
    results.passthrough ? passthroughMarkdown(results.passthrough) : "## 1. The FUSE passthrough\n\nNot run: `node e2e/dist/src/bench.js` without --commit-only or --scale-only runs it.\n",
    results.commitCost ? commitMarkdown(results.commitCost) : "## 2. Commit cost\n\nNot run: `node e2e/dist/src/bench.js` without --passthrough-only or --scale-only runs it.\n",
    results.scale ? scaleMarkdown(results.scale) : "## 3. Many volumes on one node\n\nNot run: `node e2e/dist/src/bench.js` without --passthrough-only, --commit-only or --no-scale runs it.\n",
  ].join("\n");
  await fs.writeFile(path.join(out, "results.json"), `${JSON.stringify(results, null, 2)}\n`);
  await fs.writeFile(path.join(out, "results.md"), md);
  log(`wrote ${path.join(out, "results.json")} and results.md`);
  return md;
}

function passthroughMarkdown(section: PassthroughSection): string {
  const { config, environment: env, workloads: results } = section;
  const lines = [
    "## 1. The FUSE passthrough against a plain directory and bindfs",
    "",
    `Medians of ${config.repetitions} run${config.repetitions === 1 ? "" : "s"}${config.quick ? " (--quick)" : ""}, page cache dropped before every timed step; higher is better.`,
    machine(env, env.bindfs),
    `ours = the driver's FUSE mount (our libfuse3 server, bind-mounted to the publish target); bindfs = \`${section.paths.bindfs.command}\`.`,
    "",
    "| workload | unit | direct | ours | bindfs | ours/direct | ours/bindfs | issue 29 asks, ours/direct |",
    "|---|---|--:|--:|--:|--:|--:|---|",
    ...results.map(
      (r) =>
        `| ${r.title} | ${r.unit} | ${num(r.median.direct)} | ${num(r.median.ours)} | ${num(r.median.bindfs)} | ${r.ratio.oursOverDirect.toFixed(2)} | ${r.ratio.oursOverBindfs.toFixed(2)} | ${atLeast(r.ratio.oursOverDirect, r.target)} |`,
    ),
    "",
  ];
  return lines.join("\n");
}

/** A target and whether this run met it: "≥ 0.9: met". */
function atLeast(value: number, target: number | undefined): string {
  return target === undefined ? "–" : `≥ ${target}: ${value >= target ? "met" : "not met"}`;
}

/** Issue 29: one changed file in a 1,000-file tree committed and pushed in at most this share of git by hand. */
const COMMIT_TARGET = 0.5;

function atMost(value: number, target: number): string {
  return `≤ ${target}: ${value <= target ? "met" : "not met"}`;
}

function ms(value: number): string {
  return Number.isFinite(value) ? Math.round(value).toLocaleString("en-US") : "–";
}

function ratio(value: number): string {
  return Number.isFinite(value) ? value.toFixed(2) : "–";
}

function commitMarkdown(section: CommitSection): string {
  const { config, environment: env, trees, growth } = section;
  const [small, large] = [trees[0]!, trees[1]];
  const files = (n: number) => n.toLocaleString("en-US");
  const q = `${config.quiesceMs / 1000} s`;
  // One column a tree, and the growth from the small to the large one when both ran (not with --commit-path).
  const row = (label: string, cells: string[], g = "") => `| ${label} | ${cells.join(" | ")} |${large ? ` ${g} |` : ""}`;
  const timeRow = (label: string, pick: (t: TreeResult) => number, g?: number) =>
    row(
      label,
      trees.map((t) => ms(pick(t))),
      g === undefined ? "" : ratio(g),
    );
  const ratioRow = (label: string, pick: (t: TreeResult["ratio"]) => number) =>
    row(
      label,
      trees.map((t) => ratio(pick(t.ratio))),
    );
  const lines = [
    `## 2. Commit cost: one changed file in ${large ? "a small and a large tree" : "a small tree (--commit-path)"}`,
    "",
    `Medians of ${config.repetitions} runs after one untimed warm-up${config.quick ? " (--quick)" : ""}, page cache warm; milliseconds, lower is better.`,
    `Directories of ${files(config.filesPerDirectory)} files of ${config.fileBytes} bytes: ${trees.map((t) => t.directories).join(" and ")} of them; every run appends a line to one tracked file of the middle directory. The volume's class: push.quiesce ${q}, push.maxLatency ${config.maxLatency}. Pushes go over git:// to a git daemon on this machine: the driver's through its relay with Nagle off (core.gitProxy), by hand over git's own connection.`,
    machine(env, env.git),
    "",
    `| | ${trees.map((t) => `${files(t.files)} files`).join(" | ")} |${large ? ` ${files(large.files)} / ${files(small.files)} |` : ""}`,
    `|---|${trees.map(() => "--:|").join("")}${large ? "--:|" : ""}`,
    timeRow("(a) driver: write → remote ref moved", (t) => t.median.driver.totalMs, growth?.driverTotal),
    timeRow(`(a) minus the ${q} quiesce`, (t) => t.median.driver.minusQuiesceMs, growth?.driverMinusQuiesce),
    timeRow("… write → path pending (watcher, git status of the path)", (t) => t.median.driver.pendingMs, growth?.driverPending),
    timeRow("… write → committed, minus the quiesce (watcher, then update-index beside hash-object and fast-import)", (t) => t.median.driver.committedMs, growth?.driverCommitted),
    timeRow("… committed → pushed (metadata record, owner record, push)", (t) => t.median.driver.pushMs, growth?.driverPush),
    timeRow("(b) by hand: git add PATH; git commit; git push", (t) => t.median.byHand, growth?.byHand),
    timeRow("(c) full scan: git add --all; git commit; git push", (t) => t.median.fullScan, growth?.fullScan),
    timeRow("(c') git status --porcelain alone", (t) => t.median.status, growth?.status),
    timeRow("(d) git push alone, of one commit", (t) => t.median.pushAlone, growth?.pushAlone),
    ratioRow("(a) minus the quiesce / (b)", (r) => r.driverMinusQuiesceOverByHand),
    row(
      "… issue 29 asks, at 1,000 files",
      trees.map((t, i) => (i === 0 ? atMost(t.ratio.driverMinusQuiesceOverByHand, COMMIT_TARGET) : "")),
    ),
    ratioRow("(c) / (b)", (r) => r.fullScanOverByHand),
    ratioRow("(c') / (b)", (r) => r.statusOverByHand),
    "",
    ...(large
      ? [
          `From ${files(small.files)} to ${files(large.files)} files, (a) minus the quiesce grows by ${ms(large.median.driver.minusQuiesceMs - small.median.driver.minusQuiesceMs)} ms and (d), git's push by hand, by ${ms(large.median.pushAlone - small.median.pushAlone)} ms: what grows is the remote's connectivity check of a push, which walks the parent commit's whole tree.`,
          "",
        ]
      : []),
    `The "…" rows come from the driver's own report and log, so they need not add up to the row above them. The driver's first change after the stage (the warm-up, one sample; its push records modes and owners of the whole tree on refs/git-csi/metadata once): ${trees.map((t) => ms(t.driverFirstChangeMs - config.quiesceMs)).join(" ms and ")} ms minus the quiesce.`,
    "",
  ];
  return lines.join("\n");
}

function scaleMarkdown(section: ScaleSection): string {
  const { config, environment: env } = section;
  const mib = (n: number) => n.toFixed(0);
  const sum = (r: Record<Service, number>) => SERVICES.reduce((s, k) => s + r[k], 0);
  const rssRow = (label: string, r: Record<Service, number>) => `| ${label} | ${SERVICES.map((s) => mib(r[s])).join(" | ")} | ${mib(sum(r))} |`;
  const cpu = section.idleCpuPercent;
  const stage = section.stageMs;
  const idle = section.idlePushesPerMinute;
  const w = section.writes;
  return [
    "## 3. Many volumes on one node",
    "",
    `${config.volumes} volumes staged and published one after the other on one standalone node, unarmed: half of them on each of ${config.repositories} repositories, over git:// to a git daemon on this machine. Leases renew every ${config.leaseRenewMs / 1000} s.`,
    machine(env),
    "",
    `| RSS, MiB | ${SERVICES.join(" | ")} | together |`,
    "|---|--:|--:|--:|--:|",
    rssRow("none staged", section.rssNoneMiB),
    rssRow(`${config.volumes} staged, idle`, section.rssStagedMiB),
    rssRow("after one write in each", section.rssAfterWritesMiB),
    "",
    `| idle, ${config.volumes} staged, ${config.idleMs / 1000} s measured | value |`,
    "|---|--:|",
    ...SERVICES.map((s) => `| CPU of ${s} (with its children: the worker's git), % of one core | ${cpu[s].toFixed(2)} |`),
    `| CPU of the three together, % of one core | ${sum(cpu).toFixed(2)} |`,
    `| pushes per minute received by each repository (${config.volumes / config.repositories} volumes each) | ${idle.map((n) => n.toFixed(1)).join(", ")} |`,
    "",
    `| stage + publish of one volume | ms |`,
    "|---|--:|",
    `| median of ${stage.samples.length} | ${stage.median.toFixed(0)} |`,
    `| 90th percentile | ${stage.p90.toFixed(0)} |`,
    `| median of the first 10 / of the last 10 | ${stage.first10Median.toFixed(0)} / ${stage.last10Median.toFixed(0)} |`,
    `| all ${stage.samples.length}, one after the other, s | ${stage.totalS.toFixed(1)} |`,
    "",
    `Then each volume was armed (push.quiesce 1s) and one file written in it: every volume had pushed ${w.allPushedS.toFixed(1)} s after the first write, and the repositories received ${w.pushes.join(" and ")} pushes (renewals included).`,
    "",
  ].join("\n");
}
