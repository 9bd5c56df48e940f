// Issue 11's fault matrix: the real services, a real git daemon and an
// application that writes all along, through SIGKILLs of each service at
// seeded random moments, a remote that is away for minutes, a full state
// disk, and a forge hook that rejects pushes. Each case ends by comparing the
// remote with the application's log of acknowledged writes: none lost, the
// exact content, no side branch where no file changed on both sides.
import assert from "node:assert/strict";
import { type ChildProcess, spawn } from "node:child_process";
import * as fs from "node:fs/promises";
import * as os from "node:os";
import * as path from "node:path";
import { after, describe, test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { blobId, readAcked } from "../src/app-writer";
import {
  createVolume,
  type Driver,
  type DriverOptions,
  freePort,
  type PublishedVolume,
  reasons,
  report,
  run,
  setVolumeClass,
  stageAndPublish,
  startDriver,
  unpublishAndUnstage,
  volumeLogs,
  waitFor,
} from "../src/driver";
import { type GitDaemon, refusePushes, startGitDaemon } from "../src/git-server";

const WRITER = path.join(__dirname, "..", "src", "app-writer.js");
const SERVICES = ["csi-frontend", "mount-owner", "git-worker"] as const;
type Service = (typeof SERVICES)[number];
const MOMENTS = ["write", "commit", "push", "rebase", "metadata"] as const;
type Moment = (typeof MOMENTS)[number];
const KILLS = 15;
const REMOTE_AWAY_MS = 120_000;
/** Upstream moves often, though not so often that three rebases in a row lose the race (spec 004's side branch). */
const UPSTREAM_EVERY_MS = 30_000;
const POLICY = { "push.quiesce": "1s", "push.maxLatency": "5s", "commit.maxFileSize": "64Mi" };
const T = 120_000;

const seed = Number(process.env.FAULT_SEED ?? Math.floor(Math.random() * 2 ** 31));
console.log(`fault matrix: seed ${seed} (FAULT_SEED=${seed} replays this schedule)`);

/** mulberry32: a small seeded generator, so a failing schedule can be replayed. */
function seeded(state: number): () => number {
  return () => {
    state = (state + 0x6d2b79f5) | 0;
    let t = Math.imul(state ^ (state >>> 15), 1 | state);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
const random = seeded(seed);
const pick = <T>(items: readonly T[]): T => items[Math.floor(random() * items.length)]!;

/** The application, writing into the pod's target path every interval, and its log of acknowledged writes. */
interface Application {
  log: string;
  stop(): Promise<{ steps: number; refused: number }>;
}

async function startApplication(dir: string, targetPath: string): Promise<Application> {
  const log = path.join(dir, `acked-${Date.now()}.jsonl`);
  await fs.writeFile(log, "");
  const child = spawnWriter(targetPath, log);
  return { log, stop: () => child.stop() };
}

function spawnWriter(targetPath: string, log: string): { stop(): Promise<{ steps: number; refused: number }> } {
  const child: ChildProcess = spawn(process.execPath, [WRITER, targetPath, log, "25"], { stdio: ["ignore", "pipe", "inherit"] });
  let out = "";
  child.stdout!.on("data", (chunk: Buffer) => (out += chunk.toString()));
  return {
    stop: () =>
      new Promise((resolve) => {
        if (child.exitCode !== null) return resolve(JSON.parse(out) as { steps: number; refused: number });
        child.once("exit", () => resolve(JSON.parse(out) as { steps: number; refused: number }));
        child.kill("SIGTERM");
      }),
  };
}

/** What the remote's branch holds, path → blob id. */
async function remoteTree(server: GitDaemon, repo: string, ref = "main"): Promise<Map<string, string>> {
  const out = await server.git(repo, "ls-tree", "-r", "-z", ref);
  const tree = new Map<string, string>();
  for (const entry of out.split("\0")) {
    if (entry === "") continue;
    const [meta, file] = entry.split("\t");
    tree.set(file!, meta!.split(" ")[2]!);
  }
  return tree;
}

/** What the node's work tree holds now, path → blob id; libfuse's hidden files are never committed. */
async function nodeTree(driver: Driver, volumeId: string): Promise<Map<string, string>> {
  const dir = path.join(driver.stateDir, "trees", volumeId);
  const tree = new Map<string, string>();
  for (const entry of await fs.readdir(dir, { recursive: true, withFileTypes: true })) {
    if (!entry.isFile() || entry.name.startsWith(".fuse_hidden")) continue;
    const file = path.join(entry.parentPath, entry.name);
    tree.set(path.relative(dir, file), blobId(await fs.readFile(file)));
  }
  return tree;
}

/** Upstream's files come into the node's tree only with the next rebase: they are the remote's alone to check. */
function withoutUpstream(tree: Map<string, string>): Record<string, string> {
  return Object.fromEntries([...tree].filter(([file]) => !file.startsWith("upstream/")).sort());
}

/**
 * Unstages the volume (which must push everything), then compares: every
 * acknowledged write's last content is on the remote, the remote equals the
 * node's tree, and no side branch exists. Returns how many writes were acknowledged.
 */
async function assertNothingLost(server: GitDaemon, repo: string, driver: Driver, volume: PublishedVolume, app: Application): Promise<{ acked: number; lost: number }> {
  const stopped = await app.stop();
  await unstageAsTheKubelet(driver, volume);
  const acked = readAcked(app.log);
  const remote = await remoteTree(server, repo);
  const lost = [...acked].filter(([file, blob]) => remote.get(file) !== blob);
  if (lost.length > 0) assert.fail(await diagnosis(server, repo, driver, volume.volumeId, `${lost.length} of ${acked.size} acknowledged writes missing or wrong on the remote`));
  assert.deepEqual(withoutUpstream(await nodeTree(driver, volume.volumeId)), withoutUpstream(remote), "the remote holds exactly the node's tree");
  const branches = (await server.git(repo, "for-each-ref", "--format=%(refname)", "refs/heads/")).split("\n");
  assert.deepEqual(branches, ["refs/heads/main"], "no side branch: no file changed on both sides");
  assert.ok(stopped.steps > 0);
  const writes = (await fs.readFile(app.log, "utf8")).split("\n").filter(Boolean).length;
  return { acked: writes, lost: lost.length };
}

/** A git process of the driver's, running now, whose argv or environment marks the moment. */
async function gitAt(stateDir: string, moment: Moment): Promise<boolean> {
  for (const pid of await fs.readdir("/proc")) {
    if (!/^\d+$/.test(pid)) continue;
    const [argv, environ, cwd] = await Promise.all([
      fs.readFile(`/proc/${pid}/cmdline`, "utf8").catch(() => ""),
      fs.readFile(`/proc/${pid}/environ`, "utf8").catch(() => ""),
      fs.readlink(`/proc/${pid}/cwd`).catch(() => ""),
    ]);
    const args = argv.split("\0");
    if (args[0] !== "git" || !(cwd.startsWith(stateDir) || environ.includes(stateDir))) continue;
    const isMetadata = environ.includes("metadata.index");
    if (moment === "metadata" && isMetadata) return true;
    if (moment === "commit" && !isMetadata && args.some((a) => a === "update-index" || a === "add" || a === "write-tree" || a === "commit-tree")) return true;
    if (moment === "push" && args.includes("push")) return true;
    if (moment === "rebase" && args.includes("rebase")) return true;
  }
  return false;
}

/** The service and every process it started, as a container's kill takes them all. */
async function killTree(pid: number): Promise<void> {
  const children = new Map<number, number[]>();
  for (const entry of await fs.readdir("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    const stat = await fs.readFile(`/proc/${entry}/stat`, "utf8").catch(() => "");
    const ppid = Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]);
    children.set(ppid, [...(children.get(ppid) ?? []), Number(entry)]);
  }
  const tree: number[] = [];
  const walk = (p: number) => {
    tree.push(p);
    for (const c of children.get(p) ?? []) walk(c);
  };
  walk(pid);
  for (const p of tree) {
    try {
      process.kill(p, "SIGKILL");
    } catch {
      // Exited on its own.
    }
  }
}

/** Waits until the volume is well again; a time-out says what its report still holds. */
async function settled(driver: Driver, volumeId: string, what: string): Promise<void> {
  let last: unknown;
  await waitFor(
    what,
    async () => {
      last = await report(driver, volumeId);
      return (last as { abnormal: string[] }).abnormal.length === 0;
    },
    T,
  ).catch((err: Error) => {
    const logs = volumeLogs(driver, volumeId).split("\n").slice(-80).join("\n");
    throw new Error(`${err.message}; the volume's report: ${JSON.stringify(last, null, 2)}\nits last log lines:\n${logs}`);
  });
}

/** The launcher starts a killed service again, as the kubelet would: wait until a new one runs. */
async function restarted(driver: Driver, service: Service, killed: number): Promise<void> {
  await waitFor(`${service} restarted`, async () => {
    const pid = await driver.pid(service);
    return (
      pid !== killed &&
      (await fs.stat(`/proc/${pid}`).then(
        () => true,
        () => false,
      ))
    );
  });
}

/**
 * What CI's output needs to tell a lost write's cause, since it keeps no
 * /tmp: the remote's refs besides main (stranded, staging, side branch) and
 * the volume's last warnings and errors.
 */
async function diagnosis(server: GitDaemon, repo: string, driver: Driver, volumeId: string, what: string): Promise<string> {
  const refs = (await server.git(repo, "for-each-ref", "--format=%(refname)")).split("\n").filter((ref) => ref && ref !== "refs/heads/main");
  const warnings = volumeLogs(driver, volumeId)
    .split("\n")
    .map(logLine)
    .filter((line) => line !== undefined)
    .slice(-15);
  return [`${what}; the services' log is in ${logFileOf(volumeId)}.`, `remote refs besides main: ${refs.join(", ") || "none"}`, "last warnings and errors of the volume:", ...warnings].join("\n");
}

/** A warning or error of the services' JSON log as one short line; undefined for anything else. */
function logLine(line: string): string | undefined {
  const start = line.indexOf("{");
  if (start < 0) return undefined;
  try {
    const entry = JSON.parse(line.slice(start)) as { level?: string; timestamp?: string; service?: string; operation?: string; message?: string };
    if (entry.level !== "warn" && entry.level !== "error") return undefined;
    return `${entry.timestamp?.slice(11, 19)} ${entry.service} ${entry.operation}: ${entry.message}`.slice(0, 240);
  } catch {
    return undefined;
  }
}

/** The services' whole log of a case, kept for its replay: too long for an assertion's message. */
function logFileOf(volumeId: string): string {
  return path.join(os.tmpdir(), `fault-matrix-${volumeId}-${seed}.log`);
}

/** Unpublish and unstage, tried again after a failure or a deadline, as the kubelet does. */
async function unstageAsTheKubelet(driver: Driver, volume: PublishedVolume): Promise<void> {
  await waitFor(
    "the unpublish and unstage",
    async () => {
      await unpublishAndUnstage(driver, volume);
      return true;
    },
    5 * 60_000,
  );
}

describe("the fault matrix", () => {
  const cleanups: Array<() => Promise<void>> = [];
  after(async () => {
    for (const cleanup of cleanups.reverse()) await cleanup().catch(() => undefined);
  });

  async function setUp(name: string, options: DriverOptions = {}): Promise<{ server: GitDaemon; driver: Driver; repo: string; volume: PublishedVolume; app: Application }> {
    const server = await startGitDaemon();
    cleanups.push(() => server.stop());
    const driver = await startDriver({ metricsPort: await freePort(), ...options });
    // Gigabytes of trees and objects: later tests that read /tmp need not wade through them.
    cleanups.push(() => fs.rm(driver.dir, { recursive: true, force: true }));
    cleanups.push(() => driver.stop());
    cleanups.push(() => fs.writeFile(logFileOf(name), driver.logs()));
    const repo = `${name}.git`;
    await server.createRepo(repo, { files: { "configuration.yaml": "name: home\n" } });
    const volume = await stageAndPublish(driver, await createVolume(driver, name, server.url(repo)), undefined, `${name}-pod`);
    await setVolumeClass(driver, volume.volumeId, POLICY);
    const app = await startApplication(driver.dir, volume.targetPath);
    cleanups.push(() => app.stop().then(() => undefined));
    return { server, driver, repo, volume, app };
  }

  test("SIGKILL of each service at seeded moments of write, commit, push, rebase and metadata record", { timeout: 20 * 60_000 }, async () => {
    const { server, driver, repo, volume, app } = await setUp("kills");
    const kills: Record<Service, number> = { "csi-frontend": 0, "mount-owner": 0, "git-worker": 0 };
    // A person pushes upstream now and then, to files the application never writes: rebases, never a side branch.
    const upstream: string[] = [];
    const person = setInterval(() => {
      const file = `upstream/${upstream.length}.txt`;
      upstream.push(file);
      void server.commitFiles(repo, { [file]: `upstream ${upstream.length}\n` }).catch(() => upstream.pop());
    }, UPSTREAM_EVERY_MS);
    try {
      for (let round = 0; round < KILLS; round++) {
        const service = pick(SERVICES);
        const moment = pick(MOMENTS);
        const delay = Math.floor(random() * 1500);
        const caught = moment === "write" ? (await sleep(delay), true) : await waitFor(`a ${moment}`, () => gitAt(driver.stateDir, moment), 15_000).catch(() => false);
        const pid = await driver.pid(service);
        await killTree(pid);
        kills[service]++;
        console.log(`fault matrix: round ${round}: SIGKILL ${service} at ${caught ? moment : `no ${moment} within 15 s, so at random`}`);
        await restarted(driver, service, pid);
        // A killed mount owner's mount stays: the fd-keeper held it, the new one serves it; the application writes on.
        await sleep(1000 + Math.floor(random() * 2000));
      }
    } finally {
      clearInterval(person);
    }
    for (const file of upstream) assert.ok(await server.git(repo, "cat-file", "-e", `main:${file}`).then(() => true), `upstream's ${file} kept`);
    const { acked, lost } = await assertNothingLost(server, repo, driver, volume, app);
    console.log(
      `fault matrix summary: seed=${seed} kills csi-frontend=${kills["csi-frontend"]} mount-owner=${kills["mount-owner"]} git-worker=${kills["git-worker"]} acknowledged writes=${acked} lost=${lost}`,
    );
  });

  test("the remote away for minutes: writes land in commits, the volume reports it, and everything is pushed once it is back", { timeout: 10 * 60_000 }, async () => {
    // A lease longer than the outage: spec 000 ends an epoch whose lease cannot be renewed.
    const { server, driver, repo, volume, app } = await setUp("away", { lease: { duration: "5m", renewInterval: "20s" } });
    await sleep(2000);
    await server.down();
    const unpushedBefore = (await report(driver, volume.volumeId)).unpushedCommits;
    await sleep(REMOTE_AWAY_MS);
    const away = await report(driver, volume.volumeId);
    assert.ok(
      away.abnormal.some((a) => a.startsWith("the last push failed")),
      away.abnormal.join("\n"),
    );
    assert.ok(reasons(away).includes("GitVolumePushFailed"));
    assert.ok(away.unpushedCommits > unpushedBefore, `writes keep landing in commits while the remote is away (${away.unpushedCommits} unpushed)`);
    await server.up();
    await settled(driver, volume.volumeId, "everything pushed once the remote is back");
    const { acked, lost } = await assertNothingLost(server, repo, driver, volume, app);
    console.log(`fault matrix summary: remote away ${REMOTE_AWAY_MS / 1000} s, ${away.unpushedCommits} commits waited, acknowledged writes=${acked} lost=${lost}`);
  });

  test("the state directory's disk full: an abnormal state and event, honest writes, and nothing lost once space returns", { timeout: 10 * 60_000 }, async () => {
    const dir = await fs.mkdtemp(path.join(os.tmpdir(), "git-csi-full-"));
    await fs.mkdir(path.join(dir, "state"));
    await run("mount", ["-t", "tmpfs", "-o", "size=256m", "git-csi-full", path.join(dir, "state")]);
    cleanups.push(() => run("umount", ["-l", path.join(dir, "state")]).then(() => undefined));
    const { server, driver, repo, volume, app } = await setUp("full", { dir });
    await sleep(2000);
    const filler = path.join(driver.stateDir, "filler");
    await run("sh", ["-c", `dd if=/dev/zero of='${filler}' bs=1M 2>/dev/null; true`]);
    const full = await waitFor(
      "a failed commit on the full disk",
      async () => {
        const r = await report(driver, volume.volumeId);
        return r.abnormal.some((a) => a.startsWith("the last commit failed")) && r;
      },
      T,
    );
    assert.ok(reasons(full).includes("GitVolumeCommitFailed"), reasons(full).join());
    await sleep(3000);
    await fs.rm(filler);
    await settled(driver, volume.volumeId, "everything committed and pushed once space returns");
    const { acked, lost } = await assertNothingLost(server, repo, driver, volume, app);
    console.log(`fault matrix summary: state disk full, acknowledged writes=${acked} lost=${lost}`);
  });

  test("a forge hook that rejects pushes for a while", { timeout: 10 * 60_000 }, async () => {
    const { server, driver, repo, volume, app } = await setUp("hook");
    await sleep(2000);
    const allow = await refusePushes(server, repo);
    const refused = await waitFor(
      "a rejected push",
      async () => {
        const r = await report(driver, volume.volumeId);
        return r.abnormal.some((a) => a.startsWith("the last push failed")) && r;
      },
      T,
    );
    assert.ok(reasons(refused).includes("GitVolumePushFailed"));
    await sleep(10_000);
    await allow();
    await settled(driver, volume.volumeId, "everything pushed once the hook allows it");
    const { acked, lost } = await assertNothingLost(server, repo, driver, volume, app);
    console.log(`fault matrix summary: pushes rejected by a hook, acknowledged writes=${acked} lost=${lost}`);
  });
});
