import { Reason } from "@git-csi/config";
import { failedPrecondition } from "@git-csi/protos";
import { fingerprint } from "./credential";
import type { VolumeReporter } from "../report";
import type { VolumeState } from "../sync/volume";

/**
 * The volume's credential as its publishes bring it, spec 004 "The
 * credential": the Secret is held in memory only, a new one is a rotation,
 * and a publish whose Secret differs from the stage's is refused.
 */
export class VolumeCredential {
  private publishFingerprint = "";
  /** Until a publish passes, every publish is the first. */
  private published: boolean;

  constructor(
    private readonly s: VolumeState,
    private readonly reporter: VolumeReporter,
    /** Commits and pushes now: a new credential pushes what the remote lacks at once. */
    private readonly syncNow: (trigger: string) => Promise<unknown>,
  ) {
    this.published = s.ctx.published;
  }

  /**
   * A publish's Secret. The kubelet reads the Secret again for each publish,
   * so a new one is a rotation and pushes what the remote lacks at once; but
   * at the first publish after the stage, a Secret other than the stage's
   * means two credentials for one volume, and the publish is refused.
   */
  async set(data: Record<string, string>): Promise<void> {
    const offered = fingerprint(data);
    this.refuseSecondCredential(offered);
    this.published = true;
    if (offered === "") {
      this.warnIfNoPublishSecret();
      return;
    }
    const ctx = this.s.ctx;
    if (offered === this.publishFingerprint || (this.publishFingerprint === "" && offered === ctx.stageFingerprint && this.s.access.hasCredential)) {
      this.publishFingerprint = offered;
      return;
    }
    const next = await ctx.openAccess(data);
    const previous = this.s.access;
    this.s.access = next;
    this.publishFingerprint = offered;
    previous.close();
    this.warnIfHostKeyUnverified();
    this.s.log("info", "a publish brought a new credential; pushing what the remote lacks now", "credential");
    // A restarted worker claims the epoch's lease with the first Secret it gets.
    if (!this.s.lease.claimed) await this.s.lease.claim((operation) => this.s.remote(operation));
    if (this.s.policy) await this.syncNow("a new credential");
    else this.reporter.publishMetrics();
  }

  /** The kubelet's retry of a refused first publish is refused too: nothing changes before this passes. */
  private refuseSecondCredential(offered: string): void {
    const ctx = this.s.ctx;
    if (this.published || ctx.stageFingerprint === "" || offered === "" || offered === ctx.stageFingerprint) return;
    this.reporter.emit(
      Reason.Refused,
      "Warning",
      "the publish Secret differs from the stage Secret: the driver cannot choose between two credentials for one volume; name one Secret in both nodeStageSecretRef and nodePublishSecretRef",
    );
    throw failedPrecondition(`volume ${ctx.volumeId}: the publish Secret differs from the stage Secret; name one Secret in both nodeStageSecretRef and nodePublishSecretRef`);
  }

  private warnIfNoPublishSecret(): void {
    if (this.s.ctx.stageFingerprint === "" && !this.s.ctx.credentialExpected) return;
    this.reporter.emit(
      Reason.NoPublishSecret,
      "Warning",
      "the PersistentVolume has a nodeStageSecretRef but no nodePublishSecretRef: after a driver restart the volume pushes nothing until the pod is deleted and started again. Give the volume a new PersistentVolume with both references, before the next driver upgrade",
    );
  }

  warnIfHostKeyUnverified(): void {
    if (this.s.access.hostKeyVerified) return;
    this.reporter.emit(Reason.HostKeyUnverified, "Warning", "the volume's ssh Secret has no known_hosts: the server's host key was trusted on first sight; add known_hosts to the Secret to check it");
  }
}
