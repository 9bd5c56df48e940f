// make bench: three sections, in one run on this machine.
//
//   node e2e/dist/src/bench.js [--quick] [--passthrough-only | --commit-only | --scale-only] [--out DIR]
//
// 1. The driver's FUSE passthrough against a plain directory and against
//    bindfs (skipped with --commit-only or --scale-only).
// 2. Commit cost: one changed file in a small and a large tree, committed and
//    pushed by the driver, by hand with git on that one path, and by a full
//    scan (git add --all); see "Section 2" below (skipped with
//    --passthrough-only or --scale-only).
// 3. Scale: many volumes staged on one node, idle and then written once each
//    (bench-scale.ts; skipped with --passthrough-only or --commit-only).
//
// Section 1 has three paths over the same kind of directory, all on one disk:
//   direct  a plain directory beside the volume's work tree,
//   ours    the published target of a real volume (git daemon, the three
//           services as processes, CSI calls on the socket, FUSE + bind mount),
//   bindfs  Debian's bindfs (libfuse 2.9, with big_writes) over a plain
//           directory.
// Every workload runs in its own process (dd, python3, sh): the bench process
// never makes a file call into a FUSE mount. The page cache is dropped before
// each timed step. Results: results.json and results.md in --out; the sections
// a run skips are kept as the last run wrote them.
import { type ChildProcess, spawn } from "node:child_process";
import * as fs from "node:fs/promises";
import * as os from "node:os";
import * as path from "node:path";
import { parseArgs } from "node:util";
import { setTimeout as sleep } from "node:timers/promises";
import { createVolume, type Driver, freePort, mountsUnder, type PublishedVolume, report, setVolumeClass, stageAndPublish, startDriver, unpublishAndUnstage } from "./driver";
import { gitEnv, type GitServer, startGitDaemon } from "./git-server";
import { runScale, type ScaleConfig, type ScaleSection, scaleMarkdown } from "./bench-scale";

const REPO_ROOT = path.join(__dirname, "..", "..", "..");
const DEFAULT_OUT = path.join(REPO_ROOT, "bench", "results");
const MiB = 1024 * 1024;
const SMALL_FILE_BYTES = 4096;
/** Section 2's trees: directories of this many files of FILE_BYTES each. */
const FILES_PER_DIR = 1000;
const FILE_BYTES = 100;
/** bindfs adds allow_other itself when run as root; big_writes gives it 128 KiB writes (libfuse 2.9 otherwise writes 4 KiB at a time). */
const BINDFS_OPTIONS = ["-o", "big_writes"];

type PathId = "direct" | "ours" | "bindfs";
const PATHS: readonly PathId[] = ["direct", "ours", "bindfs"];
type WorkloadId = "seq_write" | "seq_read" | "small_create" | "small_stat" | "sqlite_wal";
/** SQLite rows per transaction, as an application that batches its writes does. */
const SQLITE_BATCH = 100;

interface Config {
  quick: boolean;
  passthroughOnly: boolean;
  commitOnly: boolean;
  scaleOnly: boolean;
  scale: ScaleConfig;
  out: string;
  seqMiB: number;
  files: number;
  /** Rows the SQLite workload inserts. */
  rows: number;
  repetitions: number;
  commit: CommitConfig;
}

interface CommitConfig {
  /** The two trees, small first; every directory holds FILES_PER_DIR files, so only the number of directories differs. */
  trees: [number, number];
  repetitions: number;
  quiesceMs: number;
}

interface WorkloadResult {
  id: WorkloadId;
  title: string;
  unit: string;
  samples: Record<PathId, number[]>;
  median: Record<PathId, number>;
  ratio: { oursOverDirect: number; oursOverBindfs: number };
}

const log = (text: string) => process.stderr.write(`${text}\n`);

function parseConfig(argv: string[]): Config {
  const { values } = parseArgs({
    args: argv,
    options: {
      quick: { type: "boolean", default: false },
      "passthrough-only": { type: "boolean", default: false },
      "commit-only": { type: "boolean", default: false },
      "scale-only": { type: "boolean", default: false },
      out: { type: "string" },
    },
    strict: true,
  });
  const quick = values.quick === true;
  return {
    quick,
    passthroughOnly: values["passthrough-only"] === true,
    commitOnly: values["commit-only"] === true,
    scaleOnly: values["scale-only"] === true,
    scale: { volumes: quick ? 20 : 200, idleMs: quick ? 20_000 : 60_000 },
    out: path.resolve(values.out ?? DEFAULT_OUT),
    seqMiB: quick ? 64 : 1024,
    files: quick ? 1000 : 10_000,
    rows: quick ? 5000 : 50_000,
    repetitions: quick ? 1 : 3,
    commit: { trees: [FILES_PER_DIR, quick ? 10_000 : 100_000], repetitions: quick ? 3 : 5, quiesceMs: 1000 },
  };
}

// ---------------------------------------------------------------------------
// Child processes. The one running now is killed on SIGINT/SIGTERM so that
// the cleanup in main's finally runs promptly.

let current: ChildProcess | undefined;
let interrupted: NodeJS.Signals | undefined;

