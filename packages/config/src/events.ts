/** The event reasons of spec 004, "What the driver reports", posted on the pod and the claim. */
export const Reason = {
  Armed: "GitVolumeArmed",
  Unarmed: "GitVolumeUnarmed",
  Pending: "GitVolumePending",
  Pushed: "GitVolumePushed",
  PushFailed: "GitVolumePushFailed",
  FileSkipped: "GitVolumeFileSkipped",
  Rebased: "GitVolumeRebased",
  Diverged: "GitVolumeDiverged",
  Healed: "GitVolumeHealed",
  NoPublishSecret: "GitVolumeNoPublishSecret",
  UpstreamMoved: "GitVolumeUpstreamMoved",
  RefDeleted: "GitVolumeRefDeleted",
  Refused: "GitVolumeRefused",
  // Beyond spec 004's list: an ssh Secret without known_hosts, so the server's key is trusted on first sight.
  HostKeyUnverified: "GitVolumeHostKeyUnverified",
  // Beyond spec 004's list: written paths no commit could take (a full disk, a broken object store).
  CommitFailed: "GitVolumeCommitFailed",
  // Beyond spec 004's list: a write to what the driver does not serve (a Git LFS file, a submodule's directory).
  NotServed: "GitVolumeNotServed",
  // Beyond spec 004's list: commits a lost mount epoch made wait on refs/git-csi/stranded/ for the volume's next stage.
  Stranded: "GitVolumeStranded",
  // Beyond spec 004's list: the mount epoch lost the volume (superseded, or its lease ran out): the mount answers EIO until the pod is deleted.
  EpochLost: "GitVolumeEpochLost",
  // Beyond spec 004's list: a read-only volume that follows its ref serves a new commit.
  Updated: "GitVolumeUpdated",
  // Beyond spec 004's list: a following read-only volume's fetch failed; it keeps serving the last commit it fetched.
  FetchFailed: "GitVolumeFetchFailed",
} as const;

export type ReasonName = (typeof Reason)[keyof typeof Reason];

/** Kubernetes' two event types: Warning where the operator has something to look at. */
export type EventType = "Normal" | "Warning";

/** The driver's own refs on the remote and in the node's store all live under refs/git-csi/. */
export const METADATA_REF = "refs/git-csi/metadata";

/** The side branch of spec 004: `<ref>.<volumeHandle>`. */
export function sideBranchOf(branch: string, volumeId: string): string {
  return `${branch}.${volumeId}`;
}
