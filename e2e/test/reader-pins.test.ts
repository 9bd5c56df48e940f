import assert from "node:assert/strict";
import * as fs from "node:fs/promises";
import * as path from "node:path";
import { after, before, describe, test } from "node:test";
import { status } from "@grpc/grpc-js";
import { call, csi } from "@git-csi/protos";
import { type Driver, freePort, mountCapability, refused, report, setVolumeClass, stageAndPublish, startDriver, unpublishAndUnstage, waitFor } from "../src/driver";
import { type GitServer, startGitDaemon } from "../src/git-server";

const READER = csi.VolumeCapability_AccessMode_Mode.MULTI_NODE_READER_ONLY;
const WRITER = csi.VolumeCapability_AccessMode_Mode.SINGLE_NODE_SINGLE_WRITER;

function volumeOf(volumeId: string, url: string, ref: string): csi.Volume {
  return { volumeId, capacityBytes: 0, volumeContext: { url, ref }, contentSource: undefined, accessibleTopology: [] };
}

/** The stage alone, so a refused one leaves nothing to unpublish. */
function stage(driver: Driver, volume: csi.Volume, mode: csi.VolumeCapability_AccessMode_Mode): Promise<unknown> {
  const request = { volumeId: volume.volumeId, stagingTargetPath: path.join(driver.dir, "staging", volume.volumeId), volumeCapability: mountCapability(mode), volumeContext: volume.volumeContext };
  return call(driver.node.nodeStageVolume.bind(driver.node), csi.NodeStageVolumeRequest.fromPartial(request), 60_000);
}

function createVolume(driver: Driver, name: string, url: string, ref: string, mode: csi.VolumeCapability_AccessMode_Mode): Promise<csi.CreateVolumeResponse> {
  const request = csi.CreateVolumeRequest.fromPartial({ name, volumeCapabilities: [mountCapability(mode)], parameters: { url, ref } });
  return call(driver.controller.createVolume.bind(driver.controller), request, 60_000);
}

/** What a pod sees of an entry: its type, mode bits, owner and group. */
async function modeOf(file: string): Promise<[string, number, number, number]> {
  const st = await fs.stat(file);
  return [st.isDirectory() ? "dir" : "file", st.mode & 0o7777, st.uid, st.gid];
}