function exec(file: string, args: readonly string[], env: NodeJS.ProcessEnv = { ...process.env, LC_ALL: "C", LANG: "C" }): Promise<{ stdout: string; stderr: string }> {
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

const sh = (script: string, ...args: string[]) => exec("sh", ["-c", script, "sh", ...args]);
/** A shell script whose git runs with no system or global config and a fixed identity (git-server's gitEnv). */
const gitSh = (script: string, ...args: string[]) => exec("sh", ["-c", script, "sh", ...args], gitEnv());

function onSignal(signal: NodeJS.Signals): void {
  if (interrupted) return;
  interrupted = signal;
  log(`\n${signal}: stopping the current workload and cleaning up`);
  current?.kill("SIGKILL");
}

// ---------------------------------------------------------------------------
// Workloads, each in its own process, each returning a throughput.

/** Between steps: after a signal no new workload starts (cleanup still runs its commands). */
function checkInterrupted(): void {
  if (interrupted) throw new Error(`interrupted by ${interrupted}`);
}

async function dropCaches(): Promise<void> {
  checkInterrupted();
  await sh("sync; echo 3 > /proc/sys/vm/drop_caches");
}

/** dd's own figure: bytes and seconds from its last line (LC_ALL=C). */
function ddThroughput(stderr: string, expectedBytes: number): number {
  const match = /^(\d+) bytes .* copied, ([0-9.e+-]+) s,/m.exec(stderr);
  if (!match) throw new Error(`unexpected dd output: ${stderr.trim()}`);
  const bytes = Number(match[1]);
  const seconds = Number(match[2]);
  if (bytes !== expectedBytes) throw new Error(`dd moved ${bytes} bytes, expected ${expectedBytes}`);
  return bytes / seconds / 1e6;
}

async function seqWrite(file: string, mib: number): Promise<number> {
  const { stderr } = await exec("dd", ["if=/dev/zero", `of=${file}`, "bs=1M", `count=${mib}`, "conv=fsync"]);
  return ddThroughput(stderr, mib * MiB);
}

async function seqRead(file: string, mib: number): Promise<number> {
  const { stderr } = await exec("dd", [`if=${file}`, "of=/dev/null", "bs=1M"]);
  return ddThroughput(stderr, mib * MiB);
}

// The clock runs in the child, around the loop only: no interpreter start-up.
const CREATE_PY = `
import os, sys, time
d, n, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
os.mkdir(d)
names = [os.path.join(d, "f%05d" % i) for i in range(n)]
buf = b"x" * size
t = time.perf_counter()
for p in names:
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.write(fd, buf)
    os.close(fd)
print(n / (time.perf_counter() - t))
`;

const STAT_PY = `
import os, sys, time
d, n, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
names = [os.path.join(d, "f%05d" % i) for i in range(n)]
t = time.perf_counter()
for p in names:
    if os.stat(p).st_size != size:
        sys.exit("wrong size: " + p)
print(n / (time.perf_counter() - t))
`;

// WAL mode with SQLite's default synchronous=FULL: each commit appends to the
// WAL and fsyncs it, as a database an application keeps on the volume does.
const SQLITE_PY = `
import os, sqlite3, sys, time
db, rows, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
con = sqlite3.connect(db, isolation_level=None)
if con.execute("PRAGMA journal_mode=WAL").fetchone()[0] != "wal":
    sys.exit("WAL mode refused")
con.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, payload TEXT)")
payload = "x" * 100
t = time.perf_counter()
for start in range(0, rows, batch):
    con.execute("BEGIN")
    con.executemany("INSERT INTO t (payload) VALUES (?)", [(payload,)] * batch)
    con.execute("COMMIT")
elapsed = time.perf_counter() - t
if con.execute("SELECT count(*) FROM t").fetchone()[0] != rows:
    sys.exit("rows missing")
con.close()
print(rows / elapsed)
`;

async function python(script: string, ...args: string[]): Promise<number> {
  const { stdout } = await exec("python3", ["-c", script, ...args]);
  const value = Number(stdout.trim());
  if (!Number.isFinite(value) || value <= 0) throw new Error(`python3 printed ${JSON.stringify(stdout)}`);
  return value;
}

const smallCreate = (dir: string, files: number) => python(CREATE_PY, dir, String(files), String(SMALL_FILE_BYTES));
const smallStat = (dir: string, files: number) => python(STAT_PY, dir, String(files), String(SMALL_FILE_BYTES));
const sqliteWal = (db: string, rows: number) => python(SQLITE_PY, db, String(rows), String(SQLITE_BATCH));

/** One repetition of all five workloads in one base directory. */
async function runOnce(base: string, config: Config, rep: number, record: (id: WorkloadId, value: number) => void): Promise<void> {
  const file = path.join(base, `seq-${rep}.bin`);
  await dropCaches();
  record("seq_write", await seqWrite(file, config.seqMiB));
  await dropCaches();
  record("seq_read", await seqRead(file, config.seqMiB));
  await sh('rm -f -- "$1"', file);

  const dir = path.join(base, `small-${rep}`);
  await dropCaches();
  record("small_create", await smallCreate(dir, config.files));
  await dropCaches();
  record("small_stat", await smallStat(dir, config.files));
  await sh('rm -rf -- "$1"', dir);

  const db = path.join(base, `sqlite-${rep}.db`);
  await dropCaches();
  record("sqlite_wal", await sqliteWal(db, config.rows));
  await sh('rm -f -- "$1" "$1-wal" "$1-shm"', db);
}

// ---------------------------------------------------------------------------
// Setup and checks.

interface MountInfo {
  mountPoint: string;
  fsType: string;
  source: string;
}

async function mountAt(dir: string): Promise<MountInfo | undefined> {
  const table = await fs.readFile("/proc/self/mountinfo", "utf8");
  const found = table
    .split("\n")
    .map((line) => line.split(" "))
    .filter((fields) => fields.length > 4 && fields[4] === dir)
    .map((fields) => {
      const separator = fields.indexOf("-");
      return { mountPoint: fields[4]!, fsType: fields[separator + 1] ?? "", source: fields[separator + 2] ?? "" };
    });
  return found[found.length - 1];
}

/** The type of the file system holding dir, from the mount table (stat -f cannot tell ext4 from ext2). */
async function fsTypeOf(dir: string): Promise<string> {
  return (await exec("findmnt", ["-n", "-o", "FSTYPE", "-T", dir])).stdout.trim();
}

async function mountBindfs(source: string, mountPoint: string): Promise<void> {
  await exec("bindfs", [...BINDFS_OPTIONS, source, mountPoint]);
  const mount = await mountAt(mountPoint);
  if (!mount || !mount.fsType.startsWith("fuse")) throw new Error(`bindfs did not mount ${mountPoint}`);
}

async function unmount(dir: string): Promise<void> {
  while (await mountAt(dir)) {
    await exec("umount", [dir]).catch(() => exec("umount", ["-l", dir]));
  }
}

async function environment(config: Config): Promise<Record<string, unknown>> {
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
    dd: (await quiet("dd", ["--version"])).split("\n")[0],
    git: await quiet("git", ["--version"]),
    bindfs: bindfsVersion,
    commit: await quiet("git", ["-C", REPO_ROOT, "rev-parse", "HEAD"]),
    dirty: (await quiet("git", ["-C", REPO_ROOT, "status", "--porcelain"])) !== "",
    quick: config.quick,
  };
}

