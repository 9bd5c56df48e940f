// Issue 11: no acknowledged write is ever lost. A temp file that vanishes
// while a commit hashes a large file, and an unstage over a tree whose commit
// cannot be written, on the real services with a real git daemon.
import assert from "node:assert/strict";
import * as fs from "node:fs/promises";
import * as path from "node:path";
import { after, describe, test } from "node:test";
import { call } from "@git-csi/protos";
import { status } from "@grpc/grpc-js";
import { createVolume, type Driver, metricsText, metricValue, reasons, report, run, setVolumeClass, sh, stageAndPublish, volumeLogs, waitFor } from "../src/driver";
import type { GitServer } from "../src/git-server";
import { withDaemonAndDriver } from "../src/fixtures";

// Correctness, not speed: a 200 MB push on a busy 2-core machine takes its time.
const T = 300_000;

/** Waits until a git command stages paths in this volume's tree (update-index, or add of the pathspec file): the commit is staging now. */
async function whileStaging(driver: Driver, volumeId: string): Promise<void> {
  const tree = `GIT_WORK_TREE=${path.join(driver.stateDir, "trees", volumeId)}`;
  await waitFor(
    "the commit's staging",
    async () => {
      for (const pid of await fs.readdir("/proc")) {
        if (!/^\d+$/.test(pid)) continue;
        const argv = (await fs.readFile(`/proc/${pid}/cmdline`, "utf8").catch(() => "")).split("\0");
        if (!argv.includes("update-index") && !argv.includes("add")) continue;
        const env = await fs.readFile(`/proc/${pid}/environ`, "utf8").catch(() => "");
        if (env.split("\0").includes(tree)) return true;
      }
      return false;
    },
    60_000,
  );
}

describe("no acknowledged write is lost", () => {
  let server: GitServer;
  let driver: Driver;
  let n = 0;

  withDaemonAndDriver((s, d) => {
    server = s;
    driver = d;
  });

  after(async () => {
    // The 200 MB file's tree and objects: later tests that read /tmp need not wade through them.
    if (driver) await fs.rm(driver.dir, { recursive: true, force: true });
  });

  async function volumeOn(): Promise<{ repo: string; volume: Awaited<ReturnType<typeof stageAndPublish>> }> {
    const repo = `lost-${++n}.git`;
    await server.createRepo(repo, { files: { "configuration.yaml": "name: home\n" } });
    const created = await createVolume(driver, `lost-${n}`, server.url(repo));
    return { repo, volume: await stageAndPublish(driver, created, undefined, `lost-pod-${n}`) };
  }

  test("a temp file removed while the commit hashes a large file is a deletion, and every other path is committed and pushed", async () => {
    const { repo, volume } = await volumeOn();
    await setVolumeClass(driver, volume.volumeId, { "push.quiesce": "1s", "push.maxLatency": "1m", "commit.maxFileSize": "1Gi" });
    const t = volume.targetPath;
    await sh(`head -c 200000000 /dev/urandom > '${t}/big.bin' && echo t > '${t}/t.tmp'`);
    await whileStaging(driver, volume.volumeId);
    await sh(`rm '${t}/t.tmp' && echo b > '${t}/b.txt'`);
    await waitFor("b.txt pushed", () => server.git(repo, "show", "main:b.txt").catch(() => undefined), T).catch((err: Error) => {
      throw new Error(`${err.message}\n${volumeLogs(driver, volume.volumeId)}`);
    });
    assert.equal(await server.git(repo, "cat-file", "-s", "main:big.bin"), "200000000");
    assert.equal(await server.git(repo, "ls-tree", "--name-only", "main", "t.tmp"), "", "the vanished temp file is not committed");
    const settled = await waitFor(
      "nothing pending",
      async () => {
        const r = await report(driver, volume.volumeId);
        return r.pendingPaths.length === 0 && r.unpushedCommits === 0 && r;
      },
      T,
    );
    assert.deepEqual(settled.abnormal, []);
    assert.doesNotMatch(volumeLogs(driver, volume.volumeId), /sync failed/);
    await call(driver.node.nodeUnpublishVolume.bind(driver.node), { volumeId: volume.volumeId, targetPath: volume.targetPath }, T);
    await call(driver.node.nodeUnstageVolume.bind(driver.node), { volumeId: volume.volumeId, stagingTargetPath: volume.stagingPath }, T);
  });

  test("an unstage over writes no commit can take fails, keeps them, and succeeds once they are committed", async () => {
    const { repo, volume } = await volumeOn();
    await setVolumeClass(driver, volume.volumeId, { "push.quiesce": "1h", "push.maxLatency": "2h" });
    await sh(`echo kept > '${volume.targetPath}/kept.txt'`);
    await waitFor("kept.txt pending", async () => (await report(driver, volume.volumeId)).pendingPaths.includes("kept.txt"));
    // An object store git cannot write: a read-only bind mount over it, which root cannot write either.
    // The volume's own repository: the one whose worktrees name the volume.
    const repos = path.join(driver.stateDir, "repos");
    const owners = await Promise.all((await fs.readdir(repos)).map(async (r) => ((await fs.stat(path.join(repos, r, "worktrees", volume.volumeId)).catch(() => undefined)) ? r : undefined)));
    const objects = path.join(repos, owners.find(Boolean)!, "objects");
    await run("mount", ["--bind", objects, objects]);
    await run("mount", ["-o", "remount,ro,bind", objects]);
    try {
      await call(driver.node.nodeUnpublishVolume.bind(driver.node), { volumeId: volume.volumeId, targetPath: volume.targetPath }, T);
      const unstage = () => call(driver.node.nodeUnstageVolume.bind(driver.node), { volumeId: volume.volumeId, stagingTargetPath: volume.stagingPath }, T);
      await assert.rejects(unstage(), (err: { code: number; message: string }) => {
        assert.equal(err.code, status.UNAVAILABLE);
        assert.match(err.message, /1 written path\(s\) could not be committed/);
        assert.match(err.message, /git .*: .*(Read-only file system|insufficient permission|unable to)/i);
        return true;
      });
      const r = await report(driver, volume.volumeId);
      assert.deepEqual(r.pendingPaths, ["kept.txt"], "the failed commit forgets no path");
      assert.ok(
        r.abnormal.some((a) => a.startsWith("the last commit failed")),
        r.abnormal.join("\n"),
      );
      assert.ok(reasons(r).includes("GitVolumeCommitFailed"));
      assert.equal(metricValue(await metricsText(driver), "git_csi_volume_abnormal", volume.volumeId), 1);
      // The kubelet retries: still refused while the store is unwritable.
      await assert.rejects(unstage(), (err: { code: number }) => err.code === status.UNAVAILABLE);
      await run("umount", [objects]);
      await unstage();
    } finally {
      await run("umount", [objects]).catch(() => undefined);
    }
    assert.equal(await server.git(repo, "show", "main:kept.txt"), "kept");
  });
});
