// Section 3: many volumes on one node.
//
// N volumes (200; 20 with --quick) are staged and published on one standalone
// node, unarmed: half of them on one repository, the other half on another,
// both served by one git daemon. Measured:
//   - the RSS of the three services, with none staged and with all staged;
//   - their CPU over a minute of idling (every volume renews its lease);
//   - the stage time of a volume (stage + publish, one after the other);
//   - the pushes each repository receives in that minute, counted by its
//     pre-receive hook, as a forge would count them.
// Then every volume is armed and one file is written in each: the time until
// every remote ref moved, and the pushes received meanwhile.
import * as fs from "node:fs/promises";
import * as path from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { createVolume, type Driver, freePort, type PublishedVolume, report, setVolumeClass, stageAndPublish, startDriver, unpublishAndUnstage } from "../driver";
import { type GitServer, logPushes, startGitDaemon } from "../git-server";
import { log } from "./process";
import { median, percentile } from "./stats";

export const SERVICES = ["csi-frontend", "mount-owner", "git-worker"] as const;
export type Service = (typeof SERVICES)[number];
/** Before the idle minute: the last stage's work and first renewals settle. */
const SETTLE_MS = 25_000;
const REPOS = ["half-a.git", "half-b.git"];

export interface ScaleConfig {
  volumes: number;
  idleMs: number;
}

export interface ScaleSection {
  config: ScaleConfig & { repositories: number; leaseRenewMs: number };
  environment: Record<string, unknown>;
  /** MiB per service. */
  rssNoneMiB: Record<Service, number>;
  rssStagedMiB: Record<Service, number>;
  rssAfterWritesMiB: Record<Service, number>;
  /** Percent of one core over the idle minute, children (git) included. */
  idleCpuPercent: Record<Service, number>;
  stageMs: { samples: number[]; median: number; p90: number; first10Median: number; last10Median: number; totalS: number };
  /** Per repository, in the order of REPOS. */
  idlePushesPerMinute: number[];
  writes: { allPushedS: number; pushes: number[] };
}

async function rssMiB(pid: number): Promise<number> {
  const status = await fs.readFile(`/proc/${pid}/status`, "utf8");
  const kb = Number(/^VmRSS:\s+(\d+) kB$/m.exec(status)?.[1]);
  if (!Number.isFinite(kb)) throw new Error(`no VmRSS for pid ${pid}`);
  return kb / 1024;
}

/** utime + stime of the process and of its children it waited for (the git worker's git), in clock ticks. */
async function cpuTicks(pid: number): Promise<number> {
  const stat = await fs.readFile(`/proc/${pid}/stat`, "utf8");
  const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  // After the command: state is field 3, utime 14, stime 15, cutime 16, cstime 17.
  return [11, 12, 13, 14].reduce((sum, i) => sum + Number(fields[i]), 0);
}

async function perService<T>(driver: Driver, measure: (pid: number) => Promise<T>): Promise<Record<Service, T>> {
  const out = {} as Record<Service, T>;
  for (const service of SERVICES) out[service] = await measure(await driver.pid(service));
  return out;
}

async function allPushes(readers: Map<string, () => Promise<string[][]>>): Promise<Map<string, number>> {
  return new Map(await Promise.all([...readers].map(async ([repo, read]) => [repo, (await read()).length] as const)));
}

function deltas(before: Map<string, number>, after: Map<string, number>): number[] {
  return REPOS.map((repo) => after.get(repo)! - before.get(repo)!);
}

/** Stages and publishes `count` volumes, alternating the repositories; each one's time. */
async function stageAll(driver: Driver, server: GitServer, count: number, volumes: PublishedVolume[]): Promise<{ samples: number[]; totalS: number }> {
  const samples: number[] = [];
  const started = Date.now();
  for (let i = 0; i < count; i++) {
    const t = performance.now();
    const created = await createVolume(driver, `scale-${i}`, server.url(REPOS[i % REPOS.length]!));
    volumes.push(await stageAndPublish(driver, created, undefined, `pod-${i}`));
    samples.push(performance.now() - t);
    if ((i + 1) % 50 === 0) log(`  staged ${i + 1} volumes, the last in ${Math.round(samples.at(-1)!)} ms`);
  }
  return { samples, totalS: (Date.now() - started) / 1000 };
}