// ---------------------------------------------------------------------------
// Results.

const WORKLOADS: ReadonlyArray<{ id: WorkloadId; title: (c: Config) => string; unit: string }> = [
  { id: "seq_write", title: (c) => `sequential write, ${size(c.seqMiB)} in 1 MiB blocks, fsync`, unit: "MB/s" },
  { id: "seq_read", title: (c) => `sequential read, ${size(c.seqMiB)} in 1 MiB blocks`, unit: "MB/s" },
  { id: "small_create", title: (c) => `create+write+close, ${c.files.toLocaleString("en-US")} files of 4 KiB`, unit: "files/s" },
  { id: "small_stat", title: (c) => `stat, ${c.files.toLocaleString("en-US")} files`, unit: "stats/s" },
  { id: "sqlite_wal", title: (c) => `SQLite WAL inserts, ${c.rows.toLocaleString("en-US")} rows in transactions of ${SQLITE_BATCH}`, unit: "rows/s" },
];

function size(mib: number): string {
  return mib % 1024 === 0 ? `${mib / 1024} GiB` : `${mib} MiB`;
}

function median(values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  const mid = Math.floor(sorted.length / 2);
  return sorted.length % 2 === 1 ? sorted[mid]! : (sorted[mid - 1]! + sorted[mid]!) / 2;
}

function summarize(config: Config, samples: Record<WorkloadId, Record<PathId, number[]>>): WorkloadResult[] {
  return WORKLOADS.map(({ id, title, unit }) => {
    const m = { direct: median(samples[id].direct), ours: median(samples[id].ours), bindfs: median(samples[id].bindfs) };
    return { id, title: title(config), unit, samples: samples[id], median: m, ratio: { oursOverDirect: m.ours / m.direct, oursOverBindfs: m.ours / m.bindfs } };
  });
}

function num(value: number): string {
  if (value >= 100) return Math.round(value).toLocaleString("en-US");
  return value.toFixed(1);
}

/** Section 1 as results.json holds it. */
interface PassthroughSection {
  config: { quick: boolean; seqBytes: number; seqBlockBytes: number; files: number; fileBytes: number; sqliteRows: number; sqliteBatch: number; repetitions: number };
  environment: Record<string, unknown>;
  paths: { direct: Record<string, unknown>; ours: Record<string, unknown>; bindfs: { description: string; command: string } };
  workloads: WorkloadResult[];
}

function passthroughMarkdown(section: PassthroughSection): string {
  const { config, environment: env, workloads: results } = section;
  const lines = [
    "## 1. The FUSE passthrough against a plain directory and bindfs",
    "",
    `Medians of ${config.repetitions} run${config.repetitions === 1 ? "" : "s"}${config.quick ? " (--quick)" : ""}, page cache dropped before every timed step; higher is better.`,
    `${String(env.cpus)} CPUs, kernel ${String(env.kernel)}, ${String(env.bindfs)}; commit ${String(env.commit).slice(0, 12)}${env.dirty ? " (dirty)" : ""}; ${String(env.date)}.`,
    `ours = the driver's FUSE mount (our libfuse3 server, bind-mounted to the publish target); bindfs = \`${section.paths.bindfs.command}\`.`,
    "",
    "| workload | unit | direct | ours | bindfs | ours/direct | ours/bindfs |",
    "|---|---|--:|--:|--:|--:|--:|",
    ...results.map(
      (r) => `| ${r.title} | ${r.unit} | ${num(r.median.direct)} | ${num(r.median.ours)} | ${num(r.median.bindfs)} | ${r.ratio.oursOverDirect.toFixed(2)} | ${r.ratio.oursOverBindfs.toFixed(2)} |`,
    ),
    "",
  ];
  return lines.join("\n");
}

/** Runs the cleanup steps in order; a failing step is logged and the next one still runs. */
async function cleanUp(steps: Array<[string, () => Promise<unknown>]>): Promise<void> {
  for (const [name, step] of steps) {
    try {
      await step();
    } catch (err) {
      log(`cleanup: ${name} failed: ${err instanceof Error ? err.message : String(err)}`);
    }
  }
}

