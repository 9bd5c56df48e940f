#!/usr/bin/env node
import * as fs from "node:fs/promises";
import * as path from "node:path";
import type { Server, UntypedServiceImplementation } from "@grpc/grpc-js";
import { parseFlags, runMain, UsageError } from "@git-csi/config";
import { kubeConfigIfAny } from "@git-csi/k8s";
import { createLogger, logLifecycle } from "@git-csi/logging";
import { csi, dialUnix, mountOwner, type Service, serveUnix, stopServer } from "@git-csi/protos";
import { controllerService } from "./controller";
import { identityService } from "./identity";
import { serveHealth } from "./health";
import { nodeService } from "./node";
import { type Registration, registrationSocket, serveRegistration } from "./registration";

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
      {
        name: "registration-dir",
        help: "register with the kubelet by serving its plugin registration API in this directory (<kubelet root>/plugins_registry as mounted here); empty: a node-driver-registrar sidecar registers the driver",
        default: "",
      },
      { name: "kubelet-registration-path", help: "the CSI socket's path on the node, as the kubelet dials it; required with --registration-dir", default: "" },
      { name: "health-address", help: "serve GET /healthz (200 when CSI Probe is ready) on host:port, for the kubelet's liveness probe; empty: a livenessprobe sidecar does", default: "" },
      {
        name: "kubeconfig",
        help: "kubeconfig of the API server whose PersistentVolumes the controller consults for volumes it holds no record of; empty: the pod's service account in a cluster, none outside one",
        default: "",
      },
    ],
  );
  const mode = flags.mode as Mode;
  if (!MODES.includes(mode)) throw new UsageError(`csi-frontend: --mode ${flags.mode} must be one of ${MODES.join(", ")}`);
  if (mode !== "controller" && !flags["node-id"]) throw new UsageError("csi-frontend: --node-id (or NODE_NAME) is required to serve the Node service");
  const registration = registrationFlags(flags, mode);
  if (flags["health-address"] && !/^[^:]*:([1-9]\d{0,4})$/.test(flags["health-address"])) {
    throw new UsageError(`csi-frontend: --health-address ${flags["health-address"]} must be host:port, such as 0.0.0.0:9808`);
  }
  const logger = createLogger("csi-frontend");
  const owner = dialUnix(mountOwner.MountOwnerClient, flags["mount-owner"]!);
  const services: Service[] = [{ definition: csi.IdentityService, implementation: identityService(version(), owner, logger) }];
  // Methods a service does not implement answer UNIMPLEMENTED.
  const kubeConfig = mode === "node" ? undefined : await kubeConfigIfAny(flags.kubeconfig!);
  if (mode !== "node") services.push({ definition: csi.ControllerService, implementation: controllerService(owner, logger, kubeConfig) as UntypedServiceImplementation });
  if (mode !== "controller") services.push({ definition: csi.NodeService, implementation: nodeService(flags["node-id"]!, owner, logger) as UntypedServiceImplementation });
  // The external-resizer asks the controller's socket for the Node capabilities
  // (does the driver expand volumes on nodes?) and will not start on UNIMPLEMENTED.
  else services.push({ definition: csi.NodeService, implementation: { nodeGetCapabilities: nodeService("", owner, logger).nodeGetCapabilities } as UntypedServiceImplementation });
  const server = await serveUnix(flags.endpoint!, services);
  let registrar: Server | undefined;
  const health = flags["health-address"] ? await serveHealth(flags["health-address"], owner, logger) : undefined;
  const stop = async () => {
    health?.close();
    // Without its socket the kubelet unregisters the driver: an uninstalled driver leaves no stale registration.
    if (registrar) await stopServer(registrar).then(() => fs.rm(registrationSocket(registration!.registrationDir), { force: true }));
    await stopServer(server);
    owner.close();
  };
  // Registered last, once the CSI socket the kubelet dials next answers. A
  // refusal ends the process: the kubelet restarts it and sees a new socket.
  if (registration) registrar = await serveRegistration({ ...registration, onRefused: () => void stop().finally(() => process.exit(1)) }, logger);
  logLifecycle(logger, stop);
  logger.info("started", { operation: "startup", endpoint: flags.endpoint, mode });
}

function registrationFlags(flags: Record<string, string | undefined>, mode: Mode): Omit<Registration, "onRefused"> | undefined {
  const registrationDir = flags["registration-dir"]!;
  const kubeletEndpoint = flags["kubelet-registration-path"]!;
  if (!registrationDir && !kubeletEndpoint) return undefined;
  if (mode === "controller") throw new UsageError("csi-frontend: --registration-dir registers the Node service, which --mode controller does not serve");
  if (!registrationDir || !kubeletEndpoint) throw new UsageError("csi-frontend: --registration-dir and --kubelet-registration-path go together");
  if (!path.isAbsolute(kubeletEndpoint.replace(/^unix:(\/\/)?/, ""))) throw new UsageError(`csi-frontend: --kubelet-registration-path ${kubeletEndpoint} must be an absolute path`);
  return { registrationDir, kubeletEndpoint };
}

function version(): string {
  return (require("../../package.json") as { version: string }).version;
}

runMain("csi-frontend", main);
