import * as http from "node:http";
import { Counter, Gauge, Registry } from "prom-client";

/** The labels of every per-volume metric: the claim the volume serves (spec 004). */
export interface ClaimLabels {
  namespace: string;
  claim: string;
}

const LABELS = ["namespace", "claim"] as const;

/** The metrics of spec 004, by exactly its names, and the bounded operation label of spec 000. */
export class DriverMetrics {
  readonly registry = new Registry();
  readonly abnormal = new Gauge({ name: "git_csi_volume_abnormal", help: "1 while anything is wrong with the volume; its report says what", labelNames: LABELS, registers: [this.registry] });
  readonly armed = new Gauge({ name: "git_csi_armed", help: "1 while a class arms the volume: it commits and pushes", labelNames: LABELS, registers: [this.registry] });
  readonly pendingPaths = new Gauge({ name: "git_csi_pending_paths", help: "Changed paths waiting for a commit", labelNames: LABELS, registers: [this.registry] });
  readonly unpushedCommits = new Gauge({ name: "git_csi_unpushed_commits", help: "Commits the remote does not hold yet", labelNames: LABELS, registers: [this.registry] });
  readonly lastPush = new Gauge({ name: "git_csi_last_push_timestamp_seconds", help: "When the volume last pushed", labelNames: LABELS, registers: [this.registry] });
  readonly pushFailures = new Counter({ name: "git_csi_push_failures_total", help: "Pushes that failed", labelNames: LABELS, registers: [this.registry] });
  readonly skippedFiles = new Gauge({ name: "git_csi_skipped_files", help: "Files over commit.maxFileSize that are not committed", labelNames: LABELS, registers: [this.registry] });
  readonly diverged = new Gauge({ name: "git_csi_diverged", help: "1 while the volume pushes to its side branch", labelNames: LABELS, registers: [this.registry] });
  /** One series per read-only volume: the commit label moves with each commit it serves. */
  readonly servedCommit = new Gauge({ name: "git_csi_served_commit", help: "1, labeled by the commit a read-only volume serves", labelNames: [...LABELS, "commit"], registers: [this.registry] });

  /** Drops a volume's series when it leaves the node, so the registry does not grow with every claim ever served. */
  forget(labels: ClaimLabels): void {
    for (const metric of [this.abnormal, this.armed, this.pendingPaths, this.unpushedCommits, this.lastPush, this.pushFailures, this.skippedFiles, this.diverged]) metric.remove(labels);
  }
}

/**
 * The bounded operation label of spec 000: the mount owner's fallbacks and
 * refusals, counted by a fixed set of names so the series never grow.
 */
const OPERATIONS = ["mount_release_deferred", "stale_epoch_refused", "mount_renewal_failed", "fuse_resumed", "fuse_resume_epoch_lost"] as const;
export type Operation = (typeof OPERATIONS)[number];

export class OperationMetrics {
  readonly registry = new Registry();
  private readonly operations = new Counter({
    name: "git_csi_operations_total",
    help: "Mount owner operations by kind: mount_release_deferred (an unstage left the lease to run out), stale_epoch_refused (a read or write of a mount whose epoch no longer holds the volume), mount_renewal_failed (a volume's renew_mount that failed; the mount serves until its lease ends), fuse_resumed (a FUSE connection kept across a mount owner restart serves again), fuse_resume_epoch_lost (one whose epoch was lost meanwhile serves only EIO)",
    labelNames: ["operation"],
    registers: [this.registry],
  });

  constructor() {
    for (const operation of OPERATIONS) this.operations.inc({ operation }, 0);
  }

  count(operation: Operation): void {
    this.operations.inc({ operation });
  }
}

export type Route = (url: URL) => Promise<{ status: number; body: string; contentType: string } | undefined>;

/** The node plugin's /metrics listener, with extra JSON routes such as the per-volume report. */
export function serveMetrics(address: string, metrics: { registry: Registry }, routes: Route[] = []): Promise<http.Server> {
  const [host, port] = address.includes(":") ? [address.slice(0, address.lastIndexOf(":")), Number(address.slice(address.lastIndexOf(":") + 1))] : ["0.0.0.0", Number(address)];
  const server = http.createServer((req, res) => {
    const url = new URL(req.url ?? "/", "http://localhost");
    const respond = async () => {
      if (url.pathname === "/metrics") return { status: 200, body: await metrics.registry.metrics(), contentType: metrics.registry.contentType };
      for (const route of routes) {
        const answer = await route(url);
        if (answer) return answer;
      }
      return { status: 404, body: "not found\n", contentType: "text/plain" };
    };
    respond().then(
      (a) => res.writeHead(a.status, { "content-type": a.contentType }).end(a.body),
      (err: unknown) => res.writeHead(500, { "content-type": "text/plain" }).end(`${String(err)}\n`),
    );
  });
  return new Promise((resolve, reject) => {
    server.once("error", reject);
    server.listen(port, host || undefined, () => resolve(server));
  });
}