describe("pinned read-only volumes: a tag or a commit is served as it is and never moves", () => {
  const repo = "pins.git";
  let server: GitServer;
  let driver: Driver | undefined;
  let first = "";

  before(async () => {
    server = await startGitDaemon();
    await server.createRepo(repo, { files: { "v.txt": "first\n" } });
    first = await server.git(repo, "rev-parse", "main");
    await server.git(repo, "tag", "-a", "v1", "-m", "v1", "main");
    await server.git(repo, "tag", "light", "main");
    await server.commitFiles(repo, { "v.txt": "second\n" }, { message: "second" });
    driver = await startDriver({ nodeId: "pins", metricsPort: await freePort() });
  });

  // Never throws: a hook that fails would leave the driver and its mounts running.
  after(async () => {
    await driver?.stop().catch((err: Error) => console.error(`stopping the driver: ${err.message}`));
    await server?.stop().catch((err: Error) => console.error(`stopping the git server: ${err.message}`));
  });

  test("an annotated tag, a lightweight tag and a commit id serve their commit; with follow.interval they stay while a branch reader of the same class moves", async () => {
    const node = driver!;
    const url = server.url(repo);
    const pins = [volumeOf("annotated", url, "refs/tags/v1"), volumeOf("light", url, "refs/tags/light"), volumeOf("commit", url, first)];
    const published = [];
    for (const volume of pins) published.push(await stageAndPublish(node, volume, READER, volume.volumeId));
    const branch = await stageAndPublish(node, volumeOf("branch", url, "main"), READER, "branch");
    for (const p of published) assert.equal(await fs.readFile(path.join(p.targetPath, "v.txt"), "utf8"), "first\n", p.volumeId);
    assert.equal(await fs.readFile(path.join(branch.targetPath, "v.txt"), "utf8"), "second\n");
    for (const volumeId of ["annotated", "light", "commit", "branch"]) await setVolumeClass(node, volumeId, { "follow.interval": "1s" });
    // Upstream moves the branch and both tags; only the branch reader follows.
    await server.commitFiles(repo, { "v.txt": "third\n" }, { message: "third" });
    await server.git(repo, "tag", "-f", "-a", "v1", "-m", "moved", "main");
    await server.git(repo, "tag", "-f", "light", "main");
    await waitFor("the branch reader serves the third commit", async () => (await fs.readFile(path.join(branch.targetPath, "v.txt"), "utf8")) === "third\n");
    // One more commit the branch reader must fetch: a pin that fetched on the interval has fetched the moved tag by then.
    await server.commitFiles(repo, { "v.txt": "fourth\n" }, { message: "fourth" });
    await waitFor("the branch reader serves the fourth commit", async () => (await fs.readFile(path.join(branch.targetPath, "v.txt"), "utf8")) === "fourth\n");
    for (const p of published) assert.equal(await fs.readFile(path.join(p.targetPath, "v.txt"), "utf8"), "first\n", `${p.volumeId} moved`);
    const annotated = await report(node, "annotated");
    assert.deepEqual([annotated.servedCommit, annotated.followsBranch], [first, "refs/tags/v1"]);
    assert.equal((await report(node, "commit")).followsBranch, first);
    assert.ok(
      node
        .logs()
        .split("\n")
        .some((line) => line.includes("follow.interval is ignored") && line.includes('"volume":"annotated"')),
    );
    for (const p of [...published, branch]) await unpublishAndUnstage(node, p);
  });

  test("a reader of a branch serves the modes, owners and empty directories its writers recorded, from the first moment a commit shows; a tag's reader serves git's modes", async () => {
    const node = driver!;
    const treeRepo = "tree.git";
    await server.createRepo(treeRepo, { files: { "secrets.yaml": "token: one\n" } });
    const url = server.url(treeRepo);
    /** A pod of a writer volume writes, then stops: the unstage commits and pushes the branch and refs/git-csi/metadata. */
    const write = async (script: (dir: string) => string) => {
      const writer = await stageAndPublish(node, volumeOf("tree-writer", url, "main"), WRITER, "tree-writer");
      // A class arms the writer; its timers far off, the unstage commits and pushes.
      await setVolumeClass(node, "tree-writer", { "push.quiesce": "1h", "push.maxLatency": "2h" });
      await node.sh(script(writer.targetPath));
      await unpublishAndUnstage(node, writer);
    };
    await write((dir) => `chmod 600 '${dir}/secrets.yaml' && chown 1000:1000 '${dir}/secrets.yaml' && mkdir -m 750 '${dir}/empty' && chown 1000:2000 '${dir}/empty' && echo x > '${dir}/x'`);
    await server.git(treeRepo, "tag", "written", "main");
    const reader = await stageAndPublish(node, volumeOf("tree-reader", url, "main"), READER, "tree-reader");
    const tagged = await stageAndPublish(node, volumeOf("tree-tag", url, "refs/tags/written"), READER, "tree-tag");
    const secrets = path.join(reader.targetPath, "secrets.yaml");
    assert.deepEqual(await modeOf(secrets), ["file", 0o600, 1000, 1000]);
    assert.deepEqual(await modeOf(path.join(reader.targetPath, "empty")), ["dir", 0o750, 1000, 2000]);
    assert.deepEqual(await modeOf(path.join(tagged.targetPath, "secrets.yaml")), ["file", 0o644, 0, 0]);
    await assert.rejects(fs.stat(path.join(tagged.targetPath, "empty")), { code: "ENOENT" });
    // A writer changes content and mode together; the follower's first view of the new content already has the new mode.
    await setVolumeClass(node, "tree-reader", { "follow.interval": "1s" });
    await write((dir) => `echo 'token: two' > '${dir}/secrets.yaml' && chmod 640 '${dir}/secrets.yaml'`);
    // The stat comes after the read: once the new content shows, the lookup finds the new commit's file.
    const seen = await waitFor("the follower serves the second write", async () => (await fs.readFile(secrets, "utf8")) === "token: two\n" && modeOf(secrets));
    assert.deepEqual(seen, ["file", 0o640, 1000, 1000]);
    for (const p of [reader, tagged]) await unpublishAndUnstage(node, p);
  });

  test("a tag or commit the remote lacks is FailedPrecondition naming it, and a bare name is a branch, not a tag", async () => {
    const node = driver!;
    const url = server.url(repo);
    const absent = "1111111111111111111111111111111111111111";
    await refused(stage(node, volumeOf("no-tag", url, "refs/tags/v9"), READER), status.FAILED_PRECONDITION, ["volume_context.ref", "the tag refs/tags/v9 does not exist"]);
    await refused(stage(node, volumeOf("no-commit", url, absent), READER), status.FAILED_PRECONDITION, ["volume_context.ref", `the commit ${absent} does not exist`]);
    await refused(stage(node, volumeOf("bare-tag", url, "v1"), READER), status.FAILED_PRECONDITION, "ref v1 does not exist");
    for (const volumeId of ["no-tag", "no-commit", "bare-tag"]) assert.doesNotMatch(await fs.readFile("/proc/mounts", "utf8"), new RegExp(`/staging/${volumeId} `));
  });

  test("a writer refuses a tag or a commit as its ref, naming the field and the rule, and the refusal changes nothing", async () => {
    const node = driver!;
    const url = server.url(repo);
    const rule = "a writer volume (ReadWriteOnce, ReadWriteOncePod) pushes to its ref, so it must be a branch";
    await refused(stage(node, volumeOf("writer-tag", url, "refs/tags/v1"), WRITER), status.INVALID_ARGUMENT, ['volume_context.ref "refs/tags/v1" names a tag', rule]);
    await refused(stage(node, volumeOf("writer-tag", url, first), WRITER), status.INVALID_ARGUMENT, [`volume_context.ref "${first}" names a commit`, rule]);
    await refused(createVolume(node, "writer-tag", url, "refs/tags/v1", WRITER), status.INVALID_ARGUMENT, ['parameters.ref "refs/tags/v1" names a tag', rule]);
    // Nothing was recorded for the writer: the same volume id stages as a reader of the tag.
    const reader = await stageAndPublish(node, volumeOf("writer-tag", url, "refs/tags/v1"), READER, "writer-tag");
    assert.equal((await report(node, "writer-tag")).servedCommit, await server.git(repo, "rev-parse", "v1^{commit}"));
    await unpublishAndUnstage(node, reader);
    // A reader's class may pin a tag: CreateVolume takes it and makes nothing on the remote.
    const tags = await server.git(repo, "for-each-ref", "refs/tags");
    const created = await createVolume(node, "pinned-claim", url, "refs/tags/v1", READER);
    assert.equal(created.volume?.volumeContext.ref, "refs/tags/v1");
    assert.equal(await server.git(repo, "for-each-ref", "refs/tags"), tags);
  });
});
