import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import * as fs from "node:fs/promises";
import * as os from "node:os";
import * as path from "node:path";
import { after, before, test } from "node:test";
import { promisify } from "node:util";
import { setTimeout as sleep } from "node:timers/promises";
import { waitFor } from "../src/driver";
import { type Cluster, clusterMissing, GIT_ADDRESS, startCluster } from "../src/cluster";
import { quickStartScript } from "../src/quickstart";
import { BUSYBOX_IMAGE, NODE_IMAGE } from "../src/registry";
import { type SshGitServer, startSshGitServer } from "../src/ssh-server";

/**
 * A real cluster, used as a user uses one: two kubelets with containerd, a
 * real registry, the README's quick start run command by command (the images
 * built by buildah from the Dockerfile, `make publish` to the registry, `helm
 * install` of the chart from it, containerd pulling), and from then on kubectl
 * only. The git server is a real sshd inside the cluster's network namespace.
 */

const ROOT = path.join(__dirname, "..", "..", "..");
const run = promisify(execFile);
const EXAMPLE = path.join(ROOT, "docs", "examples", "homeassistant");
/** The release the quick start installs, and the one the upgrade test moves to. */
const VERSION = "0.1.0-e2e";
const UPGRADE = "0.1.1-e2e";
// The application of the example: writes its configuration when it starts and
// answers the Deployment's readiness probe on 8123, as Home Assistant would.
const HOMEASSISTANT = `
const fs = require("fs");
fs.writeFileSync("/config/configuration.yaml", "homeassistant:\\n  name: Home\\n");
require("http").createServer((q, r) => r.end("ok")).listen(8123);
`;

interface Event {
  reason: string;
  type: string;
  message: string;
  involvedObject: { kind: string; name: string };
}

let cluster: Cluster | undefined;
let git: SshGitServer;
let dir: string;
/** Where `make publish` puts the images and the chart, as a user's REGISTRY. */
let registry: string;

before(
  async () => {
    // A missing tool fails every test here, naming it: a skipped cluster test has not run.
    const missing = clusterMissing();
    if (missing) throw new Error(missing);
    dir = await fs.mkdtemp(path.join(os.tmpdir(), "git-csi-cluster-"));
    cluster = await startCluster(path.join(dir, "cluster"));
    registry = `${cluster.registry}/liken-sh`;
    git = await startSshGitServer({ address: GIT_ADDRESS, netns: cluster.netns });
    // Every Secret the tests make carries the server's host key.
    await fs.writeFile(path.join(dir, "known_hosts"), `${git.hostKeyLine}\n`);
  },
  { timeout: 10 * 60_000 },
);

after(async () => {
  await cluster?.stop();
  await git?.stop();
  // GIT_CSI_KEEP_CLUSTER=1 keeps the nodes' directories (kubelet, containerd and pod logs) for a failure's post-mortem.
  if (dir && process.env.GIT_CSI_KEEP_CLUSTER === "1") console.log(`kept ${dir}`);
  else if (dir) await fs.rm(dir, { recursive: true, force: true });
});

const kubectl = (...args: string[]) => cluster!.kubectl(args);
const CHART = () => `oci://${registry}/charts/git-csi`;

/**
 * `make images` on the machine's own network, under the names a run in the
 * namespace asks for: the namespace reaches no package registry, so there the
 * builder must find every layer built. With the layers `make test` built,
 * this only names them.
 */
const imagesFor = (version: string) => run("make", ["-C", ROOT, "--no-print-directory", "images", "BASES=local", `REGISTRY=${registry}`, `VERSION=${version}`], { maxBuffer: 16 << 20 });

test("the README's install and quick start, command by command: built by buildah, published to the registry, installed from it, the first volume pushed", async () => {
  await git.createRepo("quickstart.git", { files: { "README.md": "the quick start\n" } });
  const key = await git.addDeployKey("quickstart");
  await fs.writeFile(path.join(dir, "quickstart-key"), key.privateKey, { mode: 0o600 });
  await imagesFor(VERSION);
  const started = Date.now();
  const out = await cluster!.inNetns("bash", ["-euo", "pipefail", "-c", quickStartScript()], "", {
    // What the README leaves to the reader. BASES=local: this machine reaches no public registry, so
    // the base images the Dockerfile names are made here (e2e/images/bases.sh) and never pulled.
    REGISTRY: registry,
    VERSION,
    GIT_URL: git.url("quickstart.git"),
    DEPLOY_KEY: path.join(dir, "quickstart-key"),
    KNOWN_HOSTS: path.join(dir, "known_hosts"),
    BASES: "local",
  });
  console.log(`the quick start took ${Math.round((Date.now() - started) / 1000)} s:\n${out}`);
  assert.equal(await remoteFile("quickstart.git", "hello.txt"), "hello from the quick start");
  // Installed the user's way: the chart from the registry, every driver image pulled from it by containerd.
  assert.equal((await cluster!.helm(["get", "metadata", "git-csi", "-n", "git-csi", "-o", "json"])).includes(`"version":"${VERSION}"`), true);
  const pulled = (await events("git-csi")).filter((e) => e.reason === "Pulled").map((e) => e.message);
  console.log(`pulls in git-csi:\n${pulled.join("\n")}`);
  for (const service of ["csi-frontend", "mount-owner", "git-worker"])
    assert.ok(
      pulled.some((m) => m.includes(`"${registry}/git-csi/${service}:${VERSION}"`) && /Successfully pulled/.test(m)),
      `containerd pulled ${registry}/git-csi/${service}:${VERSION}`,
    );
});
const apply = (yaml: string) => cluster!.kubectl(["apply", "-f", "-"], yaml);

/** helm upgrade of the release to the version it has, with its values and these (`--set`). */
async function upgradeWith(...values: string[]): Promise<void> {
  const installed = JSON.parse(await cluster!.helm(["get", "metadata", "git-csi", "-n", "git-csi", "-o", "json"])) as { version: string };
  const sets = values.flatMap((v) => ["--set", v]);
  await cluster!.helm(["upgrade", "git-csi", CHART(), "--version", installed.version, "-n", "git-csi", "--reuse-values", ...sets, "--wait", "--timeout=5m"]);
}
const events = async (namespace: string) => (JSON.parse(await kubectl("get", "events", "-n", namespace, "-o", "json")) as { items: Event[] }).items;
const remoteFile = (repo: string, file: string) => git.git(repo, "show", `main:${file}`).catch(() => undefined);

test("the kubelet registers the driver the chart installed, on both nodes, with no registrar sidecar", async () => {
  const csinodes = await waitFor(
    "git.liken.sh in both CSINodes",
    async () => {
      const out = await kubectl("get", "csinodes", "-o", 'jsonpath={range .items[*]}{.metadata.name}={.spec.drivers[*].name}{"\\n"}{end}');
      const lines = out.trim().split("\n").sort();
      return lines.length === 2 && lines.every((l) => l.endsWith("=git.liken.sh")) && lines;
    },
    60_000,
  );
  assert.deepEqual(csinodes, ["node1=git.liken.sh", "node2=git.liken.sh"]);
  const containers = async (daemonSet: string) => (await kubectl("get", "daemonset", daemonSet, "-n", "git-csi", "-o", "jsonpath={.spec.template.spec.containers[*].name}")).split(" ").sort();
  assert.deepEqual(await containers("git-csi-node"), ["csi-frontend", "fd-keeper", "git-worker"]);
  assert.deepEqual(await containers("git-csi-mount-owner"), ["mount-owner"]);
});

