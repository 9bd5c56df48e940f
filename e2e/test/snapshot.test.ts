// Snapshots, restores and clones against a real git server: a snapshot is
// refs/git-csi/snapshots/<id> naming the volume's commit and the metadata
// commit of its moment; a restore or a clone is a new branch starting there,
// whose stage replays the source's modes, owners and empty directories.
import assert from "node:assert/strict";
import * as fs from "node:fs/promises";
import * as path from "node:path";
import { after, before, describe, test } from "node:test";
import { status } from "@grpc/grpc-js";
import { call, csi } from "@git-csi/protos";
import { type Driver, mountCapability, type PublishedVolume, refused, sh, stageAndPublish, startDriver, unpublishAndUnstage } from "../src/driver";
import { type GitServer, startGitDaemon } from "../src/git-server";

const T = 60_000;
const TEMPLATE = "claims/${pvc.metadata.namespace}/${pvc.metadata.name}";
/** Armed, so the unstage commits and pushes; never on its own during a test. */
const QUIET = { "push.quiesce": "1h", "push.maxLatency": "2h" };
const FIRST = "homeassistant:\n";
const SECRET = "token: first\n";
/** What the external-snapshotter sends with --extra-create-metadata. */
const SNAPSHOT_METADATA = { "csi.storage.k8s.io/volumesnapshot/namespace": "home", "csi.storage.k8s.io/volumesnapshot/name": "before-upgrade" };

