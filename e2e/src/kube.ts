// Test helper: a REAL Kubernetes API server — etcd and kube-apiserver built
// from source by `make kube-tools` (e2e/k8s/*/go.mod pin the versions) — on
// loopback, for tests of what the driver does with the API: RBAC, events,
// VolumeAttributesClass, watches. No scheduler, controller-manager or kubelet
// runs: objects are stored and validated, nothing reconciles them.
//
//   const kube = await startKube(dir);              // logs and data under dir
//   await kube.kubectl(["apply", "-f", "-"], yaml); // kubectl with the admin kubeconfig
//   new KubeConfig().loadFromFile(kube.kubeconfig); // @kubernetes/client-node works too
//   await kube.stop();
//
// The interface:
//   server      https://127.0.0.1:<port>, a self-signed serving certificate
//               (its CA is in the kubeconfig's certificate-authority-data)
//   token       a bearer token of user "admin" in group system:masters
//   kubeconfig  path of a kubeconfig file for that token (context "e2e",
//               namespace "default")
//   binDir      where kube-apiserver, kubectl and etcd are
//   kubectl(args, input?)  runs kubectl with that kubeconfig, input on stdin;
//               resolves to stdout, rejects with stderr in the message
//   apply(...objects)  kubectl apply of the objects, as one List
//   stop()      ends kube-apiserver and etcd; idempotent
// kubeToolsMissing() says why the binaries are not there (startKube fails with
// it), kubeVersions() and kubeBinDir() where they are, and watched()/until()
// run any other server the same way (the Prometheus test uses them).
//
// The API server authorizes with Node,RBAC, so `kubectl auth can-i --as=...`
// and impersonation answer as a real cluster would. Admission is the default
// set: a pod needs its namespace's "default" ServiceAccount, which no
// controller creates here. Both processes run under a small sh watchdog that
// holds a pipe from the test process: when the test process exits, however it
// exits (even SIGKILL), the pipe closes and the watchdog ends its server.
import { type ChildProcess, execFile, spawn } from "node:child_process";
import * as crypto from "node:crypto";
import { existsSync, readFileSync } from "node:fs";
import * as fs from "node:fs/promises";
import * as https from "node:https";
import * as os from "node:os";
import * as path from "node:path";
import type { TestContext } from "node:test";
import { promisify } from "node:util";
import { setTimeout as sleep } from "node:timers/promises";
import { freePort } from "./driver";

export interface Kube {
  server: string;
  token: string;
  kubeconfig: string;
  binDir: string;
  kubectl(args: string[], input?: string): Promise<string>;
  apply(...objects: object[]): Promise<string>;
  stop(): Promise<void>;
}

const ROOT = path.join(__dirname, "..", "..", "..");
const run = promisify(execFile);

/** The version a go.mod requires of a module: the one source of the versions, shared with the Makefile. */
function requiredVersion(goMod: string, module: string): string {
  const text = readFileSync(path.join(ROOT, goMod), "utf8");
  const match = new RegExp(`^(?:require\\s+)?\\s*${module.replace(/[.]/g, "\\.")}\\s+(v\\S+)`, "m").exec(text);
  if (!match) throw new Error(`${goMod} requires no ${module}`);
  return match[1]!;
}

export function kubeVersions(): { kubernetes: string; etcd: string } {
  return {
    kubernetes: requiredVersion("e2e/k8s/kube/go.mod", "k8s.io/kubernetes"),
    etcd: requiredVersion("e2e/k8s/etcd/go.mod", "go.etcd.io/etcd/server/v3"),
  };
}

/** The external-snapshotter of the sidecars' wrapper module: the chart's csi-snapshotter, and the cluster test's snapshot-controller and CRDs. */
export function snapshotterVersion(): string {
  return requiredVersion("e2e/k8s/csi-provisioner/go.mod", "github.com/kubernetes-csi/external-snapshotter/v8");
}

/** .cache/k8s/<Kubernetes version>, where `make kube-tools` puts the three binaries. */
export function kubeBinDir(): string {
  return path.join(ROOT, ".cache", "k8s", kubeVersions().kubernetes);
}

const TOOLS = ["etcd", "kube-apiserver", "kubectl"] as const;

