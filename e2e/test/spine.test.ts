import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import * as fs from "node:fs/promises";
import * as path from "node:path";
import { after, before, describe, test } from "node:test";
import { status } from "@grpc/grpc-js";
import { call, csi, gitcsi, gitWorker } from "@git-csi/protos";
import { createVolume, dialWorker, type Driver, mountCapability, mountsUnder, refused, sh, SINGLE_NODE_WRITER, stageAndPublish, startDriver, unpublishAndUnstage } from "../src/driver";
import { type GitServer, startGitDaemon } from "../src/git-server";

const T = 60_000;
const Mode = csi.VolumeCapability_AccessMode_Mode;

/** Every file under a directory with a hash of its content: equal snapshots mean no state changed. */
async function snapshot(dir: string): Promise<Record<string, string>> {
  const out: Record<string, string> = {};
  for (const entry of await fs.readdir(dir, { recursive: true, withFileTypes: true })) {
    if (!entry.isFile()) continue;
    const file = path.join(entry.parentPath, entry.name);
    if (file.includes(`${path.sep}run${path.sep}`)) continue;
    out[path.relative(dir, file)] = createHash("sha256")
      .update(await fs.readFile(file))
      .digest("hex");
  }
  return out;
}

describe("the spine: three services, the CSI surface, a real FUSE mount", () => {
  let server: GitServer;
  let driver: Driver;
  let url: string;

  before(async () => {
    server = await startGitDaemon();
    await server.createRepo("config.git", { files: { "configuration.yaml": "homeassistant:\n", "packages/lights.yaml": "light: []\n" } });
    url = server.url("config.git");
    driver = await startDriver();
  });

  after(async () => {
    await driver?.stop();
    await server?.stop();
  });

  test("identity names the driver and probes ready", async () => {
    const info = await call(driver.identity.getPluginInfo.bind(driver.identity), {}, T);
    assert.equal(info.name, "git.liken.sh");
    assert.match(info.vendorVersion, /^\d+\.\d+\.\d+/);
    const probe = await call(driver.identity.probe.bind(driver.identity), {}, T);
    assert.equal(probe.ready, true);
  });

  test("capabilities: the controller creates, deletes, modifies, snapshots and clones volumes and is never asked to attach; the node stages and takes the pod's fsGroup", async () => {
    const controller = await call(driver.controller.controllerGetCapabilities.bind(driver.controller), {}, T);
    const C = csi.ControllerServiceCapability_RPC_Type;
    const advertised = [C.CREATE_DELETE_VOLUME, C.MODIFY_VOLUME, C.SINGLE_NODE_MULTI_WRITER, C.CREATE_DELETE_SNAPSHOT, C.LIST_SNAPSHOTS, C.CLONE_VOLUME];
    assert.deepEqual(controller.capabilities.map((c) => c.rpc?.type).sort(), advertised.sort());
    const node = await call(driver.node.nodeGetCapabilities.bind(driver.node), {}, T);
    const N = csi.NodeServiceCapability_RPC_Type;
    assert.deepEqual(node.capabilities.map((c) => c.rpc?.type).sort(), [N.STAGE_UNSTAGE_VOLUME, N.SINGLE_NODE_MULTI_WRITER, N.VOLUME_MOUNT_GROUP, N.GET_VOLUME_STATS, N.VOLUME_CONDITION].sort());
    const plugin = await call(driver.identity.getPluginCapabilities.bind(driver.identity), {}, T);
    assert.deepEqual(
      plugin.capabilities.map((c) => c.service?.type),
      [csi.PluginCapability_Service_Type.CONTROLLER_SERVICE],
    );
    const info = await call(driver.node.nodeGetInfo.bind(driver.node), {}, T);
    assert.equal(info.nodeId, "e2e-node");
  });

  test("Probe is ready only while the git worker answers", async () => {
    const worker = await driver.pid("git-worker");
    process.kill(worker, "SIGSTOP");
    try {
      const stopped = await call(driver.identity.probe.bind(driver.identity), {}, 20_000);
      assert.equal(stopped.ready, false);
    } finally {
      process.kill(worker, "SIGCONT");
    }
    const again = await call(driver.identity.probe.bind(driver.identity), {}, T);
    assert.equal(again.ready, true);
  });

  test("stage clones, publish bind-mounts, and an application's write lands in the work tree", async () => {
    const volume = await createVolume(driver, "spine-write", url);
    assert.deepEqual(volume.volumeContext, { url, ref: "main", accessMode: "ReadWriteOncePod" });
    const published = await stageAndPublish(driver, volume);
    assert.equal(await sh(`cat '${published.targetPath}/configuration.yaml'`), "homeassistant:\n");
    await sh(`mkdir -p '${published.targetPath}/automations' && printf 'alias: lights\\n' > '${published.targetPath}/automations/lights.yaml'`);
    const tree = path.join(driver.stateDir, "trees", volume.volumeId);
    assert.equal(await fs.readFile(path.join(tree, "automations", "lights.yaml"), "utf8"), "alias: lights\n");
    // The application sees only its files: git's own live outside the tree.
    assert.deepEqual((await sh(`ls -a '${published.targetPath}'`)).split("\n").filter(Boolean).sort(), [".", "..", "automations", "configuration.yaml", "packages"]);
    assert.equal((await mountsUnder(driver.dir)).length, 2, "the staging FUSE mount and one bind mount");

    await unpublishAndUnstage(driver, published);
    assert.deepEqual(await mountsUnder(driver.dir), []);
    await assert.rejects(fs.stat(published.targetPath), { code: "ENOENT" });
    // The node keeps the tree, so the next stage is not a clone.
    assert.equal(await fs.readFile(path.join(tree, "automations", "lights.yaml"), "utf8"), "alias: lights\n");
    const again = await stageAndPublish(driver, volume);
    assert.equal(await sh(`cat '${again.targetPath}/automations/lights.yaml'`), "alias: lights\n");
    assert.match(driver.logs(), /"message":"reused the work tree the node kept"/);
    await unpublishAndUnstage(driver, again);
  });

  test("stage, publish, unpublish and unstage are idempotent", async () => {
    const volume = await createVolume(driver, "spine-idempotent", url);
    const first = await stageAndPublish(driver, volume);
    const second = await stageAndPublish(driver, volume);
    assert.deepEqual(second, first);
    assert.equal((await mountsUnder(driver.dir)).length, 2);
    await unpublishAndUnstage(driver, first);
    await unpublishAndUnstage(driver, first);
    assert.deepEqual(await mountsUnder(driver.dir), []);
  });

  test("the .rwo-session record: written beside the staging directory before success, reused by a retry, refused as a symlink, removed at unstage", async () => {
    const volume = await createVolume(driver, "spine-session", url, SINGLE_NODE_WRITER);
    const published = await stageAndPublish(driver, volume, SINGLE_NODE_WRITER, "session", { stage: { token: "never-on-disk-token" }, publish: { token: "never-on-disk-token" } });
    const file = `${published.stagingPath}.rwo-session`;
    assert.equal((await fs.stat(file)).mode & 0o777, 0o600);
    const record = JSON.parse(await fs.readFile(file, "utf8")) as Record<string, unknown>;
    assert.deepEqual(Object.keys(record).sort(), ["accessMode", "completed", "endpoints", "epoch", "generation", "node", "volumeId"]);
    assert.equal(record.completed, true);
    assert.equal(record.volumeId, "spine-session");
    assert.equal(record.node, "e2e-node");
    assert.ok(!JSON.stringify(record).includes("never-on-disk-token"));
    // A retried stage continues the same session.
    await call(
      driver.node.nodeStageVolume.bind(driver.node),
      csi.NodeStageVolumeRequest.fromPartial({
        volumeId: volume.volumeId,
        stagingTargetPath: published.stagingPath,
        volumeCapability: mountCapability(SINGLE_NODE_WRITER),
        volumeContext: volume.volumeContext,
        secrets: { token: "never-on-disk-token" },
      }),
      T,
    );
    assert.equal((JSON.parse(await fs.readFile(file, "utf8")) as Record<string, unknown>).epoch, record.epoch);
    assert.ok(!driver.logs().includes(String(record.epoch)), "the record's contents are never logged");
    await unpublishAndUnstage(driver, published);
    await assert.rejects(fs.stat(file), { code: "ENOENT" });

    // A symlink where the record goes: the stage is refused and nothing is mounted.
    await fs.symlink("/etc/hostname", file);
    await refused(stageAndPublish(driver, volume, SINGLE_NODE_WRITER, "session"), status.FAILED_PRECONDITION, ".rwo-session is a symlink");
    assert.deepEqual(await mountsUnder(driver.dir), []);
    await fs.rm(file);
  });

  test("ReadWriteOnce: two pods on the node share the one staged mount", async () => {
    const volume = await createVolume(driver, "spine-rwo", url, SINGLE_NODE_WRITER);
    const a = await stageAndPublish(driver, volume, SINGLE_NODE_WRITER, "pod-a");
    const b = await stageAndPublish(driver, volume, SINGLE_NODE_WRITER, "pod-b");
    await sh(`echo from-a > '${a.targetPath}/shared.txt'`);
    assert.equal(await sh(`cat '${b.targetPath}/shared.txt'`), "from-a\n");
    assert.equal((await mountsUnder(driver.dir)).length, 3);
    await call(driver.node.nodeUnpublishVolume.bind(driver.node), { volumeId: volume.volumeId, targetPath: b.targetPath }, T);
    await unpublishAndUnstage(driver, a);
    assert.deepEqual(await mountsUnder(driver.dir), []);
  });

  test("ReadWriteOncePod refuses a second target, and a volume's access mode never changes", async () => {
    const volume = await createVolume(driver, "spine-rwop", url);
    const a = await stageAndPublish(driver, volume, Mode.SINGLE_NODE_SINGLE_WRITER, "pod-one");
    await refused(stageAndPublish(driver, volume, Mode.SINGLE_NODE_SINGLE_WRITER, "pod-two"), status.FAILED_PRECONDITION, "already published");
    await refused(
      call(
        driver.node.nodePublishVolume.bind(driver.node),
        csi.NodePublishVolumeRequest.fromPartial({
          volumeId: volume.volumeId,
          stagingTargetPath: a.stagingPath,
          targetPath: path.join(driver.dir, "pods", "x", "v"),
          volumeCapability: mountCapability(SINGLE_NODE_WRITER),
          volumeContext: volume.volumeContext,
        }),
        T,
      ),
      status.INVALID_ARGUMENT,
      "volume_capability asks for ReadWriteOnce but the volume was created ReadWriteOncePod",
    );
    await unpublishAndUnstage(driver, a);
  });

  test("a missing ref is a clear FailedPrecondition", async () => {
    await server.createRepo("empty-branch.git", { branch: "trunk" });
    const volume = await createVolume(driver, "spine-missing-ref", server.url("empty-branch.git"));
    await refused(stageAndPublish(driver, volume), status.FAILED_PRECONDITION, "ref main does not exist");
  });

  test("a bad request answers the right code, names the field, and changes no state", async (t) => {
    const before = await snapshot(driver.stateDir);
    const cap = mountCapability();
    const stage = (r: Partial<csi.NodeStageVolumeRequest>) => call(driver.node.nodeStageVolume.bind(driver.node), csi.NodeStageVolumeRequest.fromPartial(r), T);
    const publish = (r: Partial<csi.NodePublishVolumeRequest>) => call(driver.node.nodePublishVolume.bind(driver.node), csi.NodePublishVolumeRequest.fromPartial(r), T);
    const create = (r: Partial<csi.CreateVolumeRequest>) => call(driver.controller.createVolume.bind(driver.controller), csi.CreateVolumeRequest.fromPartial(r), T);
    const modify = (r: Partial<csi.ControllerModifyVolumeRequest>) => call(driver.controller.controllerModifyVolume.bind(driver.controller), csi.ControllerModifyVolumeRequest.fromPartial(r), T);
    const ctx = { url, ref: "main" };
    const staging = path.join(driver.dir, "bad-staging");
    // The node's own store holds every volume's repository: a URL must never reach it.
    const ownStore = path.join(driver.stateDir, "repos");
    const refusedUrl = (field: string, value: string, why: string) => [`${field}.url ${JSON.stringify(value)} must be a remote git URL`, why];
    const LOCAL = "a local path or file:// URL would read the node's own files";
    const BRANCH = "must name a branch as git check-ref-format --branch accepts it";
    const cases: Array<[string, () => Promise<unknown>, status, string | string[]]> = [
      ["stage without id", () => stage({ stagingTargetPath: staging, volumeCapability: cap, volumeContext: ctx }), status.INVALID_ARGUMENT, "volume_id is required"],
      ["stage with a path-like id", () => stage({ volumeId: "../etc", stagingTargetPath: staging, volumeCapability: cap, volumeContext: ctx }), status.INVALID_ARGUMENT, 'volume_id "../etc" must be'],
      ["stage without staging path", () => stage({ volumeId: "bad", volumeCapability: cap, volumeContext: ctx }), status.INVALID_ARGUMENT, "staging_target_path is required"],
      [
        "stage with a relative staging path",
        () => stage({ volumeId: "bad", stagingTargetPath: "rel/dir", volumeCapability: cap, volumeContext: ctx }),
        status.INVALID_ARGUMENT,
        'staging_target_path "rel/dir" must be an absolute path',
      ],
      ["stage without capability", () => stage({ volumeId: "bad", stagingTargetPath: staging, volumeContext: ctx }), status.INVALID_ARGUMENT, "volume_capability is required"],
      [
        "stage without url",
        () => stage({ volumeId: "bad", stagingTargetPath: staging, volumeCapability: cap, volumeContext: { ref: "main" } }),
        status.INVALID_ARGUMENT,
        "volume_context.url is required",
      ],
      ["stage without ref", () => stage({ volumeId: "bad", stagingTargetPath: staging, volumeCapability: cap, volumeContext: { url } }), status.INVALID_ARGUMENT, "volume_context.ref is required"],
      [
        "stage a tag",
        () => stage({ volumeId: "bad", stagingTargetPath: staging, volumeCapability: cap, volumeContext: { url, ref: "refs/tags/v1" } }),
        status.INVALID_ARGUMENT,
        ['volume_context.ref "refs/tags/v1" names a tag', "a writer volume (ReadWriteOnce, ReadWriteOncePod) pushes to its ref, so it must be a branch"],
      ],
      [
        "stage raw block",
        () => stage({ volumeId: "bad", stagingTargetPath: staging, volumeCapability: { block: {}, accessMode: { mode: Mode.SINGLE_NODE_WRITER } }, volumeContext: ctx }),
        status.INVALID_ARGUMENT,
        "volume_capability.block: raw block volumes are not served",
      ],
      [
        "stage with fsType",
        () =>
          stage({
            volumeId: "bad",
            stagingTargetPath: staging,
            volumeCapability: { mount: { fsType: "ext4", mountFlags: [], volumeMountGroup: "" }, accessMode: { mode: Mode.SINGLE_NODE_WRITER } },
            volumeContext: ctx,
          }),
        status.INVALID_ARGUMENT,
        'volume_capability.mount.fs_type "ext4"',
      ],
      [
        "stage with mount flags",
        () =>
          stage({
            volumeId: "bad",
            stagingTargetPath: staging,
            volumeCapability: { mount: { fsType: "", mountFlags: ["noatime"], volumeMountGroup: "" }, accessMode: { mode: Mode.SINGLE_NODE_WRITER } },
            volumeContext: ctx,
          }),
        status.INVALID_ARGUMENT,
        "volume_capability.mount.mount_flags",
      ],
      [
        "stage multi-node",
        () => stage({ volumeId: "bad", stagingTargetPath: staging, volumeCapability: mountCapability(Mode.MULTI_NODE_MULTI_WRITER), volumeContext: ctx }),
        status.INVALID_ARGUMENT,
        "volume_capability.access_mode MULTI_NODE_MULTI_WRITER",
      ],
      ["publish without target", () => publish({ volumeId: "bad", stagingTargetPath: staging, volumeCapability: cap, volumeContext: ctx }), status.INVALID_ARGUMENT, "target_path is required"],
      [
        "publish an unstaged volume",
        () => publish({ volumeId: "never-staged", stagingTargetPath: staging, targetPath: path.join(driver.dir, "t"), volumeCapability: cap, volumeContext: ctx }),
        status.FAILED_PRECONDITION,
        "is not staged",
      ],
      ["unstage without path", () => call(driver.node.nodeUnstageVolume.bind(driver.node), { volumeId: "bad", stagingTargetPath: "" }, T), status.INVALID_ARGUMENT, "staging_target_path is required"],
      ["unpublish without id", () => call(driver.node.nodeUnpublishVolume.bind(driver.node), { volumeId: "", targetPath: "/x" }, T), status.INVALID_ARGUMENT, "volume_id is required"],
      ["create without name", () => create({ volumeCapabilities: [cap], parameters: ctx }), status.INVALID_ARGUMENT, "name is required"],
      ["create without capabilities", () => create({ name: "bad", parameters: ctx }), status.INVALID_ARGUMENT, "volume_capabilities is required"],
      [
        "create with two modes",
        () => create({ name: "bad", volumeCapabilities: [cap, mountCapability(Mode.SINGLE_NODE_WRITER)], parameters: ctx }),
        status.INVALID_ARGUMENT,
        "asks for ReadWriteOncePod and ReadWriteOnce; a volume has one access mode",
      ],
      ["create without url", () => create({ name: "bad", volumeCapabilities: [cap], parameters: { ref: "main" } }), status.INVALID_ARGUMENT, "parameters.url is required"],
      [
        "create with an unknown parameter",
        () => create({ name: "bad", volumeCapabilities: [cap], parameters: { ...ctx, "push.quiesce": "5s" } }),
        status.INVALID_ARGUMENT,
        "parameters push.quiesce: a StorageClass takes only url, ref, baseRef, onDelete",
      ],
      [
        "create with a bad class parameter",
        () => create({ name: "bad", volumeCapabilities: [cap], parameters: ctx, mutableParameters: { "push.quiesce": "soon" } }),
        status.INVALID_ARGUMENT,
        'mutable_parameters: class parameter push.quiesce: "soon" is not a duration',
      ],
      ["modify an unknown volume", () => modify({ volumeId: "no-such-volume", mutableParameters: { "push.quiesce": "5s" } }), status.NOT_FOUND, "volume no-such-volume does not exist"],
      [
        "modify with a bad class parameter",
        () => modify({ volumeId: "spine-write", mutableParameters: { "commit.author": "nobody" } }),
        status.INVALID_ARGUMENT,
        'class parameter commit.author: "nobody" is not Name <email>',
      ],
      [
        "create from a local path",
        () => create({ name: "bad", volumeCapabilities: [cap], parameters: { url: ownStore, ref: "main" } }),
        status.INVALID_ARGUMENT,
        refusedUrl("parameters", ownStore, LOCAL),
      ],
      [
        "create from file://",
        () => create({ name: "bad", volumeCapabilities: [cap], parameters: { url: `file://${ownStore}`, ref: "main" } }),
        status.INVALID_ARGUMENT,
        refusedUrl("parameters", `file://${ownStore}`, LOCAL),
      ],
      [
        "create from ext::",
        () => create({ name: "bad", volumeCapabilities: [cap], parameters: { url: "ext::sh -c id", ref: "main" } }),
        status.INVALID_ARGUMENT,
        refusedUrl("parameters", "ext::sh -c id", "ext:: is a helper transport"),
      ],
      ["create with an option-shaped ref", () => create({ name: "bad", volumeCapabilities: [cap], parameters: { url, ref: "-x" } }), status.INVALID_ARGUMENT, `parameters.ref "-x" ${BRANCH}`],
      [
        "create with a negative capacity",
        () => create({ name: "bad", volumeCapabilities: [cap], parameters: ctx, capacityRange: { requiredBytes: -1, limitBytes: 0 } }),
        status.INVALID_ARGUMENT,
        "capacity_range: required_bytes and limit_bytes must not be negative",
      ],
      [
        "stage from a local path",
        () => stage({ volumeId: "bad", stagingTargetPath: staging, volumeCapability: cap, volumeContext: { url: ownStore, ref: "main" } }),
        status.INVALID_ARGUMENT,
        refusedUrl("volume_context", ownStore, LOCAL),
      ],
      [
        "stage from file://",
        () => stage({ volumeId: "bad", stagingTargetPath: staging, volumeCapability: cap, volumeContext: { url: `file://${ownStore}`, ref: "main" } }),
        status.INVALID_ARGUMENT,
        refusedUrl("volume_context", `file://${ownStore}`, LOCAL),
      ],
      [
        "stage from ext::",
        () => stage({ volumeId: "bad", stagingTargetPath: staging, volumeCapability: cap, volumeContext: { url: "ext::sh -c id", ref: "main" } }),
        status.INVALID_ARGUMENT,
        refusedUrl("volume_context", "ext::sh -c id", "ext:: is a helper transport"),
      ],
      [
        "stage from fd::",
        () => stage({ volumeId: "bad", stagingTargetPath: staging, volumeCapability: cap, volumeContext: { url: "fd::7", ref: "main" } }),
        status.INVALID_ARGUMENT,
        refusedUrl("volume_context", "fd::7", "fd:: is a helper transport"),
      ],
      [
        "stage from an option-shaped URL",
        () => stage({ volumeId: "bad", stagingTargetPath: staging, volumeCapability: cap, volumeContext: { url: "--upload-pack=id", ref: "main" } }),
        status.INVALID_ARGUMENT,
        refusedUrl("volume_context", "--upload-pack=id", "would read as an option"),
      ],
      [
        "stage an option-shaped ref",
        () => stage({ volumeId: "bad", stagingTargetPath: staging, volumeCapability: cap, volumeContext: { url, ref: "--help" } }),
        status.INVALID_ARGUMENT,
        `volume_context.ref "--help" ${BRANCH}`,
      ],
      [
        "stage HEAD",
        () => stage({ volumeId: "bad", stagingTargetPath: staging, volumeCapability: cap, volumeContext: { url, ref: "HEAD" } }),
        status.INVALID_ARGUMENT,
        `volume_context.ref "HEAD" ${BRANCH}`,
      ],
      [
        "stage with a Secret that is no credential",
        () => stage({ volumeId: "bad", stagingTargetPath: staging, volumeCapability: cap, volumeContext: ctx, secrets: { apikey: "v" } }),
        status.INVALID_ARGUMENT,
        "secrets: the volume's Secret has the keys apikey",
      ],
      [
        "stage with an ssh-privatekey that is no key",
        () => stage({ volumeId: "bad", stagingTargetPath: staging, volumeCapability: cap, volumeContext: ctx, secrets: { "ssh-privatekey": "hunter2" } }),
        status.INVALID_ARGUMENT,
        "secrets: the volume's Secret's ssh-privatekey is no private key",
      ],
      [
        "stage with a staging path longer than Linux takes",
        () => stage({ volumeId: "bad", stagingTargetPath: `${staging}/${"n".repeat(256)}`, volumeCapability: cap, volumeContext: ctx }),
        status.INVALID_ARGUMENT,
        "staging_target_path",
      ],
      [
        "publish for a pod name that is none",
        () => publish({ volumeId: "bad", stagingTargetPath: staging, targetPath: path.join(driver.dir, "t"), volumeCapability: cap, volumeContext: { "csi.storage.k8s.io/pod.name": "../x" } }),
        status.INVALID_ARGUMENT,
        'volume_context.csi.storage.k8s.io/pod.name "../x" must be a pod name',
      ],
      [
        "delete another volume's record by a path-like id",
        () => call(driver.controller.deleteVolume.bind(driver.controller), { volumeId: "../provisioned/spine-write", secrets: {} }, T),
        status.INVALID_ARGUMENT,
        'volume_id "../provisioned/spine-write" must be',
      ],
      [
        "modify an unknown volume with a bad class parameter",
        () => modify({ volumeId: "no-such-volume", mutableParameters: { "push.quiesce": "soon" } }),
        status.INVALID_ARGUMENT,
        "mutable_parameters: class parameter push.quiesce",
      ],
      [
        "validate without capabilities",
        () => call(driver.controller.validateVolumeCapabilities.bind(driver.controller), csi.ValidateVolumeCapabilitiesRequest.fromPartial({ volumeId: "spine-write" }), T),
        status.INVALID_ARGUMENT,
        "volume_capabilities is required",
      ],
    ];
    for (const [name, request, code, fragment] of cases) {
      await t.test(name, async () => void (await refused(request(), code, fragment)));
    }
    assert.deepEqual(await snapshot(driver.stateDir), before);
    await assert.rejects(fs.stat(staging), { code: "ENOENT" });
    // No stage got as far as the mount owner, which writes the session record first.
    await assert.rejects(fs.stat(`${staging}.rwo-session`), { code: "ENOENT" });
  });

  test("the git worker's own socket refuses a local URL or a ref that is no branch before it writes anything", async (t) => {
    const worker = dialWorker(driver);
    t.after(() => worker.close());
    const before = await snapshot(driver.stateDir);
    const prepare = (source: gitcsi.VolumeSource) => call(worker.prepareTree.bind(worker), gitWorker.PrepareTreeRequest.fromPartial({ volumeId: "worker-direct", source }), T);
    const ownStore = `file://${path.join(driver.stateDir, "repos")}`;
    await refused(prepare({ url: ownStore, ref: "main" }), status.INVALID_ARGUMENT, `volume_context.url ${JSON.stringify(ownStore)} must be a remote git URL`);
    await refused(prepare({ url, ref: "--help" }), status.INVALID_ARGUMENT, 'volume_context.ref "--help" must name a branch');
    assert.deepEqual(await snapshot(driver.stateDir), before);
  });

  test("the git worker's steps are spec 000's: PrepareTree claims nothing, ClaimMount claims, ReleaseMount releases", async (t) => {
    const worker = dialWorker(driver);
    t.after(() => worker.close());
    const volumeId = "worker-steps";
    const ownerRef = `refs/git-csi/owner/${volumeId}`;
    const owner = () => server.git("config.git", "show", "-s", "--format=%B", ownerRef).catch(() => undefined);
    const mount = { node: "e2e-node", epoch: "worker-steps-epoch", accessMode: gitcsi.AccessMode.READ_WRITE_ONCE, leaseMs: 90_000, continues: false, servingLeftMs: 0 };
    const claim = (request: Partial<gitWorker.ClaimMountRequest>) => call(worker.claimMount.bind(worker), gitWorker.ClaimMountRequest.fromPartial(request), T);
    await refused(claim({ volumeId, mount }), status.FAILED_PRECONDITION, ["no prepared tree", "PrepareTree comes first"]);
    const prepared = await call(worker.prepareTree.bind(worker), gitWorker.PrepareTreeRequest.fromPartial({ volumeId, source: { url, ref: "main" } }), T);
    assert.equal(await fs.readFile(path.join(prepared.treePath, "configuration.yaml"), "utf8"), "homeassistant:\n");
    assert.equal(await owner(), undefined, "the prepared tree claimed nothing on the remote");
    await refused(claim({ volumeId, mount: { ...mount, leaseMs: 0 } }), status.INVALID_ARGUMENT, "mount.lease_ms must be a positive number");
    const claimed = await claim({ volumeId, mount });
    assert.equal(claimed.lease?.held, true, claimed.lease?.message);
    assert.match((await owner()) ?? "", /epoch: \S+/, "the owner ref names the epoch");
    const released = await call(worker.releaseMount.bind(worker), { volumeId, epoch: mount.epoch }, T);
    assert.equal(released.released, true, released.message);
    assert.match((await owner()) ?? "", /released: true/);
  });

  test("ControllerModifyVolume applies the class to the volume in standalone mode", async () => {
    await call(
      driver.controller.controllerModifyVolume.bind(driver.controller),
      csi.ControllerModifyVolumeRequest.fromPartial({ volumeId: "spine-write", mutableParameters: { "push.quiesce": "5s" } }),
      T,
    );
    await call(
      driver.controller.controllerModifyVolume.bind(driver.controller),
      csi.ControllerModifyVolumeRequest.fromPartial({ volumeId: "spine-write", mutableParameters: { "push.maxLatency": "1m" } }),
      T,
    );
    const record = JSON.parse(await fs.readFile(path.join(driver.stateDir, "provisioned", "spine-write.json"), "utf8")) as { classParameters: Record<string, string> };
    assert.deepEqual(record.classParameters, { "push.quiesce": "5s", "push.maxLatency": "1m" });
  });
});