/** The services' CPU and the remotes' pushes over idleMs, after the node settled. */
async function measureIdle(driver: Driver, readers: Map<string, () => Promise<string[][]>>, idleMs: number): Promise<{ cpuPercent: Record<Service, number>; pushesPerMinute: number[] }> {
  log(`  idle: ${SETTLE_MS / 1000} s to settle, then ${idleMs / 1000} s measured`);
  await sleep(SETTLE_MS);
  const cpuBefore = await perService(driver, cpuTicks);
  const pushesBefore = await allPushes(readers);
  const started = performance.now();
  await sleep(idleMs);
  const cpuAfter = await perService(driver, cpuTicks);
  const pushesAfter = await allPushes(readers);
  const measuredS = (performance.now() - started) / 1000;
  const ticksPerSecond = 100;
  const cpuPercent = Object.fromEntries(SERVICES.map((s) => [s, ((cpuAfter[s] - cpuBefore[s]) / ticksPerSecond / measuredS) * 100])) as Record<Service, number>;
  return { cpuPercent, pushesPerMinute: deltas(pushesBefore, pushesAfter).map((n) => (n * 60) / measuredS) };
}

/** Arms every volume and writes one file in each; how long until all were pushed, and the pushes each remote received. */
async function writeOneEach(driver: Driver, server: GitServer, volumes: PublishedVolume[], readers: Map<string, () => Promise<string[][]>>): Promise<ScaleSection["writes"]> {
  log("  arming every volume and writing one file in each");
  const before = await allPushes(readers);
  const started = performance.now();
  for (const v of volumes) {
    await setVolumeClass(driver, v.volumeId, { "push.quiesce": "1s", "push.maxLatency": "1m" }, "bench");
    // A child process writes, as an application would: the bench itself makes no file call into a FUSE mount.
    await driver.sh(`printf '%s\\n' '${v.volumeId}' > '${path.join(v.targetPath, `${v.volumeId}.txt`)}'`);
  }
  for (const v of volumes) {
    for (let r = await report(driver, v.volumeId); r.pendingPaths.length > 0 || r.unpushedCommits > 0 || !r.armed; r = await report(driver, v.volumeId)) {
      if (performance.now() - started > 15 * 60_000) throw new Error(`volume ${v.volumeId} did not push its file within 15 minutes`);
      await sleep(200);
    }
  }
  const allPushedS = (performance.now() - started) / 1000;
  for (const [i, v] of volumes.entries()) {
    const repo = REPOS[i % REPOS.length]!;
    await server.git(repo, "cat-file", "-e", `refs/heads/main:${v.volumeId}.txt`).catch(() => {
      throw new Error(`${repo} lacks the file written in ${v.volumeId}`);
    });
  }
  return { allPushedS, pushes: deltas(before, await allPushes(readers)) };
}

export async function runScale(config: ScaleConfig, dir: string, environment: Record<string, unknown>): Promise<ScaleSection> {
  const repos = REPOS;
  let server: GitServer | undefined;
  let driver: Driver | undefined;
  const volumes: PublishedVolume[] = [];
  try {
    log(`section 3, scale: ${config.volumes} volumes on one node, half of them on each of ${REPOS.length} repositories`);
    await fs.mkdir(dir, { recursive: true });
    server = await startGitDaemon();
    const readers = new Map<string, () => Promise<string[][]>>();
    for (const repo of repos) {
      await server.createRepo(repo, { files: { "README.md": `${repo}\n` } });
      readers.set(repo, await logPushes(server, repo));
    }
    driver = await startDriver({ dir, nodeId: "bench-scale", metricsPort: await freePort() });
    await sleep(2000);
    const rssNoneMiB = await perService(driver, rssMiB);

    const staged = await stageAll(driver, server, config.volumes, volumes);
    const idle = await measureIdle(driver, readers, config.idleMs);
    const rssStagedMiB = await perService(driver, rssMiB);
    const writes = await writeOneEach(driver, server, volumes, readers);
    const rssAfterWritesMiB = await perService(driver, rssMiB);

    return {
      config: { ...config, repositories: REPOS.length, leaseRenewMs: 20_000 },
      environment: { ...environment, date: new Date().toISOString() },
      rssNoneMiB,
      rssStagedMiB,
      rssAfterWritesMiB,
      idleCpuPercent: idle.cpuPercent,
      stageMs: {
        samples: staged.samples,
        median: median(staged.samples),
        p90: percentile(staged.samples, 90),
        first10Median: median(staged.samples.slice(0, 10)),
        last10Median: median(staged.samples.slice(-10)),
        totalS: staged.totalS,
      },
      idlePushesPerMinute: idle.pushesPerMinute,
      writes,
    };
  } finally {
    log("  cleaning up: unstaging every volume");
    for (const v of volumes) await (driver ? unpublishAndUnstage(driver, v) : Promise.resolve()).catch((err: Error) => log(`  unstage ${v.volumeId}: ${err.message}`));
    await driver?.stop();
    await server?.stop();
  }
}
