import type { Logger } from "@git-csi/logging";
import { call, csi, type gitcsi, type mountOwner, required, unary, type UnaryMethod } from "@git-csi/protos";
import { checkContextMode, requiredCapability, volumeMountGroupOf } from "./capabilities";
import { absolutePath, credentialFrom, podOf, sourceOf, volumeIdOf } from "./validate";

/** Staging clones or fetches: it may take as long as the repository needs. */
const STAGE_TIMEOUT_MS = 10 * 60_000;
const TIMEOUT_MS = 60_000;
const Rpc = csi.NodeServiceCapability_RPC_Type;
const Unit = csi.VolumeUsage_Unit;

export function nodeService(nodeId: string, owner: mountOwner.MountOwnerClient, logger: Logger): Partial<csi.NodeServer> {
  /** A node call the mount owner serves: the request checked and made the owner's, sent, and an empty reply. */
  const forward = <Req, OwnerReq, OwnerRes>(operation: string, method: UnaryMethod<OwnerReq, OwnerRes>, timeoutMs: number, toOwner: (request: Req) => OwnerReq) =>
    unary(operation, logger, async (request: Req) => {
      await call(method, toOwner(request), timeoutMs);
      return {};
    });

  return {
    nodeGetCapabilities: unary("node_get_capabilities", logger, async () => ({
      capabilities: [Rpc.STAGE_UNSTAGE_VOLUME, Rpc.SINGLE_NODE_MULTI_WRITER, Rpc.VOLUME_MOUNT_GROUP, Rpc.GET_VOLUME_STATS, Rpc.VOLUME_CONDITION].map((type) => ({ rpc: { type } })),
    })),

    nodeGetInfo: unary("node_get_info", logger, async () => ({ nodeId, maxVolumesPerNode: 0, accessibleTopology: undefined })),

    nodeStageVolume: forward("stage", owner.stageVolume.bind(owner), STAGE_TIMEOUT_MS, (request: csi.NodeStageVolumeRequest) => {
      const volumeId = volumeIdOf(request.volumeId);
      const stagingPath = absolutePath(request.stagingTargetPath, "staging_target_path");
      const accessMode = accessModeOfMount(request);
      const source = sourceOf(request.volumeContext, "volume_context", accessMode);
      return { volumeId, stagingPath, source, accessMode, ...credentialAndGroup(request) };
    }),

    nodeUnstageVolume: forward("unstage", owner.unstageVolume.bind(owner), STAGE_TIMEOUT_MS, (request: csi.NodeUnstageVolumeRequest) => ({
      volumeId: volumeIdOf(request.volumeId),
      stagingPath: absolutePath(request.stagingTargetPath, "staging_target_path"),
    })),

    nodePublishVolume: forward("publish", owner.publishVolume.bind(owner), TIMEOUT_MS, (request: csi.NodePublishVolumeRequest) => {
      const volumeId = volumeIdOf(request.volumeId);
      const targetPath = absolutePath(request.targetPath, "target_path");
      const stagingPath = absolutePath(request.stagingTargetPath, "staging_target_path");
      const accessMode = accessModeOfMount(request);
      const pod = podOf(request.volumeContext, "volume_context");
      return { volumeId, stagingPath, targetPath, readonly: request.readonly, accessMode, pod, ...credentialAndGroup(request) };
    }),

    nodeUnpublishVolume: forward("unpublish", owner.unpublishVolume.bind(owner), STAGE_TIMEOUT_MS, (request: csi.NodeUnpublishVolumeRequest) => ({
      volumeId: volumeIdOf(request.volumeId),
      targetPath: absolutePath(request.targetPath, "target_path"),
    })),

    // volume_path is only required here: a path where the volume is not, a
    // relative one included, is the mount owner's NotFound, as csi-sanity asks.
    nodeGetVolumeStats: unary("volume_stats", logger, async (request: csi.NodeGetVolumeStatsRequest) => {
      const volumeId = volumeIdOf(request.volumeId);
      const volumePath = required(request.volumePath, "volume_path");
      const stats = await call(owner.getVolumeStats.bind(owner), { volumeId, volumePath, stagingPath: request.stagingTargetPath }, TIMEOUT_MS);
      return {
        usage: [
          { unit: Unit.BYTES, ...stats.bytes! },
          { unit: Unit.INODES, ...stats.inodes! },
        ],
        volumeCondition: conditionOf(stats.abnormal),
      };
    }),
  };
}

/** The kubelet posts an abnormal condition's message on the pod as a VolumeConditionAbnormal event. */
function conditionOf(abnormal: string[]): csi.VolumeCondition {
  if (abnormal.length === 0) return { abnormal: false, message: "normal: the mount epoch holds the volume and the git worker reports nothing wrong" };
  return { abnormal: true, message: abnormal.join("; ") };
}

/** What a stage or publish carries about how it mounts. */
type MountRequest = Pick<csi.NodeStageVolumeRequest, "volumeCapability" | "volumeContext" | "secrets">;

/** The capability's access mode, which must be the one the volume was provisioned with. */
function accessModeOfMount(request: MountRequest): gitcsi.AccessMode {
  const accessMode = requiredCapability(request.volumeCapability, "volume_capability");
  checkContextMode(request.volumeContext, accessMode);
  return accessMode;
}

/** The Secret as a credential and the pod's fsGroup, each checked. */
function credentialAndGroup(request: MountRequest): { credential?: gitcsi.Credential; volumeMountGroup: string } {
  const credential = credentialFrom(request.secrets, "secrets");
  return { credential, volumeMountGroup: volumeMountGroupOf(request.volumeCapability, "volume_capability") };
}