test("spec 004's homeassistant example: written, armed through the claim's class, pushed; the reasons in describe and events", async () => {
  await git.createRepo("homeassistant.git", { files: { "README.md": "Home Assistant's configuration\n" } });
  const key = await git.addDeployKey("homeassistant");
  const keyFile = path.join(dir, "homeassistant-deploy-key");
  await fs.writeFile(keyFile, key.privateKey, { mode: 0o600 });
  const example = async (file: string) => fs.readFile(path.join(EXAMPLE, file), "utf8");

  await kubectl("apply", "-f", path.join(EXAMPLE, "namespace.yaml"));
  // The Secret as secret.yaml says to make it from files.
  await kubectl(...sshAuthSecret("homeassistant-deploy-key", "home", keyFile));
  await apply((await example("persistentvolume.yaml")).replace("git@code.example.com:home/homeassistant.git", git.url("homeassistant.git")));
  await kubectl("apply", "-f", path.join(EXAMPLE, "persistentvolumeclaim.yaml"));
  await waitFor("the claim Bound", async () => (await kubectl("get", "pvc", "config", "-n", "home", "-o", "jsonpath={.status.phase}")) === "Bound");
  const deployment = (await example("deployment.yaml")).replace(
    "          image: ghcr.io/home-assistant/home-assistant:stable",
    `          image: ${NODE_IMAGE}\n          command: ["node", "-e", ${JSON.stringify(HOMEASSISTANT)}]`,
  );
  assert.notEqual(deployment, await example("deployment.yaml"), "the example names the image this test replaces");
  await apply(deployment);
  await kubectl("rollout", "status", "deployment/homeassistant", "-n", "home", "--timeout=180s");

  // Unarmed: the driver commits nothing until the claim names a class.
  assert.equal(await remoteFile("homeassistant.git", "configuration.yaml"), undefined);
  await kubectl("apply", "-f", path.join(EXAMPLE, "volumeattributesclass.yaml"));
  await kubectl("patch", "pvc", "config", "-n", "home", "-p", JSON.stringify({ spec: { volumeAttributesClassName: "config-eager" } }));
  // The external-resizer calls ControllerModifyVolume, and the claim's status follows.
  await waitFor(
    "status.currentVolumeAttributesClassName",
    async () => (await kubectl("get", "pvc", "config", "-n", "home", "-o", "jsonpath={.status.currentVolumeAttributesClassName}")) === "config-eager",
    90_000,
  );
  // push.quiesce is 30s in the example.
  const pushed = await waitFor("configuration.yaml pushed", () => remoteFile("homeassistant.git", "configuration.yaml"), 120_000);
  assert.equal(pushed, "homeassistant:\n  name: Home");
  assert.equal((await git.git("homeassistant.git", "log", "-1", "--format=%an <%ae>", "main")).trim(), "Home Assistant <homeassistant@home.example>");

  const all = await waitFor(
    "GitVolumeArmed and GitVolumePushed on the pod and the claim",
    async () => {
      const list = await events("home");
      const on = (kind: string, reason: string) => list.some((e) => e.involvedObject.kind === kind && e.reason === reason);
      return on("Pod", "GitVolumeArmed") && on("PersistentVolumeClaim", "GitVolumeArmed") && on("Pod", "GitVolumePushed") && on("PersistentVolumeClaim", "GitVolumePushed") && list;
    },
    60_000,
  );
  assert.ok(
    all.every((e) => !e.reason.startsWith("GitVolume") || e.type === "Normal"),
    "no Warning from the driver",
  );
  const describe = await kubectl("describe", "pvc", "config", "-n", "home");
  assert.match(describe, /GitVolumeArmed/);
  assert.match(describe, /GitVolumePushed/);
  const listed = await kubectl("get", "events", "-n", "home");
  assert.match(listed, /pod\/homeassistant-\S+\s+.*GitVolumePushed|GitVolumePushed\s+pod\/homeassistant-/);
});

const inApp = (script: string) => kubectl("exec", "-n", "home", "deploy/homeassistant", "--", "sh", "-c", script);

test("git-csi report in the git worker's container, as the README says to run it", async () => {
  const node = (await kubectl("get", "pods", "-n", "home", "-l", "app.kubernetes.io/name=homeassistant", "-o", "jsonpath={.items[0].spec.nodeName}")).trim();
  const plugin = (
    await kubectl("get", "pods", "-n", "git-csi", "-l", "app.kubernetes.io/component=node", "--field-selector", `spec.nodeName=${node}`, "-o", "jsonpath={.items[0].metadata.name}")
  ).trim();
  const report = await kubectl("exec", "-n", "git-csi", plugin, "-c", "git-worker", "--", "git-csi", "report", "homeassistant-config");
  assert.match(report, /^volume homeassistant-config$/m);
  assert.match(report, /^claim: home\/config$/m);
  assert.match(report, /^armed by class config-eager: commits and pushes$/m);
  assert.match(report, /^status: normal$/m);
});

test("a rotated Secret is what the next push uses", async () => {
  const key = await git.addDeployKey("homeassistant-rotated");
  const keyFile = path.join(dir, "homeassistant-deploy-key-rotated");
  await fs.writeFile(keyFile, key.privateKey, { mode: 0o600 });
  const secret = await kubectl(...sshAuthSecret("homeassistant-deploy-key", "home", keyFile), "--dry-run=client", "-o", "yaml");
  await apply(secret);
  // The old key no longer opens the repository: only the rotated one can push what comes next.
  await git.revokeDeployKey("homeassistant");
  await inApp("echo 'light: {}' > /config/light.yaml");
  const pushed = await waitFor("light.yaml pushed with the rotated key", () => remoteFile("homeassistant.git", "light.yaml"), 120_000);
  assert.equal(pushed, "light: {}");
});

test("deleting the pod pushes what it wrote, without waiting for the quiesce", async () => {
  await inApp("echo 'switch: {}' > /config/switch.yaml");
  const pod = (await kubectl("get", "pods", "-n", "home", "-l", "app.kubernetes.io/name=homeassistant", "-o", "jsonpath={.items[0].metadata.name}")).trim();
  await kubectl("delete", "pod", pod, "-n", "home", "--wait=true", "--timeout=120s");
  // The class's quiesce is 30 s: a push within a few seconds of the delete is the stop's.
  const pushed = await waitFor("switch.yaml pushed by the stop", () => remoteFile("homeassistant.git", "switch.yaml"), 10_000);
  assert.equal(pushed, "switch: {}");
  await kubectl("rollout", "status", "deployment/homeassistant", "-n", "home", "--timeout=180s");
});

