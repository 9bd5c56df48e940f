// Test and demo helper: the real driver — three services as separate
// processes under the standalone launcher — and CSI clients on its socket.
import assert from "node:assert/strict";
import { type ChildProcess, execFile, spawn } from "node:child_process";
import * as fs from "node:fs/promises";
import * as os from "node:os";
import * as path from "node:path";
import { promisify } from "node:util";
import * as net from "node:net";
import { setTimeout as sleep } from "node:timers/promises";
import { status } from "@grpc/grpc-js";
import { call, csi, CsiError, dialUnix, gitWorker, mountOwner } from "@git-csi/protos";

export const run = promisify(execFile);

const LAUNCHER = path.join(__dirname, "..", "..", "..", "packages", "cli", "dist", "src", "main.js");

export interface Driver {
  dir: string;
  stateDir: string;
  endpoint: string;
  identity: csi.IdentityClient;
  controller: csi.ControllerClient;
  node: csi.NodeClient;
  /** The pid of one service, as the launcher last started it. */
  pid(service: "csi-frontend" | "mount-owner" | "git-worker" | "fd-keeper"): Promise<number>;
  /** Everything the services logged, one JSON object per line. */
  logs(): string;
  /** The mount owner's own socket: what the Kubernetes watch drives, such as a claim's class. */
  owner: mountOwner.MountOwnerClient;
  /** The node plugin's /metrics listener, when started with a metrics port. */
  metricsUrl: string;
  /** The mount owner's /metrics listener, when started with its port. */
  ownerMetricsUrl: string;
  /** A shell command as the node's applications see its mounts: in the node's own mount namespace, if it has one. */
  sh(script: string): Promise<string>;
  stop(): Promise<void>;
}

export interface DriverOptions {
  nodeId?: string;
  dir?: string;
  metricsPort?: number;
  /** The mount owner's /metrics port (git_csi_operations_total). */
  ownerMetricsPort?: number;
  /** Spec 000's lease and renewal, shortened for tests that wait for an expiry. */
  lease?: { duration: string; renewInterval: string };
  /**
   * A mount namespace of the node's own (unshare, private propagation), as a
   * second machine has: its mounts and the kernel table it scans are its own.
   */
  ownMountNamespace?: boolean;
  /** An API server the services watch and post events to. */
  kubeconfig?: string;
  /** The git worker's collection interval (--gc-interval), shortened for tests that wait for a collection. */
  gcInterval?: string;
  /** The git worker's --owner-ref-retention, shortened for tests of the owner refs' collection. */
  ownerRefRetention?: string;
  /** The git worker deletes a lost epoch's pods that a controller owns (--delete-fenced-pods). */
  deleteFencedPods?: boolean;
  /** The node's wall clock this far from the machine's (libfaketime's FAKETIME offset, e.g. "+1h"), for every process of the node. */
  clockOffset?: string;
  /**
   * A file holding the node's wall clock offset, which the node's processes
   * read again each second: writing it steps their wall clock, as an NTP
   * step does, while their monotonic clocks run on untouched.
   */
  clockFile?: string;
}

/** Debian's libfaketime: every clock a process reads (wall and monotonic) moved by the offset, in it and its children. */
const LIBFAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

function nodeEnv(options: DriverOptions): NodeJS.ProcessEnv {
  if (options.clockFile) {
    return { ...process.env, LD_PRELOAD: LIBFAKETIME, FAKETIME_TIMESTAMP_FILE: options.clockFile, FAKETIME_CACHE_DURATION: "1", FAKETIME_DONT_FAKE_MONOTONIC: "1" };
  }
  if (!options.clockOffset) return process.env;
  return { ...process.env, LD_PRELOAD: LIBFAKETIME, FAKETIME: options.clockOffset };
}

