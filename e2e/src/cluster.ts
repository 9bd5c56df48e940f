// Test helper: a REAL Kubernetes cluster on this machine — etcd,
// kube-apiserver, kube-controller-manager, kube-scheduler, the snapshot CRDs
// and snapshot-controller, and two kubelets, each with its own containerd —
// all inside a network namespace the test creates, so no traffic leaves it. Built by `make cluster-tools`; the notes
// of the study it follows are in ../shared/kubelet/NOTES.md.
//
//   const cluster = await startCluster(dir);      // nodes Ready, default ServiceAccount there
//   await cluster.inNetns("bash", ["-c", script], "", { REGISTRY: … });  // as a user's shell: kubectl, helm on PATH
//   await cluster.kubectl(["get", "nodes"]);      // kubectl and helm run inside the namespace
//   await cluster.helm(["install", ...]);
//   await cluster.nodes[0].freeze();              // the node is lost: kubelet, containerd, pods stopped
//   await cluster.stop();
//
// Layout, inside the network namespace <netns>:
//   10.96.0.1:443   the API server. It is also the first address of the
//                   service range, so the `kubernetes` Service's ClusterIP is
//                   the API server itself: pods reach it with no kube-proxy.
//   10.97.0.N       node N's InternalIP (kubelet :10250, healthz :10248)
//   10.97.0.100     where the tests' git servers listen (GIT_ADDRESS)
//   10.97.0.200:5000  a real image registry (registry.ts), which every
//                   node's containerd pulls from, and mirrors
//                   registry.k8s.io and docker.io
//   10.98.N.0/24    node N's pods, on a CNI bridge of their own
// Each node also has a mount namespace of its own, in which /var/lib/kubelet,
// /var/lib/git-csi and /var/log/pods are that node's directories: the chart's
// DaemonSet names one kubelet directory and one state directory for every
// node, as in a real cluster, and two kubelets on one machine must not share
// them. Containerd, the kubelet and every container of the node live there,
// and each node's processes live in a freezer cgroup (<cgroup root>), so
// freezing it stops the whole node at once. Mounts made inside the node never
// reach the machine's own mount table, and go when the node's last process does.
//
// Traps of this machine (cgroup v1 only, no CAP_SYS_RESOURCE, kubelet paths
// outside its root directory) are handled where noted.
import * as crypto from "node:crypto";
import { existsSync } from "node:fs";
import * as fs from "node:fs/promises";
import * as path from "node:path";
import { execFile } from "node:child_process";
import { promisify } from "node:util";
import { setTimeout as sleep } from "node:timers/promises";
import { HELM } from "./chart";
import { kubeBinDir, runTool, snapshotterVersion, until, watched, type Watched } from "./kube";
import { PAUSE_IMAGE, publicImageRefs, type Registry, REGISTRY_ADDRESS, seedPublicImages, startRegistry, writeHostsConfig } from "./registry";

const run = promisify(execFile);
const ROOT = path.join(__dirname, "..", "..", "..");
/** The wrapper module `make cluster-tools` builds the sidecars and the snapshot-controller in. */
const SIDECAR_MODULE = path.join(ROOT, "e2e", "k8s", "csi-provisioner");
const snapshotController = () => path.join(ROOT, ".cache", "csi-sidecars", "snapshot-controller", snapshotterVersion(), "snapshot-controller");

export const API_ADDRESS = "10.96.0.1";
export const GIT_ADDRESS = "10.97.0.100";
const SERVICE_RANGE = "10.96.0.0/24";
const nodeAddress = (n: number) => `10.97.0.${n}`;
const podRange = (n: number) => `10.98.${n}.0/24`;
/** cgroup v1 hierarchies a kubelet's cgroupRoot must exist in (this machine has no hugetlb, net_cls, perf_event). */
const HIERARCHIES = ["cpu", "cpuacct", "cpuset", "memory", "devices", "freezer", "blkio", "pids", "systemd"];
/** Host paths a node sees as its own. */
const NODE_PATHS = { kubelet: "/var/lib/kubelet", state: "/var/lib/git-csi", podLogs: "/var/log/pods", netns: "/run/netns" };

