import assert from "node:assert/strict";
import * as fs from "node:fs/promises";
import * as os from "node:os";
import * as path from "node:path";
import { after, before, describe, test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { csi } from "@git-csi/protos";
import { createVolume, type Driver, type DriverOptions, type PublishedVolume, setVolumeClass, stageAndPublish, startDriver, unpublishAndUnstage, waitFor } from "../src/driver";
import { type GitServer, startGitDaemon } from "../src/git-server";

// Spec 000: "Safety comes from quorum ordering and epoch checks, not a
// client's clock". Two standalone nodes on one remote, one of them with every
// clock it reads an hour off (libfaketime): the lease decides by each node's
// own monotonic clock, so the offset changes nothing.

const RWO = csi.VolumeCapability_AccessMode_Mode.SINGLE_NODE_MULTI_WRITER;
const LEASE = { duration: "8s", renewInterval: "2s" };
const LEASE_MS = 8000;
const RENEW_MS = 2000;
const CLASS = { "push.quiesce": "1s", "push.maxLatency": "1h" };
const RETENTION_MS = 10_000;
const ownerRef = (volumeId: string) => `refs/git-csi/owner/${volumeId}`;
const LIBFAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

describe("the lease trusts no node's wall clock", () => {
  let server: GitServer;
  const nodes: Driver[] = [];
  const frozen = new Set<number>();

  before(async () => {
    await fs.access(LIBFAKETIME).catch(() => assert.fail(`${LIBFAKETIME} is missing: install Debian's faketime (make apt does)`));
    server = await startGitDaemon();
  });

  after(async () => {
    for (const pid of frozen) process.kill(pid, "SIGCONT");
    await Promise.all(nodes.map((n) => n.stop()));
    await server?.stop();
  });

  async function node(nodeId: string, clockOffset?: string, clockFile?: string, collection: Pick<DriverOptions, "gcInterval" | "ownerRefRetention"> = {}): Promise<Driver> {
    const driver = await startDriver({ nodeId, lease: LEASE, ownMountNamespace: true, clockOffset, clockFile, ...collection });
    nodes.push(driver);
    return driver;
  }

  function freeze(pids: number[]): () => void {
    for (const pid of pids) {
      process.kill(pid, "SIGSTOP");
      frozen.add(pid);
    }
    return () => {
      for (const pid of pids) {
        process.kill(pid, "SIGCONT");
        frozen.delete(pid);
      }
    };
  }

  const onRemote = (repo: string, file: string) => server.git(repo, "show", `main:${file}`).catch(() => undefined);
  const ownerField = async (repo: string, volumeId: string, field: string) =>
    new RegExp(`^${field}: (\\S*)`, "m").exec(await server.git(repo, "show", "-s", "--format=%B", `refs/git-csi/owner/${volumeId}`))?.[1];
  const ownerNode = (repo: string, volumeId: string) => ownerField(repo, volumeId, "node");

  /** Stages on the node until a stage succeeds; when the successful attempt started, by this (true) clock. */
  async function takeOver(driver: Driver, volume: csi.Volume, pod: string, timeoutMs: number): Promise<{ startedAt: number; published: PublishedVolume }> {
    return waitFor(
      `node ${pod} to take the volume over`,
      async () => {
        const startedAt = Date.now();
        return stageAndPublish(driver, volume, RWO, pod).then((published) => ({ startedAt, published }));
      },
      timeoutMs,
    );
  }

  test("a taker whose clock is an hour ahead waits while the holder renews: the holder's writes all succeed and reach the remote, and once the holder freezes the taker has the volume within a lease and a renewal", async () => {
    const repo = "ahead.git";
    await server.createRepo(repo, { files: { "configuration.yaml": "a: 1\n" } });
    const a = await node("node-a");
    const b = await node("node-b-ahead", "+1h");
    const volume = await createVolume(a, "clock-ahead", server.url(repo), RWO);
    const onA = await stageAndPublish(a, volume, RWO, "app-a");
    await setVolumeClass(a, volume.volumeId, CLASS);

    // Two leases of A writing and B trying to stage: by B's clock A's records ran out an hour ago.
    const until = Date.now() + 2 * LEASE_MS;
    let writes = 0;
    let refusals = 0;
    while (Date.now() < until) {
      await a.sh(`echo ${writes} > '${onA.targetPath}/w${writes}.txt'`);
      writes++;
      await assert.rejects(stageAndPublish(b, volume, RWO, "app-b"), /is held by node node-a/);
      refusals++;
      await sleep(500);
    }
    assert.ok(refusals >= 4, `B tried ${refusals} times`);
    assert.equal(await ownerNode(repo, volume.volumeId), "node-a");
    for (let i = 0; i < writes; i++) await waitFor(`A's write w${i}.txt on the remote`, () => onRemote(repo, `w${i}.txt`));

    // A freezes whole: its renewals stop, and B takes the volume once it has watched a lease go by unchanged.
    const thaw = freeze(await Promise.all((["git-worker", "mount-owner", "csi-frontend"] as const).map((s) => a.pid(s))));
    const frozenAt = Date.now();
    const { published: onB } = await takeOver(b, volume, "app-b", 3 * LEASE_MS);
    const took = Date.now() - frozenAt;
    assert.ok(took <= LEASE_MS + RENEW_MS + 4000, `B took the volume ${took} ms after A froze: more than a lease and a renewal, and the time a stage takes`);
    assert.equal(await ownerNode(repo, volume.volumeId), "node-b-ahead");
    assert.equal(await b.sh(`cat '${onB.targetPath}/w${writes - 1}.txt'`), `${writes - 1}\n`);

    thaw();
    await assert.rejects(a.sh(`cat '${onA.targetPath}/w0.txt'`), /Input\/output error/);
    await unpublishAndUnstage(a, onA);
    await unpublishAndUnstage(b, onB);
  });

  /**
   * A's application writes on while A's git worker alone is paused (its
   * renewals stop, its mount owner serves on); `meanwhile` runs once the
   * worker is paused. B takes the volume over; every write A acknowledged
   * came before B's claim, and some came after the pause.
   */
  async function noWriteAfterTakeover(a: Driver, b: Driver, taker: string, repo: string, volumeId: string, meanwhile: () => Promise<void>): Promise<void> {
    await server.createRepo(repo, { files: { "configuration.yaml": "a: 1\n" } });
    const volume = await createVolume(a, volumeId, server.url(repo), RWO);
    const onA = await stageAndPublish(a, volume, RWO, "app-a");

    // Each acknowledged write is timed by this (true) clock.
    let lastAck = 0;
    let writing = true;
    const writer = (async () => {
      for (let i = 0; writing; i++) {
        const ok = await a.sh(`echo ${i} > '${onA.targetPath}/app.txt'`).then(
          () => true,
          () => false,
        );
        if (ok) lastAck = Date.now();
        await sleep(100);
      }
    })();
    try {
      await waitFor("a first acknowledged write", async () => lastAck > 0);
      const thaw = freeze([await a.pid("git-worker")]);
      const frozenAt = Date.now();
      await meanwhile();
      const { published: onB } = await takeOver(b, volume, "app-b", 3 * LEASE_MS);
      assert.equal(await ownerNode(repo, volumeId), taker);
      // B's clock is true: its record's time is when it decided to claim.
      const claimedAt = Number(await ownerField(repo, volumeId, "time"));
      assert.ok(lastAck > frozenAt, "A's mount served on after its worker paused, until its serving time");
      assert.ok(lastAck < claimedAt, `A acknowledged a write ${lastAck - claimedAt} ms after B's claim`);
      writing = false;
      await writer;
      thaw();
      await unpublishAndUnstage(a, onA);
      await unpublishAndUnstage(b, onB);
    } finally {
      writing = false;
      await writer;
    }
  }

  test("a collector whose clock is an hour ahead keeps the owner ref of a volume another node holds, and deletes a released one only after watching it unchanged for the retention", async () => {
    const repo = "collect-ahead.git";
    await server.createRepo(repo, { files: { "configuration.yaml": "a: 1\n" } });
    const a = await node("node-a-holds");
    const b = await node("node-b-collects", "+1h", undefined, { gcInterval: "1s", ownerRefRetention: `${RETENTION_MS / 1000}s` });
    const held = await createVolume(a, "collect-held", server.url(repo), RWO);
    const onA = await stageAndPublish(a, held, RWO, "app-a");
    // B's collection reaches a URL only while a volume of it is staged on B.
    const own = await createVolume(b, "collect-own", server.url(repo), RWO);
    const onB = await stageAndPublish(b, own, RWO, "app-b");
    const collections = () =>
      b
        .logs()
        .split("\n")
        .filter((l) => /"message":"collected [^"]*"/.test(l)).length;

    // By B's clock A's records are an hour old: two leases of B's collections must leave A's owner ref.
    const before = collections();
    const until = Date.now() + 2 * LEASE_MS;
    for (let i = 0; Date.now() < until; i++) {
      await a.sh(`echo ${i} > '${onA.targetPath}/w.txt'`);
      await sleep(500);
    }
    await waitFor("B's collections over two leases", async () => collections() >= before + 4);
    assert.equal(await ownerNode(repo, held.volumeId), "node-a-holds", "the held volume's owner ref stays");

    // Released, the owner ref goes once B has watched the released record for the retention, not at once.
    await unpublishAndUnstage(a, onA);
    const releasedAt = Date.now();
    await waitFor("the released owner ref collected", async () => (await server.git(repo, "for-each-ref", ownerRef(held.volumeId))).trim() === "", RETENTION_MS + 30_000);
    const after = Date.now() - releasedAt;
    assert.ok(after >= RETENTION_MS, `B deleted the released owner ref ${after} ms after the release, before the retention of ${RETENTION_MS} ms`);
    assert.equal(await ownerNode(repo, own.volumeId), "node-b-collects", "B's own volume keeps its owner ref");
    await unpublishAndUnstage(b, onB);
  });

  test("a holder whose clock is an hour behind, its worker alone paused: its mount refuses before the taker's claim, so no write is acknowledged on it after the takeover", async () => {
    const a = await node("node-a-behind", "-1h");
    const b = await node("node-b");
    await noWriteAfterTakeover(a, b, "node-b", "behind.git", "clock-behind", async () => undefined);
  });

  test("a holder whose wall clock steps an hour back after its renewals stopped still stops serving on time: its fence reads no wall clock", async () => {
    const clockFile = path.join(await fs.mkdtemp(path.join(os.tmpdir(), "git-csi-clock-")), "offset");
    await fs.writeFile(clockFile, "+0\n");
    const a = await node("node-a-steps", undefined, clockFile);
    const b = await node("node-b-steady");
    await noWriteAfterTakeover(a, b, "node-b-steady", "steps.git", "clock-steps", () => fs.writeFile(clockFile, "-1h\n"));
  });
});