/** Section 1: the same workloads on direct, ours and bindfs. */
type Samples = Record<WorkloadId, Record<PathId, number[]>>;

/** Every workload on every path, config.repetitions times. */
async function sampleWorkloads(config: Config, bases: Record<PathId, string>): Promise<Samples> {
  const samples = Object.fromEntries(WORKLOADS.map((w) => [w.id, { direct: [], ours: [], bindfs: [] }])) as unknown as Samples;
  for (let rep = 1; rep <= config.repetitions; rep++) {
    // Paths take turns within a repetition, so a drift of the machine touches all three.
    for (const id of PATHS) {
      const values: string[] = [];
      await runOnce(bases[id], config, rep, (workload, value) => {
        samples[workload][id].push(value);
        values.push(`${workload} ${num(value)}`);
      });
      log(`  run ${rep}/${config.repetitions} ${id.padEnd(6)} ${values.join(", ")}`);
    }
  }
  return samples;
}

function passthroughSection(config: Config, environment: Record<string, unknown>, oursMount: { fsType: string; source: string }, samples: Samples): PassthroughSection {
  return {
    config: {
      quick: config.quick,
      seqBytes: config.seqMiB * MiB,
      seqBlockBytes: MiB,
      files: config.files,
      fileBytes: SMALL_FILE_BYTES,
      sqliteRows: config.rows,
      sqliteBatch: SQLITE_BATCH,
      repetitions: config.repetitions,
    },
    environment,
    paths: {
      direct: { description: "a plain directory beside the volume's work tree, on the same file system" },
      ours: {
        description: "the published target of a real volume: the mount owner's FUSE server (native, libfuse3) over the work tree, bind-mounted",
        fsType: oursMount.fsType,
        source: oursMount.source,
      },
      bindfs: { description: "bindfs over a plain directory on the same file system", command: `bindfs ${BINDFS_OPTIONS.join(" ")} SRC DST` },
    },
    workloads: summarize(config, samples),
  };
}

async function runPassthrough(config: Config, dir: string, baseEnv: Record<string, unknown>): Promise<PassthroughSection> {
  const benchRoot = path.join(dir, "bench");
  const directDir = path.join(benchRoot, "direct");
  const bindfsSource = path.join(benchRoot, "bindfs-source");
  const bindfsMount = path.join(benchRoot, "bindfs-mount");
  let server: GitServer | undefined;
  let driver: Driver | undefined;
  let published: PublishedVolume | undefined;
  let bindfsMounted = false;
  let failed = false;

  try {
    log(`section 1, the FUSE passthrough: ${size(config.seqMiB)} sequential, ${config.files} small files, ${config.repetitions} repetition(s)`);
    const env = { ...baseEnv, date: new Date().toISOString() };
    await fs.mkdir(dir, { recursive: true });

    log("starting a git daemon and the driver (three services)");
    server = await startGitDaemon();
    // The bench's files stay out of git, whatever the driver commits.
    await server.createRepo("bench.git", { files: { ".gitignore": "/bench/\n", "README.md": "git.liken.sh bench volume\n" } });
    driver = await startDriver({ dir, nodeId: "bench-node" });
    const volume = await createVolume(driver, "bench", server.url("bench.git"));
    published = await stageAndPublish(driver, volume);
    const tree = path.join(driver.stateDir, "trees", volume.volumeId);
    const oursMount = await mountAt(published.targetPath);
    if (!oursMount || !oursMount.fsType.startsWith("fuse")) throw new Error(`the publish target ${published.targetPath} is not a FUSE mount: ${JSON.stringify(oursMount)}`);

    await fs.mkdir(directDir, { recursive: true });
    await fs.mkdir(bindfsSource, { recursive: true });
    await fs.mkdir(bindfsMount, { recursive: true });
    // The backing directories of all three paths are on one file system.
    const devices = await Promise.all([tree, directDir, bindfsSource].map(async (d) => (await fs.stat(d)).dev));
    if (new Set(devices).size !== 1) throw new Error(`the work tree, the direct directory and bindfs's source are on different devices: ${devices.join(", ")}`);
    const backingFs = await fsTypeOf(directDir);

    log(`mounting bindfs ${BINDFS_OPTIONS.join(" ")} ${bindfsSource} ${bindfsMount}`);
    bindfsMounted = true;
    await mountBindfs(bindfsSource, bindfsMount);

    // The same layout on every path: the workloads run in <path>/bench.
    const bases: Record<PathId, string> = { direct: path.join(directDir, "bench"), ours: path.join(published.targetPath, "bench"), bindfs: path.join(bindfsMount, "bench") };
    await sh('mkdir -- "$1" "$2" "$3"', bases.direct, bases.ours, bases.bindfs);

    const samples = await sampleWorkloads(config, bases);

    return passthroughSection(config, { ...env, backingFileSystem: backingFs }, oursMount, samples);
  } catch (err) {
    failed = true;
    throw err;
  } finally {
    await cleanUp([
      ["unmount bindfs", async () => (bindfsMounted ? unmount(bindfsMount) : undefined)],
      ["unpublish and unstage", async () => (driver && published ? unpublishAndUnstage(driver, published) : undefined)],
      ["stop the driver", async () => driver?.stop()],
      ["stop the git server", async () => server?.stop()],
    ]);
    if (failed && driver) log(`driver logs (tail):\n${driver.logs().split("\n").slice(-40).join("\n")}`);
    // The services' own account (with GIT_CSI_LOG_LEVEL=debug, every git command and its time): what to profile.
    if (driver) await fs.writeFile(path.join(config.out, "commit-driver.log"), driver.logs());
  }
}