/** Why the tests against a real API server cannot run here, or undefined when they can. */
export function kubeToolsMissing(): string | undefined {
  const dir = kubeBinDir();
  const missing = TOOLS.filter((tool) => !existsSync(path.join(dir, tool)));
  if (missing.length === 0) return undefined;
  return `no ${missing.join(", ")} in ${path.relative(ROOT, dir)}: run 'make kube-tools' to build them (Go, from the module proxy; about 7 minutes cold on 2 cores)`;
}

/** Starts etcd and kube-apiserver with their data, certificates and logs under dir; resolves once /readyz answers ok. */
export async function startKube(dir: string): Promise<Kube> {
  const missing = kubeToolsMissing();
  if (missing) throw new Error(missing);
  const binDir = kubeBinDir();
  await fs.mkdir(dir, { recursive: true });
  const processes: Watched[] = [];
  const stop = async () => {
    // The API server first, so it never logs a lost etcd as a failure worth reading.
    for (const p of processes.reverse()) await p.stop();
    processes.length = 0;
  };
  try {
    const pki = await makePki(dir);
    const [etcdPort, peerPort, apiPort] = [await freePort(), await freePort(), await freePort()];
    const etcdUrl = await startEtcd(binDir, dir, processes, etcdPort, peerPort);
    const { server, ca } = await startApiServer(binDir, dir, processes, pki, etcdUrl, apiPort);
    const kubeconfig = await writeKubeconfig(dir, server, ca, pki.token);
    const kubectlEnv = { ...process.env, KUBECONFIG: kubeconfig, KUBECACHEDIR: path.join(dir, "kubectl-cache") };
    const kubectl = (args: string[], input?: string) => runTool(path.join(binDir, "kubectl"), args, kubectlEnv, input);
    return {
      server,
      token: pki.token,
      kubeconfig,
      binDir,
      kubectl,
      apply: (...items) => kubectl(["apply", "-f", "-"], JSON.stringify({ apiVersion: "v1", kind: "List", items })),
      stop,
    };
  } catch (err) {
    await stop();
    throw err;
  }
}

/** The API server's serving certificate, the service-account key pair, and the admin's token. */
async function makePki(dir: string): Promise<{ cert: string; key: string; saKey: string; saPub: string; tokens: string; token: string }> {
  const pki = path.join(dir, "pki");
  await fs.mkdir(pki, { recursive: true });
  const cert = path.join(pki, "serving.crt");
  const key = path.join(pki, "serving.key");
  await run("openssl", [
    "req",
    "-x509",
    "-newkey",
    "ec",
    "-pkeyopt",
    "ec_paramgen_curve:prime256v1",
    "-nodes",
    "-days",
    "2",
    "-subj",
    "/CN=127.0.0.1",
    "-addext",
    "subjectAltName=IP:127.0.0.1,DNS:localhost",
    "-keyout",
    key,
    "-out",
    cert,
  ]);
  const sa = crypto.generateKeyPairSync("rsa", { modulusLength: 2048 });
  const saKey = path.join(pki, "service-account.key");
  const saPub = path.join(pki, "service-account.pub");
  await fs.writeFile(saKey, sa.privateKey.export({ type: "pkcs8", format: "pem" }), { mode: 0o600 });
  await fs.writeFile(saPub, sa.publicKey.export({ type: "spki", format: "pem" }));
  const token = crypto.randomBytes(24).toString("hex");
  const tokens = path.join(pki, "tokens.csv");
  await fs.writeFile(tokens, `${token},admin,admin,"system:masters"\n`, { mode: 0o600 });

  return { cert, key, saKey, saPub, tokens, token };
}

/** etcd on the ports, healthy; its client URL. */
async function startEtcd(binDir: string, dir: string, processes: Watched[], etcdPort: number, peerPort: number): Promise<string> {
  const etcdUrl = `http://127.0.0.1:${etcdPort}`;
  const peerUrl = `http://127.0.0.1:${peerPort}`;
  const etcd = await watched(
    path.join(binDir, "etcd"),
    [
      "--name=e2e",
      `--data-dir=${path.join(dir, "etcd")}`,
      `--listen-client-urls=${etcdUrl}`,
      `--advertise-client-urls=${etcdUrl}`,
      `--listen-peer-urls=${peerUrl}`,
      `--initial-advertise-peer-urls=${peerUrl}`,
      `--initial-cluster=e2e=${peerUrl}`,
      // A test's store outlives no test: fsync buys nothing and costs seconds on a busy disk.
      "--unsafe-no-fsync",
      "--log-level=warn",
    ],
    path.join(dir, "etcd.log"),
  );
  processes.push(etcd);
  await until("etcd answers /health", etcd, async () => {
    const response = await fetch(`${etcdUrl}/health`);
    return response.ok && ((await response.json()) as { health?: string }).health === "true";
  });

  return etcdUrl;
}

