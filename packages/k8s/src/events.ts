import { setTimeout as sleep } from "node:timers/promises";
import { DRIVER_NAME, type EventType, type ReasonName } from "@git-csi/config";
import type { Logger } from "@git-csi/logging";
import type { CoreV1Api, KubeConfig } from "@kubernetes/client-node" with { "resolution-mode": "import" };
import { clientNode } from "./client";
import { describeError, httpStatus } from "./watched";

/** The object an event is about. Without its uid, `kubectl describe` does not show the event. */
export interface InvolvedObject {
  kind: "Pod" | "PersistentVolumeClaim";
  namespace: string;
  name: string;
  uid?: string;
}

export interface EventRecorderOptions {
  kubeConfig: KubeConfig;
  /** reportingInstance and source.host of every event. */
  nodeId: string;
  logger: Logger;
  /** Events an object may get at once, then one per refillMs. */
  burst?: number;
  refillMs?: number;
  /** Waits before each retry of a post the API server did not answer or answered with 429 or 5xx. */
  retryDelaysMs?: readonly number[];
}

export const EVENT_BURST = 25;
const EVENT_REFILL_MS = 5_000;
// client-go's correlator: an identical event within 10 minutes counts on the existing Event.
const SAME_EVENT_MS = 10 * 60_000;
// client-go's bounds: its LRU caches hold 4096 keys, its broadcaster queues 1000 events.
const REMEMBERED = 4096;
const MAX_QUEUED = 1000;
// An API server that restarts (an upgrade, a leader change) is back within seconds.
const RETRY_DELAYS_MS = [1_000, 2_000, 4_000];

interface Posted {
  name: string;
  count: number;
  lastAt: number;
}

interface Bucket {
  tokens: number;
  at: number;
  /** A drop was logged since the last event that passed: one log line per dry spell, not per event. */
  dryLogged?: boolean;
}

/**
 * Posts core/v1 Events as client-go's recorder does: one at a time, an identical event within
 * 10 minutes as a count on the first, and a token bucket per object and reason so a busy
 * volume cannot flood the API server, and one reason's flood silences no other. A post the
 * API server does not answer, or answers with 429 or 5xx, is tried again after 1, 2 and 4 s. record() never throws and never waits; an event that is not
 * posted is logged and counted in dropped().
 */
export class EventRecorder {
  private api: Promise<CoreV1Api> | undefined;
  private readonly buckets = new Map<string, Bucket>();
  private readonly posted = new Map<string, Posted>();
  private tail: Promise<void> = Promise.resolve();
  private queued = 0;
  private droppedCount = 0;
  private sequence = 0;

  constructor(private readonly options: EventRecorderOptions) {}

  record(object: InvolvedObject, type: EventType, reason: ReasonName, message: string): void {
    // A bucket per reason too: a flood of failed pushes must never silence the one event that says the epoch was lost.
    const key = `${object.kind}/${object.namespace}/${object.name}/${object.uid ?? ""}/${reason}`;
    if (!this.takeToken(key) || this.queued >= MAX_QUEUED) {
      this.droppedCount++;
      const bucket = this.buckets.get(key);
      if (bucket && !bucket.dryLogged) {
        bucket.dryLogged = true;
        const { burst = EVENT_BURST, refillMs = EVENT_REFILL_MS } = this.options;
        this.options.logger.warn(
          `${reason} events on this object are dropped: over ${burst} at once and one per ${refillMs / 1000}s, or ${MAX_QUEUED} waiting; the volume's log and report keep every event`,
          {
            operation: "event",
            reason,
            kind: object.kind,
            namespace: object.namespace,
            name: object.name,
          },
        );
      }
      return;
    }
    this.queued++;
    const at = new Date();
    this.tail = this.tail.then(() => this.post(object, type, reason, message, at)).finally(() => this.queued--);
  }

  /** Settles when every event recorded so far has been posted or dropped. */
  flush(): Promise<void> {
    return this.tail;
  }

  /** Events never posted: over the rate limit, over the queue, or refused by the API server. */
  dropped(): number {
    return this.droppedCount;
  }

