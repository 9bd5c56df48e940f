import { DRIVER_NAME } from "@git-csi/config";
import type { Logger } from "@git-csi/logging";
import type { KubeConfig, V1PersistentVolume, V1PersistentVolumeClaim, V1VolumeAttributesClass } from "@kubernetes/client-node" with { "resolution-mode": "import" };
import { clientNode } from "./client";
import { SNAPSHOT_REQUEST_ANNOTATION } from "./volumes";
import { DEFAULT_BACKOFF, Watched, type Backoff } from "./watched";

/** The claim bound to a volume; uid included because `kubectl describe` finds a claim's events by it. */
export interface ClaimRef {
  namespace: string;
  name: string;
  uid: string | undefined;
}

/** A VolumeAttributesClass of this driver: the cluster owner's commit and push policy. */
export interface VolumeClass {
  name: string;
  parameters: Record<string, string>;
}

export interface VolumeState {
  claim: ClaimRef | undefined;
  /** Undefined: the volume is unarmed (no claim, no class named, or the class is missing or another driver's). */
  volumeClass: VolumeClass | undefined;
  /** The PersistentVolume's persistentVolumeReclaimPolicy: on deletion, Delete removes the node's tree. */
  reclaimPolicy: string;
  deleted: boolean;
  /** The PersistentVolume's git.liken.sh/snapshot-request, when set: the snapshot or clone the node serving the volume flushes for. */
  flushRequest?: string;
}

export type OnVolume = (volumeHandle: string, state: VolumeState) => void;

export interface ClassWatchOptions {
  kubeConfig: KubeConfig;
  logger: Logger;
  onVolume: OnVolume;
  backoff?: Backoff;
}

/**
 * Kubernetes hands VolumeAttributesClass parameters to the controller only, so the node learns a
 * volume's class by watching PersistentVolume → claimRef → claim.spec.volumeAttributesClassName →
 * VolumeAttributesClass. It follows the claim's spec, the user's word, not
 * status.currentVolumeAttributesClassName, which only external-resizer writes after a
 * ControllerModifyVolume succeeds.
 */
export class ClassWatch {
  private volumes: Watched<V1PersistentVolume> | undefined;
  private claims: Watched<V1PersistentVolumeClaim> | undefined;
  private classes: Watched<V1VolumeAttributesClass> | undefined;
  private readonly heard = new Map<string, { state: VolumeState; key: string }>();
  private ready = false;
  private stopped = false;
  private scheduled = false;

  constructor(private readonly options: ClassWatchOptions) {}

  /** Resolves once volumes, claims and classes are listed and onVolume has heard every volume once. */
  async start(): Promise<void> {
    const client = await clientNode();
    if (this.stopped) return;
    const { kubeConfig, logger } = this.options;
    const backoff = this.options.backoff ?? DEFAULT_BACKOFF;
    const core = kubeConfig.makeApiClient(client.CoreV1Api);
    const storage = kubeConfig.makeApiClient(client.StorageV1Api);
    const changed = () => this.schedule();
    this.volumes = new Watched("PersistentVolumes", client, kubeConfig, "/api/v1/persistentvolumes", () => core.listPersistentVolume(), logger, backoff, changed);
    this.claims = new Watched("PersistentVolumeClaims", client, kubeConfig, "/api/v1/persistentvolumeclaims", () => core.listPersistentVolumeClaimForAllNamespaces(), logger, backoff, changed);
    this.classes = new Watched("VolumeAttributesClasses", client, kubeConfig, "/apis/storage.k8s.io/v1/volumeattributesclasses", () => storage.listVolumeAttributesClass(), logger, backoff, changed);
    const all = [this.volumes, this.claims, this.classes];
    for (const watched of all) watched.start();
    await Promise.all(all.map((watched) => watched.synced));
    if (this.stopped) return;
    this.ready = true;
    this.resolve();
  }

  async stop(): Promise<void> {
    this.stopped = true;
    await Promise.all([this.volumes?.stop(), this.claims?.stop(), this.classes?.stop()]);
  }

