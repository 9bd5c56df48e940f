#!/usr/bin/env node
import type * as http from "node:http";
import { parseFlags, UsageError } from "@git-csi/config";
import { createLogger, logLifecycle } from "@git-csi/logging";
import { DriverMetrics, serveMetrics } from "@git-csi/metrics";
import { gitWorker, serveUnix, stopServer } from "@git-csi/protos";
import * as path from "node:path";
import { CredentialBroker } from "./broker";
import { gitWorkerService, type Syncs } from "./service";
import { Store } from "./store";

async function main(): Promise<void> {
  const flags = parseFlags(process.argv.slice(2), "git-worker", "The only git.liken.sh process that runs git: clones, fetches, commits and pushes each volume's work tree.", [
    { name: "state-dir", help: "directory holding the node's bare repositories and work trees", required: true },
    { name: "listen", help: "unix socket this worker serves, unix:///path/git-worker.sock", required: true },
    { name: "metrics-address", help: "host:port of the /metrics listener and the per-volume reports at /volumes/<volume>; empty for none", default: "" },
  ]);
  const logger = createLogger("git-worker");
  const store = new Store(flags["state-dir"]!);
  const metrics = new DriverMetrics();
  const syncs: Syncs = new Map();
  const broker = new CredentialBroker(path.join(store.socketDir(), "credentials.sock"));
  await broker.start();
  const server = await serveUnix(flags.listen!, [{ definition: gitWorker.GitWorkerService, implementation: gitWorkerService(store, syncs, broker, metrics, logger) }]);
  let listener: http.Server | undefined;
  if (flags["metrics-address"]) {
    listener = await serveMetrics(flags["metrics-address"], metrics, [
      async (url) => {
        const m = url.pathname.match(/^\/volumes(?:\/([^/]+))?$/);
        if (!m) return undefined;
        const reports = [...syncs.values()].map((s) => s.report()).filter((r) => !m[1] || r.volumeId === m[1]);
        if (m[1] && reports.length === 0) return { status: 404, body: `volume ${m[1]} is not staged on this node\n`, contentType: "text/plain" };
        return { status: 200, body: `${JSON.stringify(m[1] ? reports[0] : reports, null, 2)}\n`, contentType: "application/json" };
      },
    ]);
  }
  logLifecycle(logger, async () => {
    // Each watcher keeps a snapshot, so writes made while the worker is down are committed after it starts.
    await Promise.all([...syncs.values()].map((s) => s.stop()));
    listener?.close();
    broker.stop();
    await stopServer(server);
  });
  logger.info("started", { operation: "startup", listen: flags.listen, stateDir: flags["state-dir"], metrics: flags["metrics-address"] || undefined });
}

main().catch((err: unknown) => {
  process.stderr.write(`${err instanceof UsageError ? err.message : JSON.stringify({ level: "error", service: "git-worker", operation: "startup", message: String(err) })}\n`);
  process.exit(err instanceof UsageError ? 2 : 1);
});