describe("snapshots, restores and clones", { timeout: 10 * T }, () => {
  let server: GitServer;
  let driver: Driver;
  let url: string;
  let source: csi.Volume;

  before(async () => {
    server = await startGitDaemon();
    await server.createRepo("config.git", { files: { "configuration.yaml": FIRST } });
    url = server.url("config.git");
    driver = await startDriver();
  });

  // Neither can throw: a hook that throws never stops the driver.
  after(async () => {
    await driver?.stop().catch((err: unknown) => console.error(`stopping the driver: ${String(err)}`));
    await server?.stop().catch((err: unknown) => console.error(`stopping the git server: ${String(err)}`));
  });

  const claimParameters = (pvc: string, extra: Record<string, string> = {}) => ({
    url,
    ref: TEMPLATE,
    "csi.storage.k8s.io/pvc/namespace": "home",
    "csi.storage.k8s.io/pvc/name": pvc,
    "csi.storage.k8s.io/pv/name": `pv-${pvc}`,
    ...extra,
  });

  const create = async (name: string, parameters: Record<string, string>, volumeContentSource?: csi.VolumeContentSource): Promise<csi.Volume> => {
    const request = csi.CreateVolumeRequest.fromPartial({ name, volumeCapabilities: [mountCapability()], parameters, mutableParameters: QUIET, volumeContentSource });
    return (await call(driver.controller.createVolume.bind(driver.controller), request, T)).volume!;
  };

  const snapshot = async (name: string, sourceVolumeId: string, parameters: Record<string, string> = {}): Promise<csi.Snapshot> =>
    (await call(driver.controller.createSnapshot.bind(driver.controller), csi.CreateSnapshotRequest.fromPartial({ name, sourceVolumeId, parameters }), T)).snapshot!;

  const list = (request: Partial<csi.ListSnapshotsRequest>) => call(driver.controller.listSnapshots.bind(driver.controller), csi.ListSnapshotsRequest.fromPartial(request), T);

  const deleteSnapshot = (snapshotId: string) => call(driver.controller.deleteSnapshot.bind(driver.controller), csi.DeleteSnapshotRequest.fromPartial({ snapshotId }), T);

  /** Every ref of the server's repository, name → commit. */
  const refs = async (): Promise<Record<string, string>> => {
    const listed = await server.git("config.git", "for-each-ref", "--format=%(refname) %(objectname)");
    return Object.fromEntries(
      listed
        .split("\n")
        .filter(Boolean)
        .map((line) => line.split(" ") as [string, string]),
    );
  };

  /** Writes as a pod would, then the pod stops and the node unstages: the unstage commits and pushes. */
  const writeAndRelease = async (volume: csi.Volume, pod: string, script: (dir: string) => string): Promise<void> => {
    const published = await stageAndPublish(driver, volume, undefined, pod);
    await sh(script(published.targetPath));
    await unpublishAndUnstage(driver, published);
  };

  test("a snapshot of a released volume right after a write holds that write, names its commit and the metadata commit, and is ready", async () => {
    source = await create("pv-src", claimParameters("src"));
    await writeAndRelease(
      source,
      "writer",
      (dir) =>
        `printf '${SECRET}' > '${dir}/secrets.yaml' && chmod 600 '${dir}/secrets.yaml' && chown 1000:1000 '${dir}/secrets.yaml' && mkdir -m 750 '${dir}/empty' && chown 1000:1000 '${dir}/empty'`,
    );
    const pushed = await refs();
    const made = await snapshot("snap-1", "pv-src");
    assert.equal(made.snapshotId, "snap-1");
    assert.equal(made.sourceVolumeId, "pv-src");
    assert.equal(made.readyToUse, true);
    assert.equal(made.sizeBytes, Buffer.byteLength(FIRST) + Buffer.byteLength(SECRET));

    const ref = (await refs())["refs/git-csi/snapshots/snap-1"]!;
    assert.ok(ref, "the snapshot is a ref on the remote");
    const parents = (await server.git("config.git", "show", "-s", "--format=%P", ref)).split(" ");
    assert.deepEqual(parents, [pushed["refs/heads/claims/home/src"], pushed["refs/git-csi/metadata"]]);
    assert.equal(await server.git("config.git", "show", `${ref}:secrets.yaml`), SECRET.trimEnd());
    const message = await server.git("config.git", "show", "-s", "--format=%s", ref);
    assert.match(message, /snapshot snap-1 of volume pv-src at \d{4}-\d\d-\d\dT/);

    assert.deepEqual(await snapshot("snap-1", "pv-src"), made, "the same name again is the same snapshot");
    assert.equal((await refs())["refs/git-csi/snapshots/snap-1"], ref);
  });

  test("a restore gives the snapshot's tree with its modes, owners and empty directories, and not the writes made after it", async () => {
    await writeAndRelease(source, "writer", (dir) => `printf 'token: later\\n' > '${dir}/secrets.yaml' && printf 'later\\n' > '${dir}/later.yaml'`);
    const restored = await create("pv-restored", claimParameters("restored"), { snapshot: { snapshotId: "snap-1" } });
    assert.equal(restored.contentSource?.snapshot?.snapshotId, "snap-1");
    const snapshotRef = (await refs())["refs/git-csi/snapshots/snap-1"]!;
    assert.equal((await refs())["refs/heads/claims/home/restored"], (await server.git("config.git", "rev-parse", `${snapshotRef}^1`)).trim());

    const published = await stageAndPublish(driver, restored, undefined, "restorer");
    try {
      assert.equal(await fs.readFile(path.join(published.targetPath, "secrets.yaml"), "utf8"), SECRET);
      await assert.rejects(fs.stat(path.join(published.targetPath, "later.yaml")), { code: "ENOENT" });
      const secrets = await fs.stat(path.join(published.targetPath, "secrets.yaml"));
      assert.deepEqual([secrets.mode & 0o7777, secrets.uid, secrets.gid], [0o600, 1000, 1000]);
      const empty = await fs.stat(path.join(published.targetPath, "empty"));
      assert.ok(empty.isDirectory());
      assert.deepEqual([empty.mode & 0o7777, empty.uid, empty.gid], [0o750, 1000, 1000]);
    } finally {
      await unpublishAndUnstage(driver, published);
    }
  });

  test("a clone gives the source's tree as the source's last push left it", async () => {
    const clone = await create("pv-clone", claimParameters("clone"), { volume: { volumeId: "pv-src" } });
    const now = await refs();
    assert.equal(now["refs/heads/claims/home/clone"], now["refs/heads/claims/home/src"]);
    const published: PublishedVolume = await stageAndPublish(driver, clone, undefined, "cloner");
    try {
      assert.equal(await fs.readFile(path.join(published.targetPath, "later.yaml"), "utf8"), "later\n");
      const secrets = await fs.stat(path.join(published.targetPath, "secrets.yaml"));
      assert.deepEqual([secrets.mode & 0o7777, secrets.uid], [0o600, 1000]);
      assert.ok((await fs.stat(path.join(published.targetPath, "empty"))).isDirectory());
    } finally {
      await unpublishAndUnstage(driver, published);
    }
  });

  test("ListSnapshots by id and by source volume, a page at a time; an unknown token is ABORTED", async () => {
    await snapshot("snap-2", "pv-src");
    await snapshot("snap-3", "pv-restored");
    const ids = (r: csi.ListSnapshotsResponse) => r.entries.map((e) => e.snapshot!.snapshotId);
    assert.deepEqual(ids(await list({})), ["snap-1", "snap-2", "snap-3"]);
    assert.deepEqual(ids(await list({ snapshotId: "snap-2" })), ["snap-2"]);
    assert.deepEqual(ids(await list({ snapshotId: "snap-none" })), []);
    assert.deepEqual(ids(await list({ sourceVolumeId: "pv-src" })), ["snap-1", "snap-2"]);

    const first = await list({ maxEntries: 2 });
    assert.deepEqual(ids(first), ["snap-1", "snap-2"]);
    const second = await list({ maxEntries: 2, startingToken: first.nextToken });
    assert.deepEqual(ids(second), ["snap-3"]);
    assert.equal(second.nextToken, "");
    await refused(list({ startingToken: "7" }), status.ABORTED, "starting_token");
  });

  test("a snapshot or a clone of a volume a node serves is refused, naming why, and changes nothing", async () => {
    // The serving node renews its owner ref meanwhile: every other ref must stay.
    const unowned = async () => Object.fromEntries(Object.entries(await refs()).filter(([ref]) => !ref.startsWith("refs/git-csi/owner/")));
    const published = await stageAndPublish(driver, source, undefined, "holder");
    try {
      const before = await unowned();
      await refused(snapshot("snap-held", "pv-src"), status.FAILED_PRECONDITION, ["volume pv-src is held by node", "without a Kubernetes API server"]);
      await refused(create("pv-clone-held", claimParameters("clone-held"), { volume: { volumeId: "pv-src" } }), status.FAILED_PRECONDITION, "volume pv-src is held by node");
      assert.deepEqual(await unowned(), before);
      assert.deepEqual((await list({ snapshotId: "snap-held" })).entries, [], "a refused snapshot is not recorded");
    } finally {
      await unpublishAndUnstage(driver, published);
    }
  });

  test("bad input names the field and changes neither the remote nor the records", async () => {
    await server.git("config.git", "tag", "taken", "main");
    const before = await refs();
    await refused(snapshot("snap-x", "pv-nobody"), status.INVALID_ARGUMENT, "source_volume_id pv-nobody");
    await refused(snapshot("snap-1", "pv-restored"), status.ALREADY_EXISTS, "snapshot snap-1 exists already, of volume pv-src");
    await refused(snapshot("../x", "pv-src"), status.INVALID_ARGUMENT, "name");
    await refused(
      call(driver.controller.createSnapshot.bind(driver.controller), csi.CreateSnapshotRequest.fromPartial({ name: "snap-x", sourceVolumeId: "pv-src", parameters: { color: "v1" } }), T),
      status.INVALID_ARGUMENT,
      "parameters color",
    );
    await refused(snapshot("snap-x", "pv-src", { tag: "s/${volumesnapshot.uid}", ...SNAPSHOT_METADATA }), status.INVALID_ARGUMENT, "parameters.tag");
    await refused(snapshot("snap-x", "pv-src", { tag: "s/${volumesnapshot.name}" }), status.INVALID_ARGUMENT, ["parameters.tag", "--extra-create-metadata"]);
    await refused(snapshot("snap-x", "pv-src", { tag: "taken" }), status.ALREADY_EXISTS, ["parameters.tag", "refs/tags/taken exists"]);
    await refused(create("pv-r1", claimParameters("r1"), { snapshot: { snapshotId: "snap-nope" } }), status.NOT_FOUND, "volume_content_source.snapshot snap-nope");
    await refused(create("pv-r2", claimParameters("r2"), { volume: { volumeId: "pv-nope" } }), status.NOT_FOUND, "volume_content_source.volume pv-nope");
    await refused(create("pv-r3", claimParameters("r3", { ref: "main" }), { snapshot: { snapshotId: "snap-1" } }), status.INVALID_ARGUMENT, ["volume_content_source", "parameters.ref"]);
    await refused(create("pv-r4", claimParameters("r4", { url: server.url("other.git") }), { snapshot: { snapshotId: "snap-1" } }), status.INVALID_ARGUMENT, "same repository");
    assert.deepEqual(await refs(), before);
    assert.deepEqual(
      (await list({})).entries.map((e) => e.snapshot!.snapshotId),
      ["snap-1", "snap-2", "snap-3"],
    );
  });

  test("DeleteSnapshot removes the ref and the record; again is no error, and a restored volume keeps its branch", async () => {
    const restoredBranch = (await refs())["refs/heads/claims/home/restored"];
    for (const id of ["snap-1", "snap-1", "snap-never"]) await deleteSnapshot(id);
    const after = await refs();
    assert.equal(after["refs/git-csi/snapshots/snap-1"], undefined);
    assert.ok(after["refs/git-csi/snapshots/snap-2"]);
    assert.equal(after["refs/heads/claims/home/restored"], restoredBranch);
    assert.deepEqual((await list({ snapshotId: "snap-1" })).entries, []);
  });

  test("a VolumeSnapshotClass's tag shows the snapshot as an annotated tag at the volume's commit; DeleteSnapshot deletes both, and never a tag a person moved", async () => {
    const made = await snapshot("snap-tag", "pv-src", { tag: "snapshots/${volumesnapshot.namespace}/${volumesnapshot.name}", ...SNAPSHOT_METADATA });
    assert.equal(made.readyToUse, true);
    const tag = "refs/tags/snapshots/home/before-upgrade";
    const ref = (await refs())["refs/git-csi/snapshots/snap-tag"]!;
    assert.equal(await server.git("config.git", "cat-file", "-t", tag), "tag", "an annotated tag, which a forge lists with its message");
    assert.equal(await server.git("config.git", "rev-parse", `${tag}^{commit}`), await server.git("config.git", "rev-parse", `${ref}^1`), "the tag names the volume's commit");
    assert.match(await server.git("config.git", "cat-file", "-p", tag), /^tag snapshots\/home\/before-upgrade$[\s\S]*snapshot snap-tag of volume pv-src[\s\S]*^Snapshot: snap-tag$/m);
    await deleteSnapshot("snap-tag");
    const after = await refs();
    assert.equal(after[tag], undefined, "the tag goes with the snapshot");
    assert.equal(after["refs/git-csi/snapshots/snap-tag"], undefined);

    await snapshot("snap-moved", "pv-src", { tag: "keep/${volumesnapshot.name}", ...SNAPSHOT_METADATA });
    await server.git("config.git", "tag", "-f", "-a", "-m", "a person's release", "keep/before-upgrade", "main");
    const moved = (await refs())["refs/tags/keep/before-upgrade"];
    await deleteSnapshot("snap-moved");
    assert.equal((await refs())["refs/tags/keep/before-upgrade"], moved, "a tag a person moved is theirs");
    assert.equal((await refs())["refs/git-csi/snapshots/snap-moved"], undefined);
  });
});
