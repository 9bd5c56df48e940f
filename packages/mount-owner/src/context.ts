import type { KeyedSerial } from "@git-csi/config";
import type { Logger } from "@git-csi/logging";
import type { OperationMetrics } from "@git-csi/metrics";
import type { gitcsi, gitWorker } from "@git-csi/protos";
import type { EpochFence } from "./fuse/binding";
import type { ReaderGroup, ReaderMount } from "./reader";
import type { MountSessions } from "./sessions";
import type { State } from "./state";
import type { TreeUsage } from "./tree-usage";
import type { WorkerLink } from "./worker-link";

/** A staged volume's FUSE session, as the mount owner holds it. */
export interface StagedMount {
  unmount(): Promise<void>;
  /** A renewal moved the lease's end. */
  serveUntil(ms: number): void;
  /** Every operation of the mount answers EIO from now on, its kernel caches dropped. */
  fence(): void;
  /** The kernel's dirty pages reach the tree; false when nothing is mounted any more. */
  sync(): Promise<boolean>;
  /** The tree moved behind the mount: the kernel forgets the entries and attributes it cached. */
  invalidate(): void;
  /** A read-only volume's mount serves another commit's tree from now on, switched at the root in one step. */
  switchRoot(treePath: string): void;
}

export interface MountOwnerDeps {
  state: State;
  nodeId: string;
  /** This mount owner's and its git worker's sockets, recorded in each .rwo-session. */
  endpoints: { mountOwner: string; gitWorker: string };
  worker: gitWorker.GitWorkerClient;
  logger: Logger;
  metrics: OperationMetrics;
  /** Spec 000's lease: 90 s from the record's time, renewed every 20 s. */
  lease: { durationMs: number; renewMs: number };
  /**
   * Serves the volume's work tree through FUSE at the staging path; the
   * server refuses every operation itself once the epoch's lease ran out or
   * the mount was fenced, and tells `epoch.onFenced`.
   */
  mountTree(volumeId: string, treePath: string, stagingPath: string, epoch: EpochFence): Promise<StagedMount>;
}

/** What the Kubernetes watch resolved for a volume: PersistentVolume → claim → VolumeAttributesClass. */
export interface WatchedVolume {
  claim?: gitcsi.Claim;
  volumeClass?: gitcsi.VolumeClass;
  /** The PersistentVolume is gone; with reclaim policy Delete its tree goes too. */
  deleted: boolean;
  reclaimPolicy: string;
  /** The PersistentVolume's git.liken.sh/snapshot-request: a snapshot's or a clone's id the node serving the volume flushes for. */
  flushRequest?: string;
}

/** What every part of the mount owner shares: its records, its live mount sessions, its link to the git worker. */
export interface Owner {
  deps: MountOwnerDeps;
  state: State;
  logger: Logger;
  sessions: MountSessions;
  /** The read-only volumes this process serves, by volume id: no epoch, no session. */
  readers: Map<string, ReaderMount>;
  /** The read-only volumes of each URL and ref (readerKeyOf), which share one checkout and one fetch. */
  readerGroups: Map<string, ReaderGroup>;
  /** A group's fetch, and a volume joining or leaving it, one at a time: taken inside a volume's turn, never around one. */
  perReaderGroup: KeyedSerial;
  link: WorkerLink;
  /** Operations on one volume run one at a time: a kubelet retry never interleaves with its original. */
  perVolume: KeyedSerial;
  /** The Kubernetes watch's view of each volume, which overrides what the node recorded. */
  watched: Map<string, WatchedVolume>;
  /** What each staged tree uses, for NodeGetVolumeStats. */
  usage: TreeUsage;
}