export interface ClusterNode {
  name: string;
  address: string;
  /** This node's directory: kubelet/, state/, containerd/, logs. */
  dir: string;
  containerdSocket: string;
  /** Stops every process of the node (kubelet, containerd, shims, pods) where it is. */
  freeze(): Promise<void>;
  thaw(): Promise<void>;
  /** Ends the kubelet, the node's containers, then containerd. */
  stop(): Promise<void>;
}

export interface Cluster {
  /** The network namespace everything runs in (/run/netns/<netns>). */
  netns: string;
  /** The admin's kubeconfig, for kubectl run inside the namespace by hand. */
  kubeconfig: string;
  nodes: ClusterNode[];
  /** host:port of the registry the nodes pull from, inside the namespace. */
  registry: string;
  kubectl(args: string[], input?: string): Promise<string>;
  helm(args: string[]): Promise<string>;
  /** Any command inside the namespace, as a user's shell would run it: kubectl and helm on PATH, their configuration, and env. */
  inNetns(file: string, args: string[], input?: string, env?: NodeJS.ProcessEnv): Promise<string>;
  stop(): Promise<void>;
}

const TOOLS = ["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kubectl"];
const PROGRAMS = ["/usr/bin/containerd", "/usr/sbin/runc", "/usr/lib/cni/bridge", "/usr/bin/docker-registry", "/usr/bin/skopeo", "/usr/bin/buildah", "/usr/bin/curl"];

/** Why a cluster cannot start here, naming each missing tool, or undefined when it can. */
export function clusterMissing(kubeBin = kubeBinDir(), uid = process.getuid?.()): string | undefined {
  if (uid !== 0) return "the cluster tests need root (network namespaces, mounts, cgroups): run them as root";
  const missing = [...TOOLS.map((t) => path.join(kubeBin, t)), snapshotController(), HELM, ...PROGRAMS].filter((bin) => !existsSync(bin));
  if (missing.length === 0) return undefined;
  return `no ${missing.join(", ")}: run 'make go-tools cluster-tools' (Go, from the module proxy, and Debian packages)`;
}

export async function startCluster(dir: string, nodeCount = 2): Promise<Cluster> {
  const missing = clusterMissing();
  if (missing) throw new Error(missing);
  const id = crypto.randomBytes(3).toString("hex");
  const netns = `gcsi-${id}`;
  const bin = kubeBinDir();
  const processes: Watched[] = [];
  const nodes: ClusterNode[] = [];
  const cgroupRoots = Array.from({ length: nodeCount }, (_, i) => `${netns}-node${i + 1}`);
  await fs.mkdir(dir, { recursive: true });
  const guard = await watched("sh", ["-c", GUARD, "guard", netns, ...cgroupRoots], path.join(dir, "guard.log"));
  const stop = async () => {
    for (const node of nodes) await node.thaw().then(node.stop);
    for (const p of processes.reverse()) await p.stop();
    processes.length = 0;
    await guard.stop();
  };
  try {
    await network(netns, nodeCount);
    const registry = await startRegistry(path.join(dir, "registry"), { address: REGISTRY_ADDRESS, netns });
    processes.push(registry.process);
    await seedPublicImages(netns, registry, publicImageRefs());
    const start = async (name: string, b: string, args: string[]) => {
      const p = await watched("nsenter", [`--net=/run/netns/${netns}`, "--", b, ...args], path.join(dir, `${name}.log`));
      processes.push(p);
      return p;
    };

    const pki = await certificates(path.join(dir, "pki"), nodeCount);
    const kubeconfig = await kubeconfigFile(dir, "admin", pki.tokens.admin, pki.ca);
    const kubectlEnv = {
      ...registry.env,
      PATH: `${bin}:${path.dirname(HELM)}:${process.env.PATH}`,
      KUBECONFIG: kubeconfig,
      KUBECACHEDIR: path.join(dir, "kubectl-cache"),
      HELM_CACHE_HOME: path.join(dir, "helm", "cache"),
      HELM_CONFIG_HOME: path.join(dir, "helm", "config"),
      HELM_DATA_HOME: path.join(dir, "helm", "data"),
    };
    const inNetns = (b: string, args: string[], input?: string, env?: NodeJS.ProcessEnv) => runTool("nsenter", [`--net=/run/netns/${netns}`, "--", b, ...args], { ...kubectlEnv, ...env }, input);
    const kubectl = (args: string[], input?: string) => inNetns(path.join(bin, "kubectl"), args, input);

    await start("etcd", path.join(bin, "etcd"), etcdArgs(dir));
    const apiserver = await start("kube-apiserver", path.join(bin, "kube-apiserver"), apiServerArgs(dir, pki));
    await until("kube-apiserver answers /readyz", apiserver, async () => (await kubectl(["get", "--raw", "/readyz"])) === "ok", 120_000);

    await start("kube-controller-manager", path.join(bin, "kube-controller-manager"), controllerManagerArgs(dir, kubeconfig, pki));
    await start("kube-scheduler", path.join(bin, "kube-scheduler"), schedulerArgs(kubeconfig));
    // As a cluster a user installs the chart on has them: the chart's snapshots.enabled=auto sees snapshot.storage.k8s.io/v1.
    await snapshotCrds(kubectl);
    await start("snapshot-controller", snapshotController(), [`--kubeconfig=${kubeconfig}`, "--leader-election=false"]);

    for (let n = 1; n <= nodeCount; n++) nodes.push(await startNode(n, cgroupRoots[n - 1]!, path.join(dir, `node${n}`), netns, pki, bin, registry));
    await until(
      "every node is Ready",
      apiserver,
      async () => {
        const out = await kubectl(["get", "nodes", "-o", 'jsonpath={range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\\n"}{end}']);
        return out.split("\n").filter((s) => s === "True").length === nodeCount;
      },
      120_000,
    );
    await until("the default ServiceAccount exists", apiserver, async () => kubectl(["get", "serviceaccount", "default"]).then(() => true), 60_000);

    return { netns, kubeconfig, nodes, registry: REGISTRY_ADDRESS, kubectl, helm: (args) => inNetns(HELM, args), inNetns, stop };
  } catch (err) {
    await stop();
    throw err;
  }
}

