// Registration with the kubelet, without the node-driver-registrar sidecar:
// the kubelet's plugin watcher finds a socket in <kubelet root>/plugins_registry,
// asks it for the driver's name and CSI endpoint (GetInfo), dials that endpoint
// (NodeGetInfo, then CSINode), and reports the outcome
// (NotifyRegistrationStatus). The frontend serves that socket itself.
import type { Server } from "@grpc/grpc-js";
import type { Logger } from "@git-csi/logging";
import { pluginRegistration, serveUnix, socketPath, unary } from "@git-csi/protos";
import * as path from "node:path";
import { DRIVER_NAME } from "@git-csi/config";

/** The kubelet's CSI plugin API versions the frontend speaks. */
const SUPPORTED_VERSIONS = ["1.0.0"];

export interface Registration {
  /** Directory the kubelet watches, as this process sees it. */
  registrationDir: string;
  /** The CSI socket's path as the kubelet sees it (a host path). */
  kubeletEndpoint: string;
  /** Called once the kubelet says it refused the driver. */
  onRefused(reason: string): void;
}

/** The registration socket's path: <dir>/<driver>-reg.sock, the name the kubelet's own tooling uses. */
export function registrationSocket(registrationDir: string): string {
  return path.join(registrationDir, `${DRIVER_NAME}-reg.sock`);
}

export function registrationService(r: Registration, logger: Logger): pluginRegistration.RegistrationServer {
  const endpoint = socketPath(r.kubeletEndpoint);
  return {
    getInfo: unary("registration_info", logger, async () => ({ type: "CSIPlugin", name: DRIVER_NAME, endpoint, supportedVersions: SUPPORTED_VERSIONS })),
    notifyRegistrationStatus: unary("registration_status", logger, async (status) => {
      if (status.pluginRegistered) logger.info("registered with the kubelet", { operation: "registration", endpoint });
      else {
        logger.error("the kubelet refused the driver", { operation: "registration", endpoint, reason: status.error });
        r.onRefused(status.error);
      }
      return {};
    }),
  };
}

/** Serves the registration socket; the kubelet registers the driver within a second or so. */
export function serveRegistration(r: Registration, logger: Logger): Promise<Server> {
  return serveUnix(registrationSocket(r.registrationDir), [{ definition: pluginRegistration.RegistrationService, implementation: registrationService(r, logger) }]);
}