// Appends a line to /config/upgrade.txt every 200 ms for the given seconds and
// reports each failed write, then "done ok=<n> failed=<n>", in /tmp/writer.log.
const WRITER = (seconds: number) => `
const fs = require("fs");
let ok = 0, failed = 0;
const end = Date.now() + ${seconds * 1000};
const timer = setInterval(() => {
  try { fs.appendFileSync("/config/upgrade.txt", Date.now() + "\\n"); ok++; }
  catch (e) { failed++; if (failed <= 3) console.log("write failed: " + e.code + " " + e.message); }
  if (Date.now() > end) { clearInterval(timer); console.log("done ok=" + ok + " failed=" + failed); }
}, 200);
`;

test("helm upgrade to a newly published version while the example writes: the node plugin is replaced, no mount-owner pod is, no write fails", async () => {
  await imagesFor(UPGRADE);
  await cluster!.inNetns("make", ["-C", ROOT, "publish", `REGISTRY=${registry}`, `VERSION=${UPGRADE}`], "", { BASES: "local" });
  const pods = async (component: string) => (await kubectl("get", "pods", "-n", "git-csi", "-l", `app.kubernetes.io/component=${component}`, "-o", "jsonpath={.items[*].metadata.uid}")).split(" ");
  const before = await pods("node");
  const owners = await pods("mount-owner");
  await inApp(`nohup node -e '${WRITER(60)}' > /tmp/writer.log 2>&1 &`);
  await cluster!.helm(["upgrade", "git-csi", CHART(), "--version", UPGRADE, "-n", "git-csi", "--reuse-values", "--wait", "--timeout=5m"]);
  // helm's --wait is satisfied once all but maxUnavailable node pods are new.
  await kubectl("rollout", "status", "daemonset/git-csi-node", "-n", "git-csi", "--timeout=300s");
  const after = await pods("node");
  assert.ok(
    after.every((uid) => !before.includes(uid)),
    "every node plugin pod was replaced",
  );
  assert.deepEqual(await pods("mount-owner"), owners, "no mount-owner pod was replaced");
  assert.equal(await kubectl("get", "daemonset", "git-csi-node", "-n", "git-csi", "-o", "jsonpath={.spec.template.spec.containers[0].image}"), `${registry}/git-csi/csi-frontend:${UPGRADE}`);
  const log = await waitFor(
    "the writer's summary",
    async () => {
      const text = await inApp("cat /tmp/writer.log");
      return /done ok=\d+ failed=\d+/.test(text) && text;
    },
    120_000,
  );
  const [, ok, failed] = /done ok=(\d+) failed=(\d+)/.exec(log)!.map(Number) as [number, number, number];
  // The mount-owner is a DaemonSet of its own: replacing the node plugin pods never ends a mount, and the
  // restarted git worker gets the Secret the mount owner kept, so it renews the lease as soon as it runs.
  console.log(`helm upgrade: ${ok} writes succeeded, ${failed} failed`);
  assert.ok(ok > 0, `the writer wrote: ${log}`);
  assert.equal(failed, 0, `no write failed during the upgrade: ${log}`);
  // A restarted application is staged and published anew: every write that succeeded is pushed.
  await kubectl("rollout", "restart", "deployment/homeassistant", "-n", "home");
  await kubectl("rollout", "status", "deployment/homeassistant", "-n", "home", "--timeout=180s");
  await inApp("echo 'scene: {}' > /config/scene.yaml");
  assert.equal(await waitFor("scene.yaml pushed after the restart", () => remoteFile("homeassistant.git", "scene.yaml"), 120_000), "scene: {}");
  assert.equal((await remoteFile("homeassistant.git", "upgrade.txt"))?.split("\n").length, ok, "every write that succeeded is pushed");
});

test("reclaim policy Delete: deleting the PersistentVolume removes the node's tree", async () => {
  const node = (await kubectl("get", "pods", "-n", "home", "-l", "app.kubernetes.io/name=homeassistant", "-o", "jsonpath={.items[0].spec.nodeName}")).trim();
  const tree = path.join(cluster!.nodes.find((n) => n.name === node)!.dir, "state", "trees", "homeassistant-config");
  await fs.access(tree);
  await kubectl("scale", "deployment/homeassistant", "-n", "home", "--replicas=0");
  await kubectl("wait", "--for=delete", "pod", "-n", "home", "-l", "app.kubernetes.io/name=homeassistant", "--timeout=120s");
  // With reclaim policy Delete, deleting the claim deletes the PersistentVolume.
  await kubectl("patch", "pv", "homeassistant-config", "-p", JSON.stringify({ spec: { persistentVolumeReclaimPolicy: "Delete" } }));
  await kubectl("delete", "pvc", "config", "-n", "home");
  await kubectl("wait", "--for=delete", "pv/homeassistant-config", "--timeout=120s");
  await waitFor(
    "the node's tree removed",
    async () =>
      fs.access(tree).then(
        () => false,
        () => true,
      ),
    60_000,
  );
});

// Appends "<node> <n>" to /data/writes.txt every second, for as long as it runs.
const RWO_WRITER = (node: string) => `
const fs = require("fs");
let n = 0;
setInterval(() => {
  try { fs.appendFileSync("/data/writes.txt", "${node} " + ++n + "\\n"); } catch (e) { console.log("write failed: " + e.code); }
}, 1000);
`;

const rwoPod = (name: string, node: string) =>
  JSON.stringify({
    apiVersion: "v1",
    kind: "Pod",
    metadata: { name, namespace: "rwo" },
    spec: {
      nodeName: node,
      terminationGracePeriodSeconds: 5,
      containers: [{ name: "app", image: NODE_IMAGE, command: ["node", "-e", RWO_WRITER(node)], volumeMounts: [{ name: "data", mountPath: "/data" }] }],
      volumes: [{ name: "data", persistentVolumeClaim: { claimName: "data" } }],
    },
  });

/** `kubectl create secret` arguments for a deploy key and the test server's host key, as the README says to make a Secret. */
function sshAuthSecret(name: string, namespace: string, keyFile: string): string[] {
  const files = [`--from-file=ssh-privatekey=${keyFile}`, `--from-file=known_hosts=${path.join(dir, "known_hosts")}`];
  return ["create", "secret", "generic", name, "-n", namespace, "--type=kubernetes.io/ssh-auth", ...files];
}

/** A repository on the ssh server, a deploy key of it, and that key as a `kubernetes.io/ssh-auth` Secret in a namespace of the same name. */
async function repositoryWithKey(name: string): Promise<{ name: string; namespace: string }> {
  await git.createRepo(`${name}.git`, { files: { "README.md": `${name}\n` } });
  await kubectl("create", "namespace", name);
  return keySecret(name, name);
}

