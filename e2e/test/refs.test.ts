import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { createVolume, deleteVolume, type Driver, nodeRepo, setVolumeClass, sh, stageAndPublish, unpublishAndUnstage, waitFor } from "../src/driver";
import { type GitServer, refusePushes, runGit } from "../src/git-server";
import { withDaemonAndDriver } from "../src/fixtures";

/** The driver's refs under refs/git-csi/ on the remote and on the node, collected once no volume needs them. */
describe("refs the driver collects", () => {
  let server: GitServer;
  let driver: Driver;

  withDaemonAndDriver((s, d) => {
    server = s;
    driver = d;
  });

  const remoteRefs = async (repo: string, prefix: string) => (await server.git(repo, "for-each-ref", "--format=%(refname)", prefix)).split("\n").filter(Boolean);
  /** A log line of the git worker about one volume, as JSON. */
  const logged = (volumeId: string, message: RegExp) =>
    driver
      .logs()
      .split("\n")
      .filter((l) => l.startsWith("{"))
      .map((l) => JSON.parse(l) as Record<string, unknown>)
      .some((l) => l.volume === volumeId && l.operation === "gc" && message.test(String(l.message)));

  test("a push that did not land deletes the staging refs it sent its objects ahead to", async () => {
    await server.createRepo("staging.git");
    const volume = await stageAndPublish(driver, await createVolume(driver, "staging", server.url("staging.git")), undefined, "staging");
    await setVolumeClass(driver, volume.volumeId, { "push.quiesce": "1s", "push.maxLatency": "1m" });
    const allow = await refusePushes(server, "staging.git");
    try {
      // Over 1 MiB to send: the objects go ahead to a staging ref, and the branch refuses the fenced push.
      await sh(`head -c 2097152 /dev/urandom > '${volume.targetPath}/large.bin'`);
      await waitFor("the staging ref of the refused push deleted", async () => logged("staging", /^deleted refs\/git-csi\/staging\/staging\/0: the push it held objects for is over$/));
      await unpublishAndUnstage(driver, volume);
      assert.deepEqual(await remoteRefs("staging.git", "refs/git-csi/staging/"), [], "the flush at the unstage failed too, and left no staging ref");
    } finally {
      await allow();
    }
  });

  test("DeleteVolume: the collection after the tree's removal deletes the volume's owner ref through another staged volume of the repository, and the node's view of it", async () => {
    await server.createRepo("shared.git");
    const url = server.url("shared.git");
    const keep = await stageAndPublish(driver, await createVolume(driver, "shared-keep", url), undefined, "keep");
    const gone = await createVolume(driver, "shared-gone", url);
    // Staged twice: the second claim reads the first one's released record into the node's view.
    for (const pod of ["gone-1", "gone-2"]) await unpublishAndUnstage(driver, await stageAndPublish(driver, gone, undefined, pod));
    const gitDir = await nodeRepo(driver, url);
    const view = "refs/git-csi/upstream/owner/shared-gone";
    assert.notEqual(await runGit(["--git-dir", gitDir, "for-each-ref", view]), "", "the node has a view of the owner ref");

    await deleteVolume(driver, "shared-gone");

    assert.deepEqual(await remoteRefs("shared.git", "refs/git-csi/owner/"), ["refs/git-csi/owner/shared-keep"], "the live volume's owner ref stays");
    assert.ok(logged("shared-gone", /^deleted refs\/git-csi\/owner\/shared-gone on the remote: the volume was deleted$/));
    assert.equal(await runGit(["--git-dir", gitDir, "for-each-ref", view]), "", "the node's view is deleted");
    assert.ok(logged("shared-gone", /^deleted the node's view refs\/git-csi\/upstream\/owner\/shared-gone/));
    await unpublishAndUnstage(driver, keep);
    await deleteVolume(driver, "shared-keep");
  });
});