/** The CRDs of external-snapshotter's client module at the wrapper module's version, from the Go module cache, applied and established. */
async function snapshotCrds(kubectl: (args: string[]) => Promise<string>): Promise<void> {
  const module = "github.com/kubernetes-csi/external-snapshotter/client/v8";
  const { stdout } = await run("go", ["mod", "download", "-json", module], { cwd: SIDECAR_MODULE });
  const crds = path.join((JSON.parse(stdout) as { Dir: string }).Dir, "config", "crd");
  await kubectl(["apply", "-k", crds]);
  const names = ["volumesnapshotclasses", "volumesnapshotcontents", "volumesnapshots"].map((r) => `crd/${r}.snapshot.storage.k8s.io`);
  await kubectl(["wait", "--for=condition=Established", "--timeout=60s", ...names]);
}

function etcdArgs(dir: string): string[] {
  return [
    "--name=e2e",
    `--data-dir=${path.join(dir, "etcd")}`,
    "--listen-client-urls=http://127.0.0.1:2379",
    "--advertise-client-urls=http://127.0.0.1:2379",
    "--listen-peer-urls=http://127.0.0.1:2380",
    "--initial-advertise-peer-urls=http://127.0.0.1:2380",
    "--initial-cluster=e2e=http://127.0.0.1:2380",
    "--unsafe-no-fsync",
    "--log-level=warn",
  ];
}

function apiServerArgs(dir: string, pki: Pki): string[] {
  return [
    "--etcd-servers=http://127.0.0.1:2379",
    `--bind-address=${API_ADDRESS}`,
    `--advertise-address=${API_ADDRESS}`,
    "--secure-port=443",
    `--tls-cert-file=${pki.serving.cert}`,
    `--tls-private-key-file=${pki.serving.key}`,
    `--cert-dir=${path.join(dir, "apiserver-certs")}`,
    `--token-auth-file=${pki.tokensFile}`,
    "--authorization-mode=Node,RBAC",
    `--service-cluster-ip-range=${SERVICE_RANGE}`,
    "--service-account-issuer=https://kubernetes.default.svc",
    `--service-account-key-file=${pki.serviceAccount.pub}`,
    `--service-account-signing-key-file=${pki.serviceAccount.key}`,
    "--allow-privileged=true",
    "--profiling=false",
    // kubectl logs and exec reach the kubelets by their InternalIP, with a client certificate they trust.
    "--kubelet-preferred-address-types=InternalIP",
    `--kubelet-client-certificate=${pki.kubeletClient.cert}`,
    `--kubelet-client-key=${pki.kubeletClient.key}`,
  ];
}

