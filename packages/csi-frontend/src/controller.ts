import { findPersistentVolume, type KubeConfig } from "@git-csi/k8s";
import type { Logger } from "@git-csi/logging";
import { status } from "@grpc/grpc-js";
import { type BranchPlan, branchPlanOf, namesClaim, ProvisionError, REF_VARIABLES } from "@git-csi/config";
import { call, CsiError, csi, describeAccessMode, gitcsi, invalidArgument, isReader, type mountOwner, required, unary, unavailable } from "@git-csi/protos";
import { ACCESS_MODE_KEY, accessModeOf, accessModeOfAll, accessModeOfPersistentVolume, capabilityOf } from "./capabilities";
import { askFlush, servedFlush, snapshotMethods } from "./snapshots";
import { checkClassParameters, credentialFrom, sourceOf, volumeIdOf } from "./validate";

const TIMEOUT_MS = 30_000;
/** Parameters the external-provisioner adds on its own; they are not the user's to validate. */
const PROVISIONER_PREFIX = "csi.storage.k8s.io/";

/** A volume the controller knows: by its record, or only by its PersistentVolume. */
interface KnownVolume {
  accessMode: gitcsi.AccessMode;
  recorded: boolean;
}

/**
 * kubeConfig: in a cluster, a volume the controller holds no record of still
 * exists when a PersistentVolume of the driver names it: a static volume, or
 * one whose record went with the controller pod's state.
 */
export function controllerService(owner: mountOwner.MountOwnerClient, logger: Logger, kubeConfig?: KubeConfig): Partial<csi.ControllerServer> {
  const getVolume = async (volumeId: string): Promise<KnownVolume> => {
    try {
      const { volume } = await call(owner.getVolume.bind(owner), { volumeId }, TIMEOUT_MS);
      return { accessMode: volume!.accessMode, recorded: true };
    } catch (err) {
      if (!kubeConfig || !(err instanceof CsiError) || err.code !== status.NOT_FOUND) throw err;
      const pv = await findPersistentVolume(kubeConfig, volumeId).catch((e: Error) => {
        throw unavailable(`volume ${volumeId} has no controller record, and the API server did not answer whether a PersistentVolume names it: ${e.message}`);
      });
      if (!pv) throw err;
      return { accessMode: accessModeOfPersistentVolume(pv.accessModes), recorded: false };
    }
  };

  return {
    controllerGetCapabilities: unary("controller_get_capabilities", logger, async () => ({
      capabilities: [
        csi.ControllerServiceCapability_RPC_Type.CREATE_DELETE_VOLUME,
        csi.ControllerServiceCapability_RPC_Type.MODIFY_VOLUME,
        csi.ControllerServiceCapability_RPC_Type.SINGLE_NODE_MULTI_WRITER,
        csi.ControllerServiceCapability_RPC_Type.CREATE_DELETE_SNAPSHOT,
        csi.ControllerServiceCapability_RPC_Type.LIST_SNAPSHOTS,
        csi.ControllerServiceCapability_RPC_Type.CLONE_VOLUME,
      ].map((type) => ({ rpc: { type } })),
    })),

    createVolume: unary("create_volume", logger, async (request: csi.CreateVolumeRequest) => {
      const wanted = createRequestOf(request);
      const { volume, heldBy } = await call(owner.createVolume.bind(owner), wanted, TIMEOUT_MS);
      const cloned = wanted.contentSource?.volumeId ?? "";
      if (heldBy !== "") {
        await askFlush(kubeConfig, cloned, wanted.name, heldBy);
        throw unavailable(`volume_content_source.volume ${cloned}: the clone waits until node ${heldBy}, which serves the volume, has pushed its writes; the provisioner retries`);
      }
      if (cloned !== "") await servedFlush(kubeConfig, cloned, wanted.name, logger, { volume: wanted.name, operation: "create_volume" });
      return {
        volume: {
          volumeId: volume!.volumeId,
          capacityBytes: volume!.capacityBytes,
          volumeContext: { url: wanted.source!.url, ref: wanted.source!.ref, [ACCESS_MODE_KEY]: describeAccessMode(wanted.accessMode) },
          contentSource: request.volumeContentSource,
          accessibleTopology: [],
        },
      };
    }),

    // The remote repository is never deleted: the controller's record goes, and the branch as the class's onDelete says.
    deleteVolume: unary("delete_volume", logger, async (request: csi.DeleteVolumeRequest) => {
      // The id names files under the node's state directory: "../x" would name another volume's.
      const volumeId = volumeIdOf(request.volumeId);
      const credential = credentialFrom(request.secrets, "secrets");
      await call(owner.deleteVolume.bind(owner), { volumeId, credential }, TIMEOUT_MS);
      return {};
    }),

    validateVolumeCapabilities: unary("validate_volume_capabilities", logger, async (request: csi.ValidateVolumeCapabilitiesRequest) => {
      const volumeId = volumeIdOf(request.volumeId);
      if (request.volumeCapabilities.length === 0) throw invalidArgument("volume_capabilities is required");
      const volume = await getVolume(volumeId);
      const problems = capabilityProblems(request.volumeCapabilities, volume.accessMode);
      if (problems.length > 0) return { confirmed: undefined, message: problems.join("; ") };
      return {
        confirmed: { volumeContext: request.volumeContext, volumeCapabilities: [capabilityOf(volume.accessMode)], parameters: request.parameters, mutableParameters: request.mutableParameters },
        message: "",
      };
    }),

    ...snapshotMethods(owner, logger, kubeConfig),

    controllerModifyVolume: unary("controller_modify_volume", logger, async (request: csi.ControllerModifyVolumeRequest) => {
      const volumeId = volumeIdOf(request.volumeId);
      checkClassParameters(request.mutableParameters, "mutable_parameters");
      const volume = await getVolume(volumeId);
      // Without a record there is nothing to keep: the nodes learn the claim's class from the API.
      if (volume.recorded) await call(owner.modifyVolume.bind(owner), { volumeId, classParameters: request.mutableParameters }, TIMEOUT_MS);
      return {};
    }),
  };
}