// ---------------------------------------------------------------------------
// Section 2: commit cost. Issue 3, item 4: "commit cost grows with the changed
// paths, not with the tree". One changed file, in a tree of FILES_PER_DIR
// files and in one of 10 (--quick) or 100 times that, committed and pushed
// three ways:
//   (a) driver     the application appends to one file through the volume's
//                  mount; the clock runs from the write's return to the moment
//                  the remote ref moves (git rev-parse on the bare repository
//                  every POLL_MS). The class's quiesce is idle waiting, so it is
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

const POLL_MS = 20;
/** The first push after the stage records metadata for the whole tree: over a minute at 100,000 files here. */
const FIRST_PUSH_TIMEOUT_MS = 15 * 60_000;
const CHANGED_BY: Record<"driver" | "byHand" | "fullScan" | "pushAlone", number> = { driver: 100, byHand: 300, fullScan: 500, pushAlone: 700 };

/** A fast-import stream: one commit of `dirs` directories of `per` files of `size` bytes, each file its own blob. */
const TREE_PY = `
import sys
dirs, per, size = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
out = sys.stdout.buffer
msg = b"a bench tree of %d files\\n" % (dirs * per)
out.write(b"commit refs/heads/main\\ncommitter git.liken.sh bench <bench@git.liken.sh> 1700000000 +0000\\ndata %d\\n%s\\n" % (len(msg), msg))
for d in range(dirs):
    parts = []
    for f in range(per):
        name = b"d%03d/f%04d" % (d, f)
        body = (name + b" " + b"x" * size)[: size - 1] + b"\\n"
        parts.append(b"M 100644 inline %s\\ndata %d\\n%s\\n" % (name, len(body), body))
    out.write(b"".join(parts))
out.write(b"done\\n")
`;

interface Tree {
  files: number;
  directories: number;
  /** The directory every change goes to: the middle one. */
  changedDir: string;
  driverRepo: string;
  handRepo: string;
  clone: string;
  volume: PublishedVolume;
}

interface DriverSample {
  /** Write returned → remote ref moved. */
  totalMs: number;
  minusQuiesceMs: number;
  /** Write → the Pending event: the watcher, then git status of the path. */
  pendingMs: number;
  /** Write → the commit's log line, minus the quiesce: the watcher, then staging the path and committing. */
  committedMs: number;
  /** The commit's log line → the Pushed event: the metadata record, the owner record, the push. */
  pushMs: number;
}

const DRIVER_PARTS = ["totalMs", "minusQuiesceMs", "pendingMs", "committedMs", "pushMs"] as const;

interface TreeResult {
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

interface CommitSection {
  config: { quick: boolean; repetitions: number; warmUps: number; quiesceMs: number; maxLatency: string; pollMs: number; filesPerDirectory: number; fileBytes: number };
  environment: Record<string, unknown>;
  ways: Record<string, string>;
  trees: TreeResult[];
  /** Large tree over small tree, median over median. */
  growth: { driverTotal: number; driverMinusQuiesce: number; driverPending: number; driverCommitted: number; driverPush: number; byHand: number; fullScan: number; status: number; pushAlone: number };
}

/** Polls until probe gives a value; stops at a signal. */
async function until<T>(what: string, probe: () => Promise<T | undefined | false>, timeoutMs = 60_000, everyMs = 50): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    checkInterrupted();
    const value = await probe();
    if (value !== undefined && value !== false) return value;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await sleep(everyMs);
  }
}

const git = async (...args: string[]) => (await exec("git", args, gitEnv())).stdout.trim();
const remoteHead = (server: GitServer, repo: string) => git(`--git-dir=${server.repoPath(repo)}`, "rev-parse", "--verify", "--quiet", "refs/heads/main");

/** The paths the branch's last commit changed, and checks that it sits right on `parent`. */
async function lastCommitPaths(server: GitServer, repo: string, parent: string): Promise<string[]> {
  const gitDir = `--git-dir=${server.repoPath(repo)}`;
  const actual = await git(gitDir, "rev-parse", "refs/heads/main^");
  if (actual !== parent) throw new Error(`${repo}: the new commit's parent is ${actual}, not ${parent}: more than one commit was pushed`);
  return (await git(gitDir, "diff-tree", "--no-commit-id", "--name-only", "-r", "refs/heads/main^", "refs/heads/main")).split("\n").filter((p) => p !== "");
}

function changedFile(tree: Tree, way: keyof typeof CHANGED_BY, rep: number): string {
  return `${tree.changedDir}/f${String(CHANGED_BY[way] + rep).padStart(4, "0")}`;
}