  private takeToken(key: string): boolean {
    const { burst = EVENT_BURST, refillMs = EVENT_REFILL_MS } = this.options;
    const now = Date.now();
    const bucket = this.buckets.get(key) ?? { tokens: burst, at: now };
    bucket.tokens = Math.min(burst, bucket.tokens + (now - bucket.at) / refillMs);
    bucket.at = now;
    const allowed = bucket.tokens >= 1;
    if (allowed) {
      bucket.tokens -= 1;
      bucket.dryLogged = false;
    }
    remember(this.buckets, key, bucket);
    return allowed;
  }

  private async post(object: InvolvedObject, type: EventType, reason: ReasonName, message: string, at: Date): Promise<void> {
    const { retryDelaysMs = RETRY_DELAYS_MS } = this.options;
    const name = `${object.name}.${this.uniqueHex(at)}`;
    for (let attempt = 0; ; attempt++) {
      try {
        return await this.postOnce(object, type, reason, message, at, name);
      } catch (err) {
        // A retry's create that finds its Event: the try before landed, only its answer was lost.
        if (attempt > 0 && httpStatus(err) === 409) return;
        const delay = retryDelaysMs[attempt];
        if (delay !== undefined && transient(err)) {
          await sleep(delay);
          continue;
        }
        this.droppedCount++;
        this.options.logger.warn("posting a Kubernetes event failed", {
          operation: "event",
          reason,
          kind: object.kind,
          namespace: object.namespace,
          name: object.name,
          attempts: attempt + 1,
          error: describeError(err),
        });
        return;
      }
    }
  }

  /** One try: a count on the same event posted before, else a new Event of the given name. */
  private async postOnce(object: InvolvedObject, type: EventType, reason: ReasonName, message: string, at: Date, name: string): Promise<void> {
    const key = JSON.stringify([object.kind, object.namespace, object.name, object.uid, type, reason, message]);
    const api = await (this.api ??= clientNode().then((client) => this.options.kubeConfig.makeApiClient(client.CoreV1Api)));
    const previous = this.posted.get(key);
    if (previous && at.getTime() - previous.lastAt <= SAME_EVENT_MS && (await this.count(api, object, previous, at))) {
      remember(this.posted, key, { name: previous.name, count: previous.count + 1, lastAt: at.getTime() });
      return;
    }
    const { nodeId } = this.options;
    await api.createNamespacedEvent({
      namespace: object.namespace,
      body: {
        metadata: { name, namespace: object.namespace },
        involvedObject: { apiVersion: "v1", kind: object.kind, namespace: object.namespace, name: object.name, uid: object.uid },
        reason,
        message,
        type,
        count: 1,
        firstTimestamp: at,
        lastTimestamp: at,
        source: { component: DRIVER_NAME, host: nodeId },
        reportingComponent: DRIVER_NAME,
        reportingInstance: nodeId,
      },
    });
    remember(this.posted, key, { name, count: 1, lastAt: at.getTime() });
  }

  /** Adds one to the Event posted before; false when that Event is gone (expired or deleted). */
  private async count(api: CoreV1Api, object: InvolvedObject, previous: Posted, at: Date): Promise<boolean> {
    try {
      await api.patchNamespacedEvent({
        name: previous.name,
        namespace: object.namespace,
        body: [
          { op: "replace", path: "/count", value: previous.count + 1 },
          { op: "replace", path: "/lastTimestamp", value: at.toISOString() },
        ],
      });
    } catch (err) {
      if (httpStatus(err) === 404) return false;
      throw err;
    }
    return true;
  }

  // client-go names an Event <object>.<UnixNano in hex>; the sequence keeps two in one millisecond apart.
  private uniqueHex(at: Date): string {
    return (BigInt(at.getTime()) * 1_000_000n + BigInt(this.sequence++ % 1_000_000)).toString(16);
  }
}

/** Least recently used first out, so the maps stay bounded however many objects come and go. */
function remember<V>(map: Map<string, V>, key: string, value: V): void {
  map.delete(key);
  map.set(key, value);
  if (map.size > REMEMBERED) map.delete(map.keys().next().value!);
}

/** No answer, too many requests, or a server error: worth another try. A refusal (4xx) is final. */
function transient(err: unknown): boolean {
  const code = httpStatus(err);
  return code === undefined || code === 429 || code >= 500;
}
