// A mount owner that restarts keeps every FUSE connection: the descriptor
// keeper holds each /dev/fuse descriptor, the restarted mount owner takes them
// back and serves on. An application fsyncs a line every 4 ms through the
// mount while the mount owner is killed (SIGKILL) or stopped (SIGTERM) again
// and again, restarted each time by the launcher, as a kubelet would.
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import * as path from "node:path";
import { describe, test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { status } from "@grpc/grpc-js";
import { call, type CsiError } from "@git-csi/protos";
import { createVolume, type Driver, mountsUnder, type PublishedVolume, setVolumeClass, sh, stageAndPublish, unpublishAndUnstage, waitFor } from "../src/driver";
import { withDaemonAndDriver } from "../src/fixtures";
import { forgeMerge, type GitServer } from "../src/git-server";

/**
 * The application, a process of its own: appends "line N" with one write and
 * an fsync every 4 ms until SIGTERM, then prints the lines it saw written
 * (acknowledged) and every error it met.
 */
const WRITER = `
import json, os, signal, sys, time
stop = False
def on_term(*_):
    global stop
    stop = True
signal.signal(signal.SIGTERM, on_term)
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
acked, errors, i = [], [], 0
while not stop:
    try:
        os.write(fd, b"line %d\\n" % i)
        os.fsync(fd)
        acked.append(i)
    except OSError as e:
        errors.append("line %d: %s" % (i, e))
    i += 1
    time.sleep(0.004)
print(json.dumps({"acked": acked, "errors": errors}))
`;

const RESTARTS = 20;
const T = 120_000;

interface Written {
  acked: number[];
  errors: string[];
}

function startWriter(file: string): { stop(): Promise<Written> } {
  const writer = spawn("python3", ["-c", WRITER, file], { stdio: ["ignore", "pipe", "pipe"] });
  let out = "";
  let err = "";
  writer.stdout.on("data", (c: Buffer) => (out += c.toString()));
  writer.stderr.on("data", (c: Buffer) => (err += c.toString()));
  const exited = new Promise<void>((resolve) => writer.once("exit", () => resolve()));
  return {
    stop: async () => {
      writer.kill("SIGTERM");
      await exited;
      if (!out.trim()) throw new Error(`the writer printed nothing: ${err}`);
      return JSON.parse(out) as Written;
    },
  };
}

describe("a mount owner restart keeps the mounts", () => {
  let server: GitServer;
  let driver: Driver;

  withDaemonAndDriver((s, d) => {
    server = s;
    driver = d;
  });

  /** How many times a mount owner served a kept connection again, from the services' logs. */
  function resumes(): number {
    return driver
      .logs()
      .split("\n")
      .filter((l) => l.includes("the FUSE connection serves again")).length;
  }

  /** Restarts the mount owner with signal, waiting each time until the new one serves the kept connection. */
  async function restartOwner(signal: NodeJS.Signals, times: number): Promise<void> {
    for (let i = 0; i < times; i++) {
      const before = resumes();
      const pid = await driver.pid("mount-owner");
      process.kill(pid, signal);
      await waitFor("a new mount owner", async () => (await driver.pid("mount-owner")) !== pid, T);
      await waitFor("the new mount owner serving the kept connection", async () => resumes() > before, T);
      // Some writes served by this one before the next restart.
      await sleep(200);
    }
  }

  /** The git worker and the mount owner killed at once: the restarted mount owner hands the new worker the volume as it resumes. */
  async function killWorkerAndOwner(): Promise<void> {
    const before = resumes();
    const worker = await driver.pid("git-worker");
    const owner = await driver.pid("mount-owner");
    process.kill(worker, "SIGKILL");
    process.kill(owner, "SIGKILL");
    const outcome = await waitFor("the kept connection served again, or its epoch lost", async () => (resumes() > before ? "served" : driver.logs().includes("it serves only EIO") && "lost"), T);
    assert.equal(outcome, "served", "the epoch was checked and the connection serves again");
  }

  /** The volume armed, its writes pushed within a second of quiet. */
  async function armedVolume(name: string): Promise<PublishedVolume> {
    await server.createRepo(`${name}.git`);
    const volume = await createVolume(driver, name, server.url(`${name}.git`));
    const published = await stageAndPublish(driver, volume, undefined, name);
    await setVolumeClass(driver, volume.volumeId, { "push.quiesce": "1s", "push.maxLatency": "1m" });
    return published;
  }

  /** Every acknowledged line is on the remote's branch, in order. */
  async function assertPushed(name: string, written: Written): Promise<void> {
    const expected = written.acked.map((i) => `line ${i}`);
    const remoteLines = await waitFor(
      "every acknowledged line on the remote",
      async () => {
        const lines = (await server.git(`${name}.git`, "show", "main:log.txt").catch(() => "")).split("\n").filter(Boolean);
        const present = new Set(lines);
        return expected.every((l) => present.has(l)) && lines;
      },
      T,
    );
    // A write that failed at a kill may have reached the tree: lines beyond the acknowledged ones are the failed ones at most.
    assert.ok(remoteLines.length - expected.length <= written.errors.length, `${remoteLines.length} lines on the remote, ${expected.length} acknowledged, ${written.errors.length} failed`);
  }

  /** An application writes while the mount owner is restarted RESTARTS times by signal; what it saw, printed. */
  async function writeThroughRestarts(name: string, signal: NodeJS.Signals): Promise<{ published: PublishedVolume; written: Written }> {
    const published = await armedVolume(name);
    const writer = startWriter(path.join(published.targetPath, "log.txt"));
    await sleep(500);
    await restartOwner(signal, RESTARTS);
    const written = await writer.stop();
    console.log(`${signal} x${RESTARTS}: ${written.acked.length} lines acknowledged, ${written.errors.length} failed operations${written.errors.length ? `: ${written.errors.join("; ")}` : ""}`);
    assert.ok(written.acked.length > RESTARTS * 10, "the application wrote throughout");
    return { published, written };
  }

  test(`SIGKILL of the mount owner ${RESTARTS} times while an application fsyncs every 4 ms: at most one failed operation per kill, every acknowledged line pushed`, async () => {
    const { published, written } = await writeThroughRestarts("killed", "SIGKILL");
    assert.ok(written.errors.length <= RESTARTS, `at most one failed operation per kill: ${written.errors.join("; ")}`);
    await assertPushed("killed", written);
    await unpublishAndUnstage(driver, published);
  });

  test(`SIGTERM of the mount owner ${RESTARTS} times (a graceful upgrade) while an application fsyncs every 4 ms: no operation fails`, async () => {
    const { published, written } = await writeThroughRestarts("stopped", "SIGTERM");
    assert.deepEqual(written.errors, []);
    await assertPushed("stopped", written);
    await unpublishAndUnstage(driver, published);
    assert.deepEqual(await mountsUnder(driver.dir), []);
  });

  // Until a restarted mount owner serves a kept connection again, pages written to it wait in the kernel: the git worker must not move the tree.
  test("SyncMount answers UNAVAILABLE while a kept connection waits for its epoch check, and syncs the mount once it serves again", async () => {
    const published = await armedVolume("sync-resume");
    const volumeId = published.volumeId;
    const sync = () => call(driver.owner.syncMount.bind(driver.owner), { volumeId }, 2000);
    assert.equal((await sync()).mounted, true);
    // A stopped worker cannot check the epoch, so the restarted mount owner cannot serve the connection yet.
    const worker = await driver.pid("git-worker");
    process.kill(worker, "SIGSTOP");
    try {
      const before = resumes();
      const pid = await driver.pid("mount-owner");
      process.kill(pid, "SIGTERM");
      await waitFor("a new mount owner", async () => (await driver.pid("mount-owner")) !== pid, T);
      const refused = await waitFor(
        "SyncMount refused while the connection waits",
        async () => {
          const err = await sync().then(
            () => undefined,
            (e: CsiError) => e,
          );
          // Before its socket serves, the new mount owner is UNAVAILABLE for another reason.
          return err?.code === status.UNAVAILABLE && /not served yet/.test(err.message) && err;
        },
        T,
      );
      assert.match(refused.message, /kept across the mount owner's restart, is not served yet/);
      assert.equal(resumes(), before, "the connection is not served yet");
    } finally {
      process.kill(worker, "SIGCONT");
    }
    await waitFor("SyncMount syncs the served mount", async () => (await sync().catch(() => undefined))?.mounted === true, T);
    await unpublishAndUnstage(driver, published);
  });

  // The restarted worker knows no volume: the resume hands it the volume, and that claim must not wait for a sync of the very mount waiting for it.
  test("the git worker and the mount owner killed together while upstream moved: the kept connection serves again, and the next push lands on upstream's commit", async () => {
    const repo = "both-killed.git";
    const published = await armedVolume("both-killed");
    const onMain = (file: string) => server.git(repo, "show", `main:${file}`).catch(() => "");
    await sh(`echo one > '${published.targetPath}/one.txt'`);
    await waitFor("one.txt on the remote", async () => (await onMain("one.txt")) === "one", T);
    await server.commitFiles(repo, { "upstream.txt": "upstream\n" });
    await killWorkerAndOwner();
    assert.equal(await sh(`cat '${published.targetPath}/one.txt'`), "one\n");
    await sh(`echo two > '${published.targetPath}/two.txt'`);
    await waitFor("two.txt on the remote", async () => (await onMain("two.txt")) === "two", T);
    assert.equal(await onMain("upstream.txt"), "upstream", "upstream's commit is kept under the push");
    await unpublishAndUnstage(driver, published);
  });

  // The same hand-over with the volume on its side branch, merged on the forge meanwhile: the heal moves the tree, so it waits for the next push.
  test("the git worker and the mount owner killed together after the side branch was merged: the kept connection serves again, and the next push heals", async () => {
    const repo = "both-killed-side.git";
    const published = await armedVolume("both-killed-side");
    const side = `main.${published.volumeId}`;
    const onBranch = (branch: string, file: string) => server.git(repo, "show", `${branch}:${file}`).catch(() => "");
    await sh(`echo 'name: home' > '${published.targetPath}/configuration.yaml'`);
    await waitFor("configuration.yaml on the remote", async () => (await onBranch("main", "configuration.yaml")) === "name: home", T);
    await server.commitFiles(repo, { "configuration.yaml": "name: upstream\n" });
    await sh(`echo 'name: pod' > '${published.targetPath}/configuration.yaml'`);
    await waitFor("the side branch", async () => (await onBranch(side, "configuration.yaml")) === "name: pod", T);
    await forgeMerge(server, repo, side, "merge");
    await killWorkerAndOwner();
    await sh(`echo after > '${published.targetPath}/after.txt'`);
    await waitFor("after.txt on main", async () => (await onBranch("main", "after.txt")) === "after", T);
    assert.equal(await onBranch("main", "configuration.yaml"), "name: pod", "the merge kept the pod's file");
    assert.equal(await server.git(repo, "for-each-ref", "--format=%(refname)", `refs/heads/${side}`), "", "the healed side branch is deleted");
    await unpublishAndUnstage(driver, published);
  });

  test("a descriptor keeper that restarted is told every connection again: a mount owner killed after it keeps the mount", async () => {
    const published = await armedVolume("rekept");
    // A mount owner just started: the keeper restarts before its first look at the keeper's socket.
    await restartOwner("SIGKILL", 1);
    const keeper = await driver.pid("fd-keeper");
    process.kill(keeper, "SIGKILL");
    await waitFor("a new keeper", async () => (await driver.pid("fd-keeper")) !== keeper, T);
    await waitFor("the new keeper told every connection", async () => driver.logs().includes("the FUSE descriptor keeper restarted; telling it"), T);
    const writer = startWriter(path.join(published.targetPath, "log.txt"));
    await sleep(500);
    await restartOwner("SIGKILL", 1);
    const written = await writer.stop();
    assert.ok(written.errors.length <= 1, `at most one failed operation for the kill: ${written.errors.join("; ")}`);
    await assertPushed("rekept", written);
    await unpublishAndUnstage(driver, published);
  });
});

describe("an epoch lost while the mount owner was away", () => {
  let server: GitServer;
  let driver: Driver;

  withDaemonAndDriver(
    (s, d) => {
      server = s;
      driver = d;
    },
    { lease: { duration: "3s", renewInterval: "1s" } },
  );

  test("is never served again: the kept connection answers EIO, and unpublish and unstage clear it", async () => {
    await server.createRepo("lapsed.git");
    const volume = await createVolume(driver, "lapsed", server.url("lapsed.git"));
    const published = await stageAndPublish(driver, volume);
    await sh(`echo before > '${published.targetPath}/kept.txt'`);
    // Stopped for longer than the lease, then killed: the restarted mount owner finds the epoch ran out unrenewed.
    const pid = await driver.pid("mount-owner");
    process.kill(pid, "SIGSTOP");
    await sleep(4500);
    process.kill(pid, "SIGKILL");
    await waitFor("the kept connection resumed with its epoch lost", async () => driver.logs().includes("its epoch no longer holds the volume: it serves only EIO"), T);
    await assert.rejects(sh(`cat '${published.targetPath}/kept.txt'`), /Input\/output error/);
    await waitFor("Probe ready", async () => (await call(driver.identity.probe.bind(driver.identity), {}, 1000)).ready);
    await unpublishAndUnstage(driver, published);
    assert.deepEqual(await mountsUnder(driver.dir), []);
  });
});
