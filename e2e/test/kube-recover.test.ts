import assert from "node:assert/strict";
import * as fs from "node:fs/promises";
import * as os from "node:os";
import * as path from "node:path";
import { test } from "node:test";
import { call, csi } from "@git-csi/protos";
import { Reason } from "@git-csi/config";
import { createVolume, type Driver, publish, type PublishedVolume, stageAndPublish, startDriver, waitFor } from "../src/driver";
import { startGitDaemon } from "../src/git-server";
import { type Kube, kubeForTest } from "../src/kube";

const RWO = csi.VolumeCapability_AccessMode_Mode.SINGLE_NODE_MULTI_WRITER;
const LEASE = { duration: "6s", renewInterval: "2s" };

interface Event {
  reason: string;
  type: string;
  message: string;
  involvedObject: { kind: string; name: string; namespace: string };
}

/**
 * Issue 25's recovery against a real API server: once a volume's mount epoch
 * is lost (here its lease runs out while the remote is away), the driver
 * posts GitVolumeEpochLost on the volume's pods, and with
 * --delete-fenced-pods deletes the pod a controller owns and leaves the bare
 * one; without the flag it deletes nothing.
 */
test("a lost mount epoch: events on its pods, and the pod a controller owns is deleted only with --delete-fenced-pods", async (t) => {
  const kube = await kubeForTest(t, "kube-recover");
  const server = await startGitDaemon();
  const dir = await fs.mkdtemp(path.join(os.tmpdir(), "git-csi-kube-recover-"));
  const started: Driver[] = [];
  const away: string[] = [];
  t.after(async () => {
    for (const repoDir of away) await fs.rename(`${repoDir}.away`, repoDir).catch(() => undefined);
    for (const node of started) await node.stop();
    await server.stop();
    await fs.rm(dir, { recursive: true, force: true });
  });

  // Two nodes at once, one with the flag and one without: both lose their epoch the same way.
  const [on, off] = await Promise.all(
    [
      { ns: "on", deleteFencedPods: true },
      { ns: "off", deleteFencedPods: false },
    ].map(async ({ ns, deleteFencedPods }) => {
      const pods = await podsIn(kube, ns);
      await server.createRepo(`${ns}.git`, { files: { "configuration.yaml": "a: 1\n" } });
      const driver = await startDriver({ kubeconfig: kube.kubeconfig, lease: LEASE, deleteFencedPods, nodeId: `node-${ns}`, dir: path.join(dir, ns) });
      started.push(driver);
      const volume = await createVolume(driver, `recover-${ns}`, server.url(`${ns}.git`), RWO);
      const podContext = (pod: { name: string; uid: string }) => ({
        ...volume.volumeContext,
        "csi.storage.k8s.io/pod.name": pod.name,
        "csi.storage.k8s.io/pod.namespace": ns,
        "csi.storage.k8s.io/pod.uid": pod.uid,
        "csi.storage.k8s.io/ephemeral": "false",
      });
      const first = await stageAndPublish(driver, { ...volume, volumeContext: podContext(pods.controlled) }, RWO, "controlled");
      const second: PublishedVolume = { ...first, context: podContext(pods.bare), targetPath: path.join(driver.dir, "pods", "bare", "volume") };
      await fs.mkdir(path.dirname(second.targetPath), { recursive: true });
      await publish(driver, second, {}, RWO);
      return { ns, driver, volume, published: [first, second] };
    }),
  );

  // The remotes go away: no renewal lands, and each lease runs out unrenewed.
  for (const ns of ["on", "off"]) {
    const repoDir = server.repoPath(`${ns}.git`);
    await fs.rename(repoDir, `${repoDir}.away`);
    away.push(repoDir);
  }

  const epochLost = async (ns: string, pod: string) =>
    (JSON.parse(await kube.kubectl(["get", "events", "-n", ns, "-o", "json"])) as { items: Event[] }).items.filter(
      (e) => e.reason === Reason.EpochLost && e.involvedObject.kind === "Pod" && e.involvedObject.name === pod,
    );
  const exists = async (ns: string, pod: string) => (await kube.kubectl(["get", "pod", pod, "-n", ns, "--ignore-not-found", "-o", "name"])).trim() !== "";

  // With the flag: the controller's pod is deleted, the bare pod is left and told to be deleted by hand.
  await waitFor("the controlled pod deleted", async () => !(await exists("on", "controlled")), 60_000);
  assert.ok(await exists("on", "bare"), "the pod no controller owns is left");
  const onBare = await waitFor("the bare pod told to be deleted by hand", async () => {
    const events = await epochLost("on", "bare");
    return events.some((e) => /left pod on\/bare: no controller owns it.*delete it by hand/.test(e.message)) && events;
  });
  assert.ok(onBare.every((e) => e.type === "Warning"));
  assert.ok(onBare.some((e) => /lost the volume \(.*ran out unrenewed.*\); the mount answers EIO until the pod is deleted/.test(e.message)));
  const onControlled = await epochLost("on", "controlled");
  assert.ok(onControlled.some((e) => /the mount answers EIO until the pod is deleted/.test(e.message)));
  assert.ok(onControlled.some((e) => /deleted pod on\/controlled: its controller ReplicaSet\/web starts it again/.test(e.message)));

  // Without it: both pods are told, and both stay.
  for (const pod of ["controlled", "bare"]) {
    const events = await waitFor(
      `the event on off/${pod}`,
      async () => {
        const found = await epochLost("off", pod);
        return found.length > 0 && found;
      },
      60_000,
    );
    assert.match(events[0]!.message, /--delete-fenced-pods is off/);
    assert.equal(events[0]!.type, "Warning");
  }
  assert.ok(await exists("off", "controlled"), "without --delete-fenced-pods no pod is deleted");
  assert.ok(await exists("off", "bare"));

  // The release at unstage is no loss: no event beyond the one per epoch.
  for (const repoDir of away.splice(0)) await fs.rename(`${repoDir}.away`, repoDir);
  for (const { driver, published } of [on, off]) {
    for (const p of published) await call(driver.node.nodeUnpublishVolume.bind(driver.node), { volumeId: p.volumeId, targetPath: p.targetPath }, 60_000);
    await call(driver.node.nodeUnstageVolume.bind(driver.node), { volumeId: published[0]!.volumeId, stagingTargetPath: published[0]!.stagingPath }, 60_000);
  }
  assert.equal((await epochLost("off", "bare")).length, 1);
});

