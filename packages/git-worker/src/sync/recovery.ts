import { Reason } from "@git-csi/config";
import type { FencedPod, PodRef } from "@git-csi/k8s";
import { gitWorker } from "@git-csi/protos";
import type { VolumeReporter } from "../report";
import type { VolumeState } from "./volume";

/** Deletes a fenced mount's pods that a controller owns (FencedPodDeleter); absent without --delete-fenced-pods or an API server. */
export interface PodDeleter {
  deleteIfControlled(pod: PodRef): Promise<FencedPod>;
}

/**
 * What happens once a volume's mount epoch is lost (superseded, or its lease
 * ran out unrenewed): the mount answers EIO from then on, and only a new
 * stage serves the volume again, so the pods are told, and those a
 * controller owns are deleted to start again. Once per epoch; a release at
 * unstage is no loss.
 */
export class VolumeRecovery {
  private recovered = "";

  constructor(
    private readonly s: VolumeState,
    private readonly reporter: VolumeReporter,
  ) {}

  /** Looks at the lease's state; acts the first time an epoch is seen lost. */
  check(state: gitWorker.MountLease): void {
    const lease = this.s.lease;
    if (state.held || state.refusal === gitWorker.LeaseRefusal.LEASE_REFUSAL_NONE || state.refusal === gitWorker.LeaseRefusal.LEASE_REFUSAL_RELEASED) return;
    if (this.recovered === lease.holder.epoch) return;
    this.recovered = lease.holder.epoch;
    void this.recover(state.message).catch((err: unknown) => this.reporter.fail("recover", err));
  }

  private async recover(why: string): Promise<void> {
    const deleter = this.s.ctx.pods;
    // Never the epoch itself: it is the .rwo-session's contents, which no log or event shows.
    const what = `the mount epoch lost the volume (${why}); the mount answers EIO until the pod is deleted, and commits it made wait on refs/git-csi/stranded/${this.s.volumeId}/ for the next stage`;
    if (!deleter) {
      this.reporter.emit(Reason.EpochLost, "Warning", `${what}: delete the pod so it starts again on a new stage (the driver deletes none: --delete-fenced-pods is off)`);
      return;
    }
    const pods = [...this.s.pods];
    this.reporter.emit(Reason.EpochLost, "Warning", `${what}: the driver deletes the pods a controller owns, so each starts again on a new stage`);
    const outcomes = await Promise.all(pods.map((pod) => deleter.deleteIfControlled(pod)));
    for (const o of outcomes)
      this.s.log(o.outcome === "failed" ? "error" : "info", describe(o), "recover", { claim: this.s.labels.claim, pod: `${o.pod.namespace}/${o.pod.name}`, outcome: o.outcome });
    if (outcomes.length === 0) return;
    const anyLeft = outcomes.some((o) => o.outcome === "uncontrolled" || o.outcome === "failed");
    this.reporter.emit(Reason.EpochLost, anyLeft ? "Warning" : "Normal", `after the lost mount epoch: ${outcomes.map(describe).join("; ")}`);
  }
}

function describe(o: FencedPod): string {
  const pod = `pod ${o.pod.namespace}/${o.pod.name}`;
  switch (o.outcome) {
    case "deleted":
      return `deleted ${pod}: its controller ${o.controller} starts it again on a new stage`;
    case "uncontrolled":
      return `left ${pod}: no controller owns it, so nothing would start it again; delete it by hand and start it again`;
    case "gone":
      return `${pod} is gone already`;
    case "failed":
      return `${pod} could not be deleted (${o.error}); delete it by hand`;
  }
}
