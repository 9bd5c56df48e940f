#!/usr/bin/env node
import type { UntypedServiceImplementation } from "@grpc/grpc-js";
import { parseFlags, runMain, UsageError } from "@git-csi/config";
import { kubeConfigIfAny } from "@git-csi/k8s";
import { createLogger, logLifecycle } from "@git-csi/logging";
import { csi, dialUnix, mountOwner, type Service, serveUnix, stopServer } from "@git-csi/protos";
import { controllerService } from "./controller";
import { identityService } from "./identity";
import { nodeService } from "./node";

const MODES = ["node", "controller", "standalone"] as const;
type Mode = (typeof MODES)[number];

async function main(): Promise<void> {
  const flags = parseFlags(
    process.argv.slice(2),
    "csi-frontend",
    "The thin, stateless CSI frontend of git.liken.sh: validates CSI calls and forwards them to the mount owner. Replacing it never touches a mount.",
    [
      { name: "endpoint", help: "CSI socket to serve, unix:///path/csi.sock", required: true },
      { name: "mount-owner", help: "the mount owner's socket, unix:///path/mount-owner.sock", required: true },
      { name: "node-id", help: "this node's name, answered by NodeGetInfo", default: process.env.NODE_NAME ?? "" },
      { name: "mode", help: `which CSI services to serve: ${MODES.join(", ")} (standalone serves Controller and Node together, for running with no cluster)`, default: "node" },
      { name: "kubeconfig", help: "kubeconfig of the API server whose PersistentVolumes the controller consults for volumes it holds no record of; empty: the pod's service account in a cluster, none outside one", default: "" },
    ],
  );
  const mode = flags.mode as Mode;
  if (!MODES.includes(mode)) throw new UsageError(`csi-frontend: --mode ${flags.mode} must be one of ${MODES.join(", ")}`);
  if (mode !== "controller" && !flags["node-id"]) throw new UsageError("csi-frontend: --node-id (or NODE_NAME) is required to serve the Node service");
  const logger = createLogger("csi-frontend");
  const owner = dialUnix(mountOwner.MountOwnerClient, flags["mount-owner"]!);
  const services: Service[] = [{ definition: csi.IdentityService, implementation: identityService(version(), owner, logger) }];
  // Methods a service does not implement answer UNIMPLEMENTED.
  const kubeConfig = mode === "node" ? undefined : await kubeConfigIfAny(flags.kubeconfig!);
  if (mode !== "node") services.push({ definition: csi.ControllerService, implementation: controllerService(owner, logger, kubeConfig) as UntypedServiceImplementation });
  if (mode !== "controller") services.push({ definition: csi.NodeService, implementation: nodeService(flags["node-id"]!, owner, logger) as UntypedServiceImplementation });
  const server = await serveUnix(flags.endpoint!, services);
  logLifecycle(logger, async () => {
    await stopServer(server);
    owner.close();
  });
  logger.info("started", { operation: "startup", endpoint: flags.endpoint, mode });
}

function version(): string {
  return (require("../../package.json") as { version: string }).version;
}

runMain("csi-frontend", main);