/** kube-apiserver on the port, ready; its URL and the CA that signs its certificate. */
async function startApiServer(binDir: string, dir: string, processes: Watched[], pki: Awaited<ReturnType<typeof makePki>>, etcdUrl: string, apiPort: number): Promise<{ server: string; ca: Buffer }> {
  const { cert, key, tokens, saPub, saKey, token } = pki;
  const server = `https://127.0.0.1:${apiPort}`;
  const apiserver = await watched(
    path.join(binDir, "kube-apiserver"),
    [
      `--etcd-servers=${etcdUrl}`,
      "--bind-address=127.0.0.1",
      "--advertise-address=127.0.0.1",
      `--secure-port=${apiPort}`,
      `--tls-cert-file=${cert}`,
      `--tls-private-key-file=${key}`,
      `--cert-dir=${path.join(dir, "apiserver-certs")}`,
      `--token-auth-file=${tokens}`,
      "--authorization-mode=Node,RBAC",
      "--service-cluster-ip-range=10.96.0.0/24",
      "--service-account-issuer=https://kubernetes.default.svc",
      `--service-account-key-file=${saPub}`,
      `--service-account-signing-key-file=${saKey}`,
      // The node DaemonSet runs a privileged mount-owner: a real cluster allows that, and so must dry-run validation.
      "--allow-privileged=true",
      "--profiling=false",
    ],
    path.join(dir, "kube-apiserver.log"),
  );
  processes.push(apiserver);
  const ca = await fs.readFile(cert);
  await until("kube-apiserver answers /readyz", apiserver, async () => (await get(server, token, ca, "/readyz")) === "ok", 120_000);

  return { server, ca };
}

/** A kubeconfig naming the API server as the admin; its path. */
async function writeKubeconfig(dir: string, server: string, ca: Buffer, token: string): Promise<string> {
  const kubeconfig = path.join(dir, "kubeconfig");
  // JSON is YAML: kubectl and @kubernetes/client-node both read it.
  await fs.writeFile(
    kubeconfig,
    JSON.stringify(
      {
        apiVersion: "v1",
        kind: "Config",
        clusters: [{ name: "e2e", cluster: { server, "certificate-authority-data": ca.toString("base64") } }],
        users: [{ name: "admin", user: { token } }],
        contexts: [{ name: "e2e", context: { cluster: "e2e", user: "admin", namespace: "default" } }],
        "current-context": "e2e",
      },
      null,
      2,
    ),
    { mode: 0o600 },
  );
  return kubeconfig;
}

/** Runs a command-line tool, input on stdin; resolves to stdout, rejects with stderr in the message. */
export function runTool(bin: string, args: string[], env: NodeJS.ProcessEnv, input?: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const child = spawn(bin, args, { env, stdio: ["pipe", "pipe", "pipe"] });
    let stdout = "";
    let stderr = "";
    child.stdout.on("data", (chunk: Buffer) => (stdout += chunk.toString()));
    child.stderr.on("data", (chunk: Buffer) => (stderr += chunk.toString()));
    child.once("error", reject);
    child.once("close", (code, signal) => {
      if (code === 0) resolve(stdout);
      else reject(new Error(`${path.basename(bin)} ${args.join(" ")} exited ${code ?? signal}: ${stderr.trim() || stdout.trim()}`));
    });
    child.stdin.end(input ?? "");
  });
}

/** GET a path of the API server; resolves to the body of a 200, or undefined. */
function get(server: string, token: string, ca: Buffer, urlPath: string): Promise<string | undefined> {
  return new Promise((resolve, reject) => {
    const request = https.get(`${server}${urlPath}`, { ca, headers: { authorization: `Bearer ${token}` }, timeout: 5000 }, (response) => {
      let body = "";
      response.on("data", (chunk: Buffer) => (body += chunk.toString()));
      response.on("end", () => resolve(response.statusCode === 200 ? body : undefined));
    });
    request.once("timeout", () => request.destroy(new Error("timed out")));
    request.once("error", reject);
  });
}