export async function startDriver(options: DriverOptions = {}): Promise<Driver> {
  const dir = options.dir ?? (await fs.mkdtemp(path.join(os.tmpdir(), "git-csi-e2e-")));
  const stateDir = path.join(dir, "state");
  const endpoint = `unix://${path.join(dir, "csi.sock")}`;
  const address = (port?: number) => (port ? `127.0.0.1:${port}` : "");
  const args = [
    "standalone",
    "--state-dir",
    stateDir,
    "--endpoint",
    endpoint,
    "--node-id",
    options.nodeId ?? "e2e-node",
    "--metrics-address",
    address(options.metricsPort),
    "--owner-metrics-address",
    address(options.ownerMetricsPort),
  ];
  if (options.lease) args.push("--lease-duration", options.lease.duration, "--lease-renew-interval", options.lease.renewInterval);
  if (options.kubeconfig) args.push("--kubeconfig", options.kubeconfig);
  if (options.deleteFencedPods) args.push("--delete-fenced-pods", "true");
  if (options.gcInterval) args.push("--gc-interval", options.gcInterval);
  if (options.ownerRefRetention) args.push("--owner-ref-retention", options.ownerRefRetention);
  const spawned = { stdio: ["ignore", "pipe", "pipe"] as ("ignore" | "pipe")[], env: nodeEnv(options) };
  const launcher = options.ownMountNamespace
    ? spawn("unshare", ["--mount", "--propagation", "private", process.execPath, LAUNCHER, ...args], spawned)
    : spawn(process.execPath, [LAUNCHER, ...args], spawned);
  let logs = "";
  launcher.stderr!.on("data", (chunk: Buffer) => (logs += chunk.toString()));
  await waitForReadyLine(launcher, () => logs);
  const identity = dialUnix(csi.IdentityClient, endpoint);
  const controller = dialUnix(csi.ControllerClient, endpoint);
  const node = dialUnix(csi.NodeClient, endpoint);
  const owner = dialUnix(mountOwner.MountOwnerClient, `unix://${path.join(stateDir, "sockets", "mount-owner.sock")}`);
  return {
    dir,
    stateDir,
    endpoint,
    identity,
    controller,
    node,
    pid: async (service) => Number((await fs.readFile(path.join(stateDir, "run", `${service}.pid`), "utf8")).trim()),
    logs: () => logs,
    owner,
    metricsUrl: options.metricsPort ? `http://127.0.0.1:${options.metricsPort}` : "",
    ownerMetricsUrl: options.ownerMetricsPort ? `http://127.0.0.1:${options.ownerMetricsPort}` : "",
    // unshare execs the launcher in place: its pid names the namespace.
    sh: (script) => (options.ownMountNamespace ? run("nsenter", ["-t", String(launcher.pid), "-m", "--", "sh", "-c", script]).then((r) => r.stdout) : sh(script)),
    stop: async () => {
      for (const c of [identity, controller, node, owner]) c.close();
      await stopProcess(launcher);
      // A test that failed before its unstage leaves mounts; none outlives the suite.
      for (const mountPoint of (await mountsUnder(dir)).reverse()) await run("umount", ["-l", mountPoint]).catch(() => undefined);
    },
  };
}

function waitForReadyLine(launcher: ChildProcess, logs: () => string): Promise<void> {
  return new Promise((resolve, reject) => {
    let out = "";
    launcher.stdout!.on("data", (chunk: Buffer) => {
      out += chunk.toString();
      if (out.split("\n").some((line) => line.startsWith("{") && (JSON.parse(line) as { ready?: boolean }).ready)) resolve();
    });
    launcher.once("exit", (code) => reject(new Error(`the launcher exited (${code}) before it was ready:\n${logs()}`)));
  });
}

function stopProcess(proc: ChildProcess): Promise<void> {
  if (proc.exitCode !== null || proc.signalCode !== null) return Promise.resolve();
  return new Promise((resolve) => {
    proc.once("exit", () => resolve());
    proc.kill("SIGTERM");
  });
}

export const SINGLE_NODE_WRITER = csi.VolumeCapability_AccessMode_Mode.SINGLE_NODE_WRITER;
export const SINGLE_NODE_SINGLE_WRITER = csi.VolumeCapability_AccessMode_Mode.SINGLE_NODE_SINGLE_WRITER;

/** volumeMountGroup: the pod's fsGroup, as the kubelet passes it to a driver with VOLUME_MOUNT_GROUP. */
export function mountCapability(mode: csi.VolumeCapability_AccessMode_Mode = SINGLE_NODE_SINGLE_WRITER, volumeMountGroup = ""): csi.VolumeCapability {
  return { mount: { fsType: "", mountFlags: [], volumeMountGroup }, accessMode: { mode } };
}

