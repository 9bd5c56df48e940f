#!/usr/bin/env node
import { parseFlags, runMain } from "@git-csi/config";
import { createLogger, logLifecycle } from "@git-csi/logging";
import { dialUnix, gitWorker, mountOwner, serveUnix, stopServer } from "@git-csi/protos";
import { fuseNative } from "./fuse/fuse-native";
import { createPassthrough } from "./fuse/passthrough";
import { createMountOwner } from "./service";
import { State } from "./state";

const WORKER_WATCH_MS = 2000;

async function main(): Promise<void> {
  const flags = parseFlags(
    process.argv.slice(2),
    "mount-owner",
    "The durable git.liken.sh service: serves each staged volume's work tree through FUSE at its staging path, bind-mounts it into publish targets, and keeps each volume's record. It outlives a replaced CSI frontend.",
    [
      { name: "state-dir", help: "directory holding the node's volume records", required: true },
      { name: "listen", help: "unix socket this service serves, unix:///path/mount-owner.sock", required: true },
      { name: "git-worker", help: "the git worker's socket, unix:///path/git-worker.sock", required: true },
      { name: "node-id", help: "this node's name", default: process.env.NODE_NAME ?? "" },
    ],
  );
  const logger = createLogger("mount-owner");
  const worker = dialUnix(gitWorker.GitWorkerClient, flags["git-worker"]!);
  const owner = createMountOwner({
    state: new State(flags["state-dir"]!),
    nodeId: flags["node-id"]!,
    endpoints: { mountOwner: flags.listen!, gitWorker: flags["git-worker"]! },
    worker,
    logger,
    mountTree: (volumeId, treePath, stagingPath) => fuseNative.mount({ mountpoint: stagingPath, fsname: `git-csi:${volumeId}`, ops: createPassthrough(treePath) }),
  });
  const server = await serveUnix(flags.listen!, [{ definition: mountOwner.MountOwnerService, implementation: owner.service }]);
  const workerWatch = owner.watchWorker(WORKER_WATCH_MS);
  // Mounts stay when this process stops: the normal unpublish and unstage path recovers them.
  logLifecycle(logger, async () => {
    clearInterval(workerWatch);
    await stopServer(server);
    worker.close();
  });
  logger.info("started", { operation: "startup", listen: flags.listen, stateDir: flags["state-dir"], node: flags["node-id"] });
}

runMain("mount-owner", main);
