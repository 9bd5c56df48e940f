import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { csi } from "@git-csi/protos";
import { type Driver, type PublishedVolume, stageAndPublish, startDriver, unpublishAndUnstage } from "../src/driver";
import { type GitServer, fetchOnly, startGitDaemon } from "../src/git-server";

const READER = csi.VolumeCapability_AccessMode_Mode.MULTI_NODE_READER_ONLY;

/** Every ref the remote holds, as `git ls-remote` lists them: the remote's whole state as a client sees it. */
async function remoteRefs(server: GitServer, repo: string): Promise<string> {
  return server.git(repo, "for-each-ref", "--format=%(objectname) %(refname)");
}

/** A write through the mount, and the kernel's answer to it. */
async function refusedWrite(driver: Driver, script: string): Promise<string> {
  const failed = await driver.sh(script).then(
    () => undefined,
    (err: { stderr?: string }) => err.stderr ?? "",
  );
  assert.ok(failed !== undefined, `the write was accepted: ${script}`);
  return failed;
}

describe("read-only volumes: many nodes serve one ref, write nothing, claim nothing", () => {
  const repo = "dashboards.git";
  let server: GitServer;
  let nodes: Driver[] = [];
  let pushes: () => Promise<string[][]>;

  before(async () => {
    server = await startGitDaemon();
    await server.createRepo(repo, { files: { "dashboards/home.json": '{"title":"home"}\n', "README.md": "dashboards\n" } });
    // A forge that serves fetches and refuses every push, as a read-only deploy key does.
    pushes = await fetchOnly(server, repo);
    // Two nodes: their own state, node id and mount namespace, one remote.
    nodes = await Promise.all(["reader-a", "reader-b"].map((nodeId) => startDriver({ nodeId, ownMountNamespace: true })));
  });

  // Never throws: a hook that fails would leave the drivers and their mounts running.
  after(async () => {
    await Promise.all(nodes.map((n) => n.stop().catch((err: Error) => console.error(`stopping a driver: ${err.message}`))));
    await server?.stop().catch((err: Error) => console.error(`stopping the git server: ${err.message}`));
  });

  test("two nodes stage one ReadOnlyMany volume: both serve the tree, every write fails with EROFS, and the remote's refs do not change", async () => {
    const before = await remoteRefs(server, repo);
    const volume: csi.Volume = { volumeId: "dashboards", capacityBytes: 0, volumeContext: { url: server.url(repo), ref: "main" }, contentSource: undefined, accessibleTopology: [] };
    const published: PublishedVolume[] = [];
    for (const [i, node] of nodes.entries()) published.push(await stageAndPublish(node, volume, READER, `viewer-${i}`));
    for (const [i, node] of nodes.entries()) {
      const target = published[i]!.targetPath;
      assert.equal(await node.sh(`cat '${target}/dashboards/home.json'`), '{"title":"home"}\n');
      for (const write of [
        `echo x > '${target}/new.txt'`,
        `echo x >> '${target}/README.md'`,
        `mkdir '${target}/d'`,
        `rm '${target}/README.md'`,
        `mv '${target}/README.md' '${target}/r.md'`,
        `touch '${target}/README.md'`,
      ]) {
        assert.match(await refusedWrite(node, write), /Read-only file system/, write);
      }
      // The staging mount itself refuses too, not only the pod's bind of it.
      assert.match(await refusedWrite(node, `echo x > '${published[i]!.stagingPath}/new.txt'`), /Read-only file system/);
      assert.equal(await node.sh(`cat '${target}/README.md'`), "dashboards\n");
    }
    for (const [i, node] of nodes.entries()) await unpublishAndUnstage(node, published[i]!);
    assert.equal(await remoteRefs(server, repo), before, "the remote's refs changed");
    assert.doesNotMatch(await remoteRefs(server, repo), /refs\/git-csi\//);
    assert.deepEqual(await pushes(), [], "a reader tried to push");
  });
});
