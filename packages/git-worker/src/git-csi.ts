#!/usr/bin/env node
// `git-csi` in the git worker's image, where `kubectl exec … -c git-worker --
// git-csi report <volume>` reads the node plugin's own listener. `git-csi
// standalone` starts all three services and runs from the repository
// (packages/cli), so this one has `report` alone.
import { runMain, UsageError } from "@git-csi/config";
import { reportCommand } from "./report-command";

const USAGE = `usage: git-csi report <volume> [--metrics-address host:port] [--json]

This is the git worker image's git-csi: 'git-csi standalone' runs from the repository.`;

runMain("git-csi", async () => {
  const [command, ...rest] = process.argv.slice(2);
  if (command === "report") return reportCommand(rest);
  if (command === "--help" || command === "-h") return void process.stdout.write(`${USAGE}\n`);
  throw new UsageError(command === undefined ? USAGE : `git-csi: unknown command ${command}\n${USAGE}`);
});