async function setUpTree(server: GitServer, driver: Driver, dir: string, files: number, classParameters: Record<string, string>, volumes: PublishedVolume[]): Promise<Tree> {
  const directories = files / FILES_PER_DIR;
  const driverRepo = `tree-${files}.git`;
  const handRepo = `tree-${files}-by-hand.git`;
  const started = Date.now();
  await gitSh(
    'git init -q --bare --initial-branch=main "$1" && python3 -c "$2" "$3" "$4" "$5" | git --git-dir="$1" fast-import --quiet --done && git clone -q --bare "$1" "$6"',
    server.repoPath(driverRepo),
    TREE_PY,
    String(directories),
    String(FILES_PER_DIR),
    String(FILE_BYTES),
    server.repoPath(handRepo),
  );
  const count = Number((await gitSh('git --git-dir="$1" ls-tree -r --name-only refs/heads/main | wc -l', server.repoPath(driverRepo))).stdout.trim());
  if (count !== files) throw new Error(`the tree of ${driverRepo} holds ${count} files, not ${files}`);

  const clone = path.join(dir, "clones", `tree-${files}`);
  await gitSh('mkdir -p "$(dirname "$2")" && git clone -q "$1" "$2" && cd "$2" && git status --porcelain', server.url(handRepo), clone);
  log(`  tree of ${files.toLocaleString("en-US")} files: repositories and a plain clone in ${((Date.now() - started) / 1000).toFixed(1)} s`);

  const stageStarted = Date.now();
  const created = await createVolume(driver, `tree-${files}`, server.url(driverRepo));
  const volume = await stageAndPublish(driver, created, undefined, `tree-${files}`);
  volumes.push(volume);
  await setVolumeClass(driver, volume.volumeId, classParameters, "bench");
  await until("the volume armed", async () => (await report(driver, volume.volumeId)).armed);
  log(`  tree of ${files.toLocaleString("en-US")} files: the volume staged, published and armed in ${((Date.now() - stageStarted) / 1000).toFixed(1)} s`);
  return { files, directories, changedDir: `d${String(Math.floor(directories / 2)).padStart(3, "0")}`, driverRepo, handRepo, clone, volume };
}

/** The driver's account of one change, from its report and log: when it saw the path pending, committed and pushed. */
async function driverTimeline(driver: Driver, volumeId: string, since: number): Promise<{ pending: number; committed: number; pushed: number }> {
  const r = await until("the push in the volume's report", async () => {
    const rep = await report(driver, volumeId);
    return rep.pendingPaths.length === 0 && rep.unpushedCommits === 0 && rep.recentEvents.some((e) => e.reason === "GitVolumePushed" && e.timeUnixMs >= since) && rep;
  });
  const at = (reason: string) => r.recentEvents.find((e) => e.reason === reason && e.timeUnixMs >= since)?.timeUnixMs ?? Number.NaN;
  let committed = Number.NaN;
  for (const line of driver.logs().split("\n")) {
    if (!line.includes('"committed"') || !line.includes(volumeId)) continue;
    try {
      const entry = JSON.parse(line) as { message?: string; volume?: string; timestamp?: string };
      const time = Date.parse(entry.timestamp ?? "");
      if (entry.message === "committed" && entry.volume === volumeId && time >= since) {
        committed = time;
        break;
      }
    } catch {
      /* not a log line */
    }
  }
  return { pending: at("GitVolumePending"), committed, pushed: at("GitVolumePushed") };
}

/** (a) One file appended through the volume's mount, until the remote ref moves. */
async function driverOnce(server: GitServer, driver: Driver, tree: Tree, quiesceMs: number, rep: number, timeoutMs = 60_000): Promise<DriverSample> {
  const volumeId = tree.volume.volumeId;
  await until("the volume idle", async () => {
    const r = await report(driver, volumeId);
    return r.pendingPaths.length === 0 && r.unpushedCommits === 0;
  });
  const file = changedFile(tree, "driver", rep);
  const before = await remoteHead(server, tree.driverRepo);
  checkInterrupted();
  // date(1) right after the append returned: the clock starts when the write has landed.
  const { stdout } = await sh('printf "%s\\n" "$2" >> "$1" && date +%s%N', path.join(tree.volume.targetPath, file), `driver run ${rep}`);
  const wrote = Number(stdout.trim()) / 1e6;
  // The ref moved between the last poll that saw it unchanged and the first that saw it moved: the middle, ±POLL_MS/2.
  let unchangedAt = wrote;
  let movedAt: number;
  for (const deadline = Date.now() + timeoutMs + quiesceMs; ;) {
    checkInterrupted();
    const pollAt = Date.now();
    if ((await remoteHead(server, tree.driverRepo)) !== before) {
      movedAt = (unchangedAt + pollAt) / 2;
      break;
    }
    unchangedAt = pollAt;
    if (pollAt > deadline) throw new Error(`the driver did not push ${file} within ${Math.round(pollAt - wrote)} ms`);
    await sleep(Math.max(0, POLL_MS - (Date.now() - pollAt)));
  }
  const timeline = await driverTimeline(driver, volumeId, Math.floor(wrote));
  const paths = await lastCommitPaths(server, tree.driverRepo, before);
  if (paths.join() !== file) throw new Error(`the driver's commit changed ${paths.join(", ")}, not ${file}`);
  const totalMs = movedAt - wrote;
  return {
    totalMs,
    minusQuiesceMs: totalMs - quiesceMs,
    pendingMs: timeline.pending - wrote,
    committedMs: timeline.committed - wrote - quiesceMs,
    pushMs: timeline.pushed - timeline.committed,
  };
}

/** Milliseconds a shell script takes, its git isolated; returns its output too. */
async function timed(script: string, ...args: string[]): Promise<{ ms: number; stdout: string }> {
  checkInterrupted();
  const t = performance.now();
  const { stdout } = await gitSh(script, ...args);
  return { ms: performance.now() - t, stdout };
}

