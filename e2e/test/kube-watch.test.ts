import assert from "node:assert/strict";
import { test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { ClassWatch, loadKubeConfig, type ClassWatchOptions, type VolumeState } from "@git-csi/k8s";
import { waitFor } from "../src/driver";
import { kubeForTest } from "../src/kube";

const EAGER = { "push.quiesce": "30s", "push.maxLatency": "5m", "commit.maxFileSize": "1Mi", "commit.author": "Home Assistant <homeassistant@home.example>", ignore: ".storage/,*.db*,*.log" };
const LAZY = { "push.quiesce": "10m", "push.maxLatency": "1h" };

function volumeClass(name: string, parameters: Record<string, string>, driverName = "git.liken.sh") {
  return { apiVersion: "storage.k8s.io/v1", kind: "VolumeAttributesClass", metadata: { name }, driverName, parameters };
}

function persistentVolume(name: string, driver: string, reclaimPolicy: string, claim?: { namespace: string; name: string }) {
  return {
    apiVersion: "v1",
    kind: "PersistentVolume",
    metadata: { name },
    spec: {
      capacity: { storage: "1Gi" },
      accessModes: ["ReadWriteOncePod"],
      persistentVolumeReclaimPolicy: reclaimPolicy,
      storageClassName: "",
      // No controller-manager runs to bind: the claimRef is set here, as a pre-bound volume's is.
      claimRef: claim,
      csi: { driver, volumeHandle: name, volumeAttributes: { url: "git@code.example.com:home/homeassistant.git", ref: "main" } },
    },
  };
}

test("ClassWatch follows PV → claim → VolumeAttributesClass on a real API server", async (t) => {
  const kube = await kubeForTest(t, "kube-watch");
  const apply = kube.apply;
  const removeFinalizers = (kind: string, name: string) => kube.kubectl(["patch", kind, name, "--type", "json", "-p", JSON.stringify([{ op: "remove", path: "/metadata/finalizers" }])]);
  const patchClaim = (patch: object, type = "merge") => kube.kubectl(["patch", "pvc", "config", "-n", "home", "--type", type, "-p", JSON.stringify(patch)]);

  await apply(
    { apiVersion: "v1", kind: "Namespace", metadata: { name: "home" } },
    volumeClass("config-eager", EAGER),
    volumeClass("config-lazy", LAZY),
    volumeClass("someone-elses", { tier: "gold" }, "other.example.com"),
    persistentVolume("homeassistant-config", "git.liken.sh", "Delete", { namespace: "home", name: "config" }),
    persistentVolume("spare", "git.liken.sh", "Retain"),
    persistentVolume("not-ours", "other.example.com", "Delete"),
  );
  await apply({
    apiVersion: "v1",
    kind: "PersistentVolumeClaim",
    metadata: { name: "config", namespace: "home" },
    spec: { volumeName: "homeassistant-config", accessModes: ["ReadWriteOncePod"], resources: { requests: { storage: "1Gi" } }, storageClassName: "", volumeAttributesClassName: "config-eager" },
  });
  // Kubernetes takes a class change only on a bound claim; the binder that would say so does not run here.
  await kube.kubectl(["patch", "pvc", "config", "-n", "home", "--subresource=status", "--type", "merge", "-p", JSON.stringify({ status: { phase: "Bound" } })]);
  const uid = await kube.kubectl(["get", "pvc", "config", "-n", "home", "-o", "jsonpath={.metadata.uid}"]);

  const heard: Array<[string, VolumeState]> = [];
  const warnings: string[] = [];
  const logger = { warn: (message: string) => warnings.push(message), error: (message: string) => warnings.push(message) } as unknown as ClassWatchOptions["logger"];
  const watch = new ClassWatch({ kubeConfig: await loadKubeConfig({ kubeconfig: kube.kubeconfig }), logger, onVolume: (handle, state) => heard.push([handle, state]) });
  t.after(() => watch.stop());
  await watch.start();

  // Start-up: once for each of the driver's volumes, none for another driver's.
  const claim = { namespace: "home", name: "config", uid };
  const armed = (name: string, parameters: Record<string, string>): VolumeState => ({ claim, volumeClass: { name, parameters }, reclaimPolicy: "Delete", deleted: false });
  const unarmed: VolumeState = { claim, volumeClass: undefined, reclaimPolicy: "Delete", deleted: false };
  assert.deepEqual(
    [...heard].sort(([a], [b]) => a.localeCompare(b)),
    [
      ["homeassistant-config", armed("config-eager", EAGER)],
      ["spare", { claim: undefined, volumeClass: undefined, reclaimPolicy: "Retain", deleted: false }],
    ],
  );
  assert.deepEqual(watch.claimOf("homeassistant-config"), claim);
  heard.length = 0;

  const expected: VolumeState[] = [];
  const next = async (change: () => Promise<unknown>, state: VolumeState) => {
    await change();
    expected.push(state);
    await waitFor(`onVolume to hear ${JSON.stringify(state)}`, async () => heard.length >= expected.length);
    assert.deepEqual(
      heard.map(([handle]) => handle),
      expected.map(() => "homeassistant-config"),
    );
    assert.deepEqual(
      heard.map(([, s]) => s),
      expected,
    );
  };

  // A class change re-arms with the new class's parameters.
  await next(() => patchClaim({ spec: { volumeAttributesClassName: "config-lazy" } }), armed("config-lazy", LAZY));
  // A class's parameters cannot change: a new policy is a new class.
  await assert.rejects(kube.kubectl(["patch", "volumeattributesclass", "config-lazy", "--type", "merge", "-p", JSON.stringify({ parameters: { "push.quiesce": "1m" } })]), /immutable|Forbidden/i);
  // Another driver's class unarms.
  await next(() => patchClaim({ spec: { volumeAttributesClassName: "someone-elses" } }), unarmed);
  // A class that does not exist yet leaves the volume unarmed: the same state, so no call.
  await patchClaim({ spec: { volumeAttributesClassName: "config-later" } });
  await sleep(1000);
  assert.equal(heard.length, expected.length, "no call for an unchanged state");
  // Creating it arms.
  await next(() => apply(volumeClass("config-later", { "push.quiesce": "1m" })), armed("config-later", { "push.quiesce": "1m" }));
  // A class in use is not deleted: admission gave it the vac-protection finalizer, and it stays in force while it terminates.
  await kube.kubectl(["delete", "volumeattributesclass", "config-later", "--wait=false"]);
  await sleep(1000);
  assert.equal(heard.length, expected.length, "no call while the class terminates");
  // Gone (the finalizer lifted by hand): unarmed.
  await next(() => removeFinalizers("volumeattributesclass", "config-later"), unarmed);
  // Removing the class from the claim unarms. Kubernetes allows that only while no class took
  // effect (status.currentVolumeAttributesClassName unset), as here without an external-resizer.
  await next(() => patchClaim({ spec: { volumeAttributesClassName: "config-eager" } }), armed("config-eager", EAGER));
  await next(() => patchClaim([{ op: "remove", path: "/spec/volumeAttributesClassName" }], "json"), unarmed);
  // A volume being deleted is still there: its pv-protection finalizer, which admission added, holds it.
  await kube.kubectl(["delete", "pv", "homeassistant-config", "--wait=false"]);
  await sleep(1000);
  assert.equal(heard.length, expected.length, "no call while the volume terminates");
  // Gone (the finalizer lifted, as the controller-manager would): deleted, with its reclaim policy so the node removes a Delete volume's tree.
  await next(() => removeFinalizers("pv", "homeassistant-config"), { ...unarmed, deleted: true });
  assert.equal(watch.claimOf("homeassistant-config"), undefined);
  assert.equal(warnings.length, 0, warnings.join("\n"));
});
