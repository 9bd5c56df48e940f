import assert from "node:assert/strict";
import * as fs from "node:fs/promises";
import * as os from "node:os";
import * as path from "node:path";
import { test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { status } from "@grpc/grpc-js";
import { call } from "@git-csi/protos";
import { type Driver, freePort, metricsText, metricValue, report, sh, SINGLE_NODE_SINGLE_WRITER, stageAndPublish, startDriver, unpublishAndUnstage, waitFor } from "../src/driver";
import { LFS_ATTRIBUTES, LFS_POINTER } from "../src/fixtures";
import { startGitDaemon } from "../src/git-server";
import { boundConfigClaim, kubeForTest } from "../src/kube";

const EAGER = { "push.quiesce": "1s", "push.maxLatency": "1m", "commit.author": "Home Assistant <homeassistant@home.example>" };
const LAZY = { "push.quiesce": "10m", "push.maxLatency": "1h" };
const BAD = { "push.quiesce": "soon" };

interface Event {
  reason: string;
  type: string;
  message: string;
  count?: number;
  involvedObject: { kind: string; name: string; namespace: string; uid?: string };
}

/**
 * Spec 004's homeassistant example against a real API server: the node
 * services learn the claim from the PersistentVolume, arm the volume when the
 * claim names a class, re-arm it when the class changes, refuse a bad class
 * without losing the good one, label metrics by the claim, post events on the
 * pod and the claim, and remove a Delete volume's tree when its
 * PersistentVolume goes.
 */
test("the node services against a real API server: a claim's class arms the volume, and events reach the pod and the claim", async (t) => {
  const kube = await kubeForTest(t, "kube-node");
  const server = await startGitDaemon();
  const dir = await fs.mkdtemp(path.join(os.tmpdir(), "git-csi-kube-node-"));
  const started: Driver[] = [];
  t.after(async () => {
    // The drivers first: a stop unmounts what a failed test left, before the directory goes.
    for (const node of started) await node.stop();
    await server.stop();
    await fs.rm(dir, { recursive: true, force: true });
  });
  await server.createRepo("homeassistant.git", { files: { "configuration.yaml": "homeassistant: {}\n", ".gitattributes": LFS_ATTRIBUTES, "floorplan.bin": LFS_POINTER } });
  const url = server.url("homeassistant.git");
  const apply = kube.apply;
  const vac = (name: string, parameters: Record<string, string>) => ({ apiVersion: "storage.k8s.io/v1", kind: "VolumeAttributesClass", metadata: { name }, driverName: "git.liken.sh", parameters });
  await apply(
    { apiVersion: "v1", kind: "Namespace", metadata: { name: "home" } },
    // No controller-manager makes the namespace's default ServiceAccount, which a pod needs.
    { apiVersion: "v1", kind: "ServiceAccount", metadata: { name: "default", namespace: "home" } },
    vac("config-eager", EAGER),
    vac("config-lazy", LAZY),
    vac("config-broken", BAD),
    ...boundConfigClaim("homeassistant-config", { url, ref: "main" }),
    { apiVersion: "v1", kind: "Pod", metadata: { name: "homeassistant", namespace: "home" }, spec: { containers: [{ name: "app", image: "homeassistant/home-assistant" }] } },
  );
  // No controller-manager binds them: the test marks both Bound, as the binder would; only a bound claim takes a class change.
  await kube.kubectl(["patch", "pv", "homeassistant-config", "--subresource=status", "--type=merge", "-p", '{"status":{"phase":"Bound"}}']);
  await kube.kubectl([
    "patch",
    "pvc",
    "config",
    "-n",
    "home",
    "--subresource=status",
    "--type=merge",
    "-p",
    '{"status":{"phase":"Bound","accessModes":["ReadWriteOncePod"],"capacity":{"storage":"1Gi"}}}',
  ]);
  const podUid = (await kube.kubectl(["get", "pod", "homeassistant", "-n", "home", "-o", "jsonpath={.metadata.uid}"])).trim();
  const claimUid = (await kube.kubectl(["get", "pvc", "config", "-n", "home", "-o", "jsonpath={.metadata.uid}"])).trim();

  let driver = await startDriver({ kubeconfig: kube.kubeconfig, metricsPort: await freePort(), dir: path.join(dir, "node") });
  started.push(driver);
  // The kubelet's podInfoOnMount context names the pod.
  const volume = {
    volumeId: "homeassistant-config",
    volumeContext: {
      url,
      ref: "main",
      "csi.storage.k8s.io/pod.name": "homeassistant",
      "csi.storage.k8s.io/pod.namespace": "home",
      "csi.storage.k8s.io/pod.uid": podUid,
      "csi.storage.k8s.io/ephemeral": "false",
    },
    capacityBytes: 0,
    contentSource: undefined,
    accessibleTopology: [],
  };
  const published = await stageAndPublish(driver, volume, SINGLE_NODE_SINGLE_WRITER, "homeassistant");

  // The claim names no class yet: unarmed, and labeled by the claim the API bound it to.
  const unarmed = await waitFor("the claim's labels", async () => {
    const r = await report(driver, volume.volumeId);
    return r.claim?.name === "config" && r;
  });
  assert.deepEqual([unarmed.claim?.namespace, unarmed.armed], ["home", false]);

  await kube.kubectl(["patch", "pvc", "config", "-n", "home", "-p", JSON.stringify({ spec: { volumeAttributesClassName: "config-eager" } })]);
  await waitFor("the class to arm the volume", async () => {
    const r = await report(driver, volume.volumeId);
    return r.armed && r.className === "config-eager";
  });
  await waitFor("git_csi_armed labeled by the claim", async () => /git_csi_armed\{namespace="home",claim="config"\} 1/.test(await metricsText(driver)));

  await sh(`echo 'light: {}' > '${published.targetPath}/light.yaml' && printf 'the floor plan' > '${published.targetPath}/floorplan.bin'`);
  await waitFor("the write pushed", () => server.git("homeassistant.git", "show", "main:light.yaml").catch(() => undefined));
  const author = await server.git("homeassistant.git", "log", "-1", "--format=%an <%ae>", "main");
  assert.equal(author.trim(), "Home Assistant <homeassistant@home.example>");
  const events = async () => (JSON.parse(await kube.kubectl(["get", "events", "-n", "home", "-o", "json"])) as { items: Event[] }).items;

  // The Git LFS pointer the application wrote over is committed as written, and named in a Warning on the pod and the claim.
  await waitFor("floorplan.bin pushed as written", async () => (await server.git("homeassistant.git", "show", "main:floorplan.bin")) === "the floor plan");
  const notServed = await waitFor("GitVolumeNotServed on the pod and the claim", async () => {
    const found = (await events()).filter((e) => e.reason === "GitVolumeNotServed");
    return found.length === 2 && found;
  });
  assert.deepEqual(notServed.map((e) => [e.involvedObject.kind, e.type, e.message.split(" ")[0]]).sort(), [
    ["PersistentVolumeClaim", "Warning", "floorplan.bin"],
    ["Pod", "Warning", "floorplan.bin"],
  ]);

  // A bad class is refused with a Warning on the claim; the volume keeps the class it had.
  await kube.kubectl(["patch", "pvc", "config", "-n", "home", "-p", JSON.stringify({ spec: { volumeAttributesClassName: "config-broken" } })]);
  const refused = await waitFor("GitVolumeRefused on the claim", async () => (await events()).find((e) => e.reason === "GitVolumeRefused" && e.involvedObject.kind === "PersistentVolumeClaim"));
  assert.equal(refused.type, "Warning");
  assert.match(refused.message, /class config-broken is refused[\s\S]*push\.quiesce/);
  assert.equal((await report(driver, volume.volumeId)).className, "config-eager");

  // A change of class re-arms the volume live, with no restart of anything.
  await kube.kubectl(["patch", "pvc", "config", "-n", "home", "-p", JSON.stringify({ spec: { volumeAttributesClassName: "config-lazy" } })]);
  await waitFor("the new class", async () => (await report(driver, volume.volumeId)).className === "config-lazy");

  // kubectl get events: the spec's reasons on the pod and on the claim, with the objects' uids so describe finds them.
  const posted = await waitFor("GitVolumePushed on the pod and the claim", async () => {
    const all = await events();
    const on = (kind: string, reason: string) => all.find((e) => e.involvedObject.kind === kind && e.reason === reason);
    return on("Pod", "GitVolumePushed") && on("PersistentVolumeClaim", "GitVolumePushed") && on("Pod", "GitVolumeArmed") && all;
  });
  const armedOnClaim = posted.find((e) => e.involvedObject.kind === "PersistentVolumeClaim" && e.reason === "GitVolumeArmed")!;
  assert.deepEqual([armedOnClaim.type, armedOnClaim.involvedObject.name, armedOnClaim.involvedObject.uid], ["Normal", "config", claimUid]);
  assert.equal(posted.find((e) => e.involvedObject.kind === "Pod" && e.reason === "GitVolumePushed")!.involvedObject.uid, podUid);
  const described = await kube.kubectl(["describe", "pvc", "config", "-n", "home"]);
  assert.match(described, /GitVolumePushed/);

  // The git worker dies while the claim's class changes: the node keeps the new class, the restarted
  // worker is armed with it, and its events (the stage's too) still reach the pod.
  const onPod = async (reason: string, message = /./) =>
    (await events()).filter((e) => e.involvedObject.kind === "Pod" && e.reason === reason && message.test(e.message)).reduce((n, e) => n + (e.count ?? 1), 0);
  const armedBefore = await onPod("GitVolumeArmed", /config-eager/);
  // The node recorded the lazy class: the class the worker dies under is the one thing that differs.
  const nodeRecord = path.join(driver.stateDir, "volumes", `${volume.volumeId}.json`);
  await waitFor("the lazy class recorded on the node", async () => (await fs.readFile(nodeRecord, "utf8")).includes('"name": "config-lazy"'));
  const worker = await driver.pid("git-worker");
  process.kill(worker, "SIGSTOP");
  await kube.kubectl(["patch", "pvc", "config", "-n", "home", "-p", JSON.stringify({ spec: { volumeAttributesClassName: "config-eager" } })]);
  // The class reaches the mount owner, whose call to the stopped worker is in flight when the worker dies.
  await sleep(1500);
  process.kill(worker, "SIGKILL");
  await waitFor("the restarted worker armed with the class patched while it was down", async () => (await report(driver, volume.volumeId).catch(() => undefined))?.className === "config-eager");
  await waitFor("GitVolumeArmed on the pod from the restarted worker", async () => (await onPod("GitVolumeArmed", /config-eager/)) > armedBefore);
  const pushedBefore = await onPod("GitVolumePushed");
  await sh(`echo 'switch: {}' > '${published.targetPath}/switch.yaml'`);
  await waitFor("switch.yaml pushed", () => server.git("homeassistant.git", "show", "main:switch.yaml").catch(() => undefined));
  await waitFor("GitVolumePushed on the pod after the restart", async () => (await onPod("GitVolumePushed")) > pushedBefore);
  await kube.kubectl(["patch", "pvc", "config", "-n", "home", "-p", JSON.stringify({ spec: { volumeAttributesClassName: "config-lazy" } })]);
  await waitFor("the lazy class again", async () => (await report(driver, volume.volumeId)).className === "config-lazy");
  await sh(`echo 'last: {}' > '${published.targetPath}/last.yaml'`);

  // The controller knows a static PersistentVolume it holds no record of: ControllerModifyVolume succeeds.
  await call(driver.controller.controllerModifyVolume.bind(driver.controller), { volumeId: volume.volumeId, mutableParameters: LAZY, secrets: {} }, 30_000);
  await assert.rejects(
    call(driver.controller.controllerModifyVolume.bind(driver.controller), { volumeId: "no-such-volume", mutableParameters: {}, secrets: {} }, 30_000),
    (err: { code: number }) => err.code === status.NOT_FOUND,
  );

  // The pod goes; then the PersistentVolume, with reclaim policy Delete: the node's tree goes too.
  // The push the pod's stop makes is told on that pod too.
  const pushedBeforeStop = await onPod("GitVolumePushed");
  await unpublishAndUnstage(driver, published);
  assert.equal(await server.git("homeassistant.git", "show", "main:last.yaml"), "last: {}");
  await waitFor("GitVolumePushed on the pod for the push its stop made", async () => (await onPod("GitVolumePushed")) > pushedBeforeStop);
  const tree = path.join(driver.stateDir, "trees", volume.volumeId);
  assert.ok(
    await fs.stat(tree).then(
      () => true,
      () => false,
    ),
    "Retain kept the tree",
  );
  await kube.kubectl(["patch", "pv", "homeassistant-config", "-p", JSON.stringify({ spec: { persistentVolumeReclaimPolicy: "Delete" } })]);
  await kube.kubectl(["delete", "pvc", "config", "-n", "home", "--wait=false"]);
  await kube.kubectl(["delete", "pv", "homeassistant-config", "--wait=false"]);
  // No controller-manager removes the protection finalizers: the test does, as the controllers would once unused.
  await kube.kubectl(["patch", "pvc", "config", "-n", "home", "--type", "merge", "-p", '{"metadata":{"finalizers":null}}']).catch(() => undefined);
  await kube.kubectl(["patch", "pv", "homeassistant-config", "--type", "merge", "-p", '{"metadata":{"finalizers":null}}']).catch(() => undefined);
  await waitFor(
    "the deleted volume's tree to go",
    async () =>
      !(await fs.stat(tree).then(
        () => true,
        () => false,
      )),
  );
  assert.equal(metricValue(await metricsText(driver), "git_csi_armed", "config"), undefined);

  // A PersistentVolume with reclaim policy Delete that goes while the node plugin is down: its tree goes when it starts again.
  await apply({
    apiVersion: "v1",
    kind: "PersistentVolume",
    metadata: { name: "backup-config" },
    spec: {
      capacity: { storage: "1Gi" },
      accessModes: ["ReadWriteOncePod"],
      persistentVolumeReclaimPolicy: "Delete",
      storageClassName: "",
      csi: { driver: "git.liken.sh", volumeHandle: "backup-config", volumeAttributes: { url, ref: "main" } },
    },
  });
  const backup = await stageAndPublish(driver, { ...volume, volumeId: "backup-config", volumeContext: { url, ref: "main" } }, SINGLE_NODE_SINGLE_WRITER, "backup");
  await unpublishAndUnstage(driver, backup);
  const backupRecord = path.join(driver.stateDir, "volumes", "backup-config.json");
  await waitFor("the backup volume's reclaim policy recorded", async () => (await fs.readFile(backupRecord, "utf8").catch(() => "")).includes('"reclaimPolicy": "Delete"'));
  const backupTree = path.join(driver.stateDir, "trees", "backup-config");
  assert.ok(
    await fs.stat(backupTree).then(
      () => true,
      () => false,
    ),
  );
  await started.pop()!.stop();
  await kube.kubectl(["delete", "pv", "backup-config", "--wait=false"]);
  await kube.kubectl(["patch", "pv", "backup-config", "--type", "merge", "-p", '{"metadata":{"finalizers":null}}']).catch(() => undefined);
  driver = await startDriver({ kubeconfig: kube.kubeconfig, dir: path.join(dir, "node") });
  started.push(driver);
  await waitFor(
    "the tree of the volume deleted while the node was down to go",
    async () =>
      !(await fs.stat(backupTree).then(
        () => true,
        () => false,
      )),
  );
});