/** A namespace with a ReplicaSet, a pod it controls and a bare pod; nothing reconciles them here. */
async function podsIn(kube: Kube, ns: string): Promise<{ controlled: { name: string; uid: string }; bare: { name: string; uid: string } }> {
  const labels = { app: "web" };
  const container = { name: "app", image: "busybox" };
  await kube.apply(
    { apiVersion: "v1", kind: "Namespace", metadata: { name: ns } },
    // No controller-manager makes the namespace's default ServiceAccount, which a pod needs.
    { apiVersion: "v1", kind: "ServiceAccount", metadata: { name: "default", namespace: ns } },
  );
  await kube.apply({
    apiVersion: "apps/v1",
    kind: "ReplicaSet",
    metadata: { name: "web", namespace: ns },
    spec: { replicas: 1, selector: { matchLabels: labels }, template: { metadata: { labels }, spec: { containers: [container] } } },
  });
  const uidOf = async (kind: string, name: string) => (await kube.kubectl(["get", kind, name, "-n", ns, "-o", "jsonpath={.metadata.uid}"])).trim();
  const owner = { apiVersion: "apps/v1", kind: "ReplicaSet", name: "web", uid: await uidOf("replicaset", "web"), controller: true };
  await kube.apply(
    { apiVersion: "v1", kind: "Pod", metadata: { name: "controlled", namespace: ns, labels, ownerReferences: [owner] }, spec: { containers: [container] } },
    { apiVersion: "v1", kind: "Pod", metadata: { name: "bare", namespace: ns }, spec: { containers: [container] } },
  );
  return { controlled: { name: "controlled", uid: await uidOf("pod", "controlled") }, bare: { name: "bare", uid: await uidOf("pod", "bare") } };
}
