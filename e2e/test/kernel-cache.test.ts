// The kernel caches the mount's entries and attributes for as long as the
// lease serves (docs/fuse.md, "Caches"). Nothing cached may outlive the
// fence, nor hide a tree the git worker moved behind the mount: a reader
// that had a file cached sees EIO as soon as a renewal finds a successor,
// and upstream's file as soon as the rebase is reported.
import assert from "node:assert/strict";
import * as fs from "node:fs/promises";
import * as path from "node:path";
import { describe, test } from "node:test";
import { createVolume, type Driver, reasons, report, setVolumeClass, sh, stageAndPublish, unpublishAndUnstage, volumeLogs, waitFor } from "../src/driver";
import { withDaemonAndDriver } from "../src/fixtures";
import type { GitServer } from "../src/git-server";
import { takeOver } from "../src/owner-record";

/** A lease whose serving time (27 s) is far longer than a renewal interval: a cached answer would outlive the loss by seconds. */
const LEASE = { duration: "30s", renewInterval: "2s" };
const RENEW_MS = 2000;
const FAST = { "push.quiesce": "1s", "push.maxLatency": "1m" };

/** Whether a shell command on the mount fails with EIO. */
async function eio(script: string): Promise<boolean> {
  return sh(script).then(
    () => false,
    (err: Error) => /Input\/output error/.test(err.message),
  );
}

describe("the kernel's cache of the mount", { timeout: 120_000 }, () => {
  let server: GitServer;
  let driver: Driver;
  withDaemonAndDriver((s, d) => ([server, driver] = [s, d]), { lease: LEASE });

  async function volumeOn(repo: string, name: string): Promise<{ volumeId: string; target: string; tree: string; published: Awaited<ReturnType<typeof stageAndPublish>> }> {
    await server.createRepo(repo, { files: { "a.txt": "A\n" } });
    const volume = await createVolume(driver, name, server.url(repo));
    const published = await stageAndPublish(driver, volume, undefined, name);
    await setVolumeClass(driver, volume.volumeId, FAST);
    return { volumeId: volume.volumeId, target: published.targetPath, tree: path.join(driver.stateDir, "trees", volume.volumeId), published };
  }

  test("a file read and stat-ed right before the epoch is lost answers EIO on read and stat within a renewal of the loss", async () => {
    const { volumeId, target, tree, published } = await volumeOn("cache-fence.git", "cache-fence");
    assert.equal(await sh(`cat '${target}/a.txt'; stat -c %a '${target}/a.txt'`), "A\n644\n");
    // The kernel answers stat from its cache: a mode changed behind the mount is not seen.
    await fs.chmod(path.join(tree, "a.txt"), 0o600);
    assert.equal(await sh(`stat -c %a '${target}/a.txt'`), "644\n", "the attributes are the kernel's cached ones");

    const { replaced } = await takeOver(server, "cache-fence.git", volumeId);
    const lostAt = Date.now();
    await waitFor("stat of the cached file to fail with EIO", () => eio(`stat '${target}/a.txt'`), 20_000);
    const statFailed = Date.now() - lostAt;
    assert.equal(await eio(`cat '${target}/a.txt'`), true, "a read fails with EIO too");
    assert.ok(statFailed < 2 * RENEW_MS + 1000, `stat failed ${statFailed} ms after the loss: within a renewal, not when the cache would have run out`);
    assert.ok(Date.now() < Number(replaced?.expires), "well before the lost lease would have run out");
    assert.match(volumeLogs(driver, volumeId), /was taken over by node node-other/);
    await unpublishAndUnstage(driver, published);
  });

  test("a tree moved behind the mount is seen at once by a reader who had it cached", async () => {
    const name = "cache-move";
    const { volumeId, target, published } = await volumeOn(`${name}.git`, name);
    assert.equal(await sh(`cat '${target}/a.txt'; stat -c %s '${target}/a.txt'`), "A\n2\n");
    await server.commitFiles(`${name}.git`, { "a.txt": "upstream's A\n" }, { message: "a person's commit" });
    // The application's write is pushed, refused, rebased onto upstream's commit, and the tree moves.
    await sh(`echo mine > '${target}/mine.txt'`);
    await waitFor("GitVolumeRebased", async () => reasons(await report(driver, volumeId)).includes("GitVolumeRebased"));
    assert.equal(await sh(`cat '${target}/a.txt'; stat -c %s '${target}/a.txt'`), "upstream's A\n13\n", "the reader sees the moved tree at once");
    assert.equal(await sh(`cat '${target}/mine.txt'`), "mine\n");
    await unpublishAndUnstage(driver, published);
  });
});
