/**
 * When a volume commits and pushes, spec 004 "What happens after a write":
 * after push.quiesce of quiet, at the latest push.maxLatency after the oldest
 * change the remote lacks, and again with backoff after a failure. This is
 * every timer of a volume's sync; it decides when, and the sync decides what.
 */

/** Time as the scheduler sees it: the system's, or a test's fake. */
export interface Clock {
  now(): number;
  /** Calls fire after ms; the answer cancels it. */
  after(ms: number, fire: () => void): () => void;
}

export const systemClock: Clock = {
  now: () => Date.now(),
  after: (ms, fire) => {
    const timer = setTimeout(fire, ms);
    return () => clearTimeout(timer);
  },
};

/** The class parameters the timers follow. */
export interface Timing {
  quiesceMs: number;
  maxLatencyMs: number;
}

export type ScheduledTrigger = "quiesce" | "maxLatency" | "a failed commit or push";

export const RETRY_MIN_MS = 5_000;

/** The wait before the next sync after a failed commit or push: doubling from 5 s, never beyond push.maxLatency. */
export function retryDelay(failures: number, maxLatencyMs: number | undefined): number {
  return Math.min(maxLatencyMs ?? RETRY_MIN_MS, RETRY_MIN_MS * 2 ** Math.min(failures - 1, 6));
}

export class SyncScheduler {
  private timing?: Timing;
  private stopped = false;
  private cancelQuiesce?: () => void;
  private cancelLatency?: () => void;
  private cancelRetry?: () => void;
  /** When the oldest change the remote lacks was seen. */
  private oldestUnpushedAt?: number;

  /**
   * hasWork: whether anything waits for a commit or a push; fire: runs a sync
   * for the trigger (the sync then tells the scheduler what it did).
   */
  constructor(
    private readonly clock: Clock,
    private readonly hasWork: () => boolean,
    private readonly fire: (trigger: ScheduledTrigger) => void,
  ) {}

  /** The class's timing, or none: an unarmed volume schedules nothing. */
  arm(timing: Timing | undefined): void {
    this.timing = timing;
  }

  /** A write, made by `at`: the quiet starts again from it, and the latency bound runs from the oldest unpushed change. */
  wrote(at = this.clock.now()): void {
    if (!this.timing) return;
    this.restartQuiesce(at);
    this.ensureLatency();
  }

  restartQuiesce(from = this.clock.now()): void {
    this.cancelQuiesce?.();
    if (!this.timing || this.stopped) return;
    this.cancelQuiesce = this.clock.after(Math.max(0, from + this.timing.quiesceMs - this.clock.now()), () => this.fire("quiesce"));
  }

  /** Starts the maxLatency timer unless one runs, or nothing waits. */
  ensureLatency(): void {
    if (!this.timing || this.stopped || this.cancelLatency) return;
    if (!this.hasWork()) return;
    this.oldestUnpushedAt ??= this.clock.now();
    const due = this.oldestUnpushedAt + this.timing.maxLatencyMs - this.clock.now();
    this.cancelLatency = this.clock.after(Math.max(0, due), () => {
      this.cancelLatency = undefined;
      this.fire("maxLatency");
    });
  }

  /** A sync began: the quiet it waited for no longer matters. */
  syncStarts(): void {
    this.cancelQuiesce?.();
  }

  /** A push began: it answers the latency bound, and the next write starts a new one. */
  pushStarts(): void {
    this.cancelLatency?.();
    this.cancelLatency = undefined;
  }

  /** A commit or push failed for the failures-th time in a row. */
  failed(failures: number): void {
    this.cancelRetry?.();
    this.cancelRetry = this.clock.after(retryDelay(failures, this.timing?.maxLatencyMs), () => this.fire("a failed commit or push"));
  }

  /** A commit holds changes the remote lacks. */
  committed(): void {
    this.oldestUnpushedAt ??= this.clock.now();
  }

  /** A push landed: what is still uncommitted counts from now. */
  pushed(stillPending: boolean): void {
    this.oldestUnpushedAt = stillPending ? this.clock.now() : undefined;
    this.ensureLatency();
  }

  /** The remote has every commit and nothing is pending. */
  caughtUp(): void {
    this.oldestUnpushedAt = undefined;
  }

  /** The class went away: the timers stop, and nothing is committed until one comes back. */
  disarm(): void {
    for (const cancel of [this.cancelQuiesce, this.cancelLatency, this.cancelRetry]) cancel?.();
  }

  stop(): void {
    this.stopped = true;
    this.disarm();
  }
}
