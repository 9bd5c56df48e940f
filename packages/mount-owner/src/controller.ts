import { type gitcsi, type mountOwner, required } from "@git-csi/protos";
import type { Owner } from "./context";

/** CreateVolume: the controller's record of the volume; the same request again answers the same volume. */
export async function createVolume(owner: Owner, request: mountOwner.CreateVolumeRequest): Promise<mountOwner.CreateVolumeResponse> {
  const name = required(request.name, "name");
  const wanted: mountOwner.Volume = {
    volumeId: name,
    name,
    capacityBytes: request.capacityBytes,
    source: required(request.source, "parameters"),
    accessMode: request.accessMode,
    classParameters: request.classParameters,
  };
  return owner.perVolume.run(name, async () => {
    const { volume, created } = await owner.state.createVolume(wanted);
    if (created) owner.logger.info("volume created", { volume: name, operation: "create_volume" });
    return { volume };
  });
}

/** A provisioned volume deleted with reclaim policy Delete: this node's tree goes too. The remote never does. */
export async function deleteVolume(owner: Owner, volumeId: string): Promise<void> {
  // The deletion is durable first: a git worker that does not answer now removes the tree when it does.
  if (await owner.state.recordDeleted(volumeId)) await owner.link.removeDeletedTree(volumeId);
}

/** ControllerModifyVolume: parameters a request does not name keep their values, as CSI asks. */
export async function modifyVolume(owner: Owner, request: mountOwner.ModifyVolumeRequest, volumeId: string): Promise<mountOwner.ModifyVolumeResponse> {
  const volume = await owner.state.knownVolume(volumeId);
  const classParameters = { ...volume.classParameters, ...request.classParameters };
  await setVolumeClass(owner, volumeId, { name: "", parameters: classParameters });
  await owner.state.recordProvisionedClass(volumeId, classParameters);
  owner.logger.info("class applied", { volume: volumeId, operation: "modify_volume" });
  return {};
}

/** Records the class on the node volume and arms or unarms a staged one at once. */
export async function setVolumeClass(owner: Owner, volumeId: string, volumeClass: gitcsi.VolumeClass | undefined, claim?: gitcsi.Claim): Promise<void> {
  if (owner.sessions.has(volumeId)) await owner.link.setClass(volumeId, volumeClass, claim);
  await owner.state.recordClass(volumeId, volumeClass, claim);
}
