// NodeGetVolumeStats over the real CSI socket, as the kubelet calls it, with
// the three real services behind it, real FUSE mounts and real remotes: the
// bytes and inodes of the volume's tree, and its condition, abnormal with the
// cause in the message while a push fails or after the mount was fenced.
import assert from "node:assert/strict";
import * as fs from "node:fs/promises";
import * as path from "node:path";
import { after, before, describe, test } from "node:test";
import { status } from "@grpc/grpc-js";
import { call, csi } from "@git-csi/protos";
import { createVolume, type Driver, type PublishedVolume, refused, run, setVolumeClass, stageAndPublish, startDriver, unpublishAndUnstage, waitFor } from "../src/driver";
import { type GitDaemon, startGitDaemon } from "../src/git-server";

const T = 60_000;
const { BYTES, INODES } = csi.VolumeUsage_Unit;
const FAST = { "push.quiesce": "1s", "push.maxLatency": "1m" };
/** Long enough for a push to fail and land again before the lease runs out; short enough to outwait it. */
const LEASE = { duration: "20s", renewInterval: "4s" };
const NODE = "health-node";

/** GNU du's count of a directory: allocated bytes and inodes. */
async function du(dir: string): Promise<{ bytes: number; inodes: number }> {
  const first = async (flag: string) => Number((await run("du", ["-s", flag, dir])).stdout.split("\t")[0]);
  return { bytes: await first("-B1"), inodes: await first("--inodes") };
}

