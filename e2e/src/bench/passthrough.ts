// Section 1: the driver's FUSE passthrough against a plain directory and
// against bindfs, three paths over the same kind of directory, on one disk:
//   direct  a plain directory beside the volume's work tree,
//   ours    the published target of a real volume (git daemon, the three
//           services as processes, CSI calls on the socket, FUSE + bind mount),
//   bindfs  Debian's bindfs (libfuse 2.9, with big_writes) over a plain
//           directory.
import * as fs from "node:fs/promises";
import * as path from "node:path";
import { createVolume, type Driver, type PublishedVolume, stageAndPublish, startDriver, unpublishAndUnstage } from "../driver";
import { type GitServer, startGitDaemon } from "../git-server";
import { type Config, MiB } from "./config";
import { cleanUp, exec, log, sh } from "./process";
import { median } from "./stats";
import { runOnce, size, SMALL_FILE_BYTES, SQLITE_BATCH, type WorkloadId, WORKLOADS } from "./workloads";

/** bindfs adds allow_other itself when run as root; big_writes gives it 128 KiB writes (libfuse 2.9 otherwise writes 4 KiB at a time). */
const BINDFS_OPTIONS = ["-o", "big_writes"];

export type PathId = "direct" | "ours" | "bindfs";
const PATHS: readonly PathId[] = ["direct", "ours", "bindfs"];

export interface WorkloadResult {
  id: WorkloadId;
  title: string;
  unit: string;
  samples: Record<PathId, number[]>;
  median: Record<PathId, number>;
  ratio: { oursOverDirect: number; oursOverBindfs: number };
  /** Issue 29's least ours/direct, where it names one. */
  target?: number;
}

/** Section 1 as results.json holds it. */
export interface PassthroughSection {
  config: { quick: boolean; seqBytes: number; seqBlockBytes: number; files: number; fileBytes: number; sqliteRows: number; sqliteBatch: number; repetitions: number };
  environment: Record<string, unknown>;
  paths: { direct: Record<string, unknown>; ours: Record<string, unknown>; bindfs: { description: string; command: string } };
  workloads: WorkloadResult[];
}

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

function summarize(config: Config, samples: Record<WorkloadId, Record<PathId, number[]>>): WorkloadResult[] {
  return WORKLOADS.map(({ id, title, unit, target }) => {
    const m = { direct: median(samples[id].direct), ours: median(samples[id].ours), bindfs: median(samples[id].bindfs) };
    return { id, title: title(config), unit, samples: samples[id], median: m, ratio: { oursOverDirect: m.ours / m.direct, oursOverBindfs: m.ours / m.bindfs }, target };
  });
}

export function num(value: number): string {
  if (value >= 100) return Math.round(value).toLocaleString("en-US");
  return value.toFixed(1);
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

export async function runPassthrough(config: Config, dir: string, baseEnv: Record<string, unknown>): Promise<PassthroughSection> {
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