/** A server process under the watchdog below: stop() ends it, and so does the test process's end. */
export interface Watched {
  child: ChildProcess;
  log: string;
  stop(): Promise<void>;
}

// The watchdog: runs the server, and beside it a reader of its own stdin (a
// pipe from the test process). When that pipe closes — stop(), or the test
// process gone however it went — the reader TERMs the server and KILLs it 10 s
// later if it is still there. The watchdog exits with the server, so a server
// that dies on its own is seen at once.
const WATCHDOG = `
"$@" </dev/null &
server=$!
exec 3<&0
( read -r _ <&3; kill -TERM "$server" 2>/dev/null; sleep 10; kill -KILL "$server" 2>/dev/null ) &
reader=$!
exec 3<&-
wait "$server"
code=$?
kill "$reader" 2>/dev/null
exit $code
`;

/** Starts bin under the watchdog, its stdout and stderr appended to log. */
export async function watched(bin: string, args: string[], log: string): Promise<Watched> {
  const out = await fs.open(log, "a");
  const child = spawn("sh", ["-c", WATCHDOG, path.basename(bin), bin, ...args], { stdio: ["pipe", out.fd, out.fd] });
  await out.close();
  const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()));
  return {
    child,
    log,
    stop: async () => {
      if (child.exitCode === null && child.signalCode === null) child.stdin!.end();
      await exited;
    },
  };
}

/** Polls probe until it is true; fails early, with the log's tail, if the process exits. */
export async function until(what: string, p: Watched, probe: () => Promise<boolean>, timeoutMs = 60_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  let last: unknown;
  for (;;) {
    if (p.child.exitCode !== null || p.child.signalCode !== null) throw new Error(`waiting until ${what}: it exited (${p.child.exitCode ?? p.child.signalCode}); ${p.log} ends:\n${await tail(p.log)}`);
    try {
      if (await probe()) return;
    } catch (err) {
      last = err;
    }
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting until ${what}${last ? ` (${String(last)})` : ""}; ${p.log} ends:\n${await tail(p.log)}`);
    await sleep(250);
  }
}

async function tail(file: string, lines = 30): Promise<string> {
  const text = await fs.readFile(file, "utf8").catch(() => "");
  return text.trimEnd().split("\n").slice(-lines).join("\n");
}

/**
 * A PersistentVolume of the driver (reclaim policy Retain) and its claim
 * home/config, bound to each other as a pre-bound volume is: no
 * controller-manager runs to bind them. `volumeClass`: the claim's
 * VolumeAttributesClass, if any.
 */
export function boundConfigClaim(pv: string, volumeAttributes: Record<string, string>, volumeClass?: string): object[] {
  const volumeAttributesClassName = volumeClass ? { volumeAttributesClassName: volumeClass } : {};
  return [
    {
      apiVersion: "v1",
      kind: "PersistentVolume",
      metadata: { name: pv },
      spec: {
        capacity: { storage: "1Gi" },
        accessModes: ["ReadWriteOncePod"],
        persistentVolumeReclaimPolicy: "Retain",
        storageClassName: "",
        claimRef: { namespace: "home", name: "config" },
        csi: { driver: "git.liken.sh", volumeHandle: pv, volumeAttributes },
      },
    },
    {
      apiVersion: "v1",
      kind: "PersistentVolumeClaim",
      metadata: { name: "config", namespace: "home" },
      spec: { volumeName: pv, accessModes: ["ReadWriteOncePod"], resources: { requests: { storage: "1Gi" } }, storageClassName: "", ...volumeAttributesClassName },
    },
  ];
}

/**
 * A test's own API server, which stops, its directory gone, after the test.
 * Binaries that are not built fail the test with startKube's reason: a
 * skipped test has not run.
 */
export async function kubeForTest(t: TestContext, name: string): Promise<Kube> {
  const dir = await fs.mkdtemp(path.join(os.tmpdir(), `git-csi-${name}-`));
  const kube = await startKube(dir);
  t.after(async () => {
    await kube.stop();
    await fs.rm(dir, { recursive: true, force: true });
  });
  return kube;
}
