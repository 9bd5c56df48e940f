import { DRIVER_NAME } from "@git-csi/config";
import type { Logger } from "@git-csi/logging";
import { call, csi, type mountOwner, unary } from "@git-csi/protos";

export function identityService(version: string, owner: mountOwner.MountOwnerClient, logger: Logger): csi.IdentityServer {
  return {
    getPluginInfo: unary("get_plugin_info", logger, async () => ({ name: DRIVER_NAME, vendorVersion: version, manifest: {} })),
    getPluginCapabilities: unary("get_plugin_capabilities", logger, async () => ({
      capabilities: [{ service: { type: csi.PluginCapability_Service_Type.CONTROLLER_SERVICE } }],
    })),
    probe: unary("probe", logger, async () => ({ ready: (await probeOwner(owner, logger)).ready })),
  };
}

/** Ready only when the mount owner answers, and it answers ready only when the git worker does. */
export async function probeOwner(owner: mountOwner.MountOwnerClient, logger: Logger): Promise<{ ready: boolean; message: string }> {
  const answer = await call(owner.probe.bind(owner), {}, 5000).catch((err: Error) => ({ ready: false, message: `mount owner does not answer: ${err.message}`, instance: "" }));
  if (!answer.ready) logger.warn("not ready", { operation: "probe", reason: answer.message });
  return answer;
}