/** A volume created, staged and published over the CSI socket, as the kubelet would. */
export interface PublishedVolume {
  volumeId: string;
  context: Record<string, string>;
  stagingPath: string;
  targetPath: string;
}

const T = 60_000;

export async function createVolume(driver: Driver, name: string, url: string, mode = SINGLE_NODE_SINGLE_WRITER): Promise<csi.Volume> {
  const response = await call(
    driver.controller.createVolume.bind(driver.controller),
    { ...csi.CreateVolumeRequest.fromPartial({ name, volumeCapabilities: [mountCapability(mode)], parameters: { url, ref: "main" } }) },
    T,
  );
  return response.volume!;
}

export interface Secrets {
  stage?: Record<string, string>;
  publish?: Record<string, string>;
}

export async function stageAndPublish(driver: Driver, volume: csi.Volume, mode = SINGLE_NODE_SINGLE_WRITER, pod = "app", secrets: Secrets = {}, volumeMountGroup = ""): Promise<PublishedVolume> {
  const stagingPath = path.join(driver.dir, "staging", volume.volumeId);
  const targetPath = path.join(driver.dir, "pods", pod, "volume");
  await fs.mkdir(stagingPath, { recursive: true });
  await fs.mkdir(path.dirname(targetPath), { recursive: true });
  const capability = mountCapability(mode, volumeMountGroup);
  await call(
    driver.node.nodeStageVolume.bind(driver.node),
    csi.NodeStageVolumeRequest.fromPartial({
      volumeId: volume.volumeId,
      stagingTargetPath: stagingPath,
      volumeCapability: capability,
      volumeContext: volume.volumeContext,
      secrets: secrets.stage ?? {},
    }),
    T,
  );
  const published = { volumeId: volume.volumeId, context: volume.volumeContext, stagingPath, targetPath };
  await publish(driver, published, secrets.publish ?? {}, mode, volumeMountGroup);
  return published;
}

/** NodePublishVolume, as the kubelet sends it at pod start and again on each pod sync with the Secret read afresh. */
export async function publish(driver: Driver, volume: PublishedVolume, secrets: Record<string, string>, mode = SINGLE_NODE_SINGLE_WRITER, volumeMountGroup = ""): Promise<void> {
  await call(
    driver.node.nodePublishVolume.bind(driver.node),
    csi.NodePublishVolumeRequest.fromPartial({
      volumeId: volume.volumeId,
      stagingTargetPath: volume.stagingPath,
      targetPath: volume.targetPath,
      volumeCapability: mountCapability(mode, volumeMountGroup),
      volumeContext: volume.context,
      secrets,
    }),
    T,
  );
}

/** DeleteVolume on the controller, as the external-provisioner sends it for a released volume with reclaim policy Delete. */
export async function deleteVolume(driver: Driver, volumeId: string): Promise<void> {
  await call(driver.controller.deleteVolume.bind(driver.controller), csi.DeleteVolumeRequest.fromPartial({ volumeId }), T);
}

export async function unpublishAndUnstage(driver: Driver, volume: PublishedVolume): Promise<void> {
  await call(driver.node.nodeUnpublishVolume.bind(driver.node), { volumeId: volume.volumeId, targetPath: volume.targetPath }, T);
  await call(driver.node.nodeUnstageVolume.bind(driver.node), { volumeId: volume.volumeId, stagingTargetPath: volume.stagingPath }, T);
}

/** Mount points under a directory, from the kernel's table. */
export async function mountsUnder(dir: string): Promise<string[]> {
  const table = await fs.readFile("/proc/self/mountinfo", "utf8");
  return table
    .split("\n")
    .map((line) => line.split(" ")[4] ?? "")
    .filter((mountPoint) => mountPoint === dir || mountPoint.startsWith(`${dir}/`));
}

/** A shell command in another process, as an application would run it. */
export async function sh(script: string, env: Record<string, string> = {}): Promise<string> {
  const { stdout } = await run("sh", ["-c", script], { env: { ...process.env, ...env } });
  return stdout;
}

