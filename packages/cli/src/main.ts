#!/usr/bin/env node
import { parseFlags, runMain, UsageError } from "@git-csi/config";
import { createLogger, logLifecycle } from "@git-csi/logging";
import { reportCommand } from "@git-csi/git-worker/report-command";
import { Standalone } from "./standalone";

const USAGE = `usage: git-csi <command> [flags]

commands:
  standalone   run the three services of a node with no cluster: CSI Controller and Node on one socket
  report       print one volume's report from the node's metrics listener: what it would commit, what it waits for, why it is abnormal`;

async function main(argv: string[]): Promise<void> {
  const [command, ...rest] = argv;
  if (command === "--help" || command === "-h") {
    process.stdout.write(`${USAGE}\n`);
    return;
  }
  if (command === "report") return reportCommand(rest);
  if (command !== "standalone") throw new UsageError(command === undefined ? USAGE : `git-csi: unknown command ${command}\n${USAGE}`);
  const flags = parseFlags(
    rest,
    "git-csi standalone",
    "Starts git-worker, mount-owner and csi-frontend as child processes, prints one JSON line when the CSI socket answers Probe, and stops them on SIGTERM.",
    [
      { name: "state-dir", help: "the node's state directory: work trees, volume records, sockets", required: true },
      { name: "endpoint", help: "CSI socket to serve, unix:///path/csi.sock", required: true },
      { name: "node-id", help: "this node's name", default: "standalone" },
      { name: "metrics-address", help: "host:port of the /metrics listener and per-volume reports (/volumes/<volume>); empty for none", default: "" },
      { name: "owner-metrics-address", help: "host:port of the mount owner's /metrics listener (git_csi_operations_total); empty for none", default: "" },
      { name: "lease-duration", help: "how long a mount epoch's lease lasts (spec 000)", default: "90s" },
      { name: "lease-renew-interval", help: "how often the mount owner renews it (spec 000)", default: "20s" },
      { name: "gc-interval", help: "how often the git worker collects its store and sends commits kept trees of unstaged volumes hold to stranded refs", default: "1h" },
      { name: "owner-ref-retention", help: "how long the git worker leaves a volume's owner ref on the remote once no mount epoch holds it", default: "720h" },
      { name: "kubeconfig", help: "an API server to watch (PersistentVolumes, claims, VolumeAttributesClasses) and post events to, as in a cluster; empty for none", default: "" },
      {
        name: "delete-fenced-pods",
        help: "true: once a volume's mount epoch is lost, the git worker deletes each pod on that mount that a controller owns (with --kubeconfig)",
        default: "false",
      },
    ],
  );
  const logger = createLogger("git-csi");
  const standalone = new Standalone(
    {
      stateDir: flags["state-dir"]!,
      endpoint: flags.endpoint!,
      nodeId: flags["node-id"]!,
      metricsAddress: flags["metrics-address"]!,
      ownerMetricsAddress: flags["owner-metrics-address"]!,
      leaseDuration: flags["lease-duration"]!,
      leaseRenewInterval: flags["lease-renew-interval"]!,
      gcInterval: flags["gc-interval"]!,
      ownerRefRetention: flags["owner-ref-retention"]!,
      kubeconfig: flags.kubeconfig!,
      deleteFencedPods: flags["delete-fenced-pods"]!,
    },
    logger,
  );
  logLifecycle(logger, () => standalone.stop());
  await standalone.start();
  process.stdout.write(`${JSON.stringify({ ready: true, endpoint: flags.endpoint, stateDir: flags["state-dir"], nodeId: flags["node-id"] })}\n`);
}

runMain("git-csi", () => main(process.argv.slice(2)));
