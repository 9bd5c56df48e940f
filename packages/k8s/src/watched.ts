import type { Logger } from "@git-csi/logging";
import type { Informer, KubeConfig, KubernetesListObject, KubernetesObject, ObjectCache } from "@kubernetes/client-node" with { "resolution-mode": "import" };
import type { ClientNode } from "./client";

export interface Backoff {
  initialMs: number;
  maxMs: number;
}

export const DEFAULT_BACKOFF: Backoff = { initialMs: 1_000, maxMs: 30_000 };

// A watch that ran this long before it failed was healthy: its restart starts the backoff afresh.
const HEALTHY_MS = 60_000;

/**
 * One kind of object kept in memory by client-node's list+watch. The informer lists, watches
 * from the list's resourceVersion, and lists again itself on 410 Gone; any other failure stops
 * it, so this restarts it with a doubling delay.
 */
export class Watched<T extends KubernetesObject> {
  private readonly informer: Informer<T> & ObjectCache<T>;
  private listed = false;
  private stopped = false;
  private timer: NodeJS.Timeout | undefined;
  private delayMs: number;
  private runningSince = 0;
  private markSynced!: () => void;
  /** Settles once a list has filled the cache, or at stop. */
  readonly synced = new Promise<void>((resolve) => (this.markSynced = resolve));

  constructor(
    private readonly what: string,
    client: ClientNode,
    kubeConfig: KubeConfig,
    path: string,
    list: () => Promise<KubernetesListObject<T>>,
    private readonly logger: Logger,
    private readonly backoff: Backoff,
    onChange: () => void,
  ) {
    this.delayMs = backoff.initialMs;
    this.informer = client.makeInformer(kubeConfig, path, async () => {
      const result = await list();
      this.listed = true;
      return result;
    });
    this.informer.on("change", onChange);
    this.informer.on("error", (err: unknown) => this.failed(err));
  }

  start(): void {
    void this.run();
  }

  get(name: string, namespace?: string): T | undefined {
    return this.informer.get(name, namespace);
  }

  list(): readonly T[] {
    return this.informer.list();
  }

  async stop(): Promise<void> {
    this.stopped = true;
    clearTimeout(this.timer);
    this.markSynced();
    await this.informer.stop();
  }

  private async run(): Promise<void> {
    this.runningSince = Date.now();
    try {
      // Resolves once the watch is open, after the list when there was one; most failures come as an "error" event.
      await this.informer.start();
    } catch (err) {
      this.failed(err); // reading the credential or building the request threw
      return;
    }
    if (this.listed) this.markSynced();
  }

  private failed(err: unknown): void {
    if (this.stopped) return; // stop() aborts the watch, which reports that as an error
    this.delayMs = Date.now() - this.runningSince >= HEALTHY_MS ? this.backoff.initialMs : this.delayMs;
    this.logger.warn(`watching ${this.what} failed; retrying`, { operation: "watch", error: describeError(err), retryInMs: this.delayMs });
    clearTimeout(this.timer);
    this.timer = setTimeout(() => void this.run(), this.delayMs);
    this.delayMs = Math.min(this.delayMs * 2, this.backoff.maxMs);
  }
}

/** The API server's HTTP status; undefined when it did not answer. */
export function httpStatus(err: unknown): number | undefined {
  const code = typeof err === "object" && err !== null && "code" in err ? (err as { code: unknown }).code : undefined;
  return typeof code === "number" ? code : undefined;
}

/** An API error as its status code and the server's message; client-node's own text also carries every response header. */
export function describeError(err: unknown): string {
  if (typeof err === "object" && err !== null && "code" in err && "body" in err) {
    const { code, body } = err as { code: unknown; body: unknown };
    const parsed: unknown = typeof body === "string" ? safeParse(body) : body;
    const message = typeof parsed === "object" && parsed !== null && "message" in parsed ? String(parsed.message) : String(body);
    return `HTTP ${String(code)}: ${message}`;
  }
  return err instanceof Error ? err.message : String(err);
}

function safeParse(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}