function controllerManagerArgs(dir: string, kubeconfig: string, pki: Pki): string[] {
  return [
    `--kubeconfig=${kubeconfig}`,
    `--authentication-kubeconfig=${kubeconfig}`,
    `--authorization-kubeconfig=${kubeconfig}`,
    "--leader-elect=false",
    "--bind-address=127.0.0.1",
    `--cert-dir=${path.join(dir, "kcm-certs")}`,
    // The service-account token controller signs pods' tokens; kube-root-ca.crt carries the CA pods verify the API server with.
    `--service-account-private-key-file=${pki.serviceAccount.key}`,
    `--root-ca-file=${pki.ca}`,
    "--use-service-account-credentials=false",
    "--controllers=*",
    // Otherwise it creates /usr/libexec/kubernetes/kubelet-plugins on the machine.
    `--flex-volume-plugin-dir=${path.join(dir, "kcm-volume-plugins")}`,
    // A lost node's pods are marked for deletion soon, not after the default 5 minutes.
    "--node-monitor-grace-period=20s",
  ];
}

function schedulerArgs(kubeconfig: string): string[] {
  return [`--kubeconfig=${kubeconfig}`, `--authentication-kubeconfig=${kubeconfig}`, `--authorization-kubeconfig=${kubeconfig}`, "--leader-elect=false", "--bind-address=127.0.0.1"];
}

// The cluster's guard, under the watchdog of kube.ts: when the test process
// ends, however it ends, or stop() is done with the rest, it kills whatever is
// left in the nodes' cgroups (containers outlive a killed containerd), removes
// the cgroups, and deletes the network namespace. $1 is the namespace, the
// rest are the nodes' cgroup roots.
const GUARD = `
netns=$1; shift; roots=$*
clean() {
  for pass in 1 2; do
    for root in $roots; do
      state=/sys/fs/cgroup/freezer/$root/freezer.state
      [ -e "$state" ] && echo THAWED > "$state"
      for procs in $(find /sys/fs/cgroup/freezer/$root -name cgroup.procs 2>/dev/null); do
        for pid in $(cat "$procs"); do kill -KILL "$pid" 2>/dev/null; done
      done
    done
    sleep 1
  done
  for root in $roots; do
    for top in /sys/fs/cgroup/*/$root; do [ -d "$top" ] && find "$top" -depth -type d -exec rmdir {} + 2>/dev/null; done
  done
  ip netns del "$netns" 2>/dev/null
  kill "$sleeper" 2>/dev/null
  exit 0
}
trap clean TERM
sleep infinity &
sleeper=$!
wait "$sleeper"
`;

/** The network namespace with its loopback up and the cluster's addresses on it. */
async function network(netns: string, nodeCount: number): Promise<void> {
  await run("ip", ["netns", "add", netns]);
  const ip = (...args: string[]) => run("ip", ["-n", netns, ...args]);
  await ip("link", "set", "lo", "up");
  // The kubelet refuses a loopback node IP; these are ordinary addresses that happen to sit on this namespace's lo.
  for (const address of [API_ADDRESS, GIT_ADDRESS, REGISTRY_ADDRESS.split(":")[0]!, ...Array.from({ length: nodeCount }, (_, i) => nodeAddress(i + 1))])
    await ip("addr", "add", `${address}/32`, "dev", "lo");
}

interface Pki {
  ca: string;
  serving: { cert: string; key: string };
  kubeletClient: { cert: string; key: string };
  kubeletClientCa: string;
  serviceAccount: { key: string; pub: string };
  tokens: Record<string, string>;
  tokensFile: string;
}

