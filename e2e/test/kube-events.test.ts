import assert from "node:assert/strict";
import * as fs from "node:fs/promises";
import * as net from "node:net";
import * as path from "node:path";
import { test } from "node:test";
import { Reason } from "@git-csi/config";
import { EVENT_BURST, EventRecorder, loadKubeConfig, type EventRecorderOptions, type InvolvedObject } from "@git-csi/k8s";
import { freePort } from "../src/driver";
import { kubeForTest } from "../src/kube";

interface Event {
  metadata: { name: string };
  involvedObject: { kind: string; namespace: string; name: string; uid?: string };
  reason: string;
  type: string;
  message: string;
  count: number;
  firstTimestamp: string;
  lastTimestamp: string;
  source: { component: string; host: string };
  reportingComponent: string;
  reportingInstance: string;
}

test("EventRecorder posts, counts and rate-limits core/v1 Events on a real API server", async (t) => {
  const kube = await kubeForTest(t, "kube-events");
  const ns = "apps";
  await kube.apply(
    { apiVersion: "v1", kind: "Namespace", metadata: { name: ns } },
    // No controller creates it here, and admission wants it for a pod.
    { apiVersion: "v1", kind: "ServiceAccount", metadata: { name: "default", namespace: ns } },
  );
  await kube.apply(
    {
      apiVersion: "v1",
      kind: "PersistentVolumeClaim",
      metadata: { name: "config", namespace: ns },
      spec: { accessModes: ["ReadWriteOncePod"], resources: { requests: { storage: "1Gi" } }, storageClassName: "" },
    },
    { apiVersion: "v1", kind: "Pod", metadata: { name: "homeassistant", namespace: ns }, spec: { containers: [{ name: "app", image: "busybox" }] } },
  );
  const uidOf = (kind: string, name: string) => kube.kubectl(["get", kind, name, "-n", ns, "-o", "jsonpath={.metadata.uid}"]);
  const pod: InvolvedObject = { kind: "Pod", namespace: ns, name: "homeassistant", uid: await uidOf("pod", "homeassistant") };
  const claim: InvolvedObject = { kind: "PersistentVolumeClaim", namespace: ns, name: "config", uid: await uidOf("pvc", "config") };
  const events = async () => (JSON.parse(await kube.kubectl(["get", "events", "-n", ns, "-o", "json"])) as { items: Event[] }).items;

  const warnings: string[] = [];
  const logger = {
    warn: (message: string, meta: object) => warnings.push(`${message} ${JSON.stringify(meta)}`),
    error: (message: string, meta: object) => warnings.push(`${message} ${JSON.stringify(meta)}`),
  } as unknown as EventRecorderOptions["logger"];
  const kubeConfig = await loadKubeConfig({ kubeconfig: kube.kubeconfig });
  const recorder = new EventRecorder({ kubeConfig, nodeId: "node-a", logger });

  recorder.record(pod, "Normal", Reason.Armed, "armed with class config-eager");
  recorder.record(claim, "Warning", Reason.PushFailed, "push to main failed: permission denied");
  await recorder.flush();
  const posted = await events();
  const byReason = (reason: string) => posted.find((e) => e.reason === reason)!;
  const common = { count: 1, source: { component: "git.liken.sh", host: "node-a" }, reportingComponent: "git.liken.sh", reportingInstance: "node-a" };
  assert.equal(posted.length, 2);
  const armedEvent = byReason(Reason.Armed);
  const failedEvent = byReason(Reason.PushFailed);
  assert.deepEqual(summary(armedEvent), { involvedObject: { kind: "Pod", namespace: ns, name: "homeassistant", uid: pod.uid }, type: "Normal", message: "armed with class config-eager", ...common });
  assert.deepEqual(summary(failedEvent), {
    involvedObject: { kind: "PersistentVolumeClaim", namespace: ns, name: "config", uid: claim.uid },
    type: "Warning",
    message: "push to main failed: permission denied",
    ...common,
  });
  assert.match(armedEvent.metadata.name, /^homeassistant\.[0-9a-f]+$/);
  assert.match(failedEvent.metadata.name, /^config\.[0-9a-f]+$/);
  // kubectl describe finds an object's events by its uid too.
  assert.match(await kube.kubectl(["describe", "pod", "homeassistant", "-n", ns]), /Normal\s+GitVolumeArmed\s+.*armed with class config-eager/);
  assert.match(await kube.kubectl(["describe", "pvc", "config", "-n", ns]), /Warning\s+GitVolumePushFailed\s+.*push to main failed: permission denied/);

  // 30 identical events at once from a fresh recorder: the bucket lets 25 through, which land
  // as one Event counted 25 (the first creates it, 24 patches count on it); 5 are dropped.
  const busy = new EventRecorder({ kubeConfig, nodeId: "node-a", logger });
  for (let i = 0; i < 30; i++) busy.record(claim, "Normal", Reason.Pushed, "pushed 1 commit to main");
  await busy.flush();
  const pushed = (await events()).filter((e) => e.reason === Reason.Pushed);
  assert.equal(pushed.length, 1);
  assert.equal(pushed[0]!.count, EVENT_BURST);
  assert.ok(pushed[0]!.lastTimestamp >= pushed[0]!.firstTimestamp);
  assert.equal(busy.dropped(), 30 - EVENT_BURST);
  // The drops are logged once for the dry spell, not once each.
  assert.equal(warnings.filter((w) => w.includes("GitVolumePushed events on this object are dropped")).length, 1);
  assert.match(
    warnings.find((w) => w.includes("GitVolumePushed events on this object are dropped"))!,
    /"kind":"PersistentVolumeClaim".*"name":"config"/,
  );
  warnings.length = 0;
  // The bucket is per object: the pod still has its burst.
  busy.record(pod, "Normal", Reason.Pushed, "pushed 1 commit to main");
  await busy.flush();
  assert.equal(busy.dropped(), 30 - EVENT_BURST);
  assert.equal((await events()).filter((e) => e.reason === Reason.Pushed && e.involvedObject.kind === "Pod").length, 1);
  // And per reason: a flood of one reason on the claim never silences another.
  busy.record(claim, "Warning", Reason.EpochLost, "the mount epoch lost the volume");
  await busy.flush();
  assert.equal(busy.dropped(), 30 - EVENT_BURST);
  assert.equal((await events()).filter((e) => e.reason === Reason.EpochLost && e.involvedObject.kind === "PersistentVolumeClaim").length, 1);

  // A namespace that does not exist: no throw, a warning that names it, one more dropped; never the token.
  assert.equal(warnings.length, 0, warnings.join("\n"));
  assert.equal(recorder.dropped(), 0);
  recorder.record({ kind: "Pod", namespace: "nowhere", name: "ghost" }, "Warning", Reason.Refused, "refused");
  await recorder.flush();
  assert.equal(recorder.dropped(), 1);
  assert.equal(warnings.length, 1);
  assert.match(warnings[0]!, /posting a Kubernetes event failed .*"namespace":"nowhere".*"attempts":1,.*HTTP 404: namespaces \\"nowhere\\" not found/);
  assert.ok(!warnings[0]!.includes(kube.token));

  // An API server that does not answer for a moment (a restart, a leader change): the post is tried again.
  const port = await freePort();
  const config = JSON.parse(await fs.readFile(kube.kubeconfig, "utf8")) as { clusters: { cluster: { server: string } }[] };
  const upstream = new URL(kube.server);
  config.clusters[0]!.cluster.server = `https://${upstream.hostname}:${port}`;
  const proxied = path.join(path.dirname(kube.kubeconfig), "proxied.kubeconfig");
  await fs.writeFile(proxied, JSON.stringify(config), { mode: 0o600 });
  // The API server answers through a TCP proxy that drops the first connection, as a restarting server does.
  const sockets = new Set<net.Socket>();
  let dropped = 0;
  const proxy = net.createServer((client) => {
    sockets.add(client);
    if (dropped === 0) {
      dropped++;
      client.destroy();
      return;
    }
    const server = net.connect(Number(upstream.port), upstream.hostname);
    sockets.add(server);
    for (const socket of [client, server]) {
      socket.on("error", () => undefined);
      socket.on("close", () => [client, server].forEach((s) => s.destroy()));
    }
    client.pipe(server).pipe(client);
  });
  await new Promise<void>((resolve) => proxy.listen(port, "127.0.0.1", resolve));
  // The recorder's client keeps its connection alive: the proxy ends it, or its close would wait for it.
  t.after(() => {
    for (const socket of sockets) socket.destroy();
    return new Promise((resolve) => proxy.close(resolve));
  });
  const later = new EventRecorder({ kubeConfig: await loadKubeConfig({ kubeconfig: proxied }), nodeId: "node-a", logger, retryDelaysMs: [500, 1000, 2000] });
  later.record(pod, "Normal", Reason.Healed, "healed: main took the side branch");
  await later.flush();
  assert.equal(dropped, 1, "the first try met a dropped connection");
  assert.equal(later.dropped(), 0, warnings.join("\n"));
  assert.equal((await events()).filter((e) => e.reason === Reason.Healed && e.involvedObject.name === "homeassistant").length, 1);
});

function summary(e: Event) {
  const { kind, namespace, name, uid } = e.involvedObject;
  return {
    involvedObject: { kind, namespace, name, uid },
    type: e.type,
    message: e.message,
    count: e.count,
    source: e.source,
    reportingComponent: e.reportingComponent,
    reportingInstance: e.reportingInstance,
  };
}
