import type { Logger } from "@git-csi/logging";
import type { OperationMetrics } from "@git-csi/metrics";
import { call, type gitWorker } from "@git-csi/protos";
import { servingClock } from "./fuse/binding";

/** A mount session as its renewal sees it. */
export interface RenewedSession {
  epoch: string;
  /** Until when the mount may serve without another renewal, on servingClock(). */
  serveUntil: number;
  /** Why the epoch no longer holds the volume; a lost epoch is never renewed. */
  lost?: string;
}

export interface RenewalDeps<S extends RenewedSession> {
  worker: gitWorker.GitWorkerClient;
  logger: Logger;
  /** Counts each failed renewal: a node whose renewals keep failing is alerted on before its leases end. */
  metrics: OperationMetrics;
  /** Spec 000's renewal interval: 20 s. */
  intervalMs: number;
  /** The sessions this mount owner holds now, by volume id. */
  sessions(): Iterable<[string, S]>;
  /** The owner ref's answer for one session: a later end, or a refusal. */
  apply(volumeId: string, session: S, lease: gitWorker.MountLease): void;
  /** The session's lease ran out before a renewal could extend it. */
  ranOut(volumeId: string, session: S): void;
}

/**
 * renew_mount of spec 000 for every mount epoch this mount owner holds, in
 * one RenewMounts call per renewal interval rather than a call per volume:
 * the git worker then pushes the owner refs of one remote together, one push
 * per remote per interval however many volumes there are. A call still
 * running when the next interval comes is not doubled.
 */
export function renewEvery<S extends RenewedSession>(deps: RenewalDeps<S>): NodeJS.Timeout {
  let running = false;
  return setInterval(() => {
    if (running) return;
    running = true;
    void renewOnce(deps).finally(() => (running = false));
  }, deps.intervalMs);
}

/** One round: each session's answer applied, or its failure logged while the mount serves on until its lease's end. */
async function renewOnce<S extends RenewedSession>(deps: RenewalDeps<S>): Promise<void> {
  const asked: [string, S][] = [];
  for (const [volumeId, session] of deps.sessions()) {
    if (session.lost) continue;
    if (servingClock() >= session.serveUntil) deps.ranOut(volumeId, session);
    else asked.push([volumeId, session]);
  }
  if (asked.length === 0) return;
  const request = { mounts: asked.map(([volumeId, session]) => ({ volumeId, epoch: session.epoch })) };
  const answer = await call(deps.worker.renewMounts.bind(deps.worker), request, deps.intervalMs).catch((err: Error) => {
    // A worker that restarted gets the volumes back from watchWorker; a remote that is away may answer the next time.
    for (const [volumeId, session] of asked) failed(deps, volumeId, session, err.message);
    return undefined;
  });
  answer?.mounts.forEach((renewed, i) => {
    const [volumeId, session] = asked[i]!;
    if (renewed.lease) deps.apply(volumeId, session, renewed.lease);
    else failed(deps, volumeId, session, renewed.error);
  });
}

function failed<S extends RenewedSession>(deps: RenewalDeps<S>, volumeId: string, session: S, why: string): void {
  deps.metrics.count("mount_renewal_failed");
  const left = Math.max(0, Math.ceil((session.serveUntil - servingClock()) / 1000));
  deps.logger.warn(`renew_mount failed; the mount serves ${left} s more unless a renewal succeeds: ${why}`, {
    volume: volumeId,
    operation: "renew_mount",
  });
}