/** A new deploy key of the ssh server as the Secret `<key>-key` in a namespace, as the README says to make one. */
async function keySecret(key: string, namespace: string, access: "read-write" | "read-only" = "read-write"): Promise<{ name: string; namespace: string }> {
  const { privateKey } = await git.addDeployKey(key, access);
  const keyFile = path.join(dir, `${key}-key`);
  await fs.writeFile(keyFile, privateKey, { mode: 0o600 });
  await kubectl(...sshAuthSecret(`${key}-key`, namespace, keyFile));
  return { name: `${key}-key`, namespace };
}

/** The claim `data` in a namespace, bound to the PersistentVolume `<namespace>-data`. */
function dataClaim(namespace: string, accessMode: string): object {
  const spec = { volumeName: `${namespace}-data`, storageClassName: "", accessModes: [accessMode], resources: { requests: { storage: "1Gi" } } };
  return { apiVersion: "v1", kind: "PersistentVolumeClaim", metadata: { name: "data", namespace }, spec };
}

/**
 * The repository `<namespace>.git` as the static PersistentVolume `<namespace>-data`, its claim
 * `data`, bound and armed by the class `<namespace>-eager`, which pushes within 5 s.
 */
async function eagerVolume(namespace: string, accessMode: string, secretRef: { name: string; namespace: string }): Promise<void> {
  const klass = {
    apiVersion: "storage.k8s.io/v1",
    kind: "VolumeAttributesClass",
    metadata: { name: `${namespace}-eager` },
    driverName: "git.liken.sh",
    parameters: { "push.quiesce": "1s", "push.maxLatency": "5s" },
  };
  const csi = {
    driver: "git.liken.sh",
    volumeHandle: `${namespace}-data`,
    volumeAttributes: { url: git.url(`${namespace}.git`), ref: "main" },
    nodeStageSecretRef: secretRef,
    nodePublishSecretRef: secretRef,
  };
  const spec = { capacity: { storage: "1Gi" }, accessModes: [accessMode], persistentVolumeReclaimPolicy: "Retain", csi };
  const volume = { apiVersion: "v1", kind: "PersistentVolume", metadata: { name: `${namespace}-data` }, spec };
  await apply(JSON.stringify({ apiVersion: "v1", kind: "List", items: [klass, volume, dataClaim(namespace, accessMode)] }));
  await bindAndArm(namespace);
}

/** Waits for the claim `data` to bind, then arms it with the class `<namespace>-eager`, as a user does. */
async function bindAndArm(namespace: string): Promise<void> {
  await waitFor("the claim Bound", async () => (await kubectl("get", "pvc", "data", "-n", namespace, "-o", "jsonpath={.status.phase}")) === "Bound");
  await kubectl("patch", "pvc", "data", "-n", namespace, "-p", JSON.stringify({ spec: { volumeAttributesClassName: `${namespace}-eager` } }));
}

/** A volume's .rwo-session records beside a node's staging directories: one while it is staged there, none once it is unstaged. */
async function rwoSessions(nodeDir: string, volumeId: string): Promise<string[]> {
  const plugins = path.join(nodeDir, "kubelet", "plugins");
  const records = (await fs.readdir(plugins, { recursive: true })).filter((e) => e.endsWith(".rwo-session"));
  // Another volume's record may go while it is read: its unstage.
  const read = (r: string) => fs.readFile(path.join(plugins, r), "utf8").catch((err: NodeJS.ErrnoException) => (err.code === "ENOENT" ? "{}" : Promise.reject(err)));
  const volumes = await Promise.all(records.map(async (r) => (JSON.parse(await read(r)) as { volumeId?: string }).volumeId));
  return records.filter((_, i) => volumes[i] === volumeId);
}

/** A pod that writes its name to a file of the claim named after it (at subPath, when given), then waits. */
function writerPod(namespace: string, app: string, file: string, subPath?: string): object {
  const mount = { name: "config", mountPath: "/config", ...(subPath === undefined ? {} : { subPath }) };
  const container = { name: app, image: BUSYBOX_IMAGE, command: ["sh", "-c", `echo '${app}' > /config/${file} && sleep 3600`], volumeMounts: [mount] };
  const spec = { terminationGracePeriodSeconds: 5, containers: [container], volumes: [{ name: "config", persistentVolumeClaim: { claimName: app } }] };
  return { apiVersion: "v1", kind: "Pod", metadata: { name: app, namespace }, spec };
}

const nodeLines = (text: string | undefined, node: string) => (text ?? "").split("\n").filter((l) => l.startsWith(`${node} `));

