import assert from "node:assert/strict";
import * as fs from "node:fs/promises";
import { after, before, describe, test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { csi } from "@git-csi/protos";
import { createVolume, type Driver, freePort, metricsText, metricValue, report, setVolumeClass, sh, stageAndPublish, startDriver, unpublishAndUnstage, volumeLogs, waitFor } from "../src/driver";
import { type GitServer, startGitDaemon } from "../src/git-server";

const RWO = csi.VolumeCapability_AccessMode_Mode.SINGLE_NODE_MULTI_WRITER;
/** Spec 000's 90 s and 20 s, scaled down so the test can outwait a lease. */
const LEASE = { duration: "6s", renewInterval: "2s" };
const LEASE_MS = 6000;
const CLASS = { "push.quiesce": "2s", "push.maxLatency": "1h" };

describe("RWO ownership across two nodes (spec 000)", () => {
  let server: GitServer;
  let a: Driver;
  let b: Driver;
  const repo = "owned.git";

  before(async () => {
    server = await startGitDaemon();
    await server.createRepo(repo, { files: { "configuration.yaml": "a: 1\n" } });
    // Two nodes: their own state, node id and mount namespace, one remote.
    [a, b] = await Promise.all(
      ["node-a", "node-b"].map(async (nodeId) => startDriver({ nodeId, lease: LEASE, ownMountNamespace: true, metricsPort: await freePort(), ownerMetricsPort: await freePort() })),
    );
  });

  after(async () => {
    await Promise.all([a?.stop(), b?.stop()]);
    await server?.stop();
  });

  const onRemote = (file: string, ref = "main") => server.git(repo, "show", `${ref}:${file}`).catch(() => undefined);
  const ownerRecord = async (volumeId: string) => server.git(repo, "show", "-s", "--format=%B", `refs/git-csi/owner/${volumeId}`);
  const pids = async (driver: Driver) => Promise.all((["git-worker", "mount-owner", "csi-frontend"] as const).map((s) => driver.pid(s)));

  test("a node frozen past its lease is fenced: the new epoch's node serves and pushes, the old one's reads, writes and pushes fail, and it unstages cleanly", async () => {
    const volume = await createVolume(a, "rwo-takeover", server.url(repo), RWO);
    const onA = await stageAndPublish(a, volume, RWO, "app-a");
    await setVolumeClass(a, volume.volumeId, CLASS);
    assert.match(await ownerRecord(volume.volumeId), /node: node-a\n[\s\S]*access-mode: ReadWriteOnce\n[\s\S]*released: false/);

    await a.sh(`echo one > '${onA.targetPath}/one.txt'`);
    await waitFor("A's first write on the remote", () => onRemote("one.txt"));

    // A second write, then A freezes before its quiesce ends: that commit is made only after the takeover.
    await a.sh(`echo late > '${onA.targetPath}/late.txt'`);
    const frozen = await pids(a);
    for (const pid of frozen) process.kill(pid, "SIGSTOP");
    try {
      // B cannot take the volume while A's lease lasts.
      await assert.rejects(stageAndPublish(b, volume, RWO, "app-b"), /is held by node node-a/);
      await sleep(LEASE_MS + 1000);
      const onB = await stageAndPublish(b, volume, RWO, "app-b");
      await setVolumeClass(b, volume.volumeId, CLASS);
      assert.match(await ownerRecord(volume.volumeId), /node: node-b\n/);
      assert.equal(await b.sh(`cat '${onB.targetPath}/one.txt'`), "one\n");
      await b.sh(`echo from-b > '${onB.targetPath}/b.txt'`);
      await waitFor("B's write on the remote", () => onRemote("b.txt"));

      for (const pid of frozen) process.kill(pid, "SIGCONT");
      // A's mount: every read and write fails with EIO now.
      await assert.rejects(a.sh(`cat '${onA.targetPath}/one.txt'`), /Input\/output error/);
      await assert.rejects(a.sh(`echo stale > '${onA.targetPath}/stale.txt'`), /Input\/output error/);
      // A's worker commits the late write and tries to push it: refused, and said so.
      const refused = await waitFor(
        "A's push to be refused",
        async () => {
          const r = await report(a, volume.volumeId);
          return r.pushFailures > 0 && r.abnormal.some((x) => x.startsWith("the mount epoch does not hold the volume")) && r;
        },
        30_000,
      );
      assert.ok(refused.recentEvents.some((e) => e.reason === "GitVolumePushFailed"));
      const counted = await (await fetch(`${a.ownerMetricsUrl}/metrics`)).text();
      assert.match(counted, /git_csi_operations_total\{operation="stale_epoch_refused"\} [1-9]/);
      // The mount owner's listener is as clean as the worker's: promtool has nothing to say.
      assert.equal(await sh(`printf '%s' "$TEXT" | /usr/bin/promtool check metrics 2>&1`, { TEXT: counted }), "");

      // The remote holds all of B's commits and none of A's made after the takeover, on any ref.
      assert.equal(await onRemote("b.txt"), "from-b");
      assert.equal((await server.git(repo, "log", "--all", "--format=%H", "--", "late.txt", "stale.txt")).trim(), "");

      // A's unpublish and unstage complete, and never clear B's ownership.
      await unpublishAndUnstage(a, onA);
      assert.equal(await a.sh(`grep ' git-csi:${volume.volumeId} ' /proc/self/mountinfo || true`), "");
      assert.match(await ownerRecord(volume.volumeId), /node: node-b\n[\s\S]*released: false/);
      // A's acknowledged late write is not lost with A's node: its commit waits on a stranded ref, which moves no branch.
      const stranded = (await server.git(repo, "for-each-ref", "--format=%(refname)", `refs/git-csi/stranded/${volume.volumeId}/`)).trim();
      assert.match(stranded, new RegExp(`^refs/git-csi/stranded/${volume.volumeId}/[0-9a-f]{40}$`));
      assert.equal(await onRemote("late.txt", stranded), "late");
      assert.equal(await onRemote("late.txt"), undefined);
      assert.match(volumeLogs(a, volume.volumeId), /"reason":"GitVolumeStranded"/);

      // B goes on, then releases at its unstage.
      await b.sh(`echo again > '${onB.targetPath}/again.txt'`);
      await waitFor("B's next write on the remote", () => onRemote("again.txt"));
      await unpublishAndUnstage(b, onB);
      assert.match(await ownerRecord(volume.volumeId), /node: node-b\n[\s\S]*released: true/);

      // B's next stage brings A's stranded commit in, its next push lands it on main, and the stranded ref goes.
      const again = await stageAndPublish(b, volume, RWO, "app-b");
      await setVolumeClass(b, volume.volumeId, CLASS);
      assert.equal(await b.sh(`cat '${again.targetPath}/late.txt'`), "late\n");
      assert.equal(await b.sh(`cat '${again.targetPath}/again.txt'`), "again\n");
      await unpublishAndUnstage(b, again);
      assert.equal(await onRemote("late.txt"), "late");
      assert.equal((await server.git(repo, "for-each-ref", `refs/git-csi/stranded/${volume.volumeId}/`)).trim(), "");
    } finally {
      for (const pid of frozen) {
        try {
          process.kill(pid, "SIGCONT");
        } catch {
          // Gone.
        }
      }
    }
  });

  test("the access mode is bound to the owner ref: staging the volume with the other mode fails before service", async () => {
    const volume = await createVolume(a, "rwo-mode", server.url(repo), RWO);
    const onA = await stageAndPublish(a, volume, RWO, "mode-a");
    await unpublishAndUnstage(a, onA);
    // Node B has no state of the volume, and a static PersistentVolume names no mode: the owner ref on the remote refuses it.
    const staticVolume = { ...volume, volumeContext: { url: server.url(repo), ref: "main" } };
    await assert.rejects(stageAndPublish(b, staticVolume, csi.VolumeCapability_AccessMode_Mode.SINGLE_NODE_SINGLE_WRITER, "mode-b"), /recorded as ReadWriteOnce on the remote's owner ref/);
    assert.equal((await b.sh("grep -c ' git-csi:rwo-mode' /proc/self/mountinfo || true")).trim(), "0");
  });

  test("a lease that runs out while nothing is written turns the abnormal gauge, and the report says why", async () => {
    await server.createRepo("idle.git", { files: { "configuration.yaml": "a: 1\n" } });
    const volume = await createVolume(a, "rwo-idle", server.url("idle.git"), RWO);
    const onA = await stageAndPublish(a, volume, RWO, "app-idle");
    const gauge = async () => metricValue(await metricsText(a), "git_csi_volume_abnormal", volume.volumeId);
    await waitFor("the abnormal gauge at 0", async () => (await gauge()) === 0);
    // The remote goes away: every renewal fails, and no write comes that would push.
    const repoDir = server.repoPath("idle.git");
    await fs.rename(repoDir, `${repoDir}.away`);
    try {
      await waitFor("the abnormal gauge at 1", async () => (await gauge()) === 1, LEASE_MS * 2);
      assert.ok((await report(a, volume.volumeId)).abnormal.some((r) => /ran out unrenewed/.test(r)));
      await assert.rejects(a.sh(`cat '${onA.targetPath}/configuration.yaml'`), /Input\/output error/);
    } finally {
      await fs.rename(`${repoDir}.away`, repoDir);
    }
    await unpublishAndUnstage(a, onA);
  });
});