  /** The claim of a volume as last reported, for metric labels. */
  claimOf(volumeHandle: string): ClaimRef | undefined {
    return this.heard.get(volumeHandle)?.state.claim;
  }

  // A re-list or a burst of updates resolves once, with the state they end in.
  private schedule(): void {
    if (!this.ready || this.scheduled) return;
    this.scheduled = true;
    setImmediate(() => {
      this.scheduled = false;
      if (!this.stopped) this.resolve();
    });
  }

  private resolve(): void {
    const current = new Map<string, VolumeState>();
    for (const volume of newestFirst(this.volumes!.list())) {
      const handle = volume.spec?.csi?.driver === DRIVER_NAME ? volume.spec.csi.volumeHandle : undefined;
      // Two PersistentVolumes may name one handle while a volume is recreated: the newer one speaks for it.
      if (handle && !current.has(handle)) current.set(handle, this.stateOf(volume));
    }
    for (const [handle, state] of current) this.tell(handle, state);
    for (const [handle, last] of this.heard) {
      if (current.has(handle)) continue;
      this.heard.delete(handle);
      this.call(handle, { ...last.state, deleted: true });
    }
  }

  private stateOf(volume: V1PersistentVolume): VolumeState {
    const flushRequest = volume.metadata?.annotations?.[SNAPSHOT_REQUEST_ANNOTATION];
    return flushRequest ? { ...this.classStateOf(volume), flushRequest } : this.classStateOf(volume);
  }

  private classStateOf(volume: V1PersistentVolume): VolumeState {
    const reclaimPolicy = volume.spec?.persistentVolumeReclaimPolicy ?? "Retain";
    const ref = volume.spec?.claimRef;
    const claim = ref?.name && ref.namespace ? this.claims!.get(ref.name, ref.namespace) : undefined;
    // A claim of the same name that is not the one this volume is bound to (recreated, or bound elsewhere) does not count.
    const bound = claim && (!ref?.uid || ref.uid === claim.metadata?.uid) && (!claim.spec?.volumeName || claim.spec.volumeName === volume.metadata?.name) ? claim : undefined;
    if (!bound) return { claim: undefined, volumeClass: undefined, reclaimPolicy, deleted: false };
    const className = bound.spec?.volumeAttributesClassName;
    const found = className ? this.classes!.get(className) : undefined;
    return {
      claim: { namespace: bound.metadata!.namespace!, name: bound.metadata!.name!, uid: bound.metadata?.uid },
      volumeClass: className && found?.driverName === DRIVER_NAME ? { name: className, parameters: { ...found.parameters } } : undefined,
      reclaimPolicy,
      deleted: false,
    };
  }

  private tell(handle: string, state: VolumeState): void {
    const key = stateKey(state);
    if (this.heard.get(handle)?.key === key) return;
    this.heard.set(handle, { state, key });
    this.call(handle, state);
  }

  private call(handle: string, state: VolumeState): void {
    try {
      this.options.onVolume(handle, state);
    } catch (err) {
      this.options.logger.error("the volume class callback failed", { operation: "watch", volume: handle, error: err instanceof Error ? err.message : String(err) });
    }
  }
}

function stateKey(state: VolumeState): string {
  const { claim, volumeClass } = state;
  const parameters = volumeClass ? Object.entries(volumeClass.parameters).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)) : undefined;
  return JSON.stringify([claim?.namespace, claim?.name, claim?.uid, volumeClass?.name, parameters, state.reclaimPolicy, state.flushRequest]);
}

// A listed object carries a Date, a watched one the API's string: new Date() reads both.
function newestFirst(volumes: readonly V1PersistentVolume[]): V1PersistentVolume[] {
  const created = (volume: V1PersistentVolume) => new Date(volume.metadata?.creationTimestamp ?? 0).getTime();
  return [...volumes].sort((a, b) => created(b) - created(a) || (a.metadata?.name ?? "").localeCompare(b.metadata?.name ?? ""));
}
