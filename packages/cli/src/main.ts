#!/usr/bin/env node
import { parseFlags, runMain, UsageError } from "@git-csi/config";
import { createLogger, logLifecycle } from "@git-csi/logging";
import { Standalone } from "./standalone";

const USAGE = `usage: git-csi <command> [flags]

commands:
  standalone   run the three services of a node with no cluster: CSI Controller and Node on one socket`;

async function main(argv: string[]): Promise<void> {
  const [command, ...rest] = argv;
  if (command === "--help" || command === "-h") {
    process.stdout.write(`${USAGE}\n`);
    return;
  }
  if (command !== "standalone") throw new UsageError(command === undefined ? USAGE : `git-csi: unknown command ${command}\n${USAGE}`);
  const flags = parseFlags(rest, "git-csi standalone", "Starts git-worker, mount-owner and csi-frontend as child processes, prints one JSON line when the CSI socket answers Probe, and stops them on SIGTERM.", [
    { name: "state-dir", help: "the node's state directory: work trees, volume records, sockets", required: true },
    { name: "endpoint", help: "CSI socket to serve, unix:///path/csi.sock", required: true },
    { name: "node-id", help: "this node's name", default: "standalone" },
    { name: "metrics-address", help: "host:port of the /metrics listener and per-volume reports (/volumes/<volume>); empty for none", default: "" },
  ]);
  const logger = createLogger("git-csi");
  const standalone = new Standalone({ stateDir: flags["state-dir"]!, endpoint: flags.endpoint!, nodeId: flags["node-id"]!, metricsAddress: flags["metrics-address"]! }, logger);
  logLifecycle(logger, () => standalone.stop());
  await standalone.start();
  process.stdout.write(`${JSON.stringify({ ready: true, endpoint: flags.endpoint, stateDir: flags["state-dir"], nodeId: flags["node-id"] })}\n`);
}

runMain("git-csi", () => main(process.argv.slice(2)));
