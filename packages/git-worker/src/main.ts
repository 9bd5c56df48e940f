#!/usr/bin/env node
import { parseFlags, UsageError } from "@git-csi/config";
import { createLogger, logLifecycle } from "@git-csi/logging";
import { gitWorker, serveUnix, stopServer } from "@git-csi/protos";
import { gitWorkerService } from "./service";
import { Store } from "./store";

async function main(): Promise<void> {
  const flags = parseFlags(process.argv.slice(2), "git-worker", "The only git.liken.sh process that runs git: clones, fetches, commits and pushes each volume's work tree.", [
    { name: "state-dir", help: "directory holding the node's bare repositories and work trees", required: true },
    { name: "listen", help: "unix socket this worker serves, unix:///path/git-worker.sock", required: true },
  ]);
  const logger = createLogger("git-worker");
  const store = new Store(flags["state-dir"]!);
  const server = await serveUnix(flags.listen!, [{ definition: gitWorker.GitWorkerService, implementation: gitWorkerService(store, logger) }]);
  logLifecycle(logger, () => stopServer(server));
  logger.info("started", { operation: "startup", listen: flags.listen, stateDir: flags["state-dir"] });
}

main().catch((err: unknown) => {
  process.stderr.write(`${err instanceof UsageError ? err.message : JSON.stringify({ level: "error", service: "git-worker", operation: "startup", message: String(err) })}\n`);
  process.exit(err instanceof UsageError ? 2 : 1);
});
