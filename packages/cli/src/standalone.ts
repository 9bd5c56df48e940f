import { type ChildProcess, spawn } from "node:child_process";
import * as fs from "node:fs/promises";
import * as path from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import type { Logger } from "@git-csi/logging";
import { call, csi, dialUnix } from "@git-csi/protos";

export interface StandaloneOptions {
  stateDir: string;
  endpoint: string;
  nodeId: string;
  /** host:port of the node plugin's /metrics listener; empty for none. */
  metricsAddress: string;
  /** host:port of the mount owner's /metrics listener (the operation counts of spec 000); empty for none. */
  ownerMetricsAddress: string;
  /** Spec 000's lease and renewal interval, as durations ("90s", "20s"). */
  leaseDuration: string;
  leaseRenewInterval: string;
  /** The git worker's --gc-interval, a duration. */
  gcInterval: string;
  /** The git worker's --owner-ref-retention, a duration. */
  ownerRefRetention: string;
  /** A kubeconfig: the services then watch and report to that API server, as in a cluster; empty for none. */
  kubeconfig: string;
  /** The git worker's --delete-fenced-pods, "true" or "false". */
  deleteFencedPods: string;
}

interface Child {
  name: string;
  /** Node runs args[0] unless a program of its own is named. */
  program?: string;
  args: string[];
  process?: ChildProcess;
}

/** The mount owner's FUSE descriptor keeper, a native program built beside its addon. */
function keeperProgram(): string {
  return path.join(path.dirname(require.resolve("@git-csi/mount-owner/package.json")), "dist", "native", "gitcsi-fd-keeper");
}

/** The executable a workspace package publishes as its bin. */
function binOf(pkg: string): string {
  const manifest = require.resolve(`@git-csi/${pkg}/package.json`);
  const bins = (require(manifest) as { bin: Record<string, string> }).bin;
  return path.join(path.dirname(manifest), Object.values(bins)[0]!);
}

const RESTART_DELAY_MS = 500;
const READY_TIMEOUT_MS = 60_000;
const STOP_GRACE_MS = 10_000;

/**
 * Runs the three services as separate processes, as the node DaemonSet's
 * containers run, and restarts one that dies, as the kubelet would: so a test
 * can kill one alone and watch the others carry on.
 */
export class Standalone {
  private readonly children: Child[];
  private stopping = false;

  constructor(
    private readonly options: StandaloneOptions,
    private readonly logger: Logger,
  ) {
    const sockets = path.join(options.stateDir, "sockets");
    const worker = `unix://${path.join(sockets, "git-worker.sock")}`;
    const owner = `unix://${path.join(sockets, "mount-owner.sock")}`;
    const keeper = path.join(sockets, "fd-keeper.sock");
    this.children = [
      // First: the mount owner hands it each mount's connection, and takes them back when it restarts.
      { name: "fd-keeper", program: keeperProgram(), args: [keeper] },
      {
        name: "git-worker",
        args: [
          binOf("git-worker"),
          "--state-dir",
          options.stateDir,
          "--listen",
          worker,
          "--mount-owner",
          owner,
          "--metrics-address",
          options.metricsAddress,
          "--node-id",
          options.nodeId,
          "--kubeconfig",
          options.kubeconfig,
          "--delete-fenced-pods",
          options.deleteFencedPods,
          "--gc-interval",
          options.gcInterval,
          "--owner-ref-retention",
          options.ownerRefRetention,
        ],
      },
      {
        name: "mount-owner",
        args: [
          binOf("mount-owner"),
          "--state-dir",
          options.stateDir,
          "--listen",
          owner,
          "--git-worker",
          worker,
          "--node-id",
          options.nodeId,
          "--metrics-address",
          options.ownerMetricsAddress,
          "--lease-duration",
          options.leaseDuration,
          "--lease-renew-interval",
          options.leaseRenewInterval,
          "--fd-keeper",
          keeper,
          "--kubeconfig",
          options.kubeconfig,
        ],
      },
      {
        name: "csi-frontend",
        args: [binOf("csi-frontend"), "--endpoint", options.endpoint, "--mount-owner", owner, "--node-id", options.nodeId, "--mode", "standalone", "--kubeconfig", options.kubeconfig],
      },
    ];
  }

  pidFile(name: string): string {
    return path.join(this.options.stateDir, "run", `${name}.pid`);
  }

  async start(): Promise<void> {
    await fs.mkdir(path.join(this.options.stateDir, "run"), { recursive: true });
    await fs.mkdir(path.join(this.options.stateDir, "sockets"), { recursive: true, mode: 0o700 });
    for (const child of this.children) await this.spawn(child);
    await this.waitReady();
  }

  private async spawn(child: Child): Promise<void> {
    const proc = spawn(child.program ?? process.execPath, child.args, { stdio: ["ignore", "inherit", "inherit"] });
    child.process = proc;
    await fs.writeFile(this.pidFile(child.name), `${proc.pid}\n`);
    this.logger.info("service started", { operation: "startup", child: child.name, pid: proc.pid });
    proc.once("exit", (code, signal) => {
      if (this.stopping) return;
      this.logger.warn("service exited; restarting it", { operation: "restart", child: child.name, code, signal });
      setTimeout(() => void this.spawn(child), RESTART_DELAY_MS);
    });
  }

  private async waitReady(): Promise<void> {
    const identity = dialUnix(csi.IdentityClient, this.options.endpoint);
    const deadline = Date.now() + READY_TIMEOUT_MS;
    try {
      for (;;) {
        const probe = await call(identity.probe.bind(identity), {}, 2000).catch(() => undefined);
        if (probe?.ready) return;
        if (Date.now() > deadline) throw new Error(`the CSI socket ${this.options.endpoint} did not answer Probe ready within ${READY_TIMEOUT_MS / 1000}s`);
        await sleep(200);
      }
    } finally {
      identity.close();
    }
  }

  /** Stops the services; mounts stay for the normal unstage path. */
  async stop(): Promise<void> {
    this.stopping = true;
    await Promise.all(this.children.map((child) => stopChild(child.process)));
  }
}

function stopChild(proc: ChildProcess | undefined): Promise<void> {
  if (!proc || proc.exitCode !== null || proc.signalCode !== null) return Promise.resolve();
  return new Promise((resolve) => {
    const timer = setTimeout(() => proc.kill("SIGKILL"), STOP_GRACE_MS);
    proc.once("exit", () => {
      clearTimeout(timer);
      resolve();
    });
    proc.kill("SIGTERM");
  });
}
