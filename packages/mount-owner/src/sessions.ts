import { hasSecret } from "@git-csi/config";
import type { Logger } from "@git-csi/logging";
import type { OperationMetrics } from "@git-csi/metrics";
import { type CsiError, failedPrecondition, type gitcsi, gitWorker } from "@git-csi/protos";
import type { StagedMount } from "./context";
import { servingClock } from "./fuse/binding";

/** A staged volume's FUSE session, its mount epoch, and the git worker instance that watches its tree. */
export interface LiveSession {
  stagingPath: string;
  mount: StagedMount;
  workerInstance: string;
  epoch: string;
  /** Until when the mount may serve without another renewal, on servingClock(). */
  serveUntil: number;
  /** Why the epoch no longer holds the volume; once set, the mount never serves again. */
  lost?: string;
  /**
   * The Secret the git worker last accepted for the volume, in this process's
   * memory only: a worker that restarts gets it back at once instead of
   * waiting for the kubelet's next publish.
   */
  credential?: gitcsi.Credential;
}

/** A Secret with key material, or nothing: a publish without a Secret keeps the one the worker holds. */
export function withMaterial(credential: gitcsi.Credential | undefined): gitcsi.Credential | undefined {
  return hasSecret(credential?.data) ? credential : undefined;
}

/** The mount sessions this process serves, by volume id, and how an epoch loses its volume. */
export class MountSessions {
  private readonly live = new Map<string, LiveSession>();
  /**
   * Sessions whose unstage is committing what the tree holds: their mount is
   * gone, so no publish or stage sees them, but they are renewed until the
   * unstage's flush answers, or a backlog longer than the lease would lose
   * the epoch and strand its commits.
   */
  private readonly leaving = new Map<string, LiveSession>();
  /** Volumes whose kept FUSE connection waits to be served again after a restart. */
  private readonly resuming = new Set<string>();

  constructor(
    private readonly logger: Logger,
    private readonly metrics: OperationMetrics,
  ) {}

  get(volumeId: string): LiveSession | undefined {
    return this.live.get(volumeId);
  }

  /** Marks a kept connection as waiting to be served; the answer ends the wait, resumed or not. */
  awaitResume(volumeId: string): () => void {
    this.resuming.add(volumeId);
    return () => this.resuming.delete(volumeId);
  }

  awaitsResume(volumeId: string): boolean {
    return this.resuming.has(volumeId);
  }

  has(volumeId: string): boolean {
    return this.live.has(volumeId);
  }

  entries(): IterableIterator<[string, LiveSession]> {
    return this.live.entries();
  }

  /** Every session a renewal keeps: the live ones and the leaving ones. */
  renewed(): [string, LiveSession][] {
    return [...this.live, ...this.leaving];
  }

  add(volumeId: string, session: LiveSession): void {
    this.leaving.delete(volumeId);
    this.live.set(volumeId, session);
  }

  /**
   * The unstage's mount is gone and its flush comes next: the session is
   * renewed but no longer seen. A retried unstage finds it here again.
   */
  leave(volumeId: string): LiveSession | undefined {
    const session = this.live.get(volumeId) ?? this.leaving.get(volumeId);
    this.live.delete(volumeId);
    if (session) this.leaving.set(volumeId, session);
    return session;
  }

  /** The session ends here: no renewal follows. */
  end(volumeId: string): void {
    this.live.delete(volumeId);
    this.leaving.delete(volumeId);
  }

  /**
   * The FUSE server fences by itself when the lease runs out unrenewed (a
   * renewal that finds a successor fences through lose); either way every
   * operation fails with EIO, for good, and each refusal is counted here.
   */
  fenced(volumeId: string, session: LiveSession, refused: number): void {
    this.lose(volumeId, session, "the lease ran out unrenewed");
    for (let i = 0; i < refused; i++) this.metrics.count("stale_epoch_refused");
  }

  /** Logged once: the state changes once. */
  lose(volumeId: string, session: LiveSession, why: string): void {
    if (session.lost) return;
    session.lost = why;
    session.mount.fence();
    this.logger.error(`the mount epoch no longer holds the volume: ${why}. Every read and write of its mount fails with EIO until the volume is unpublished and unstaged on this node`, {
      volume: volumeId,
      operation: "epoch_lost",
    });
  }

  /** A claim's or renewal's answer: the mount serves longer, or the epoch lost the volume. */
  applyLease(volumeId: string, session: LiveSession, lease: gitWorker.MountLease | undefined): void {
    if (!lease || session.lost || !this.held(volumeId, session)) return;
    if (lease.held) {
      session.serveUntil = servingDeadline(lease);
      session.mount.serveUntil(session.serveUntil);
    } else if (lease.refusal !== gitWorker.LeaseRefusal.LEASE_REFUSAL_NONE) this.lose(volumeId, session, lease.message);
  }

  /** A renewal answered after its session ended (or was replaced) changes nothing. */
  private held(volumeId: string, session: LiveSession): boolean {
    return this.live.get(volumeId) === session || this.leaving.get(volumeId) === session;
  }
}

/** Why the session's epoch no longer holds the volume: lost, or its lease's end passed before a renewal noticed. */
export function whyLost(session: LiveSession): string | undefined {
  return session.lost ?? (servingClock() >= session.serveUntil ? "the lease ran out unrenewed" : undefined);
}

/**
 * A held lease's end on servingClock(). The git worker reads its serving
 * deadline (kept on its own monotonic clock) as a wall-clock time on this
 * node, and this reads the wall clock again moments later: the end comes a
 * little early, never late, and no wall clock step after this moves it.
 */
export function servingDeadline(lease: gitWorker.MountLease): number {
  return servingClock() + Number(lease.serveUntilUnixMs) - Date.now();
}

/**
 * How much longer the session's mount may serve, for a git worker that
 * restarted (ClaimMount's serving_left_ms): a duration on servingClock(),
 * never a time, rounded down; -1 when none is left or the epoch was lost; 0
 * (unknown) without a session, as after this process restarted.
 */
export function servingLeft(session: LiveSession | undefined): number {
  if (!session) return 0;
  if (session.lost) return -1;
  const left = session.serveUntil - servingClock();
  if (!Number.isFinite(left)) return 0;
  return left >= 1 ? Math.floor(left) : -1;
}

/** What the operator does about a lost epoch, by the call that found it. */
const AFTER_LOSS = {
  // The kubelet unstages only once no pod on the node wants the volume; the next publish with no pod on the stage stages it again.
  publish: "another pod on this node still uses its stage: delete the pods on this node that use it, and the next pod's publish stages it again with a new epoch",
  stage: "unstage it on this node, then stage it again",
  // Found by this publish's own renewal: whether another pod uses the stage is not known yet.
  renewal: "the kubelet's next publish stages it again with a new epoch once no other pod on this node uses its stage",
} as const;

export function epochLost(volumeId: string, why: string, call: keyof typeof AFTER_LOSS): CsiError {
  return failedPrecondition(`volume ${volumeId}: the mount epoch no longer holds the volume (${why}); ${AFTER_LOSS[call]}`);
}
