import { gitcsi, type mountOwner, required } from "@git-csi/protos";
import type { Owner } from "./context";
import { setReaderClass } from "./reader";
import { branchStartOf } from "./snapshots";

/**
 * CreateVolume: the volume's branch on the remote, then the controller's
 * record. The same request again answers the same volume; another one under
 * the name is refused before the remote is touched. A clone of a volume a
 * node holds and has not flushed for makes nothing: held_by names the node.
 */
export async function createVolume(owner: Owner, request: mountOwner.CreateVolumeRequest): Promise<mountOwner.CreateVolumeResponse> {
  const name = required(request.name, "name");
  const wanted: mountOwner.Volume = {
    volumeId: name,
    name,
    capacityBytes: request.capacityBytes,
    source: required(request.source, "parameters"),
    accessMode: request.accessMode,
    classParameters: request.classParameters,
    baseRef: request.baseRef,
    onDelete: request.onDelete,
    contentSource: request.contentSource,
  };
  return owner.perVolume.run(name, async () => {
    // A retry of a volume made already answers without the remote: the branch was made before the record.
    const existing = await owner.state.checkCreatable(wanted);
    if (existing) return { volume: existing, heldBy: "" };
    const start = request.contentSource && (await branchStartOf(owner, wanted, request.contentSource));
    const branch = request.makeBranch || start ? await owner.link.provisionBranch(wanted, request.credential, start) : undefined;
    if (branch?.heldBy) return { volume: undefined, heldBy: branch.heldBy };
    const { volume } = await owner.state.createVolume(wanted);
    owner.logger.info(`volume created on ${branch?.created ? "a new" : "the"} branch ${wanted.source!.ref}`, { volume: name, operation: "create_volume" });
    return { volume, heldBy: "" };
  });
}

/**
 * A provisioned volume deleted with reclaim policy Delete: its branch goes as
 * the class's onDelete says, then the record, then this node's tree. The
 * remote repository never goes. A branch that could not be retired keeps the
 * record, so the provisioner's retry does it again.
 */
export async function deleteVolume(owner: Owner, volumeId: string, credential?: gitcsi.Credential): Promise<void> {
  const provisioned = await owner.state.provisionedVolume(volumeId);
  if (provisioned && provisioned.onDelete !== gitcsi.OnDelete.ON_DELETE_KEEP) await owner.link.retireBranch(provisioned, credential);
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
  setReaderClass(owner, volumeId, volumeClass);
  await owner.state.recordClass(volumeId, volumeClass, claim);
}
