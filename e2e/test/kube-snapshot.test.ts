// A snapshot and a clone of a volume a node serves, against a real API
// server, git server and FUSE mount: the controller asks the node through the
// PersistentVolume's git.liken.sh/snapshot-request, the node flushes and
// pushes refs/git-csi/flushed/<volume>/<request>, and only then is the
// snapshot ready or the clone made, holding every write acknowledged before.
import assert from "node:assert/strict";
import * as fs from "node:fs/promises";
import * as path from "node:path";
import { test } from "node:test";
import { status } from "@grpc/grpc-js";
import { call, csi } from "@git-csi/protos";
import { freePort, mountCapability, refused, report, sh, stageAndPublish, startDriver, unpublishAndUnstage, waitFor } from "../src/driver";
import { startGitDaemon } from "../src/git-server";
import { boundConfigClaim, kubeForTest } from "../src/kube";

const T = 60_000;
const TEMPLATE = "claims/${pvc.metadata.namespace}/${pvc.metadata.name}";
/** Armed, yet nothing is pushed on its own during the test: only a flush pushes. */
const QUIET = { "push.quiesce": "1h", "push.maxLatency": "2h" };

test("a snapshot and a clone of a volume a node serves hold every write it acknowledged: the node flushes first", async (t) => {
  const kube = await kubeForTest(t, "kube-snapshot");
  const server = await startGitDaemon();
  const driver = await startDriver({ kubeconfig: kube.kubeconfig, metricsPort: await freePort() });
  t.after(async () => {
    await driver.stop();
    await server.stop();
  });
  await server.createRepo("config.git", { files: { "configuration.yaml": "homeassistant:\n" } });
  const url = server.url("config.git");

  const parameters = (pvc: string) => ({ url, ref: TEMPLATE, "csi.storage.k8s.io/pvc/namespace": "home", "csi.storage.k8s.io/pvc/name": pvc, "csi.storage.k8s.io/pv/name": `pv-${pvc}` });
  const create = async (pvc: string, volumeContentSource?: csi.VolumeContentSource): Promise<csi.Volume> => {
    const request = csi.CreateVolumeRequest.fromPartial({ name: `pv-${pvc}`, volumeCapabilities: [mountCapability()], parameters: parameters(pvc), volumeContentSource });
    return (await call(driver.controller.createVolume.bind(driver.controller), request, T)).volume!;
  };
  const snapshot = async (name: string, sourceVolumeId: string): Promise<csi.Snapshot> =>
    (await call(driver.controller.createSnapshot.bind(driver.controller), csi.CreateSnapshotRequest.fromPartial({ name, sourceVolumeId }), T)).snapshot!;
  const show = (spec: string) => server.git("config.git", "show", spec);
  const refs = async () => (await server.git("config.git", "for-each-ref", "--format=%(refname)")).split("\n").filter(Boolean);
  const request = () => kube.kubectl(["get", "pv", "pv-config", "-o", "jsonpath={.metadata.annotations.git\\.liken\\.sh/snapshot-request}"]);

  const source = await create("config");
  await kube.apply(
    { apiVersion: "v1", kind: "Namespace", metadata: { name: "home" } },
    { apiVersion: "storage.k8s.io/v1", kind: "VolumeAttributesClass", metadata: { name: "quiet" }, driverName: "git.liken.sh", parameters: QUIET },
    ...boundConfigClaim("pv-config", source.volumeContext, "quiet"),
  );
  const published = await stageAndPublish(driver, source, undefined, "homeassistant");
  try {
    await waitFor("the claim's class to arm the volume", async () => (await report(driver, "pv-config")).armed);
    // The application's write succeeded; the class pushes it in an hour at the earliest.
    await sh(`printf 'light: {}\\n' > '${published.targetPath}/light.yaml'`);
    await assert.rejects(show("claims/home/config:light.yaml"), "the write is not pushed yet");

    const asked = await snapshot("snap-1", "pv-config");
    assert.deepEqual([asked.snapshotId, asked.sourceVolumeId, asked.readyToUse], ["snap-1", "pv-config", false]);
    assert.equal(await request(), "snap-1", "the PersistentVolume asks the node to flush");
    // The csi-snapshotter asks again until the snapshot is ready.
    const ready = await waitFor("the snapshot ready", async () => {
      const again = await snapshot("snap-1", "pv-config");
      return again.readyToUse && again;
    });
    assert.equal(await show("refs/git-csi/snapshots/snap-1:light.yaml"), "light: {}");
    assert.equal(ready.sizeBytes, Buffer.byteLength("homeassistant:\nlight: {}\n"));
    assert.deepEqual(
      (await refs()).filter((r) => r.startsWith("refs/git-csi/flushed/")),
      [],
      "the flushed marker went with the snapshot's push",
    );
    assert.equal(await request(), "", "the served request leaves the PersistentVolume");

    // A clone at the moment of its request: the write made after the snapshot is in it.
    await sh(`printf 'later\\n' > '${published.targetPath}/later.yaml'`);
    await refused(create("clone", { volume: { volumeId: "pv-config" } }), status.UNAVAILABLE, ["volume_content_source.volume pv-config", "the clone waits"]);
    assert.equal(await request(), "pv-clone");
    await waitFor("the clone made", () => create("clone", { volume: { volumeId: "pv-config" } }));
    assert.equal(await show("claims/home/clone:later.yaml"), "later");
    assert.equal(await show("claims/home/clone:light.yaml"), "light: {}");

    // A restore of the snapshot serves its write, and not the one after it.
    const restored = await create("restored", { snapshot: { snapshotId: "snap-1" } });
    const restoredMount = await stageAndPublish(driver, restored, undefined, "restorer");
    try {
      assert.equal(await fs.readFile(path.join(restoredMount.targetPath, "light.yaml"), "utf8"), "light: {}\n");
      await assert.rejects(fs.stat(path.join(restoredMount.targetPath, "later.yaml")), { code: "ENOENT" });
    } finally {
      await unpublishAndUnstage(driver, restoredMount);
    }

    const before = await refs();
    await refused(snapshot("snap-x", "pv-nobody"), status.INVALID_ARGUMENT, "source_volume_id pv-nobody");
    assert.deepEqual(await refs(), before);
  } finally {
    await unpublishAndUnstage(driver, published);
  }
});
