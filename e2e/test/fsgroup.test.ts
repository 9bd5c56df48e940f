import assert from "node:assert/strict";
import * as fs from "node:fs/promises";
import * as path from "node:path";
import { after, before, describe, test } from "node:test";
import { status } from "@grpc/grpc-js";
import { call, csi, CsiError } from "@git-csi/protos";
import { createVolume, type Driver, mountCapability, publish, SINGLE_NODE_WRITER, setVolumeClass, sh, stageAndPublish, startDriver, unpublishAndUnstage, waitFor } from "../src/driver";
import { type GitServer, startGitDaemon } from "../src/git-server";

// A non-root application, the Kubernetes way: the node advertises
// VOLUME_MOUNT_GROUP (spine.test.ts), the kubelet passes the pod's fsGroup as
// volume_mount_group, and the driver applies it to the backing tree; the
// application's process (uid 1000, supplementary group 1000) writes through the
// real FUSE mount as itself, and its files reach the remote and a restore.

const FAST = { "push.quiesce": "1s", "push.maxLatency": "1m" };
const APP = "setpriv --reuid=1000 --regid=3000 --groups=1000 sh -c";
const T = 60_000;

describe("fsGroup: volume_mount_group on the backing tree, a uid-1000 application", () => {
  let server: GitServer;
  let driver: Driver;

  before(async () => {
    server = await startGitDaemon();
    driver = await startDriver();
    // A pod's uid reaches its volume through the kubelet's directories, which are searchable.
    await fs.chmod(driver.dir, 0o755);
  });

  after(async () => {
    await driver?.stop();
    await server?.stop();
  });

  const treeOf = (volumeId: string) => path.join(driver.stateDir, "trees", volumeId);
  const remoteFile = (repo: string, file: string) => server.git(repo, "show", `main:${file}`).catch(() => undefined);

  test("a uid-1000 process creates, reopens, appends, chmods and renames; the files are its own, reach the remote, and come back on a restore", async () => {
    await server.createRepo("app.git", { files: { "config.yaml": "a: 1\n", "sub/existing.txt": "x\n" } });
    const volume = await stageAndPublish(driver, await createVolume(driver, "app", server.url("app.git")), undefined, "app", {}, "1000");
    await setVolumeClass(driver, volume.volumeId, FAST);
    const tree = treeOf(volume.volumeId);

    // The kubelet's rules: group 1000 with g+rw everywhere, directories setgid and searchable.
    const root = await fs.lstat(tree);
    assert.deepEqual([root.gid, root.mode & 0o2070], [1000, 0o2070]);
    const existing = await fs.lstat(path.join(tree, "sub/existing.txt"));
    assert.deepEqual([existing.gid, existing.mode & 0o060], [1000, 0o060]);
    assert.equal((await fs.lstat(path.join(tree, "sub"))).mode & 0o2070, 0o2070);

    const t = volume.targetPath;
    await sh(
      `${APP} 'umask 022 && mkdir "$T/data" && echo one > "$T/data/new.txt" && echo two >> "$T/data/new.txt" && chmod 0640 "$T/data/new.txt" && mv "$T/data/new.txt" "$T/data/kept.txt" && echo b: 2 >> "$T/config.yaml"'`,
      { T: t },
    );
    assert.equal(await sh(`${APP} 'cat "$T/data/kept.txt"'`, { T: t }), "one\ntwo\n");
    for (const [name, mode] of [
      ["data", 0o2755],
      ["data/kept.txt", 0o640],
    ] as const) {
      const stat = await fs.lstat(path.join(tree, name));
      assert.deepEqual([stat.uid, stat.gid, stat.mode & 0o7777], [1000, 1000, mode], name);
    }
    assert.equal(await sh(`stat -c '%u %g %a' '${t}/data/kept.txt'`), "1000 1000 640\n");

    await waitFor(
      "the application's files on the remote",
      async () => (await remoteFile("app.git", "data/kept.txt")) === "one\ntwo" && (await remoteFile("app.git", "config.yaml")) === "a: 1\nb: 2",
    ).catch((err) => {
      console.error(driver.logs().split("\n").slice(-40).join("\n"));
      throw err;
    });
    await waitFor("their owner in the metadata ref", async () =>
      (await server.git("app.git", "log", "-1", "-p", "refs/git-csi/metadata").catch(() => "")).includes('"name":"kept.txt","type":"file","mode":416,"uid":1000,"gid":1000'),
    );
    await unpublishAndUnstage(driver, volume);

    const restored = await stageAndPublish(driver, await createVolume(driver, "app-restored", server.url("app.git")), undefined, "app-restored", {}, "1000");
    const kept = await fs.lstat(path.join(treeOf(restored.volumeId), "data/kept.txt"));
    assert.deepEqual([kept.uid, kept.gid, kept.mode & 0o7777], [1000, 1000, 0o640]);
    assert.equal(await sh(`${APP} 'echo three >> "$T/data/kept.txt" && cat "$T/data/kept.txt"'`, { T: restored.targetPath }), "one\ntwo\nthree\n");
    await unpublishAndUnstage(driver, restored);
  });

  test("a tree whose root already matches is left alone; a second pod of an RWO volume with another fsGroup is refused", async () => {
    await server.createRepo("shared.git", { files: { "f.txt": "f\n" } });
    const created = await createVolume(driver, "shared", server.url("shared.git"), SINGLE_NODE_WRITER);
    const first = await stageAndPublish(driver, created, SINGLE_NODE_WRITER, "first", {}, "1000");
    const file = path.join(treeOf(created.volumeId), "f.txt");
    // Changed behind the driver's back: a tree whose root matches is not walked again.
    await fs.chmod(file, 0o600);
    await unpublishAndUnstage(driver, first);
    const again = await stageAndPublish(driver, created, SINGLE_NODE_WRITER, "first", {}, "1000");
    assert.equal((await fs.lstat(file)).mode & 0o777, 0o600);
    assert.match(driver.logs(), /the tree's root already matches volume_mount_group 1000/);

    const second = { ...again, targetPath: path.join(driver.dir, "pods", "second", "volume") };
    await fs.mkdir(path.dirname(second.targetPath), { recursive: true });
    await assert.rejects(publish(driver, second, {}, SINGLE_NODE_WRITER, "2000"), (err: unknown) => {
      assert.ok(err instanceof CsiError && err.code === status.FAILED_PRECONDITION, String(err));
      assert.match(err.message, /staged on this node with volume_mount_group 1000; a pod with fsGroup 2000 cannot share it/);
      return true;
    });
    await publish(driver, second, {}, SINGLE_NODE_WRITER, "");
    await call(driver.node.nodeUnpublishVolume.bind(driver.node), { volumeId: second.volumeId, targetPath: second.targetPath }, T);
    await unpublishAndUnstage(driver, again);
  });

  test("a volume_mount_group that is not a group id is refused, naming the field", async () => {
    const stagingTargetPath = path.join(driver.dir, "staging", "bad-group");
    await fs.mkdir(stagingTargetPath, { recursive: true });
    const request = csi.NodeStageVolumeRequest.fromPartial({
      volumeId: "bad-group",
      stagingTargetPath,
      volumeCapability: mountCapability(SINGLE_NODE_WRITER, "wheel"),
      volumeContext: { url: server.url("shared.git"), ref: "main" },
    });
    await assert.rejects(call(driver.node.nodeStageVolume.bind(driver.node), request, T), (err: unknown) => {
      assert.ok(err instanceof CsiError && err.code === status.INVALID_ARGUMENT, String(err));
      assert.match(err.message, /volume_capability\.mount\.volume_mount_group "wheel" must be a decimal group id/);
      return true;
    });
  });
});