describe("volume health: NodeGetVolumeStats on the CSI socket", () => {
  let home: GitDaemon;
  let away: GitDaemon;
  let driver: Driver;
  let served: PublishedVolume;
  let fenced: PublishedVolume;

  before(async () => {
    // Two remotes: the one that stays away fences only its own volume.
    [home, away] = await Promise.all([startGitDaemon(), startGitDaemon()]);
    await home.createRepo("home.git", { files: { "configuration.yaml": "name: home\n" } });
    await away.createRepo("away.git", { files: { "configuration.yaml": "name: away\n" } });
    driver = await startDriver({ nodeId: NODE, lease: LEASE });
    served = await stageAndPublish(driver, await createVolume(driver, "health-served", home.url("home.git")), undefined, "served");
    fenced = await stageAndPublish(driver, await createVolume(driver, "health-fenced", away.url("away.git")), undefined, "fenced");
    for (const v of [served, fenced]) await setVolumeClass(driver, v.volumeId, FAST);
  });

  after(async () => {
    for (const v of [served, fenced]) if (v) await unpublishAndUnstage(driver, v).catch(() => undefined);
    await driver?.stop();
    await Promise.all([home?.stop(), away?.stop()]);
  });

  const stats = (volumeId: string, volumePath: string, stagingTargetPath = ""): Promise<csi.NodeGetVolumeStatsResponse> =>
    call(driver.node.nodeGetVolumeStats.bind(driver.node), { volumeId, volumePath, stagingTargetPath }, T);

  /** The usage of one unit, which every answer carries. */
  const usage = (response: csi.NodeGetVolumeStatsResponse, unit: csi.VolumeUsage_Unit): csi.VolumeUsage => {
    const found = response.usage.find((u) => u.unit === unit);
    assert.ok(found, `the answer carries ${csi.VolumeUsage_Unit[unit]}: ${JSON.stringify(response.usage)}`);
    return found;
  };

  /** Waits for the volume's condition to satisfy `holds`. */
  const condition = (what: string, volume: PublishedVolume, holds: (c: csi.VolumeCondition) => boolean) =>
    waitFor(
      what,
      async () => {
        const c = (await stats(volume.volumeId, volume.targetPath)).volumeCondition;
        return c !== undefined && holds(c) && c;
      },
      T,
    );

  test("the tree's bytes and inodes, as du counts them, move with the application's writes; the room is the node filesystem's", async () => {
    const tree = path.join(driver.stateDir, "trees", served.volumeId);
    const first = await stats(served.volumeId, served.targetPath);
    await driver.sh(`mkdir '${served.targetPath}/blobs' && for i in 1 2 3 4 5; do head -c 20000 /dev/urandom > '${served.targetPath}/blobs/'$i.bin; done`);
    // Six inodes more: the directory and its five files.
    const moved = await waitFor("the stats to count the writes as du does", async () => {
      const now = await stats(served.volumeId, served.targetPath);
      const counted = { bytes: usage(now, BYTES).used, inodes: usage(now, INODES).used };
      return counted.inodes === usage(first, INODES).used + 6 && JSON.stringify(counted) === JSON.stringify(await du(tree)) && now;
    });
    assert.ok(usage(moved, BYTES).used >= usage(first, BYTES).used + 100_000, `${usage(moved, BYTES).used} bytes count the 100,000 written`);
    const room = await fs.statfs(tree);
    assert.equal(usage(moved, BYTES).total, room.blocks * room.bsize);
    assert.equal(usage(moved, INODES).total, room.files);
    for (const unit of [BYTES, INODES]) assert.ok(usage(moved, unit).available > 0 && usage(moved, unit).available <= usage(moved, unit).total);
    assert.deepEqual(moved.volumeCondition, { abnormal: false, message: "normal: the mount epoch holds the volume and the git worker reports nothing wrong" });
    // The staging path names the same volume.
    const staged = await stats(served.volumeId, served.stagingPath, served.stagingPath);
    assert.deepEqual([usage(staged, BYTES).used, usage(staged, INODES).used], [usage(moved, BYTES).used, usage(moved, INODES).used]);
  });

  test("a remote that is down: abnormal naming the failed push, normal again once the remote is back and the push lands", async () => {
    await home.down();
    try {
      await driver.sh(`echo unsent > '${served.targetPath}/unsent.txt'`);
      const down = await condition("abnormal naming the push", served, (c) => c.abnormal);
      assert.match(down.message, new RegExp(`^the last push failed: .*cannot connect to 127\\.0\\.0\\.1:${home.port}`));
    } finally {
      await home.up();
    }
    const back = await condition("normal again", served, (c) => !c.abnormal);
    assert.match(back.message, /^normal/);
    assert.equal(await home.git("home.git", "show", "main:unsent.txt"), "unsent");
  });

  test("a lease that ran out unrenewed: abnormal naming the fence, the tree still counted", async () => {
    await away.down();
    try {
      const lost = await condition("abnormal naming the fence", fenced, (c) => c.abnormal && c.message.startsWith("fenced"));
      assert.match(lost.message, /^fenced: the mount epoch no longer holds the volume \(the lease ran out unrenewed\); every read and write of its mount fails with EIO/);
    } finally {
      await away.up();
    }
    // A fence is for good: the remote's return does not serve the mount again.
    await assert.rejects(driver.sh(`cat '${fenced.targetPath}/configuration.yaml'`), /Input\/output error/);
    const counted = await stats(fenced.volumeId, fenced.targetPath);
    assert.match(counted.volumeCondition!.message, /^fenced/);
    assert.equal(usage(counted, INODES).used, (await du(path.join(driver.stateDir, "trees", fenced.volumeId))).inodes);
  });

  test("NotFound: an unknown volume, a path where the volume is neither staged nor published, a staging path it is not staged at", async () => {
    await refused(stats("health-unknown", served.targetPath), status.NOT_FOUND, "volume health-unknown is neither staged nor published at");
    await refused(stats(served.volumeId, "/var/lib/kubelet/pods/other/volume"), status.NOT_FOUND, `volume ${served.volumeId} is neither staged nor published at /var/lib/kubelet/pods/other/volume`);
    await refused(stats(served.volumeId, "some/path"), status.NOT_FOUND, "neither staged nor published at some/path");
    await refused(stats(served.volumeId, served.targetPath, "/var/lib/kubelet/staging/other"), status.NOT_FOUND, `volume ${served.volumeId} is not staged at /var/lib/kubelet/staging/other`);
  });

  test("NotFound once the volume is unpublished and unstaged", async () => {
    const gone = await stageAndPublish(driver, await createVolume(driver, "health-gone", home.url("home.git")), undefined, "gone");
    assert.equal((await stats(gone.volumeId, gone.targetPath)).volumeCondition?.abnormal, false);
    await unpublishAndUnstage(driver, gone);
    await refused(stats(gone.volumeId, gone.targetPath), status.NOT_FOUND, "neither staged nor published");
    await refused(stats(gone.volumeId, gone.stagingPath), status.NOT_FOUND, "neither staged nor published");
  });

  test("InvalidArgument naming the empty field", async () => {
    await refused(stats("", served.targetPath), status.INVALID_ARGUMENT, "volume_id is required");
    await refused(stats(served.volumeId, ""), status.INVALID_ARGUMENT, "volume_path is required");
  });

  test("a condition the git worker cannot tell is an error, never normal", async () => {
    const worker = await driver.pid("git-worker");
    process.kill(worker, "SIGSTOP");
    try {
      await refused(stats(served.volumeId, served.targetPath), status.DEADLINE_EXCEEDED, `volume ${served.volumeId}: the git worker could not tell the volume's condition`);
    } finally {
      process.kill(worker, "SIGCONT");
    }
    await condition("normal once the worker answers", served, (c) => !c.abnormal);
  });

  test("a node plugin replaced without its FUSE connections: abnormal, naming that no mount serves the volume", async () => {
    const { dir } = driver;
    await driver.stop();
    driver = await startDriver({ dir, nodeId: NODE, lease: LEASE });
    const gone = await condition("abnormal naming the missing mount", served, (c) => c.abnormal);
    assert.match(gone.message, /^not served: the mount owner restarted and serves no mount of the volume on this node/);
  });
});