/** A TCP port nothing listens on now. */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address() as net.AddressInfo;
      server.close(() => resolve(port));
    });
  });
}

/** The git directory of the node's bare repository of a URL: the one whose origin is the URL. */
export async function nodeRepo(driver: Driver, url: string): Promise<string> {
  const repos = path.join(driver.stateDir, "repos");
  for (const name of await fs.readdir(repos)) {
    const gitDir = path.join(repos, name);
    const origin = await run("git", ["--git-dir", gitDir, "config", "remote.origin.url"]).then(
      (r) => r.stdout.trim(),
      () => "",
    );
    if (origin === url) return gitDir;
  }
  throw new Error(`the node keeps no repository of ${url}`);
}

/** The services' log lines about one volume, for a failure's message. */
export function volumeLogs(driver: Driver, volumeId: string): string {
  return driver
    .logs()
    .split("\n")
    .filter((l) => l.includes(`"volume":"${volumeId}"`) && !l.includes('"operation":"probe"'))
    .join("\n");
}

/** Asserts that a call fails with the code and a message naming every fragment; answers the error. */
export async function refused(promise: Promise<unknown>, code: status, fragments: string | RegExp | Array<string | RegExp>): Promise<CsiError> {
  let caught: CsiError | undefined;
  await assert.rejects(promise, (err: unknown) => {
    assert.ok(err instanceof CsiError, `expected a CsiError, got ${String(err)}`);
    assert.equal(status[err.code], status[code], err.message);
    for (const f of [fragments].flat()) assert.ok(typeof f === "string" ? err.message.includes(f) : f.test(err.message), `message ${JSON.stringify(err.message)} should name ${String(f)}`);
    caught = err;
    return true;
  });
  return caught!;
}

export async function waitFor<T>(what: string, probe: () => Promise<T | undefined | false>, timeoutMs = 30_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let last: unknown;
  for (;;) {
    try {
      const value = await probe();
      if (value !== undefined && value !== false) return value;
    } catch (err) {
      last = err;
    }
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}${last ? `: ${String(last)}` : ""}`);
    await sleep(100);
  }
}

/** ControllerModifyVolume: in standalone mode, this is how a class arms a volume. */
export async function modifyVolume(driver: Driver, volumeId: string, parameters: Record<string, string>): Promise<void> {
  await call(driver.controller.controllerModifyVolume.bind(driver.controller), csi.ControllerModifyVolumeRequest.fromPartial({ volumeId, mutableParameters: parameters }), T);
}

/** What the Kubernetes watch does when a claim's class changes; undefined removes it. */
export async function setVolumeClass(driver: Driver, volumeId: string, parameters: Record<string, string> | undefined, name = "e2e"): Promise<void> {
  await call(driver.owner.setVolumeClass.bind(driver.owner), { volumeId, class: parameters ? { name, parameters } : undefined }, T);
}

/** A client of the driver's git worker on its own socket, as the mount owner reaches it; the caller closes it. */
export function dialWorker(driver: Driver): InstanceType<typeof gitWorker.GitWorkerClient> {
  return dialUnix(gitWorker.GitWorkerClient, `unix://${path.join(driver.stateDir, "sockets", "git-worker.sock")}`);
}

export async function report(driver: Driver, volumeId: string): Promise<gitWorker.VolumeReport> {
  const response = await fetch(`${driver.metricsUrl}/volumes/${volumeId}`);
  if (!response.ok) throw new Error(`report of ${volumeId}: ${response.status} ${await response.text()}`);
  return (await response.json()) as gitWorker.VolumeReport;
}

export async function metricsText(driver: Driver): Promise<string> {
  return (await fetch(`${driver.metricsUrl}/metrics`)).text();
}

/** One sample's value from the Prometheus text format, for a claim. */
export function metricValue(text: string, name: string, claim: string): number | undefined {
  const line = text.split("\n").find((l) => l.startsWith(`${name}{`) && l.includes(`claim="${claim}"`));
  return line === undefined ? undefined : Number(line.slice(line.lastIndexOf(" ") + 1));
}

export function reasons(r: gitWorker.VolumeReport): string[] {
  return r.recentEvents.map((e) => e.reason);
}