/** CreateVolume's request as the mount owner's, each field checked: a bad one is InvalidArgument naming it. */
function createRequestOf(request: csi.CreateVolumeRequest): mountOwner.CreateVolumeRequest {
  const name = volumeIdOf(request.name, "name");
  const accessMode = accessModeOfAll(request.volumeCapabilities, "volume_capabilities");
  const userParameters = Object.fromEntries(Object.entries(request.parameters).filter(([k]) => !k.startsWith(PROVISIONER_PREFIX)));
  const unknown = Object.keys(userParameters).filter((k) => !STORAGE_CLASS_PARAMETERS.includes(k));
  if (unknown.length > 0) {
    throw invalidArgument(`parameters ${unknown.join(", ")}: a StorageClass takes only ${STORAGE_CLASS_PARAMETERS.join(", ")}; commit and push policy belongs in a VolumeAttributesClass`);
  }
  // The external-provisioner names the PersistentVolume as it names CreateVolume: ${pv.metadata.name} needs no --extra-create-metadata.
  const plan = planOf({ [REF_VARIABLES["pv.metadata.name"]!]: name, ...request.parameters }, isReader(accessMode));
  const contentSource = contentSourceOf(request.volumeContentSource, request.parameters.ref!);
  const source = sourceOf({ url: required(userParameters.url, "parameters.url"), ref: plan.ref }, "parameters", accessMode);
  const credential = credentialFrom(request.secrets, "secrets");
  checkClassParameters(request.mutableParameters, "mutable_parameters");
  return {
    name,
    capacityBytes: capacityOf(request.capacityRange),
    source,
    accessMode,
    classParameters: request.mutableParameters,
    baseRef: plan.baseRef,
    onDelete: ON_DELETE[plan.onDelete],
    credential,
    makeBranch: plan.makesBranch,
    contentSource,
  };
}

/** A restore or a clone: a new branch per claim at the source's commit; a shared ref cannot take one. */
function contentSourceOf(source: csi.VolumeContentSource | undefined, template: string): mountOwner.ContentSource | undefined {
  if (!source) return undefined;
  if (!namesClaim(template)) {
    throw invalidArgument(
      `volume_content_source: a restore or a clone makes a branch of its own, so parameters.ref must hold \${pvc.metadata.name} or \${pv.metadata.name}; ${JSON.stringify(template)} names a branch several claims share`,
    );
  }
  if (source.snapshot) return { snapshotId: volumeIdOf(source.snapshot.snapshotId, "volume_content_source.snapshot.snapshot_id"), volumeId: "" };
  if (source.volume) return { snapshotId: "", volumeId: volumeIdOf(source.volume.volumeId, "volume_content_source.volume.volume_id") };
  throw invalidArgument("volume_content_source names neither a snapshot nor a volume");
}

/** The capacity a range asks for; a git volume has no size of its own, so any sane range is taken. */
function capacityOf(range: csi.CapacityRange | undefined): number {
  if (range && (range.requiredBytes < 0 || range.limitBytes < 0)) throw invalidArgument("capacity_range: required_bytes and limit_bytes must not be negative");
  if (range && range.limitBytes > 0 && range.requiredBytes > range.limitBytes) {
    throw invalidArgument(`capacity_range.required_bytes ${range.requiredBytes} exceeds limit_bytes ${range.limitBytes}`);
  }
  return range?.requiredBytes || range?.limitBytes || 0;
}

const STORAGE_CLASS_PARAMETERS = ["url", "ref", "baseRef", "onDelete"];
const ON_DELETE = { keep: gitcsi.OnDelete.ON_DELETE_KEEP, archive: gitcsi.OnDelete.ON_DELETE_ARCHIVE, delete: gitcsi.OnDelete.ON_DELETE_DELETE };

/** The branch the parameters ask for, its template rendered: a bad one is InvalidArgument naming the field. */
function planOf(parameters: Record<string, string>, reader: boolean): BranchPlan {
  required(parameters.ref, "parameters.ref");
  try {
    return branchPlanOf(parameters, reader);
  } catch (err) {
    if (err instanceof ProvisionError) throw invalidArgument(err.message);
    throw err;
  }
}

/** Why each capability the volume cannot serve is refused; none when it serves them all. */
function capabilityProblems(capabilities: csi.VolumeCapability[], accessMode: gitcsi.AccessMode): string[] {
  const problems: string[] = [];
  capabilities.forEach((capability, i) => {
    try {
      const mode = accessModeOf(capability, `volume_capabilities[${i}]`);
      if (mode !== accessMode) problems.push(`volume_capabilities[${i}] asks for ${describeAccessMode(mode)}, the volume is ${describeAccessMode(accessMode)}`);
    } catch (err) {
      problems.push((err as Error).message);
    }
  });
  return problems;
}
