// make bench: the driver's FUSE passthrough against a plain directory and
// against bindfs, in one run on this machine.
//
//   node e2e/dist/src/bench.js [--quick] [--out DIR]
//
// Three paths over the same kind of directory, all on one disk:
//   direct  a plain directory beside the volume's work tree,
//   ours    the published target of a real volume (git daemon, the three
//           services as processes, CSI calls on the socket, FUSE + bind mount),
//   bindfs  Debian's bindfs (libfuse 2.9, like ours, with big_writes, like ours)
//           over a plain directory.
// Every workload runs in its own process (dd, python3, sh): the bench process
// never makes a file call into a FUSE mount. The page cache is dropped before
// each timed step. Results: results.json and results.md in --out.
import { type ChildProcess, spawn } from "node:child_process";
import * as fs from "node:fs/promises";
import * as os from "node:os";
import * as path from "node:path";
import { parseArgs } from "node:util";
import { createVolume, type Driver, mountsUnder, type PublishedVolume, stageAndPublish, startDriver, unpublishAndUnstage } from "./driver";
import { type GitServer, startGitDaemon } from "./git-server";

const REPO_ROOT = path.join(__dirname, "..", "..", "..");
const DEFAULT_OUT = path.join(REPO_ROOT, "bench", "results");
const MiB = 1024 * 1024;
const SMALL_FILE_BYTES = 4096;
/** bindfs adds allow_other itself when run as root; big_writes matches ours (libfuse 2.9 otherwise writes 4 KiB at a time). */
const BINDFS_OPTIONS = ["-o", "big_writes"];

type PathId = "direct" | "ours" | "bindfs";
const PATHS: readonly PathId[] = ["direct", "ours", "bindfs"];
type WorkloadId = "seq_write" | "seq_read" | "small_create" | "small_stat";

interface Config {
  quick: boolean;
  out: string;
  seqMiB: number;
  files: number;
  repetitions: number;
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
  const { values } = parseArgs({ args: argv, options: { quick: { type: "boolean", default: false }, out: { type: "string" } }, strict: true });
  const quick = values.quick === true;
  return {
    quick,
    out: path.resolve(values.out ?? DEFAULT_OUT),
    seqMiB: quick ? 64 : 1024,
    files: quick ? 1000 : 10_000,
    repetitions: quick ? 1 : 3,
  };
}

// ---------------------------------------------------------------------------
// Child processes. The one running now is killed on SIGINT/SIGTERM so that
// the cleanup in main's finally runs promptly.

let current: ChildProcess | undefined;
let interrupted: NodeJS.Signals | undefined;

function exec(file: string, args: readonly string[]): Promise<{ stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(file, [...args], { stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, LC_ALL: "C", LANG: "C" } });
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

async function python(script: string, ...args: string[]): Promise<number> {
  const { stdout } = await exec("python3", ["-c", script, ...args]);
  const value = Number(stdout.trim());
  if (!Number.isFinite(value) || value <= 0) throw new Error(`python3 printed ${JSON.stringify(stdout)}`);
  return value;
}

const smallCreate = (dir: string, files: number) => python(CREATE_PY, dir, String(files), String(SMALL_FILE_BYTES));
const smallStat = (dir: string, files: number) => python(STAT_PY, dir, String(files), String(SMALL_FILE_BYTES));

/** One repetition of all four workloads in one base directory. */
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

function markdown(config: Config, env: Record<string, unknown>, results: WorkloadResult[], bindfsCommand: string): string {
  const lines = [
    `Medians of ${config.repetitions} run${config.repetitions === 1 ? "" : "s"}${config.quick ? " (--quick)" : ""}, page cache dropped before every timed step; higher is better.`,
    `${String(env.cpus)} CPUs, kernel ${String(env.kernel)}, ${String(env.bindfs)}; commit ${String(env.commit).slice(0, 12)}${env.dirty ? " (dirty)" : ""}; ${String(env.date)}.`,
    `ours = the driver's FUSE mount (fuse-native, bind-mounted to the publish target); bindfs = \`${bindfsCommand}\`.`,
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

// ---------------------------------------------------------------------------

async function main(): Promise<void> {
  const config = parseConfig(process.argv.slice(2));
  process.once("SIGINT", onSignal);
  process.once("SIGTERM", onSignal);

  // Up front, so a bad --out fails before the run, and by mkdir(1): Node 20's
  // recursive fs.mkdir spins forever on a path under /proc.
  await exec("mkdir", ["-p", "--", config.out]);
  const dir = await fs.mkdtemp(path.join(os.tmpdir(), "git-csi-bench-"));
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
    log(`bench: ${config.quick ? "quick" : "full"} run, ${size(config.seqMiB)} sequential, ${config.files} small files, ${config.repetitions} repetition(s); scratch ${dir}`);
    const env = { ...(await environment(config)), date: new Date().toISOString() };

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

    const samples = Object.fromEntries(WORKLOADS.map((w) => [w.id, { direct: [], ours: [], bindfs: [] }])) as unknown as Record<WorkloadId, Record<PathId, number[]>>;
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

    const results = summarize(config, samples);
    const bindfsCommand = `bindfs ${BINDFS_OPTIONS.join(" ")} SRC DST`;
    const table = markdown(config, env, results, bindfsCommand);
    const json = {
      config: { quick: config.quick, seqBytes: config.seqMiB * MiB, seqBlockBytes: MiB, files: config.files, fileBytes: SMALL_FILE_BYTES, repetitions: config.repetitions },
      environment: { ...env, backingFileSystem: backingFs },
      paths: {
        direct: { description: "a plain directory beside the volume's work tree, on the same file system" },
        ours: { description: "the published target of a real volume: the mount owner's FUSE passthrough (fuse-native) of the work tree, bind-mounted", fsType: oursMount.fsType, source: oursMount.source },
        bindfs: { description: "bindfs over a plain directory on the same file system", command: bindfsCommand },
      },
      workloads: results,
    };
    await fs.writeFile(path.join(config.out, "results.json"), `${JSON.stringify(json, null, 2)}\n`);
    await fs.writeFile(path.join(config.out, "results.md"), `# git.liken.sh bench\n\n${table}`);
    log(`wrote ${path.join(config.out, "results.json")} and results.md`);
    process.stdout.write(`\n${table}`);
  } catch (err) {
    failed = true;
    throw err;
  } finally {
    const steps: Array<[string, () => Promise<void>]> = [
      ["unmount bindfs", async () => (bindfsMounted ? unmount(bindfsMount) : undefined)],
      ["unpublish and unstage", async () => (driver && published ? unpublishAndUnstage(driver, published) : undefined)],
      ["stop the driver", async () => driver?.stop()],
      ["stop the git server", async () => server?.stop()],
      // Whatever a failed step left mounted goes before the scratch directory does.
      ["unmount leftovers", async () => {
        for (const mountPoint of (await mountsUnder(dir)).reverse()) await exec("umount", ["-l", mountPoint]);
      }],
      ["remove the scratch directory", () => fs.rm(dir, { recursive: true, force: true })],
    ];
    for (const [name, step] of steps) {
      try {
        await step();
      } catch (err) {
        log(`cleanup: ${name} failed: ${err instanceof Error ? err.message : String(err)}`);
      }
    }
    if (failed && driver) log(`driver logs (tail):\n${driver.logs().split("\n").slice(-40).join("\n")}`);
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
