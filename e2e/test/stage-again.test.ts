// A pod started again on the node whose epoch was lost. The kubelet unstages
// a volume only once no pod on the node wants it, so the new pod publishes
// onto the dead stage: with no pod left on it, the mount owner stages the
// volume again in place, and the lost epoch's commits come along.
import assert from "node:assert/strict";
import * as fs from "node:fs/promises";
import * as path from "node:path";
import { after, before, test } from "node:test";
import { status } from "@grpc/grpc-js";
import { call } from "@git-csi/protos";
import { createVolume, type Driver, type PublishedVolume, publish, refused, setVolumeClass, stageAndPublish, startDriver, unpublishAndUnstage, waitFor } from "../src/driver";
import { type GitDaemon, startGitDaemon } from "../src/git-server";

const T = 60_000;
const NODE = "again-node";
const LEASE = { duration: "20s", renewInterval: "4s" };

let server: GitDaemon;
let driver: Driver;
let first: PublishedVolume;

before(async () => {
  server = await startGitDaemon();
  await server.createRepo("again.git", { files: { "configuration.yaml": "name: again\n" } });
  driver = await startDriver({ nodeId: NODE, lease: LEASE });
  first = await stageAndPublish(driver, await createVolume(driver, "again", server.url("again.git")), undefined, "one");
  await setVolumeClass(driver, first.volumeId, { "push.quiesce": "1s", "push.maxLatency": "5s" });
});

after(async () => {
  await driver?.stop();
  await server?.stop();
});

const onMain = (file: string) => server.git("again.git", "show", `main:${file}`).catch(() => undefined);

/** The owner record's fields on the remote. */
async function owner(): Promise<Record<string, string>> {
  const text = await server.git("again.git", "show", "-s", "--format=%B", `refs/git-csi/owner/${first.volumeId}`);
  return Object.fromEntries([...text.matchAll(/^([a-z-]+): (\S+)/gm)].map((m) => [m[1]!, m[2]!]));
}

const unpublish = (volume: PublishedVolume) => call(driver.node.nodeUnpublishVolume.bind(driver.node), { volumeId: volume.volumeId, targetPath: volume.targetPath }, T);

test("a new pod's publish onto a stage whose epoch was lost stages the volume again in place, once no pod uses it and the remote answers", async () => {
  await driver.sh(`echo one > '${first.targetPath}/one.txt'`);
  await waitFor("one.txt on main", () => onMain("one.txt"), T);
  const before = await owner();

  const second: PublishedVolume = { ...first, targetPath: path.join(driver.dir, "pods", "two", "volume") };
  await fs.mkdir(path.dirname(second.targetPath), { recursive: true });
  // The forge goes away for longer than the lease: the mount fences after a write it acknowledged.
  await server.down();
  try {
    await driver.sh(`echo two > '${first.targetPath}/two.txt'`);
    await waitFor(
      "the mount fenced",
      () =>
        driver.sh(`cat '${first.targetPath}/configuration.yaml'`).then(
          () => false,
          (err: Error) => /Input\/output error/.test(err.message),
        ),
      T,
    );

    // The first pod still uses the stage: the new pod waits, and is told why.
    await refused(publish(driver, second, {}), status.FAILED_PRECONDITION, [
      "the mount epoch no longer holds the volume (the lease ran out unrenewed)",
      "another pod on this node still uses its stage",
    ]);
    await unpublish(first);
    // No pod uses the stage, but the forge is still away: the claim fails, and the kubelet retries.
    await assert.rejects(publish(driver, second, {}), /cannot connect|could not|refused|unavailable/i);
    assert.equal(await driver.sh(`mountpoint -q '${second.targetPath}' && echo mounted || echo none`), "none\n");
  } finally {
    await server.up();
  }
  await waitFor(
    "the publish staged the volume again",
    () =>
      publish(driver, second, {}).then(
        () => true,
        () => false,
      ),
    T,
  );
  await driver.sh(`echo three > '${second.targetPath}/three.txt'`);
  assert.equal(await driver.sh(`cat '${second.targetPath}/two.txt'`), "two\n", "the lost epoch's acknowledged write is in the new stage");
  await waitFor("two.txt and three.txt on main", async () => (await onMain("two.txt")) === "two" && (await onMain("three.txt")) === "three", T);
  const after = await owner();
  assert.equal(after.node, NODE, "the same node holds the volume");
  assert.notEqual(after.epoch, before.epoch, "with a new epoch");
  assert.match(driver.logs(), /staging it again in place for the new pod.*"operation":"stage_again"|"operation":"stage_again".*staging it again in place for the new pod/);
  await unpublishAndUnstage(driver, second);
});