/** (b), (c'), (c) and (d), in that order, in the plain clone. */
async function byHandOnce(server: GitServer, tree: Tree, rep: number): Promise<{ byHand: number; status: number; fullScan: number; pushAlone: number }> {
  const handFile = changedFile(tree, "byHand", rep);
  let before = await remoteHead(server, tree.handRepo);
  const byHand = await timed('cd "$1" && printf "%s\\n" "$3" >> "$2" && git add -- "$2" && git commit -q -m "$3" && git push -q', tree.clone, handFile, `by hand, run ${rep}`);
  const handPaths = await lastCommitPaths(server, tree.handRepo, before);
  if (handPaths.join() !== handFile) throw new Error(`the by-hand commit changed ${handPaths.join(", ")}, not ${handFile}`);

  // c' times the status of the tree c then commits: one appended file.
  const scanFile = changedFile(tree, "fullScan", rep);
  await sh('printf "%s\\n" "$3" >> "$1/$2"', tree.clone, scanFile, `full scan, run ${rep}`);
  const status = await timed('cd "$1" && git status --porcelain', tree.clone);
  if (status.stdout.trim() !== `M ${scanFile}`) throw new Error(`git status --porcelain printed ${JSON.stringify(status.stdout)}, expected one modified ${scanFile}`);
  before = await remoteHead(server, tree.handRepo);
  const fullScan = await timed('cd "$1" && git add --all && git commit -q -m "$2" && git push -q', tree.clone, `full scan, run ${rep}`);
  const scanPaths = await lastCommitPaths(server, tree.handRepo, before);
  if (scanPaths.join() !== scanFile) throw new Error(`the full-scan commit changed ${scanPaths.join(", ")}, not ${scanFile}`);

  const pushFile = changedFile(tree, "pushAlone", rep);
  await gitSh('cd "$1" && printf "%s\\n" "$3" >> "$2" && git add -- "$2" && git commit -q -m "$3"', tree.clone, pushFile, `push alone, run ${rep}`);
  before = await remoteHead(server, tree.handRepo);
  const pushAlone = await timed('cd "$1" && git push -q', tree.clone);
  const pushPaths = await lastCommitPaths(server, tree.handRepo, before);
  if (pushPaths.join() !== pushFile) throw new Error(`the pushed commit changed ${pushPaths.join(", ")}, not ${pushFile}`);
  return { byHand: byHand.ms, status: status.ms, fullScan: fullScan.ms, pushAlone: pushAlone.ms };
}

