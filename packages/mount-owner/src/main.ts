#!/usr/bin/env node
import { durationFlag, parseFlags, runMain, UsageError } from "@git-csi/config";
import { ClassWatch, kubeConfigIfAny } from "@git-csi/k8s";
import { createLogger, type Logger, logLifecycle } from "@git-csi/logging";
import { OperationMetrics, serveMetrics } from "@git-csi/metrics";
import { dialUnix, gitWorker, mountOwner, serveUnix, stopServer } from "@git-csi/protos";
import { mountFuse } from "./fuse/binding";
import { Handover } from "./handover";
import { fuseSource } from "./mounts";
import { createMountOwner, type MountOwner } from "./service";
import { State } from "./state";

const WORKER_WATCH_MS = 2000;

function ownerFlags(argv: string[]): Record<string, string> {
  return parseFlags(
    argv,
    "mount-owner",
    "The durable git.liken.sh service: serves each staged volume's work tree through FUSE at its staging path, bind-mounts it into publish targets, and keeps each volume's record. It outlives a replaced CSI frontend.",
    [
      { name: "state-dir", help: "directory holding the node's volume records", required: true },
      { name: "listen", help: "unix socket this service serves, unix:///path/mount-owner.sock", required: true },
      { name: "git-worker", help: "the git worker's socket, unix:///path/git-worker.sock", required: true },
      { name: "node-id", help: "this node's name", default: process.env.NODE_NAME ?? "" },
      { name: "lease-duration", help: "how long a mount epoch's claim or renewal lasts (spec 000: 90s)", default: "90s" },
      { name: "lease-renew-interval", help: "how often the mount owner renews each staged volume's lease (spec 000: 20s)", default: "20s" },
      {
        name: "fd-keeper",
        help: "unix socket path of the FUSE descriptor keeper (gitcsi-fd-keeper), which keeps every mount's connection across a restart of this process; empty: the mounts end with it",
        default: "",
      },
      { name: "metrics-address", help: "host:port serving git_csi_operations_total at /metrics; empty for none", default: "" },
      {
        name: "kubeconfig",
        help: "kubeconfig of the API server whose PersistentVolumes, claims and VolumeAttributesClasses arm the node's volumes; empty: the pod's service account in a cluster, none outside one",
        default: "",
      },
    ],
  );
}

/**
 * No CSI call carries a claim's VolumeAttributesClass to a node: the node
 * learns it from the API. None outside a cluster.
 */
async function watchClasses(owner: MountOwner, kubeconfig: string, logger: Logger): Promise<ClassWatch | undefined> {
  const kubeConfig = await kubeConfigIfAny(kubeconfig);
  if (!kubeConfig) return undefined;
  const listed = new Set<string>();
  const classWatch = new ClassWatch({
    kubeConfig,
    logger,
    onVolume: (volumeId, watched) => {
      if (watched.deleted) listed.delete(volumeId);
      else listed.add(volumeId);
      void owner.applyWatched(volumeId, { ...watched, claim: watched.claim && { namespace: watched.claim.namespace, name: watched.claim.name, uid: watched.claim.uid ?? "" } });
    },
  });
  void classWatch
    .start()
    .then(() => owner.removeVolumesDeletedWhileDown(new Set(listed)))
    .catch((err: Error) => logger.error(`the Kubernetes watch did not start: ${err.message}`, { operation: "watch_volumes" }));
  return classWatch;
}

async function main(): Promise<void> {
  const flags = ownerFlags(process.argv.slice(2));
  const durationMs = durationFlag(flags, "lease-duration");
  const renewMs = durationFlag(flags, "lease-renew-interval");
  if (renewMs * 2 > durationMs)
    throw new UsageError(`--lease-renew-interval ${flags["lease-renew-interval"]} must be at most half of --lease-duration ${flags["lease-duration"]}, so one failed renewal does not end the lease`);
  const logger = createLogger("mount-owner");
  const worker = dialUnix(gitWorker.GitWorkerClient, flags["git-worker"]!);
  const metrics = new OperationMetrics();
  const handover = flags["fd-keeper"] ? await Handover.start({ keeperSocket: flags["fd-keeper"], stateDir: flags["state-dir"]!, logger, metrics, leaseMs: durationMs }) : undefined;
  const owner = createMountOwner({
    state: new State(flags["state-dir"]!),
    nodeId: flags["node-id"]!,
    endpoints: { mountOwner: flags.listen!, gitWorker: flags["git-worker"]! },
    worker,
    logger,
    metrics,
    lease: { durationMs, renewMs },
    mountTree: async (volumeId, treePath, stagingPath, epoch) =>
      handover ? handover.mount(volumeId, treePath, stagingPath, epoch) : mountFuse({ mountpoint: stagingPath, backing: treePath, fsname: fuseSource(volumeId), epoch }),
  });
  // Before the socket serves: a stage or unstage of a resuming volume waits for its resume.
  handover?.resumeAll(owner);
  const keepTelling = handover?.keepTelling();
  const metricsServer = flags["metrics-address"] ? await serveMetrics(flags["metrics-address"], metrics) : undefined;
  const classWatch = await watchClasses(owner, flags.kubeconfig!, logger);
  const server = await serveUnix(flags.listen!, [{ definition: mountOwner.MountOwnerService, implementation: owner.service }]);
  const workerWatch = owner.watchWorker(WORKER_WATCH_MS);
  const renewals = owner.renewLeases();
  // Mounts stay when this process stops: the keeper holds their connections for the next mount owner.
  logLifecycle(logger, async () => {
    clearInterval(workerWatch);
    clearInterval(renewals);
    clearInterval(keepTelling);
    await classWatch?.stop();
    metricsServer?.close();
    await stopServer(server);
    worker.close();
    handover?.handOff();
  });
  logger.info("started", { operation: "startup", listen: flags.listen, stateDir: flags["state-dir"], node: flags["node-id"] });
}

runMain("mount-owner", main);