test("ReadWriteOnce across two nodes: node 1 is lost, node 2 takes the volume after the lease, node 1 back lands nothing", async () => {
  const secretRef = await repositoryWithKey("rwo");
  await eagerVolume("rwo", "ReadWriteOnce", secretRef);
  await apply(rwoPod("writer-1", "node1"));
  await kubectl("wait", "--for=condition=Ready", "pod/writer-1", "-n", "rwo", "--timeout=180s");
  assert.equal((await rwoSessions(cluster!.nodes.find((n) => n.name === "node1")!.dir, "rwo-data")).length, 1, "node 1's stage wrote its .rwo-session");
  await waitFor("node 1's writes pushed", async () => nodeLines(await remoteFile("rwo.git", "writes.txt"), "node1").length >= 2, 60_000);

  // Node 1 is lost: its kubelet, containerd and pods stop where they are.
  const node1 = cluster!.nodes.find((n) => n.name === "node1")!;
  await node1.freeze();
  const atLoss = nodeLines(await remoteFile("rwo.git", "writes.txt"), "node1");
  // The operator gives up on the pod, as on a dead machine, and starts the application on node 2.
  await kubectl("delete", "pod", "writer-1", "-n", "rwo", "--force", "--grace-period=0");
  await apply(rwoPod("writer-2", "node2"));
  // While node 1's record is being watched, node 2's stage is refused and the pod is told who holds the volume.
  const refusedStage = await waitFor(
    "a FailedMount naming node 1",
    async () => (await events("rwo")).find((e) => e.reason === "FailedMount" && e.involvedObject.name === "writer-2" && /is held by node node1/.test(e.message)),
    120_000,
  );
  assert.match(refusedStage.message, /takes it over only once it has seen the owner record unchanged for a whole lease/);
  // The kubelet retries the refused stage with its backoff until node 1's 90 s lease has run out.
  await kubectl("wait", "--for=condition=Ready", "pod/writer-2", "-n", "rwo", "--timeout=300s");
  const taken = await waitFor(
    "node 2's writes pushed",
    async () => {
      const text = await remoteFile("rwo.git", "writes.txt");
      return nodeLines(text, "node2").length >= 2 && text;
    },
    120_000,
  );
  // Node 1's writes that reached the remote before the loss are kept under node 2's.
  assert.deepEqual(nodeLines(taken, "node1"), atLoss);

  // Node 1 comes back: its application writes on for a moment, its driver pushes at the stop; nothing of it lands.
  await node1.thaw();
  await waitFor("node 1 Ready again", async () => (await kubectl("get", "node", "node1", "-o", 'jsonpath={.status.conditions[?(@.type=="Ready")].status}')) === "True", 120_000);
  const owner = await git.git("rwo.git", "log", "-1", "--format=%H", "refs/git-csi/owner/rwo-data");
  // Node 1's driver finds its epoch taken over (or run out) and says so on the claim, instead of pushing.
  const lost = await waitFor("node 1's GitVolumeEpochLost on the claim", async () => (await events("rwo")).find((e) => e.reason === "GitVolumeEpochLost" && e.involvedObject.name === "data"), 120_000);
  assert.match(
    lost.message,
    /the mount epoch lost the volume \((the mount epoch of volume rwo-data on node node1 was taken over by node node2|the lease of the mount epoch of volume rwo-data on node node1 ran out unrenewed)/,
  );
  // And unstages the volume the kubelet no longer has a pod for (its .rwo-session goes last): what it committed goes to a stranded ref, never to main.
  await waitFor("node 1's unstage", async () => (await rwoSessions(node1.dir, "rwo-data")).length === 0, 120_000);
  const final = await remoteFile("rwo.git", "writes.txt");
  assert.deepEqual(nodeLines(final, "node1"), atLoss, "no write of node 1 after its loss reached the remote");
  assert.ok(nodeLines(final, "node2").length > nodeLines(taken, "node2").length, "node 2 still writes");
  assert.match(await git.git("rwo.git", "log", "-1", "--format=%B", "refs/git-csi/owner/rwo-data"), /node2/, `the owner ref names node 2 (was ${owner.trim()})`);
  await kubectl("delete", "pod", "writer-2", "-n", "rwo", "--wait=true", "--timeout=120s");
});

test("a non-root pod with fsGroup writes, and its files carry the fsGroup", async () => {
  const secretRef = await repositoryWithKey("fsgroup");
  await apply(
    JSON.stringify({
      apiVersion: "v1",
      kind: "List",
      items: [
        {
          apiVersion: "storage.k8s.io/v1",
          kind: "VolumeAttributesClass",
          metadata: { name: "fsgroup-eager" },
          driverName: "git.liken.sh",
          parameters: { "push.quiesce": "1s", "push.maxLatency": "5s" },
        },
        {
          apiVersion: "v1",
          kind: "PersistentVolume",
          metadata: { name: "fsgroup-data" },
          spec: {
            capacity: { storage: "1Gi" },
            accessModes: ["ReadWriteOncePod"],
            persistentVolumeReclaimPolicy: "Retain",
            csi: {
              driver: "git.liken.sh",
              volumeHandle: "fsgroup-data",
              volumeAttributes: { url: git.url("fsgroup.git"), ref: "main" },
              nodeStageSecretRef: secretRef,
              nodePublishSecretRef: secretRef,
            },
          },
        },
        dataClaim("fsgroup", "ReadWriteOncePod"),
      ],
    }),
  );
  await bindAndArm("fsgroup");
  await apply(
    JSON.stringify({
      apiVersion: "v1",
      kind: "Pod",
      metadata: { name: "app", namespace: "fsgroup" },
      spec: {
        securityContext: { runAsUser: 1000, runAsGroup: 1000, fsGroup: 2000, runAsNonRoot: true },
        containers: [
          {
            name: "app",
            image: NODE_IMAGE,
            command: ["node", "-e", 'require("fs").writeFileSync("/data/app.txt", "non-root\\n"); setInterval(() => {}, 1000)'],
            volumeMounts: [{ name: "data", mountPath: "/data" }],
          },
        ],
        volumes: [{ name: "data", persistentVolumeClaim: { claimName: "data" } }],
      },
    }),
  );
  await kubectl("wait", "--for=condition=Ready", "pod/app", "-n", "fsgroup", "--timeout=180s");
  assert.equal((await kubectl("exec", "-n", "fsgroup", "app", "--", "stat", "-c", "%u %g", "/data/app.txt")).trim(), "1000 2000");
  assert.equal(await waitFor("app.txt pushed", () => remoteFile("fsgroup.git", "app.txt"), 60_000), "non-root");
  await kubectl("delete", "pod", "app", "-n", "fsgroup", "--wait=true", "--timeout=120s");
});

test("many writers on one repository: two claims, each pod writing its own directory through subPath, both land on the ref", async () => {
  const secretRef = await repositoryWithKey("subpath");
  const apps = { homeassistant: "configuration.yaml", nodered: "flows.json" };
  const volume = (app: string) => ({
    apiVersion: "v1",
    kind: "PersistentVolume",
    metadata: { name: `subpath-${app}` },
    spec: {
      capacity: { storage: "1Gi" },
      accessModes: ["ReadWriteOncePod"],
      persistentVolumeReclaimPolicy: "Retain",
      csi: { driver: "git.liken.sh", volumeHandle: `subpath-${app}`, volumeAttributes: { url: git.url("subpath.git"), ref: "main" }, nodeStageSecretRef: secretRef, nodePublishSecretRef: secretRef },
    },
  });
  const claim = (app: string) => {
    const spec = { volumeName: `subpath-${app}`, storageClassName: "", accessModes: ["ReadWriteOncePod"], resources: { requests: { storage: "1Gi" } } };
    return { apiVersion: "v1", kind: "PersistentVolumeClaim", metadata: { name: app, namespace: "subpath" }, spec };
  };
  const klass = { apiVersion: "storage.k8s.io/v1", kind: "VolumeAttributesClass", metadata: { name: "subpath-eager" }, driverName: "git.liken.sh", parameters: { "push.quiesce": "1s" } };
  const entries = Object.entries(apps);
  await apply(JSON.stringify({ apiVersion: "v1", kind: "List", items: [klass, ...entries.flatMap(([app, file]) => [volume(app), claim(app), writerPod("subpath", app, file, app)])] }));
  // A claim binds to its PersistentVolume without a class, then the class arms it, as bindAndArm does.
  for (const app of Object.keys(apps)) {
    await waitFor(`claim ${app} Bound`, async () => (await kubectl("get", "pvc", app, "-n", "subpath", "-o", "jsonpath={.status.phase}")) === "Bound");
    await kubectl("patch", "pvc", app, "-n", "subpath", "-p", JSON.stringify({ spec: { volumeAttributesClassName: "subpath-eager" } }));
  }
  for (const [app, file] of entries) assert.equal(await waitFor(`${app}/${file} pushed`, () => remoteFile("subpath.git", `${app}/${file}`), 180_000), app);
  assert.deepEqual((await git.git("subpath.git", "for-each-ref", "--format=%(refname)", "refs/heads")).trim().split("\n"), ["refs/heads/main"], "no side branch");
  for (const app of Object.keys(apps)) await kubectl("delete", "pod", app, "-n", "subpath", "--wait=true", "--timeout=120s");
});

/** A pod on `node` that only reads the claim `readers`, read-only, as the users of git-sync's sidecar do. */
const readerPod = (name: string, node: string) => ({
  apiVersion: "v1",
  kind: "Pod",
  metadata: { name, namespace: "follow" },
  spec: {
    nodeName: node,
    terminationGracePeriodSeconds: 5,
    containers: [{ name: "reader", image: BUSYBOX_IMAGE, command: ["sleep", "3600"], volumeMounts: [{ name: "data", mountPath: "/data", readOnly: true }] }],
    volumes: [{ name: "data", persistentVolumeClaim: { claimName: "readers", readOnly: true } }],
  },
});

test("two nodes follow one ReadOnlyMany claim with a read-only deploy key while a writer's claim pushes to the same branch: both serve each push, refuse writes, and claim nothing on the remote", async () => {
  const writerKey = await repositoryWithKey("follow");
  const readSecret = await keySecret("follow-read", "follow", "read-only");
  await eagerVolume("follow", "ReadWriteOncePod", writerKey);
  const csi = {
    driver: "git.liken.sh",
    volumeHandle: "follow-readers",
    volumeAttributes: { url: git.url("follow.git"), ref: "main" },
    nodeStageSecretRef: readSecret,
    nodePublishSecretRef: readSecret,
  };
  const spec = { capacity: { storage: "1Gi" }, accessModes: ["ReadOnlyMany"], persistentVolumeReclaimPolicy: "Retain", csi };
  const readers = { apiVersion: "v1", kind: "PersistentVolume", metadata: { name: "follow-readers" }, spec };
  const claimSpec = { volumeName: "follow-readers", storageClassName: "", accessModes: ["ReadOnlyMany"], resources: { requests: { storage: "1Gi" } } };
  const claim = { apiVersion: "v1", kind: "PersistentVolumeClaim", metadata: { name: "readers", namespace: "follow" }, spec: claimSpec };
  const klass = { apiVersion: "storage.k8s.io/v1", kind: "VolumeAttributesClass", metadata: { name: "follow-2s" }, driverName: "git.liken.sh", parameters: { "follow.interval": "2s" } };
  await apply(JSON.stringify({ apiVersion: "v1", kind: "List", items: [readers, claim, klass] }));
  await waitFor("the readers' claim Bound", async () => (await kubectl("get", "pvc", "readers", "-n", "follow", "-o", "jsonpath={.status.phase}")) === "Bound");
  await kubectl("patch", "pvc", "readers", "-n", "follow", "-p", JSON.stringify({ spec: { volumeAttributesClassName: "follow-2s" } }));
  // The writer counts in stamp.txt every two seconds; its class pushes within five.
  const writer = {
    name: "writer",
    image: BUSYBOX_IMAGE,
    command: ["sh", "-c", "i=0; while true; do i=$((i+1)); echo $i > /data/stamp.txt; sleep 2; done"],
    volumeMounts: [{ name: "data", mountPath: "/data" }],
  };
  const writerSpec = { terminationGracePeriodSeconds: 5, containers: [writer], volumes: [{ name: "data", persistentVolumeClaim: { claimName: "data" } }] };
  const writerPod = { apiVersion: "v1", kind: "Pod", metadata: { name: "writer", namespace: "follow" }, spec: writerSpec };
  await apply(JSON.stringify({ apiVersion: "v1", kind: "List", items: [readerPod("reader-1", "node1"), readerPod("reader-2", "node2"), writerPod] }));
  for (const pod of ["reader-1", "reader-2", "writer"]) await kubectl("wait", "--for=condition=Ready", `pod/${pod}`, "-n", "follow", "--timeout=180s");

  const served = (pod: string) =>
    kubectl("exec", "-n", "follow", pod, "--", "cat", "/data/stamp.txt").then(
      (text) => Number(text.trim()),
      () => 0,
    );
  let last = 0;
  for (let push = 0; push < 3; push++) {
    const pushed = await waitFor(
      `a push after stamp ${last}`,
      async () => {
        const stamp = Number(await remoteFile("follow.git", "stamp.txt"));
        return stamp > last && stamp;
      },
      60_000,
    );
    for (const pod of ["reader-1", "reader-2"]) await waitFor(`${pod} serving stamp ${pushed}`, async () => (await served(pod)) >= pushed, 30_000);
    last = pushed;
  }
  for (const pod of ["reader-1", "reader-2"]) await assert.rejects(kubectl("exec", "-n", "follow", pod, "--", "sh", "-c", "echo x > /data/stamp.txt"), /Read-only file system/);
  const owners = (await git.git("follow.git", "for-each-ref", "--format=%(refname)", "refs/git-csi/owner/")).trim().split("\n");
  assert.deepEqual(owners, ["refs/git-csi/owner/follow-data"], "the readers claim no owner ref");
  const updated = (await events("follow")).filter((e) => e.reason === "GitVolumeUpdated" && e.involvedObject.name === "readers");
  assert.ok(updated.length > 0, "GitVolumeUpdated on the readers' claim");
  await kubectl("delete", "pod", "reader-1", "reader-2", "writer", "-n", "follow", "--wait=true", "--timeout=120s");
});

test("a branch per claim: two claims of one StorageClass get two branches, each pod's writes land on its own, and deleting the claims archives both", async () => {
  const secretRef = await repositoryWithKey("perclaim");
  // The class names the deploy key for CreateVolume too: the provisioner may read it only with controller.provisionerSecrets.
  await upgradeWith("controller.provisionerSecrets=true");
  const secret = (kind: string) => ({ [`csi.storage.k8s.io/${kind}-secret-name`]: secretRef.name, [`csi.storage.k8s.io/${kind}-secret-namespace`]: secretRef.namespace });
  const storageClass = {
    apiVersion: "storage.k8s.io/v1",
    kind: "StorageClass",
    metadata: { name: "perclaim" },
    provisioner: "git.liken.sh",
    reclaimPolicy: "Delete",
    parameters: {
      url: git.url("perclaim.git"),
      ref: "claims/${pvc.metadata.namespace}/${pvc.metadata.name}",
      onDelete: "archive",
      ...secret("provisioner"),
      ...secret("node-stage"),
      ...secret("node-publish"),
    },
  };
  const klass = { apiVersion: "storage.k8s.io/v1", kind: "VolumeAttributesClass", metadata: { name: "perclaim-eager" }, driverName: "git.liken.sh", parameters: { "push.quiesce": "1s" } };
  const apps = { homeassistant: "configuration.yaml", nodered: "flows.json" };
  const claim = (app: string) => ({
    apiVersion: "v1",
    kind: "PersistentVolumeClaim",
    metadata: { name: app, namespace: "perclaim" },
    spec: { storageClassName: "perclaim", volumeAttributesClassName: "perclaim-eager", accessModes: ["ReadWriteOncePod"], resources: { requests: { storage: "1Gi" } } },
  });
  const entries = Object.entries(apps);
  await apply(JSON.stringify({ apiVersion: "v1", kind: "List", items: [storageClass, klass, ...entries.flatMap(([app, file]) => [claim(app), writerPod("perclaim", app, file)])] }));
  const onBranch = (app: string, file: string) => git.git("perclaim.git", "show", `claims/perclaim/${app}:${file}`).catch(() => undefined);
  for (const [app, file] of entries) assert.equal(await waitFor(`${app}/${file} pushed to its branch`, () => onBranch(app, file), 180_000), app);
  for (const [app, file] of entries) assert.equal(await remoteFile("perclaim.git", file), undefined, `${file} is on ${app}'s branch alone`);
  const volumeOf = async (app: string) => (await kubectl("get", "pvc", app, "-n", "perclaim", "-o", "jsonpath={.spec.volumeName}")).trim();
  const volumes = Object.fromEntries(await Promise.all(Object.keys(apps).map(async (app) => [app, await volumeOf(app)] as const)));
  for (const app of Object.keys(apps)) {
    assert.equal(await kubectl("get", "pv", volumes[app]!, "-o", "jsonpath={.spec.csi.volumeAttributes.ref}"), `claims/perclaim/${app}`, "the PersistentVolume names the claim's branch");
  }

  for (const app of Object.keys(apps)) await kubectl("delete", "pod", app, "-n", "perclaim", "--wait=true", "--timeout=120s");
  await kubectl("delete", "pvc", ...Object.keys(apps), "-n", "perclaim", "--wait=true", "--timeout=120s");
  for (const volume of Object.values(volumes)) await kubectl("wait", "--for=delete", `pv/${volume}`, "--timeout=120s");
  const refs = (await git.git("perclaim.git", "for-each-ref", "--format=%(refname)", "refs/heads", "refs/git-csi/archive")).trim().split("\n");
  assert.deepEqual(refs.sort(), ["refs/heads/main", ...entries.map(([app]) => `refs/git-csi/archive/${volumes[app]}/claims/perclaim/${app}`)].sort());
  for (const [app, file] of entries)
    assert.equal(await git.git("perclaim.git", "show", `refs/git-csi/archive/${volumes[app]}/claims/perclaim/${app}:${file}`), app, "the archive holds the claim's writes");
});

test("snapshots of a claim a pod writes to: ready holding the write just made, a restore with its tree, modes and owners and not the later write, a clone at its request; deleting them leaves the remote as the class says", async () => {
  // The class of "a branch per claim" (its deploy key, onDelete: archive). Armed, but no push of its own
  // comes in the test: only the flush a snapshot or a clone asks for pushes.
  const held = {
    apiVersion: "storage.k8s.io/v1",
    kind: "VolumeAttributesClass",
    metadata: { name: "perclaim-held" },
    driverName: "git.liken.sh",
    parameters: { "push.quiesce": "1h", "push.maxLatency": "2h" },
  };
  const claim = (name: string, dataSource?: object) => ({
    apiVersion: "v1",
    kind: "PersistentVolumeClaim",
    metadata: { name, namespace: "perclaim" },
    spec: { storageClassName: "perclaim", volumeAttributesClassName: "perclaim-held", accessModes: ["ReadWriteOncePod"], resources: { requests: { storage: "1Gi" } }, dataSource },
  });
  const pod = (name: string) => ({
    apiVersion: "v1",
    kind: "Pod",
    metadata: { name, namespace: "perclaim" },
    spec: {
      terminationGracePeriodSeconds: 5,
      containers: [{ name: "app", image: BUSYBOX_IMAGE, command: ["sleep", "3600"], volumeMounts: [{ name: "config", mountPath: "/config" }] }],
      volumes: [{ name: "config", persistentVolumeClaim: { claimName: name } }],
    },
  });
  const items = (...objects: object[]) => apply(JSON.stringify({ apiVersion: "v1", kind: "List", items: objects }));
  const ready = (...pods: string[]) => kubectl("wait", "--for=condition=Ready", ...pods.map((p) => `pod/${p}`), "-n", "perclaim", "--timeout=180s");
  const inPod = async (name: string, script: string) => (await kubectl("exec", "-n", "perclaim", name, "--", "sh", "-c", script)).trim();
  const show = (spec: string) => git.git("perclaim.git", "show", spec).catch(() => undefined);
  const refs = async (...patterns: string[]) => (await git.git("perclaim.git", "for-each-ref", "--format=%(refname)", ...patterns)).split("\n").filter(Boolean).sort();

  // The repository is private: the chart's VolumeSnapshotClass names the deploy key CreateSnapshot pushes with,
  // which the csi-snapshotter may read with controller.provisionerSecrets ("a branch per claim" set it).
  const secret = "snapshots.volumeSnapshotClass.parameters.csi\\.storage\\.k8s\\.io/snapshotter-secret";
  await upgradeWith(`${secret}-name=perclaim-key`, `${secret}-namespace=perclaim`);
  // The chart's snapshots.enabled=auto saw the cluster's snapshot CRDs when the quick start installed it.
  const snapshotClass = await kubectl("get", "volumesnapshotclass", "-o", "jsonpath={range .items[*]}{.metadata.name} {.driver} {.deletionPolicy}{end}");
  assert.match(snapshotClass, /^\S+ git\.liken\.sh Delete$/, "the chart made one VolumeSnapshotClass, the driver's, deletionPolicy Delete");
  await items(held, claim("source"), pod("source"));
  await ready("source");
  await waitFor("the source claim armed", async () => (await events("perclaim")).some((e) => e.involvedObject.name === "source" && e.reason === "GitVolumeArmed"), 60_000);
  await inPod("source", "printf before > /config/state.txt && printf '#!/bin/sh\\n' > /config/run.sh && chmod 700 /config/run.sh && chown 1000:2000 /config/run.sh");
  assert.equal(await show("claims/perclaim/source:state.txt"), undefined, "the write is not pushed on its own");

  const metadata = { name: "source-snap", namespace: "perclaim" };
  await items({
    apiVersion: "snapshot.storage.k8s.io/v1",
    kind: "VolumeSnapshot",
    metadata,
    spec: { volumeSnapshotClassName: snapshotClass.split(" ")[0], source: { persistentVolumeClaimName: "source" } },
  });
  const status = () => kubectl("get", "volumesnapshot", "source-snap", "-n", "perclaim", "-o", "jsonpath={.status.readyToUse} {.status.boundVolumeSnapshotContentName}");
  const snapshotRef = await waitFor(
    "the VolumeSnapshot readyToUse",
    async () => {
      const [readyToUse, content] = (await status()).split(" ");
      if (readyToUse !== "true") return undefined;
      return `refs/git-csi/snapshots/${await kubectl("get", "volumesnapshotcontent", content!, "-o", "jsonpath={.status.snapshotHandle}")}`;
    },
    120_000,
  );
  assert.equal(await show(`${snapshotRef}:state.txt`), "before", "the snapshot holds the write the pod saw succeed");
  await inPod("source", "printf after > /config/state.txt && printf later > /config/later.txt");

  const fromSnapshot = { apiGroup: "snapshot.storage.k8s.io", kind: "VolumeSnapshot", name: "source-snap" };
  await items(claim("restored", fromSnapshot), pod("restored"), claim("cloned", { kind: "PersistentVolumeClaim", name: "source" }), pod("cloned"));
  await ready("restored", "cloned");
  const tree = (name: string) => inPod(name, "cat /config/state.txt; echo; stat -c '%a %u:%g' /config/run.sh; [ -e /config/later.txt ] && cat /config/later.txt || echo no-later");
  // git alone would give 755 and root's owner: the mode and the owner come from refs/git-csi/metadata.
  assert.equal(await tree("restored"), "before\n700 1000:2000\nno-later", "the restore has the snapshot's tree, its mode and owner, and not the later write");
  assert.equal(await tree("cloned"), "after\n700 1000:2000\nlater", "the clone has the source's tree at its request");

  await kubectl("delete", "volumesnapshot", "source-snap", "-n", "perclaim", "--wait=true", "--timeout=120s");
  await waitFor("the snapshot's ref deleted", async () => (await refs(snapshotRef)).length === 0, 60_000);
  const claims = ["source", "restored", "cloned"];
  const volumes = await Promise.all(claims.map(async (c) => (await kubectl("get", "pvc", c, "-n", "perclaim", "-o", "jsonpath={.spec.volumeName}")).trim()));
  await kubectl("delete", "pod", ...claims, "-n", "perclaim", "--wait=true", "--timeout=120s");
  await kubectl("delete", "pvc", ...claims, "-n", "perclaim", "--wait=true", "--timeout=120s");
  for (const volume of volumes) await kubectl("wait", "--for=delete", `pv/${volume}`, "--timeout=120s");
  const archived = claims.map((c, i) => `refs/git-csi/archive/${volumes[i]}/claims/perclaim/${c}`);
  assert.deepEqual(await refs(...claims.map((c) => `refs/heads/claims/perclaim/${c}`), ...archived), [...archived].sort(), "onDelete: archive moved each claim's branch");
  assert.equal(await show(`${archived[1]}:state.txt`), "before", "the restored claim's archive holds its tree");
});

// Appends "<pod> <n>" to /data/writes.txt every second and prints "ok <n>" once the write returned: what the application saw succeed.
const ACKED_WRITER = `
const fs = require("fs");
const pod = process.env.POD;
let n = 0;
setInterval(() => {
  n++;
  try { fs.appendFileSync("/data/writes.txt", pod + " " + n + "\\n"); console.log("ok " + n); } catch (e) { console.log("write failed: " + e.code); }
}, 1000);
`;

test("the forge away for three minutes: the volume condition turns abnormal, the driver deletes the fenced pod and its Deployment starts another, and every acknowledged write lands once the forge is back", async () => {
  const secretRef = await repositoryWithKey("away");
  const deployment = {
    apiVersion: "apps/v1",
    kind: "Deployment",
    metadata: { name: "writer", namespace: "away" },
    spec: {
      replicas: 1,
      strategy: { type: "Recreate" },
      selector: { matchLabels: { app: "writer" } },
      template: {
        metadata: { labels: { app: "writer" } },
        spec: {
          // The new pod stages on the node that kept the tree and its commits the forge never got.
          nodeSelector: { "kubernetes.io/hostname": "node2" },
          terminationGracePeriodSeconds: 5,
          containers: [
            {
              name: "app",
              image: NODE_IMAGE,
              command: ["node", "-e", ACKED_WRITER],
              env: [{ name: "POD", valueFrom: { fieldRef: { fieldPath: "metadata.name" } } }],
              volumeMounts: [{ name: "data", mountPath: "/data" }],
            },
          ],
          volumes: [{ name: "data", persistentVolumeClaim: { claimName: "data" } }],
        },
      },
    },
  };
  await eagerVolume("away", "ReadWriteOncePod", secretRef);
  await apply(JSON.stringify(deployment));
  await kubectl("rollout", "status", "deployment/writer", "-n", "away", "--timeout=180s");
  const first = (await kubectl("get", "pods", "-n", "away", "-l", "app=writer", "-o", "jsonpath={.items[0].metadata.name}")).trim();
  // What the first pod saw succeed, until its container ends.
  const firstLog = kubectl("logs", "-f", first, "-n", "away");
  await waitFor("the first pod's writes pushed", async () => nodeLines(await remoteFile("away.git", "writes.txt"), first).length >= 2, 60_000);

  // The forge refuses every connection, as a server that is down does.
  const rule = ["INPUT", "-p", "tcp", "--dport", String(git.port), "-j", "REJECT", "--reject-with", "tcp-reset"];
  await cluster!.inNetns("iptables", ["-I", ...rule]);
  const away = Date.now();
  try {
    const abnormal = await waitFor(
      "the kubelet's VolumeConditionAbnormal on the pod",
      async () => (await events("away")).find((e) => e.reason === "VolumeConditionAbnormal" && e.involvedObject.name === first),
      120_000,
    );
    assert.match(abnormal.message, /the last push failed/);
    const lost = await waitFor("GitVolumeEpochLost on the claim", async () => (await events("away")).find((e) => e.reason === "GitVolumeEpochLost" && e.involvedObject.name === "data"), 180_000).catch(
      async (err: Error) => {
        throw new Error(`${err.message}; the namespace's events: ${(await events("away")).map((e) => `${e.involvedObject.name} ${e.reason}: ${e.message}`).join("\n")}`);
      },
    );
    assert.match(lost.message, /the driver deletes the pods a controller owns/);
    await waitFor(
      "the Deployment's new pod",
      async () => {
        const names = (await kubectl("get", "pods", "-n", "away", "-l", "app=writer", "-o", "jsonpath={.items[*].metadata.name}")).split(" ").filter(Boolean);
        return names.some((n) => n !== first);
      },
      60_000,
    );
    // The outage is three minutes long, whatever the driver did meanwhile.
    await sleep(Math.max(0, 180_000 - (Date.now() - away)));
  } finally {
    await cluster!.inNetns("iptables", ["-D", ...rule]);
  }
  const acked = Math.max(0, ...[...(await firstLog).matchAll(/^ok (\d+)$/gm)].map((m) => Number(m[1])));
  assert.ok(acked >= 2, `the first pod saw writes succeed: ${acked}`);
  await kubectl("rollout", "status", "deployment/writer", "-n", "away", "--timeout=300s");
  const landed = await waitFor(
    "every write the first pod saw succeed on main",
    async () => {
      const lines = nodeLines(await remoteFile("away.git", "writes.txt"), first);
      return lines.length >= acked && lines;
    },
    300_000,
  );
  for (let n = 1; n <= acked; n++) assert.ok(landed.includes(`${first} ${n}`), `${first}'s acknowledged write ${n} is on main`);
  // The new pod writes on the same node's stage, taken again with a fresh epoch, and its writes reach main too.
  const pods = (await kubectl("get", "pods", "-n", "away", "-l", "app=writer", "-o", "jsonpath={.items[*].metadata.name}")).split(" ").filter(Boolean);
  assert.equal(pods.length, 1, `one pod after the rollout: ${pods.join(", ")}`);
  const second = pods[0];
  assert.notEqual(second, first, "the Deployment's pod is a new one");
  await waitFor("the new pod's writes on main", async () => nodeLines(await remoteFile("away.git", "writes.txt"), second).length >= 2, 120_000);
  await kubectl("delete", "deployment", "writer", "-n", "away", "--wait=true", "--timeout=120s");
});