/** The API server's serving certificate (its own CA), a CA the kubelets trust for the API server's client certificate, tokens. */
async function certificates(dir: string, nodeCount: number): Promise<Pki> {
  await fs.mkdir(dir, { recursive: true });
  const f = (name: string) => path.join(dir, name);
  const ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
  await run("openssl", [
    "req",
    "-x509",
    ...ec,
    "-days",
    "2",
    "-subj",
    "/CN=git-csi-e2e-apiserver",
    "-keyout",
    f("serving.key"),
    "-out",
    f("serving.crt"),
    "-addext",
    `subjectAltName=IP:${API_ADDRESS},IP:127.0.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:localhost`,
  ]);
  await run("openssl", ["req", "-x509", ...ec, "-days", "2", "-subj", "/CN=git-csi-e2e-kubelet-client-ca", "-keyout", f("kubelet-ca.key"), "-out", f("kubelet-ca.crt")]);
  await run("openssl", ["req", ...ec, "-subj", "/O=system:masters/CN=kube-apiserver-kubelet-client", "-keyout", f("kubelet-client.key"), "-out", f("kubelet-client.csr")]);
  await run("openssl", ["x509", "-req", "-in", f("kubelet-client.csr"), "-CA", f("kubelet-ca.crt"), "-CAkey", f("kubelet-ca.key"), "-CAcreateserial", "-days", "2", "-out", f("kubelet-client.crt")]);
  const sa = crypto.generateKeyPairSync("rsa", { modulusLength: 2048 });
  await fs.writeFile(f("sa.key"), sa.privateKey.export({ type: "pkcs8", format: "pem" }), { mode: 0o600 });
  await fs.writeFile(f("sa.pub"), sa.publicKey.export({ type: "spki", format: "pem" }));
  const token = () => crypto.randomBytes(24).toString("hex");
  const tokens: Record<string, string> = { admin: token() };
  const lines = [`${tokens.admin},admin,admin,"system:masters"`];
  for (let n = 1; n <= nodeCount; n++) {
    tokens[`node${n}`] = token();
    // The Node authorizer and NodeRestriction know a kubelet by this user and group.
    lines.push(`${tokens[`node${n}`]},system:node:node${n},node${n},"system:nodes"`);
  }
  await fs.writeFile(f("tokens.csv"), `${lines.join("\n")}\n`, { mode: 0o600 });
  return {
    ca: f("serving.crt"),
    serving: { cert: f("serving.crt"), key: f("serving.key") },
    kubeletClient: { cert: f("kubelet-client.crt"), key: f("kubelet-client.key") },
    kubeletClientCa: f("kubelet-ca.crt"),
    serviceAccount: { key: f("sa.key"), pub: f("sa.pub") },
    tokens,
    tokensFile: f("tokens.csv"),
  };
}

async function kubeconfigFile(dir: string, user: string, token: string, ca: string): Promise<string> {
  const file = path.join(dir, `${user}.kubeconfig`);
  // JSON is YAML: kubectl, helm and the kubelet all read it.
  await fs.writeFile(
    file,
    JSON.stringify(
      {
        apiVersion: "v1",
        kind: "Config",
        clusters: [{ name: "e2e", cluster: { server: `https://${API_ADDRESS}:443`, "certificate-authority-data": (await fs.readFile(ca)).toString("base64") } }],
        users: [{ name: user, user: { token } }],
        contexts: [{ name: "e2e", context: { cluster: "e2e", user, namespace: "default" } }],
        "current-context": "e2e",
      },
      null,
      2,
    ),
    { mode: 0o600 },
  );
  return file;
}

/** Node n: its cgroup root, its mount namespace (held by its containerd), and its kubelet. */
async function startNode(n: number, cgroupRoot: string, dir: string, netns: string, pki: Pki, bin: string, registry: Registry): Promise<ClusterNode> {
  const name = `node${n}`;
  const address = nodeAddress(n);
  const paths = nodePaths(dir);
  for (const p of [...Object.values(paths), ...Object.values(NODE_PATHS)]) await fs.mkdir(p, { recursive: true });
  await nodeCgroups(cgroupRoot);
  const socket = path.join(paths.containerd, "containerd.sock");
  await writeHostsConfig(paths.registries, registry);
  await fs.writeFile(path.join(dir, "containerd.toml"), containerdConfig(paths.containerd, socket, paths.netd, paths.registries, address));
  await fs.writeFile(path.join(paths.netd, "10-bridge.conflist"), bridgeConfig(name, `${netns}n${n}`.slice(-15), podRange(n), paths.cni));
  const { containerd, holder } = await startContainerd(name, dir, netns, paths, cgroupRoot, socket);
  const kubeconfig = await kubeconfigFile(dir, name, pki.tokens[name]!, pki.ca);
  await fs.writeFile(path.join(dir, "kubelet.yaml"), JSON.stringify(kubeletConfig(address, cgroupRoot, socket, pki.kubeletClientCa, path.join(dir, "volume-plugins"))));
  const kubelet = await watched("nsenter", kubeletArgs(name, address, dir, netns, holder, cgroupRoot, kubeconfig, bin), path.join(dir, "kubelet.log"));
  const freezer = `/sys/fs/cgroup/freezer/${cgroupRoot}/freezer.state`;
  return {
    name,
    address,
    dir,
    containerdSocket: socket,
    freeze: () => settleFreezer(freezer, "FROZEN"),
    thaw: () => settleFreezer(freezer, "THAWED"),
    stop: async () => {
      await kubelet.stop();
      await stopContainers(socket);
      await containerd.stop();
    },
  };
}