/** Median of the finite values (a part the driver's report lacked is NaN). */
function medianOf(values: number[]): number {
  const finite = values.filter((v) => Number.isFinite(v));
  return finite.length === 0 ? Number.NaN : median(finite);
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
function growthOf(small: TreeResult["median"], large: TreeResult["median"]): CommitSection["growth"] {
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

async function runCommitCost(config: Config, dir: string, baseEnv: Record<string, unknown>): Promise<CommitSection> {
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
    const [small, large] = [results[0]!.median, results[1]!.median];
    return {
      config: { quick: config.quick, repetitions: c.repetitions, warmUps: 1, quiesceMs: c.quiesceMs, maxLatency: "1m", pollMs: POLL_MS, filesPerDirectory: FILES_PER_DIR, fileBytes: FILE_BYTES },
      environment: env,
      ways: {
        driver: `a volume armed with push.quiesce ${quiesce}, push.maxLatency 1m; one file appended through the publish target; write returned → the remote ref moved (git rev-parse every ${POLL_MS} ms, the middle of the last two polls)`,
        byHand: "a plain clone: append; git add <path>; git commit -q -m x; git push -q",
        status: "the same clone, one file appended: git status --porcelain",
        fullScan: "the same clone, that file appended: git add --all; git commit -q -m x; git push -q",
        pushAlone: "the same clone, one file appended and committed untimed: git push -q",
      },
      trees: results,
      growth: growthOf(small, large),
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

function ms(value: number): string {
  return Number.isFinite(value) ? Math.round(value).toLocaleString("en-US") : "–";
}

function ratio(value: number): string {
  return Number.isFinite(value) ? value.toFixed(2) : "–";
}

function commitMarkdown(section: CommitSection): string {
  const { config, environment: env, trees, growth } = section;
  const [small, large] = [trees[0]!, trees[1]!];
  const files = (n: number) => n.toLocaleString("en-US");
  const q = `${config.quiesceMs / 1000} s`;
  const row = (label: string, a: string, b: string, g: string) => `| ${label} | ${a} | ${b} | ${g} |`;
  const timeRow = (label: string, pick: (t: TreeResult) => number, g: number) => row(label, ms(pick(small)), ms(pick(large)), ratio(g));
  const lines = [
    "## 2. Commit cost: one changed file in a small and a large tree",
    "",
    `Medians of ${config.repetitions} runs after one untimed warm-up${config.quick ? " (--quick)" : ""}, page cache warm; milliseconds, lower is better.`,
    `Directories of ${files(config.filesPerDirectory)} files of ${config.fileBytes} bytes: ${small.directories} and ${large.directories} of them; every run appends a line to one tracked file of the middle directory. The volume's class: push.quiesce ${q}, push.maxLatency ${config.maxLatency}. Pushes go over git:// to a git daemon on this machine: the driver's through its relay with Nagle off (core.gitProxy), by hand over git's own connection.`,
    `${String(env.cpus)} CPUs, kernel ${String(env.kernel)}, ${String(env.git)}; commit ${String(env.commit).slice(0, 12)}${env.dirty ? " (dirty)" : ""}; ${String(env.date)}.`,
    "",
    `| | ${files(small.files)} files | ${files(large.files)} files | ${files(large.files)} / ${files(small.files)} |`,
    "|---|--:|--:|--:|",
    timeRow("(a) driver: write → remote ref moved", (t) => t.median.driver.totalMs, growth.driverTotal),
    timeRow(`(a) minus the ${q} quiesce`, (t) => t.median.driver.minusQuiesceMs, growth.driverMinusQuiesce),
    timeRow("… write → path pending (watcher, git status of the path)", (t) => t.median.driver.pendingMs, growth.driverPending),
    timeRow("… write → committed, minus the quiesce (watcher, then update-index beside hash-object and fast-import)", (t) => t.median.driver.committedMs, growth.driverCommitted),
    timeRow("… committed → pushed (metadata record, owner record, push)", (t) => t.median.driver.pushMs, growth.driverPush),
    timeRow("(b) by hand: git add PATH; git commit; git push", (t) => t.median.byHand, growth.byHand),
    timeRow("(c) full scan: git add --all; git commit; git push", (t) => t.median.fullScan, growth.fullScan),
    timeRow("(c') git status --porcelain alone", (t) => t.median.status, growth.status),
    timeRow("(d) git push alone, of one commit", (t) => t.median.pushAlone, growth.pushAlone),
    row("(a) minus the quiesce / (b)", ratio(small.ratio.driverMinusQuiesceOverByHand), ratio(large.ratio.driverMinusQuiesceOverByHand), ""),
    row("(c) / (b)", ratio(small.ratio.fullScanOverByHand), ratio(large.ratio.fullScanOverByHand), ""),
    row("(c') / (b)", ratio(small.ratio.statusOverByHand), ratio(large.ratio.statusOverByHand), ""),
    "",
    `From ${files(small.files)} to ${files(large.files)} files, (a) minus the quiesce grows by ${ms(large.median.driver.minusQuiesceMs - small.median.driver.minusQuiesceMs)} ms and (d), git's push by hand, by ${ms(large.median.pushAlone - small.median.pushAlone)} ms: what grows is the remote's connectivity check of a push, which walks the parent commit's whole tree.`,
    "",
    `The "…" rows come from the driver's own report and log, so they need not add up to the row above them. The driver's first change after the stage (the warm-up, one sample; its push records modes and owners of the whole tree on refs/git-csi/metadata once): ${ms(small.driverFirstChangeMs - config.quiesceMs)} ms and ${ms(large.driverFirstChangeMs - config.quiesceMs)} ms minus the quiesce.`,
    "",
  ];
  return lines.join("\n");
}

// ---------------------------------------------------------------------------

interface Results {
  passthrough?: PassthroughSection;
  commitCost?: CommitSection;
  scale?: ScaleSection;
}

/** The sections of an earlier results.json, for a run of fewer sections; older files held section 1 at the top level. */
async function previousResults(out: string): Promise<Results> {
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

async function main(): Promise<void> {
  const config = parseConfig(process.argv.slice(2));
  process.once("SIGINT", onSignal);
  process.once("SIGTERM", onSignal);

  // Up front, so a bad --out fails before the run, and by mkdir(1): Node 20's
  // recursive fs.mkdir spins forever on a path under /proc.
  await exec("mkdir", ["-p", "--", config.out]);
  const dir = await fs.mkdtemp(path.join(os.tmpdir(), "git-csi-bench-"));

  try {
    log(
      `bench: ${config.quick ? "quick" : "full"} run${config.passthroughOnly ? ", passthrough only" : ""}${config.commitOnly ? ", commit cost only" : ""}${config.scaleOnly ? ", scale only" : ""}; scratch ${dir}`,
    );
    const env = await environment(config);
    const results = await previousResults(config.out);
    const kept = (name: keyof Results) => results[name] && log(`keeping section ${name} from ${String(results[name].environment.date)} in ${path.join(config.out, "results.json")}`);
    if (config.commitOnly || config.scaleOnly) kept("passthrough");
    else results.passthrough = await runPassthrough(config, path.join(dir, "passthrough"), env);
    if (config.passthroughOnly || config.scaleOnly) kept("commitCost");
    else results.commitCost = await runCommitCost(config, path.join(dir, "commit"), env);
    if (config.passthroughOnly || config.commitOnly) kept("scale");
    else results.scale = await runScale(config.scale, path.join(dir, "scale"), env, log);

    const md = [
      "# git.liken.sh bench",
      "",
      results.passthrough ? passthroughMarkdown(results.passthrough) : "## 1. The FUSE passthrough\n\nNot run: `node e2e/dist/src/bench.js` without --commit-only or --scale-only runs it.\n",
      results.commitCost ? commitMarkdown(results.commitCost) : "## 2. Commit cost\n\nNot run: `node e2e/dist/src/bench.js` without --passthrough-only or --scale-only runs it.\n",
      results.scale ? scaleMarkdown(results.scale) : "## 3. Many volumes on one node\n\nNot run: `node e2e/dist/src/bench.js` without --passthrough-only or --commit-only runs it.\n",
    ].join("\n");
    await fs.writeFile(path.join(config.out, "results.json"), `${JSON.stringify(results, null, 2)}\n`);
    await fs.writeFile(path.join(config.out, "results.md"), md);
    log(`wrote ${path.join(config.out, "results.json")} and results.md`);
    process.stdout.write(`\n${md}`);
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
    if (interrupted) process.exit(130);
  },
  (err: unknown) => {
    process.stderr.write(`bench failed: ${err instanceof Error ? err.stack : String(err)}\n`);
    process.exit(interrupted ? 130 : 1);
  },
);
