import assert from "node:assert/strict";
import { type ChildProcessWithoutNullStreams, spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import * as fs from "node:fs/promises";
import * as path from "node:path";
import { createInterface } from "node:readline";
import { after, before, describe, test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { status } from "@grpc/grpc-js";
import { call, csi, CsiError } from "@git-csi/protos";
import { type Driver, mountsUnder, refused, run, setVolumeClass, sh, startDriver, volumeLogs, waitFor } from "../src/driver";
import { blobId } from "../src/app-writer";
import { type GitServer, slowUploads, startGitDaemon } from "../src/git-server";
import { ownerRecord as ownerOf, type OwnerFields, takeOver } from "../src/owner-record";

// Spec 000's retry, restart and cleanup rules of the .rwo-session record and
// the mount epoch, on the real services, a real FUSE mount and a real remote.

const Mode = csi.VolumeCapability_AccessMode_Mode;
const RWO = Mode.SINGLE_NODE_MULTI_WRITER;
const RWOP = Mode.SINGLE_NODE_SINGLE_WRITER;
/** Spec 000's 90 s and 20 s, scaled down so a test can outwait a lease. */
const LEASE = { duration: "6s", renewInterval: "2s" };
const LEASE_RENEW_MS = 2000;
const LEASE_SECONDS = 6;
const T = 60_000;
/** A class that commits and pushes nothing before the pod stops. */
const UNTIL_POD_STOPS = { "push.quiesce": "1h", "push.maxLatency": "2h" };

/** What a .rwo-session holds; the epoch is compared, never printed. */
interface SessionFile {
  volumeId: string;
  epoch: string;
  completed: boolean;
  generation: number;
}

/** Asserts two epochs are equal without putting either in a message or a log. */
function sameEpoch(actual: string | undefined, expected: string | undefined, what: string): void {
  assert.ok(typeof actual === "string" && actual !== "" && actual === expected, what);
}

function otherEpoch(actual: string | undefined, previous: string | undefined, what: string): void {
  assert.ok(typeof actual === "string" && actual !== "" && typeof previous === "string" && actual !== previous, what);
}

/**
 * An application in its own process that opens files on the mount before the
 * epoch is lost and keeps them open. On "watch" it fsyncs its held descriptor
 * and keeps the mount's entries freshly looked up until the loss shows; then
 * it tries every operation at once and answers each one's errno as JSON. The
 * fresh entries let the kernel send unlink, rmdir and setattr themselves
 * rather than a new lookup (a rename's target is always looked up again).
 */
const ACTOR = String.raw`
import errno, json, os, sys, time
root = sys.argv[1]
p = lambda n: os.path.join(root, n)
held = os.open(p("held.txt"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
reader = os.open(p("a.txt"), os.O_RDONLY)
# In the kernel's page cache from now on: the fence must drop it.
os.pread(reader, 100, 0)
os.write(held, b"before\n")
os.fsync(held)
print("ready", flush=True)
def name(e):
    return errno.errorcode.get(e.errno, str(e.errno))
def attempt(fn):
    try:
        fn()
        return "ok"
    except OSError as e:
        return name(e)
def refresh(n):
    try:
        os.close(os.open(p(n), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    except FileExistsError:
        pass
def close_after(fd):
    try:
        os.close(fd)
    except OSError:
        pass
for line in sys.stdin:
    if line.strip() != "watch":
        continue
    names = ["a.txt", "b.txt", "c.txt", "e.txt", "d", "held.txt"]
    deadline = time.time() + 60
    first = None
    root_mode = os.stat(root).st_mode & 0o7777
    while first is None:
        # The mount root's attributes, fresh from a setattr's reply: the kernel checks permissions on them.
        steps = [lambda: os.chmod(root, root_mode)] + [(lambda n: lambda: refresh(n))(n) for n in names]
        for step in steps:
            # The held descriptor notices the loss without a lookup; then one entry is looked up afresh
            # (O_CREAT|O_EXCL on an existing name forces that), so every entry stays valid past the loss
            # and the kernel sends the operation itself rather than a new lookup.
            try:
                os.fsync(held)
                step()
            except OSError as e:
                first = name(e)
                break
        if first is None:
            if time.time() > deadline:
                print(json.dumps({"timeout": True}), flush=True)
                sys.exit(1)
            time.sleep(0.2)
    lost_at = time.time() * 1000
    results = {
        "the first operation to see the loss": first,
        "fsync of a descriptor opened before": attempt(lambda: os.fsync(held)),
        "write to a descriptor opened before": attempt(lambda: os.write(held, b"after\n")),
        "read from a descriptor opened before": attempt(lambda: os.pread(reader, 100, 0)),
        "ftruncate of a descriptor opened before": attempt(lambda: os.ftruncate(held, 0)),
        "fchmod of a descriptor opened before": attempt(lambda: os.fchmod(held, 0o600)),
        "rename onto an existing file": attempt(lambda: os.rename(p("a.txt"), p("e.txt"))),
        "unlink": attempt(lambda: os.unlink(p("b.txt"))),
        "chmod": attempt(lambda: os.chmod(p("c.txt"), 0o600)),
        "truncate": attempt(lambda: os.truncate(p("c.txt"), 0)),
        "rmdir": attempt(lambda: os.rmdir(p("d"))),
        "mkdir": attempt(lambda: os.mkdir(p("newdir"))),
        "open for writing": attempt(lambda: close_after(os.open(p("c.txt"), os.O_WRONLY))),
        "open for reading": attempt(lambda: close_after(os.open(p("e.txt"), os.O_RDONLY))),
        "create": attempt(lambda: close_after(os.open(p("new.txt"), os.O_WRONLY | os.O_CREAT, 0o644))),
        "readdir": attempt(lambda: os.listdir(root)),
        # The fence dropped the kernel's cached attributes and pages: nothing answers from them.
        "stat": attempt(lambda: os.stat(p("e.txt"))),
        "fstat of a descriptor opened before": attempt(lambda: os.fstat(reader)),
    }
    print(json.dumps({"lostAt": lost_at, "results": results}), flush=True)
`;

interface Actor {
  proc: ChildProcessWithoutNullStreams;
  /** Starts watching; resolves when every operation was tried after the loss. */
  watch(): Promise<{ lostAt: number; results: Record<string, string> }>;
  kill(): Promise<void>;
}

async function startActor(dir: string): Promise<Actor> {
  const proc = spawn("python3", ["-c", ACTOR, dir], { stdio: ["pipe", "pipe", "pipe"] });
  let stderr = "";
  proc.stderr.on("data", (c: Buffer) => (stderr += c.toString()));
  const lines = createInterface({ input: proc.stdout });
  const queue: string[] = [];
  const waiting: Array<(line: string) => void> = [];
  lines.on("line", (line) => (waiting.length > 0 ? waiting.shift()!(line) : queue.push(line)));
  const exited = new Promise<never>((_, reject) => proc.once("exit", (code) => reject(new Error(`the application process exited (${code}): ${stderr}`))));
  exited.catch(() => undefined);
  const next = () => Promise.race([queue.length > 0 ? Promise.resolve(queue.shift()!) : new Promise<string>((resolve) => waiting.push(resolve)), exited]);
  assert.equal(await next(), "ready");
  return {
    proc,
    async watch() {
      proc.stdin.write("watch\n");
      const answer = JSON.parse(await next()) as { timeout?: boolean; lostAt: number; results: Record<string, string> };
      assert.ok(!answer.timeout, "the mount kept serving for a minute");
      return answer;
    },
    async kill() {
      if (proc.exitCode !== null || proc.signalCode !== null) return;
      const gone = new Promise<void>((resolve) => proc.once("exit", () => resolve()));
      proc.kill("SIGKILL");
      await gone;
    },
  };
}

describe("the .rwo-session record and the mount epoch: retries, expiry, cleanup, fencing (spec 000)", () => {
  let server: GitServer;
  let driver: Driver;
  const stopped = new Set<number>();
  const actors: Actor[] = [];

  before(async () => {
    server = await startGitDaemon();
    driver = await startDriver({ lease: LEASE });
  });

  after(async () => {
    for (const pid of stopped) {
      try {
        process.kill(pid, "SIGCONT");
      } catch {
        // Gone.
      }
    }
    for (const actor of actors) await actor.kill();
    await driver?.stop();
    await server?.stop();
  });

  /** A static volume's context: no recorded access mode, so only the node and the remote judge the mode. */
  const contextOf = (repo: string) => ({ url: server.url(repo), ref: "main" });
  const stagingOf = (volumeId: string) => path.join(driver.dir, "staging", volumeId);

  /** A repository with one file, and the staging directory the kubelet makes before a stage. */
  async function freshVolume(repo: string, volumeId: string): Promise<string> {
    await server.createRepo(repo, { files: { "a.txt": "A\n" } });
    const stagingPath = stagingOf(volumeId);
    await fs.mkdir(stagingPath, { recursive: true });
    return stagingPath;
  }
  const targetOf = (volumeId: string) => path.join(driver.dir, "pods", volumeId, "volume");
  const treeOf = (volumeId: string) => path.join(driver.stateDir, "trees", volumeId);

  const stage = (volumeId: string, repo: string, mode: csi.VolumeCapability_AccessMode_Mode = RWO, stagingPath = stagingOf(volumeId)) =>
    call(
      driver.node.nodeStageVolume.bind(driver.node),
      csi.NodeStageVolumeRequest.fromPartial({ volumeId, stagingTargetPath: stagingPath, volumeCapability: capability(mode), volumeContext: contextOf(repo) }),
      T,
    );
  const unstage = (volumeId: string, stagingPath = stagingOf(volumeId)) => call(driver.node.nodeUnstageVolume.bind(driver.node), { volumeId, stagingTargetPath: stagingPath }, T);
  async function publish(volumeId: string, repo: string, mode: csi.VolumeCapability_AccessMode_Mode = RWO): Promise<string> {
    const targetPath = targetOf(volumeId);
    await fs.mkdir(path.dirname(targetPath), { recursive: true });
    await call(
      driver.node.nodePublishVolume.bind(driver.node),
      csi.NodePublishVolumeRequest.fromPartial({ volumeId, stagingTargetPath: stagingOf(volumeId), targetPath, volumeCapability: capability(mode), volumeContext: contextOf(repo) }),
      T,
    );
    return targetPath;
  }
  const unpublish = (volumeId: string) => call(driver.node.nodeUnpublishVolume.bind(driver.node), { volumeId, targetPath: targetOf(volumeId) }, T);

  /** The volume's owner ref on the remote, as fields; undefined when there is none. */
  const ownerRecord = (repo: string, volumeId: string) => ownerOf(server, repo, volumeId);

  async function session(volumeId: string, stagingPath = stagingOf(volumeId)): Promise<SessionFile> {
    const file = `${stagingPath}.rwo-session`;
    assert.equal((await fs.stat(file)).mode & 0o777, 0o600);
    return JSON.parse(await fs.readFile(file, "utf8")) as SessionFile;
  }

  async function noSession(volumeId: string, stagingPath = stagingOf(volumeId)): Promise<void> {
    await assert.rejects(fs.stat(`${stagingPath}.rwo-session`), { code: "ENOENT" }, "no .rwo-session remains");
  }

  /** Kernel mounts of the volume in this (the node's) mount namespace, by source. */
  async function mountsOf(volumeId: string): Promise<string[]> {
    const table = await fs.readFile("/proc/self/mountinfo", "utf8");
    return table
      .split("\n")
      .filter((line) => line.split(" - ")[1]?.split(" ")[1] === `git-csi:${volumeId}`)
      .map((line) => line.split(" ")[4]!);
  }

  /** Waits until the lease the owner record names has run out, by this host's clock. */
  async function outwaitLease(record: OwnerFields | undefined): Promise<void> {
    assert.ok(record, "an owner record to outwait");
    const wait = Number(record.expires) + 500 - Date.now();
    if (wait > 0) await sleep(wait);
  }

  /** About when the record's epoch stops serving: its renewal went out just after the record's time, and serves nine tenths of the lease. */
  const serveUntil = (record: OwnerFields) => Number(record.expires) - Math.floor((Number(record.expires) - Number(record.time)) / 10);

  async function freeze(service: "git-worker" | "mount-owner"): Promise<() => void> {
    const pid = await driver.pid(service);
    process.kill(pid, "SIGSTOP");
    stopped.add(pid);
    return () => {
      process.kill(pid, "SIGCONT");
      stopped.delete(pid);
    };
  }

  const eio = (script: string) =>
    sh(script).then(
      () => false,
      (err: Error) => /Input\/output error/.test(err.message),
    );

  test("a stage that failed after its .rwo-session was written is retried with the stored epoch, before and after its claim landed", { timeout: 90_000 }, async () => {
    const repo = "retry.git";
    const volumeId = "rwo-retry";
    const stagingPath = await freshVolume(repo, volumeId);

    // The remote's repository is away: the stage fails before any claim, after the record was written.
    const away = `${server.repoPath(repo)}.away`;
    await fs.rename(server.repoPath(repo), away);
    try {
      await refused(stage(volumeId, repo), status.UNAVAILABLE, [server.url(repo)]);
    } finally {
      await fs.rename(away, server.repoPath(repo));
    }
    const first = await session(volumeId);
    assert.equal(first.completed, false);
    assert.equal(first.volumeId, volumeId);
    assert.equal(await ownerRecord(repo, volumeId), undefined, "nothing was claimed while the remote was away");
    assert.deepEqual(await mountsOf(volumeId), []);

    // The remote is back but the staging path cannot take the mount: the claim lands, the stage still fails.
    await fs.rmdir(stagingPath);
    await fs.writeFile(stagingPath, "not a directory\n");
    await assert.rejects(stage(volumeId, repo));
    const claimed = await ownerRecord(repo, volumeId);
    sameEpoch(claimed?.epoch, first.epoch, "the retry claimed the epoch the first attempt stored, not a new one");
    assert.equal(claimed?.released, "false");
    const second = await session(volumeId);
    sameEpoch(second.epoch, first.epoch, "the .rwo-session still holds the first epoch");
    assert.equal(second.completed, false);

    // The kubelet retries once more with everything in place: the stored epoch continues its own live claim.
    await fs.rm(stagingPath);
    await fs.mkdir(stagingPath);
    await stage(volumeId, repo);
    const served = await ownerRecord(repo, volumeId);
    sameEpoch(served?.epoch, first.epoch, "the stage that succeeded serves with the epoch stored before the first attempt");
    const done = await session(volumeId);
    sameEpoch(done.epoch, first.epoch, "the completed record keeps the epoch");
    assert.equal(done.completed, true);
    assert.equal(done.generation, first.generation, "one session, not a new one per attempt");
    assert.deepEqual(await mountsOf(volumeId), [stagingPath]);
    assert.equal(await sh(`cat '${stagingPath}/a.txt'`), "A\n");
    assert.ok(!driver.logs().includes(first.epoch), "the epoch is never logged");

    await unstage(volumeId);
    assert.equal((await ownerRecord(repo, volumeId))?.released, "true");
    await noSession(volumeId);
  });

  test("an initial stage that never succeeded, its mount absent and its pending epoch's lease run out, is retried with a fresh epoch", { timeout: 90_000 }, async () => {
    const repo = "pending.git";
    const volumeId = "rwo-pending";
    await server.createRepo(repo, { files: { "a.txt": "A\n" } });
    const stagingPath = stagingOf(volumeId);
    await fs.mkdir(path.dirname(stagingPath), { recursive: true });
    // The claim lands, then the mount cannot be made: the stage never succeeds.
    await fs.writeFile(stagingPath, "not a directory\n");
    await assert.rejects(stage(volumeId, repo));
    const pending = await session(volumeId);
    assert.equal(pending.completed, false);
    const claimed = await ownerRecord(repo, volumeId);
    sameEpoch(claimed?.epoch, pending.epoch, "the pending epoch was claimed on the remote");
    assert.deepEqual(await mountsOf(volumeId), [], "the mount is positively absent");

    // Nobody renews a pending epoch: its lease runs out.
    await outwaitLease(claimed);
    await fs.rm(stagingPath);
    await fs.mkdir(stagingPath);
    await stage(volumeId, repo);
    const fresh = await session(volumeId);
    otherEpoch(fresh.epoch, pending.epoch, "the retry staged with a fresh epoch, not the expired pending one");
    assert.equal(fresh.completed, true);
    const record = await ownerRecord(repo, volumeId);
    sameEpoch(record?.epoch, fresh.epoch, "the owner ref names the fresh epoch");
    assert.equal(record?.released, "false");
    assert.equal(await sh(`cat '${stagingPath}/a.txt'`), "A\n");

    await unstage(volumeId);
    assert.equal((await ownerRecord(repo, volumeId))?.released, "true");
  });

  test("a stage that once succeeded and lost its epoch to the clock is refused on retry until a normal unpublish and unstage; then a stage gets a new epoch", { timeout: 90_000 }, async () => {
    const repo = "expired.git";
    const volumeId = "rwo-expired";
    await freshVolume(repo, volumeId);
    await stage(volumeId, repo);
    const target = await publish(volumeId, repo);
    const staged = await session(volumeId);
    assert.equal(staged.completed, true);

    // Renewals stop (the git worker is frozen): the mount stops serving at 90 % of the lease.
    const thaw = await freeze("git-worker");
    try {
      await waitFor("the mount to refuse with EIO", () => eio(`cat '${target}/a.txt'`), 20_000);
    } finally {
      thaw();
    }
    const lost = await ownerRecord(repo, volumeId);
    sameEpoch(lost?.epoch, staged.epoch, "the owner ref still names the lost epoch");

    // The kubelet's retries never bring the expired epoch back, nor replace it silently.
    for (let i = 0; i < 2; i++) {
      await refused(stage(volumeId, repo), status.FAILED_PRECONDITION, ["no longer holds", "unstage"]);
      await sleep(LEASE_RENEW_MS);
    }
    const after = await ownerRecord(repo, volumeId);
    sameEpoch(after?.epoch, staged.epoch, "no new epoch was claimed");
    assert.equal(after?.expires, lost?.expires, "the lost epoch was not renewed");
    sameEpoch((await session(volumeId)).epoch, staged.epoch, "the .rwo-session keeps the old epoch");
    assert.equal(await eio(`cat '${target}/a.txt'`), true, "the mount still refuses");

    await unpublish(volumeId);
    await unstage(volumeId);
    await noSession(volumeId);
    assert.deepEqual(await mountsOf(volumeId), []);

    await stage(volumeId, repo);
    const again = await session(volumeId);
    otherEpoch(again.epoch, staged.epoch, "the stage after unstage has a new epoch");
    const record = await ownerRecord(repo, volumeId);
    sameEpoch(record?.epoch, again.epoch, "the owner ref names the new epoch");
    assert.equal(record?.released, "false");
    assert.equal(await sh(`cat '${stagingOf(volumeId)}/a.txt'`), "A\n");
    await unstage(volumeId);
  });

  test("after a mount-owner restart, a completed stage whose lease ran out is refused even with its mount gone: no fresh epoch until unstage", { timeout: 90_000 }, async () => {
    const repo = "completed.git";
    const volumeId = "rwo-completed";
    const stagingPath = await freshVolume(repo, volumeId);
    await stage(volumeId, repo);
    const staged = await session(volumeId);
    assert.equal(staged.completed, true);

    const oldPid = await driver.pid("mount-owner");
    // The descriptor keeper dies with it: no process keeps the connection, so no restarted mount owner resumes it and renews its lease.
    process.kill(await driver.pid("fd-keeper"), "SIGKILL");
    process.kill(oldPid, "SIGKILL");
    await waitFor("a new mount owner", async () => (await driver.pid("mount-owner").catch(() => oldPid)) !== oldPid);
    await waitFor("Probe ready", async () => (await call(driver.identity.probe.bind(driver.identity), {}, 1000)).ready);
    // The dead FUSE connection goes, so the mount is positively absent; only the completed flag speaks.
    await run("umount", ["-l", stagingPath]);
    assert.deepEqual(await mountsOf(volumeId), []);
    await outwaitLease(await ownerRecord(repo, volumeId));

    await refused(stage(volumeId, repo), status.FAILED_PRECONDITION, ["ran out", "nstage"]);
    const kept = await session(volumeId);
    sameEpoch(kept.epoch, staged.epoch, "the .rwo-session keeps the epoch of the stage that succeeded");
    assert.equal(kept.completed, true);
    sameEpoch((await ownerRecord(repo, volumeId))?.epoch, staged.epoch, "no fresh epoch reached the owner ref");
    assert.deepEqual(await mountsOf(volumeId), [], "nothing was mounted");

    await unstage(volumeId);
    await noSession(volumeId);
    await stage(volumeId, repo);
    const again = await session(volumeId);
    otherEpoch(again.epoch, staged.epoch, "the stage after unstage has a new epoch");
    sameEpoch((await ownerRecord(repo, volumeId))?.epoch, again.epoch, "the owner ref names the new epoch");
    assert.equal(await sh(`cat '${stagingPath}/a.txt'`), "A\n");
    await unstage(volumeId);
  });

  test(
    "a git worker restarted after its mount stopped serving is told so: the epoch is not renewed, and the mount's writes wait on a stranded ref until the next stage lands them",
    { timeout: 90_000 },
    async () => {
      const repo = "worker-restart-expired.git";
      const volumeId = "rwo-worker-restart-expired";
      await freshVolume(repo, volumeId);
      await stage(volumeId, repo);
      await setVolumeClass(driver, volumeId, UNTIL_POD_STOPS);
      const target = await publish(volumeId, repo);
      const staged = await session(volumeId);
      await sh(`echo late > '${target}/late.txt'`);

      // Renewals stop (the git worker is frozen) until the mount stops serving; then that worker dies.
      const worker = await driver.pid("git-worker");
      await freeze("git-worker");
      await waitFor("the mount to refuse with EIO", () => eio(`cat '${target}/a.txt'`), 20_000);
      process.kill(worker, "SIGKILL");
      stopped.delete(worker);
      await waitFor("a new git worker", async () => (await driver.pid("git-worker").catch(() => worker)) !== worker);
      await waitFor("Probe ready", async () => (await call(driver.identity.probe.bind(driver.identity), {}, 1000)).ready);
      // Nobody took the volume: the record still names the epoch, and only the mount owner knows its mount stopped serving.
      sameEpoch((await ownerRecord(repo, volumeId))?.epoch, staged.epoch, "the owner ref still names the lost epoch");
      // Upstream moved meanwhile: the handed-over tree is not synced with a mount that serves nothing, and stays as it is.
      await server.commitFiles(repo, { "upstream.txt": "upstream\n" });

      // The unstage hands the new worker the volume, with no serving time left: it commits the write but neither renews nor pushes.
      await unpublish(volumeId);
      await unstage(volumeId);
      assert.match(volumeLogs(driver, volumeId), /"operation":"claim_mount"[^\n]*ran out unrenewed|ran out unrenewed[^\n]*"operation":"claim_mount"/);
      await assert.rejects(server.git(repo, "show", "main:late.txt"), "the lost epoch's write did not reach main");
      const stranded = (await server.git(repo, "for-each-ref", "--format=%(refname)", `refs/git-csi/stranded/${volumeId}/`)).split("\n").filter(Boolean);
      assert.equal(stranded.length, 1, "one stranded ref");
      assert.equal(await server.git(repo, "show", `${stranded[0]}:late.txt`), "late");
      assert.ok(!driver.logs().includes(staged.epoch), "the epoch is never logged");

      // The next stage, with a new epoch, rebases the stranded commit onto the tree; its pod's stop lands it.
      await stage(volumeId, repo);
      otherEpoch((await session(volumeId)).epoch, staged.epoch, "the stage after unstage has a new epoch");
      await setVolumeClass(driver, volumeId, UNTIL_POD_STOPS);
      await unstage(volumeId);
      assert.equal(await server.git(repo, "show", "main:late.txt"), "late");
      assert.equal(await server.git(repo, "show", "main:upstream.txt"), "upstream");
    },
  );

  // The unstage's flush is the last push of a backlog: the epoch must hold until it answers, however long past the lease the upload takes.
  test("an unstage whose flush takes longer than the lease renews until the flush answered: the write lands on main, and nothing is stranded", { timeout: 90_000 }, async () => {
    const repo = "slow-flush.git";
    const volumeId = "rwo-slow-flush";
    const stagingPath = await freshVolume(repo, volumeId);
    await stage(volumeId, repo);
    await setVolumeClass(driver, volumeId, UNTIL_POD_STOPS);
    // Written at the stage itself: no pod stops, so the unstage's flush is the one that pushes. Over 1 MiB, its objects go ahead.
    const big = randomBytes(2 * 1024 * 1024);
    await fs.writeFile(path.join(stagingPath, "big.bin"), big);
    await slowUploads(server, repo, 2 * LEASE_SECONDS);
    await unstage(volumeId);
    assert.equal(await server.git(repo, "rev-parse", "main:big.bin"), blobId(big), "the write is on main");
    const driverRefs = await server.git(repo, "for-each-ref", "--format=%(refname)", "refs/git-csi/");
    assert.doesNotMatch(driverRefs, /stranded|staging/, "nothing stranded, no staging ref left");
    assert.doesNotMatch(volumeLogs(driver, volumeId), /no longer holds the volume/, "the epoch held throughout");
  });

  test(
    "the access mode is bound into the node's volume record: a volume staged ReadWriteOncePod is refused as ReadWriteOnce before service, even when the remote has no owner record",
    { timeout: 60_000 },
    async () => {
      const repo = "mode.git";
      const volumeId = "rwo-mode-bound";
      const stagingPath = await freshVolume(repo, volumeId);
      await stage(volumeId, repo, RWOP);
      await unstage(volumeId);
      assert.equal((await ownerRecord(repo, volumeId))?.["access-mode"], "ReadWriteOncePod");
      // Only the node remembers the mode now.
      await server.git(repo, "update-ref", "-d", `refs/git-csi/owner/${volumeId}`);

      for (const mode of [Mode.SINGLE_NODE_WRITER, Mode.SINGLE_NODE_MULTI_WRITER]) {
        let message = "";
        await stage(volumeId, repo, mode).then(
          () => assert.fail(`staging ${Mode[mode]} succeeded`),
          (e: CsiError) => {
            assert.ok(e instanceof CsiError, String(e));
            assert.ok([status.ALREADY_EXISTS, status.FAILED_PRECONDITION, status.INVALID_ARGUMENT].includes(e.code), `code ${status[e.code]}: ${e.message}`);
            message = e.message;
          },
        );
        assert.match(message, new RegExp(volumeId));
        assert.match(message, /ReadWriteOncePod/);
        assert.match(message, /ReadWriteOnce(?!Pod)/, "the message names the refused mode too");
        assert.doesNotMatch(message, /owner ref/, "the node's own record refused it, not the remote");
      }
      assert.deepEqual(await mountsOf(volumeId), [], "nothing mounted");
      assert.deepEqual(await mountsUnder(stagingPath), []);
      await noSession(volumeId);
      assert.equal(await ownerRecord(repo, volumeId), undefined, "nothing claimed");
    },
  );

  test("unstage refuses while published and while any kernel mount of the volume remains, keeping ownership; once all are gone it releases", { timeout: 60_000 }, async () => {
    const repo = "unstage.git";
    const volumeId = "rwo-unstage";
    const stagingPath = await freshVolume(repo, volumeId);
    await stage(volumeId, repo);
    const target = await publish(volumeId, repo);
    const staged = await session(volumeId);

    await refused(unstage(volumeId), status.FAILED_PRECONDITION, ["still published", target]);
    let record = await ownerRecord(repo, volumeId);
    sameEpoch(record?.epoch, staged.epoch, "the owner ref still names the epoch");
    assert.equal(record?.released, "false");
    assert.equal(await sh(`cat '${target}/a.txt'`), "A\n", "the mount serves on");
    assert.deepEqual((await mountsOf(volumeId)).sort(), [stagingPath, target].sort());

    // The pod goes, but another mount of the volume stays in the kernel's table.
    const extra = path.join(driver.dir, "elsewhere", volumeId);
    await fs.mkdir(extra, { recursive: true });
    await run("mount", ["--bind", stagingPath, extra]);
    try {
      await unpublish(volumeId);
      await refused(unstage(volumeId), status.FAILED_PRECONDITION, ["still mounted", extra]);
      record = await ownerRecord(repo, volumeId);
      sameEpoch(record?.epoch, staged.epoch, "the owner ref still names the epoch");
      assert.equal(record?.released, "false", "ownership stays while a mount remains");
      sameEpoch((await session(volumeId)).epoch, staged.epoch, "the .rwo-session stays");
      // The mount owner still holds the volume: it renews, even with the staging mount itself gone.
      const renewed = Number(record?.time);
      await waitFor("a renewal after the refused unstage", async () => Number((await ownerRecord(repo, volumeId))?.time) > renewed, 10_000);
      assert.equal((await ownerRecord(repo, volumeId))?.released, "false");
    } finally {
      await run("umount", [extra]).catch(() => run("umount", ["-l", extra]));
    }

    await unstage(volumeId);
    record = await ownerRecord(repo, volumeId);
    sameEpoch(record?.epoch, staged.epoch, "the release names the epoch it releases");
    assert.equal(record?.released, "true");
    assert.deepEqual(await mountsOf(volumeId), []);
    await noSession(volumeId);
  });

  /** Files on the mount for the application process, and the backing tree's state to compare after. */
  async function prepareFiles(target: string, volumeId: string): Promise<() => Promise<void>> {
    await sh(`cd '${target}' && printf 'B\\n' > b.txt && printf 'C\\n' > c.txt && printf 'E\\n' > e.txt && mkdir d`);
    const tree = treeOf(volumeId);
    const names = async () => (await fs.readdir(tree)).sort();
    const before = { names: await names(), mode: (await fs.stat(path.join(tree, "c.txt"))).mode };
    return async () => {
      const now = await names();
      assert.deepEqual(now, [...before.names, "held.txt"].sort(), "no entry was created, renamed or removed");
      assert.equal(await fs.readFile(path.join(tree, "a.txt"), "utf8"), "A\n");
      assert.equal(await fs.readFile(path.join(tree, "b.txt"), "utf8"), "B\n");
      assert.equal(await fs.readFile(path.join(tree, "c.txt"), "utf8"), "C\n", "c.txt was neither truncated nor written");
      assert.equal(await fs.readFile(path.join(tree, "e.txt"), "utf8"), "E\n");
      assert.equal((await fs.stat(path.join(tree, "c.txt"))).mode, before.mode, "c.txt's mode is unchanged");
      assert.equal(await fs.readFile(path.join(tree, "held.txt"), "utf8"), "before\n", "nothing written after the loss landed");
      assert.equal((await fs.stat(path.join(tree, "held.txt"))).mode & 0o777, 0o644);
    };
  }

  function allEio(results: Record<string, string>): void {
    const wrong = Object.entries(results).filter(([, errno]) => errno !== "EIO");
    assert.deepEqual(wrong, [], `every operation fails with EIO; these did not: ${JSON.stringify(wrong)}`);
    assert.ok(Object.keys(results).length >= 15);
  }

  async function shellOpsFail(target: string): Promise<void> {
    for (const script of [
      `cat '${target}/a.txt'`,
      `echo x > '${target}/shell-new.txt'`,
      `echo x >> '${target}/a.txt'`,
      `mv '${target}/b.txt' '${target}/moved.txt'`,
      `rm '${target}/b.txt'`,
      `chmod 600 '${target}/c.txt'`,
      `truncate -s 0 '${target}/c.txt'`,
      `mkdir '${target}/shell-dir'`,
      `ls '${target}'`,
    ]) {
      assert.equal(await eio(script), true, `${script} fails with EIO`);
    }
  }

  test("once the lease ran out unrenewed, every operation fails with EIO, on descriptors opened before the loss too", { timeout: 90_000 }, async () => {
    const repo = "eio-clock.git";
    const volumeId = "rwo-eio-clock";
    await freshVolume(repo, volumeId);
    await stage(volumeId, repo);
    const target = await publish(volumeId, repo);
    const unchanged = await prepareFiles(target, volumeId);
    const actor = await startActor(target);
    actors.push(actor);

    const thaw = await freeze("git-worker");
    let outcome: Awaited<ReturnType<Actor["watch"]>>;
    try {
      outcome = await actor.watch();
    } finally {
      thaw();
    }
    allEio(outcome.results);
    await shellOpsFail(target);
    await unchanged();
    assert.match(volumeLogs(driver, volumeId), /the lease ran out unrenewed/);

    await actor.kill();
    await unpublish(volumeId);
    await unstage(volumeId);
    assert.deepEqual(await mountsOf(volumeId), []);
  });

  test(
    "once a renewal finds a successor's epoch on the owner ref, every operation fails with EIO before the lease would have run out, and the unstage leaves the successor's ownership",
    { timeout: 90_000 },
    async () => {
      const repo = "eio-successor.git";
      const volumeId = "rwo-eio-successor";
      await freshVolume(repo, volumeId);
      await stage(volumeId, repo);
      const target = await publish(volumeId, repo);
      const staged = await session(volumeId);
      const unchanged = await prepareFiles(target, volumeId);
      const actor = await startActor(target);
      actors.push(actor);
      const watching = actor.watch();

      // Another node's epoch takes the owner ref, by compare-and-swap against whatever record is there now.
      const { replaced, successor } = await takeOver(server, repo, volumeId);
      sameEpoch(replaced?.epoch, staged.epoch, "the record replaced was the mount's own");

      const outcome = await watching;
      allEio(outcome.results);
      assert.ok(
        outcome.lostAt < serveUntil(replaced!),
        `the mount stopped serving ${serveUntil(replaced!) - outcome.lostAt} ms before its lease would have let it: a renewal found the successor, not the clock`,
      );
      assert.match(volumeLogs(driver, volumeId), /was taken over by node node-other/);
      await shellOpsFail(target);
      await unchanged();
      // The lost epoch never wrote over the successor's record.
      const record = await ownerRecord(repo, volumeId);
      assert.equal(record?.node, "node-other");
      assert.equal(record?.epoch, successor.epoch);
      await refused(stage(volumeId, repo), status.FAILED_PRECONDITION, ["no longer holds"]);

      await actor.kill();
      await unpublish(volumeId);
      await unstage(volumeId);
      assert.deepEqual(await mountsOf(volumeId), []);
      const left = await ownerRecord(repo, volumeId);
      assert.equal(left?.epoch, successor.epoch, "the unstage did not clear the successor's ownership");
      assert.equal(left?.released, "false");
    },
  );
});

function capability(mode: csi.VolumeCapability_AccessMode_Mode): csi.VolumeCapability {
  return { mount: { fsType: "", mountFlags: [], volumeMountGroup: "" }, accessMode: { mode } };
}