type NodePaths = Record<"kubelet" | "state" | "podLogs" | "netns" | "containerd" | "netd" | "cni" | "registries", string>;

function nodePaths(dir: string): NodePaths {
  return {
    kubelet: path.join(dir, "kubelet"),
    state: path.join(dir, "state"),
    podLogs: path.join(dir, "pods"),
    netns: path.join(dir, "netns"),
    containerd: path.join(dir, "containerd"),
    netd: path.join(dir, "net.d"),
    cni: path.join(dir, "cni"),
    registries: path.join(dir, "certs.d"),
  };
}

/** The kubelet's cgroupRoot must exist in every v1 hierarchy; a cpuset group needs its cpus and mems. */
async function nodeCgroups(cgroupRoot: string): Promise<void> {
  for (const h of HIERARCHIES) await fs.mkdir(`/sys/fs/cgroup/${h}/${cgroupRoot}/system`, { recursive: true });
  const cpuset = "/sys/fs/cgroup/cpuset";
  for (const [parent, group] of [
    [cpuset, `${cpuset}/${cgroupRoot}`],
    [`${cpuset}/${cgroupRoot}`, `${cpuset}/${cgroupRoot}/system`],
  ] as const) {
    for (const file of ["cpuset.cpus", "cpuset.mems"]) await fs.writeFile(`${group}/${file}`, await fs.readFile(`${parent}/${file}`));
  }
}

function bridgeConfig(name: string, bridge: string, subnet: string, dataDir: string): string {
  return JSON.stringify({
    cniVersion: "0.4.0",
    name: `pods-${name}`,
    plugins: [
      {
        type: "bridge",
        bridge,
        isGateway: true,
        ipMasq: false,
        hairpinMode: true,
        ipam: { type: "host-local", ranges: [[{ subnet }]], routes: [{ dst: "0.0.0.0/0" }], dataDir },
      },
    ],
  });
}

function joinCgroup(cgroupRoot: string): string {
  return `echo $$ > /sys/fs/cgroup/freezer/${cgroupRoot}/system/cgroup.procs`;
}

/** containerd holds the node's mount namespace: it binds the node's directories over the paths every node uses, then runs. */
async function startContainerd(name: string, dir: string, netns: string, paths: NodePaths, cgroupRoot: string, socket: string): Promise<{ containerd: Watched; holder: string }> {
  const pidFile = path.join(dir, "containerd.pid");
  // Shared inside the node, as on a real one: the mount-owner's Bidirectional mounts reach the kubelet and the pods.
  const binds = Object.entries(NODE_PATHS)
    .map(([key, target]) => `mount --bind ${paths[key as keyof typeof NODE_PATHS]} ${target} && mount --make-rshared ${target}`)
    .join(" && ");
  const script = `${binds} && ${joinCgroup(cgroupRoot)} && echo $$ > ${pidFile} && exec containerd --config ${path.join(dir, "containerd.toml")}`;
  const args = [`--net=/run/netns/${netns}`, "--", "unshare", "--mount", "--propagation", "slave", "--", "sh", "-c", script];
  const containerd = await watched("nsenter", args, path.join(dir, "containerd.log"));
  await until(`containerd of ${name} answers`, containerd, async () => (await run("ctr", ["-a", socket, "version"])).stdout.includes("Server"), 30_000);
  return { containerd, holder: (await fs.readFile(pidFile, "utf8")).trim() };
}

/** The kubelet runs in the node's network and mount namespaces and its freezer cgroup. */
function kubeletArgs(name: string, address: string, dir: string, netns: string, holder: string, cgroupRoot: string, kubeconfig: string, bin: string): string[] {
  return [
    `--net=/run/netns/${netns}`,
    `--mount=/proc/${holder}/ns/mnt`,
    "--",
    "sh",
    "-c",
    `${joinCgroup(cgroupRoot)} && exec "$@"`,
    "kubelet",
    path.join(bin, "kubelet"),
    `--config=${path.join(dir, "kubelet.yaml")}`,
    `--kubeconfig=${kubeconfig}`,
    `--cert-dir=${path.join(dir, "kubelet-pki")}`,
    `--hostname-override=${name}`,
    `--node-ip=${address}`,
    "--v=2",
  ];
}

async function settleFreezer(freezer: string, state: "FROZEN" | "THAWED"): Promise<void> {
  await fs.writeFile(freezer, state);
  // FREEZING until every task stopped.
  while ((await fs.readFile(freezer, "utf8")).trim() !== state) await sleep(100);
}

function containerdConfig(root: string, socket: string, netd: string, registries: string, address: string): string {
  return `version = 2
root = "${root}/root"
state = "${root}/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs"]
[grpc]
  address = "${socket}"
[ttrpc]
  address = "${socket}.ttrpc"
[metrics]
  address = ""
[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "${PAUSE_IMAGE}"
    stream_server_address = "${address}"
    stream_server_port = "0"
    enable_selinux = false
    # runc cannot lower oom_score_adj without CAP_SYS_RESOURCE, which this machine does not give.
    restrict_oom_score_adj = true
    [plugins."io.containerd.grpc.v1.cri".containerd]
      snapshotter = "overlayfs"
      default_runtime_name = "runc"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
          SystemdCgroup = false
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "/usr/lib/cni"
      conf_dir = "${netd}"
    [plugins."io.containerd.grpc.v1.cri".registry]
      config_path = "${registries}"
  [plugins."io.containerd.internal.v1.opt"]
    path = "${root}/opt"
`;
}

function kubeletConfig(address: string, cgroupRoot: string, socket: string, clientCa: string, volumePluginDir: string): object {
  return {
    apiVersion: "kubelet.config.k8s.io/v1beta1",
    kind: "KubeletConfiguration",
    address,
    port: 10250,
    readOnlyPort: 0,
    healthzBindAddress: address,
    healthzPort: 10248,
    cgroupDriver: "cgroupfs",
    cgroupRoot: `/${cgroupRoot}`,
    containerRuntimeEndpoint: `unix://${socket}`,
    failSwapOn: false,
    // This machine has cgroup v1 only.
    failCgroupV1: false,
    authentication: { anonymous: { enabled: false }, webhook: { enabled: false }, x509: { clientCAFile: clientCa } },
    authorization: { mode: "AlwaysAllow" },
    serializeImagePulls: false,
    // Each image is pulled once, for the whole test: none may be collected.
    imageGCHighThresholdPercent: 100,
    imageGCLowThresholdPercent: 99,
    evictionHard: { "memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%", "nodefs.inodesFree": "1%" },
    enforceNodeAllocatable: [],
    resolvConf: "/etc/resolv.conf",
    podPidsLimit: -1,
    // Pods and requiresRepublish volumes resync every 10 s instead of every minute.
    syncFrequency: "10s",
    fileCheckFrequency: "10s",
    nodeStatusUpdateFrequency: "10s",
    // The kubelet posts a volume's abnormal condition (NodeGetVolumeStats) as a pod event only with this alpha gate.
    featureGates: { CSIVolumeHealth: true },
    // It asks for the volumes' stats and conditions every 10 s, not every minute: a condition is told before the driver's recovery deletes the pod.
    volumeStatsAggPeriod: "10s",
    // Otherwise the kubelet creates /usr/libexec/kubernetes/kubelet-plugins on the machine.
    volumePluginDir,
  };
}

/** Kills what a stopped kubelet left running in its containerd. */
async function stopContainers(socket: string): Promise<void> {
  const ctr = (...args: string[]) => run("ctr", ["-a", socket, "-n", "k8s.io", ...args]).then((r) => r.stdout);
  const tasks = (await ctr("tasks", "ls", "-q").catch(() => "")).split("\n").filter(Boolean);
  for (const task of tasks) await ctr("tasks", "kill", "-s", "KILL", task).catch(() => undefined);
  for (const task of tasks) await ctr("tasks", "delete", "-f", task).catch(() => undefined);
}
