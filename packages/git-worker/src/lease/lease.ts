import { gitWorker } from "@git-csi/protos";
import type { SimpleGit } from "simple-git";
import { Serial } from "@git-csi/config";
import {
  type Decision,
  decideClaim,
  type Refusal,
  type Refused,
  decideRelease,
  decideRenew,
  describeRefusal,
  formatRecord,
  type Holder,
  type OwnerRecord,
  parseRecord,
  RecordError,
  serveFor,
} from "./ownership";
import * as fs from "node:fs/promises";
import * as os from "node:os";
import * as path from "node:path";
import { writeObjects } from "../metadata/plumbing";
import { type Fence, fetchOwner, type PushResult, pushUpdates, type ReadRef, type RefChange, RemoteError, stageObjects } from "../remote/remote";
import { ownerRef } from "../trees/store";
import { runGit } from "../remote/git";
import { writeLooseObject } from "../remote/loose";

/** The ownership rules' refusals as the worker API says them. */
const REFUSALS: Record<Refusal, gitWorker.LeaseRefusal> = {
  expired: gitWorker.LeaseRefusal.LEASE_REFUSAL_EXPIRED,
  released: gitWorker.LeaseRefusal.LEASE_REFUSAL_RELEASED,
  taken: gitWorker.LeaseRefusal.LEASE_REFUSAL_TAKEN,
  superseded: gitWorker.LeaseRefusal.LEASE_REFUSAL_SUPERSEDED,
  access_mode: gitWorker.LeaseRefusal.LEASE_REFUSAL_ACCESS_MODE,
};
/** Runs a git command against the remote with the volume's credential. */
export type OnRemote = <T>(operation: (repo: SimpleGit) => Promise<T>) => Promise<T>;

/** The epoch no longer owns the volume: nothing it pushes may land. */
export class LeaseLost extends RemoteError {}

export const CAS_ATTEMPTS = 4;

/** This process's monotonic clock in ms: no wall clock step or skew between nodes moves it. */
export const monotonic = (): number => performance.now();

/**
 * What this node has seen of each volume's owner ref, and since when by its
 * monotonic clock: a claim takes a volume from an unreleased record only
 * once the ref has stayed on one commit for a whole lease (client-go's
 * leader election watches its lock the same way), and the collection
 * deletes a ref an epoch may use only on the same watch. A restarted worker
 * starts watching again, which only delays a takeover or a deletion.
 */
export class OwnerWatch {
  private readonly seen = new Map<string, { oid: string; since: number }>();

  /** How long the owner ref has been seen on this commit. */
  watched(volumeId: string, oid: string): number {
    const seen = this.seen.get(volumeId);
    if (seen?.oid === oid) return monotonic() - seen.since;
    this.wrote(volumeId, oid, monotonic());
    return 0;
  }

  /**
   * This node's own record landed: the node knows it since it was sent, and
   * its mount stops serving a tenth of a lease before a watch from then is
   * over, so a later epoch on this node takes over from it without another.
   */
  wrote(volumeId: string, oid: string, sent: number): void {
    this.seen.set(volumeId, { oid, since: sent });
  }
}

/** The worker's one watch: every claim and collection of the process reads and extends it. */
export const nodeWatch = new OwnerWatch();
const RECORD_AUTHOR = "git-csi <git-csi@git.liken.sh>";

/**
 * A lease held by a batch renewal (renewal.ts), which pushes many owner refs
 * at once: the lease's own steps wait meanwhile.
 */
export interface HeldLease {
  readonly volumeId: string;
  /** The owner ref's oid this lease last wrote or read: the renewal's compare-and-swap expects it. */
  expected(): string;
  /** The renewed record to write, or undefined when the epoch holds nothing to renew (the refusal is kept). */
  renewal(): OwnerRecord | undefined;
  /** The renewal sent at `sent` (monotonic ms) landed as this commit. */
  took(oid: string, record: OwnerRecord, sent: number): void;
  /** The owner ref moved: the lease takes the record it holds now, already fetched ("" for none). */
  load(oid: string): Promise<void>;
}

/**
 * One mount session's ownership of a volume, held on the remote's owner ref:
 * claim_mount, renew_mount and release_mount of spec 000, each a
 * compare-and-swap, and the fence every push of the volume carries. The
 * worker keeps the oid it last wrote, so a renewal needs no fetch; steps run
 * one at a time.
 */
export class MountLease {
  private oid = "";
  private record?: OwnerRecord;
  /** Until when the mount may serve, by this process's monotonic clock: set by each renewal that lands. */
  private servingUntil?: number;
  /** Why the epoch lost the volume, for the operator, and the refusal it came from. */
  private lost?: string;
  private lostRefusal = gitWorker.LeaseRefusal.LEASE_REFUSAL_NONE;
  private readonly steps = new Serial();
  /** Staging refs the objects went ahead to that no landed push deleted yet, ref → the commit sent there. */
  private readonly sentAhead = new Map<string, string>();
  /** The repository's object directory, where this lease writes its records. */
  private objectsDir?: string;

  constructor(
    readonly holder: Holder,
    /** git in the URL's bare repository with extra environment, for the record commits. */
    private readonly local: (env?: Record<string, string>) => SimpleGit,
    private readonly watch: OwnerWatch = nodeWatch,
  ) {}

  claim(remote: OnRemote): Promise<gitWorker.MountLease> {
    return this.steps.run(async () => {
      // A lost epoch writes no record: another node may be waiting for the volume.
      if (this.lost) return this.state();
      const decision = await this.update(remote, true, (current, now) =>
        decideClaim(current, this.holder, { now, watchedMs: this.watch.watched(this.holder.volumeId, this.oid), serving: this.serving() }),
      );
      return this.outcome(decision);
    });
  }

  /** True when the owner ref no longer names this epoch as holding the volume. */
  release(remote: OnRemote): Promise<boolean> {
    return this.steps.run(async () => {
      const decision = await this.update(remote, this.oid === "", (current, now) => decideRelease(current, this.holder.epoch, now));
      if (!this.lost) {
        this.lost = "released";
        this.lostRefusal = gitWorker.LeaseRefusal.LEASE_REFUSAL_RELEASED;
      }
      return !("refuse" in decision);
    });
  }

  /** Runs a batch renewal's part once every earlier step of this lease finished; nothing else runs on the lease until it settles. */
  hold<T>(work: (held: HeldLease) => Promise<T>): Promise<T> {
    return this.steps.run(() =>
      work({
        volumeId: this.holder.volumeId,
        expected: () => this.oid,
        renewal: () => this.renewal(),
        took: (oid, record, sent) => this.took(oid, record, sent),
        load: (oid) => this.load(oid),
      }),
    );
  }

  /** renew_mount's decision for a batch: a refusal loses the epoch here, once. */
  private renewal(): OwnerRecord | undefined {
    // Never claimed (a restarted worker waits for its Secret): nothing on the remote to renew from.
    if (this.lost || !this.record) return undefined;
    const decision = decideRenew(this.record, this.holder, Date.now(), this.serving());
    if ("write" in decision) return decision.write;
    this.lose(decision);
    return undefined;
  }

  /**
   * Runs a push of the volume together with the owner ref's renewal, in one
   * atomic push: it lands only while this epoch still holds the volume.
   * Throws LeaseLost once the epoch expired or was superseded. The objects of
   * the changes it sends, when there are many, go ahead to staging refs first,
   * outside the lease's steps: the fenced push then only moves refs, so a
   * transfer longer than the lease never holds back its renewals.
   */
  async fenced(remote: OnRemote, push: (fence: Fence) => Promise<PushResult>, sends: RefChange[] = []): Promise<PushResult> {
    if (this.lost) throw new LeaseLost(this.lost);
    const staged = await remote((repo) => stageObjects(repo, this.holder.volumeId, sends));
    if (!Array.isArray(staged)) return staged;
    for (const s of staged) this.sentAhead.set(s.ref, s.expected);
    return this.steps.run(async () => {
      if (this.lost) throw new LeaseLost(this.lost);
      const decision = decideRenew(this.record, this.holder, Date.now(), this.serving());
      if (!("write" in decision)) throw this.lose(decision);
      const next = await this.commitRecord(decision.write);
      const sent = monotonic();
      const result = await push([{ ref: ownerRef(this.holder.volumeId), expected: this.oid, next }, ...staged]);
      if (result.outcome === "pushed") {
        this.took(next, decision.write, sent);
        for (const s of staged) this.sentAhead.delete(s.ref);
      } else if (result.outcome === "rejected") {
        // The data ref moved, or the owner ref did: only the latter loses the volume.
        await this.read(remote);
        const again = decideRenew(this.record, this.holder, Date.now(), this.serving());
        if (!("write" in again)) throw this.lose(again);
      }
      return result;
    });
  }

  /**
   * The staging refs no landed push deleted, forgotten here: a push that is
   * over deletes them itself, since a later push may send too little to
   * stage and so never replace them.
   */
  takeSentAhead(): ReadRef[] {
    const refs = [...this.sentAhead].map(([ref, expected]) => ({ ref, expected }));
    this.sentAhead.clear();
    return refs;
  }

  /**
   * The mount owner's word on how much longer its mount may serve, read on
   * this process's monotonic clock as it arrives (ClaimMount's
   * serving_left_ms): the lease never serves past it, and an epoch with none
   * left is expired, so its next claim or renewal is refused rather than
   * written. 0 is unknown and changes nothing. A restarted worker knows the
   * epoch's serving time from nothing else. The mount owner read it just
   * before the call, so this end comes after the mount's by the call's
   * transit: the mount's own fence, on CLOCK_BOOTTIME, stops the mount.
   */
  servesAtMost(servingLeftMs: number): void {
    if (servingLeftMs === 0) return;
    const until = monotonic() + Math.max(0, servingLeftMs);
    this.servingUntil = Math.min(this.servingUntil ?? Infinity, until);
  }

  /** True once a claim reached the owner ref (a restarted worker without its Secret has not). */
  get claimed(): boolean {
    return this.record !== undefined || this.lost !== undefined;
  }

  /** What the mount owner needs: whether to serve, and until when. */
  state(): gitWorker.MountLease {
    if (this.lost) return { held: false, serveUntilUnixMs: 0, refusal: this.lostRefusal, message: this.lost };
    // By this node's clock the mount stopped serving (its last renewal's time, or the mount owner's word before any): the report and the abnormal gauge say so before any renewal does.
    if (!this.serving()) return { held: false, serveUntilUnixMs: 0, refusal: REFUSALS.expired, message: describeRefusal({ refuse: "expired", record: this.record }, this.holder) };
    // Never claimed here (a restarted worker waits for its Secret): the mount serves on the time it was last given.
    if (!this.record || this.servingUntil === undefined) {
      return { held: false, serveUntilUnixMs: 0, refusal: gitWorker.LeaseRefusal.LEASE_REFUSAL_NONE, message: "the lease is renewed once a publish brings the volume's credential" };
    }
    // The proto carries a wall time: the monotonic deadline read as one now, on the same node; the mount owner turns it into CLOCK_BOOTTIME as it receives it.
    return { held: true, serveUntilUnixMs: Math.floor(Date.now() + this.servingUntil - monotonic()), refusal: gitWorker.LeaseRefusal.LEASE_REFUSAL_NONE, message: "" };
  }

  /**
   * Whether the mount may still serve. A lease that took no renewal and no
   * word of the mount owner's serving time is a restarted worker's,
   * continuing an epoch on the mount owner's word that it still serves.
   */
  private serving(): boolean {
    return this.servingUntil === undefined || monotonic() < this.servingUntil;
  }

  private lose(decision: Refused): LeaseLost {
    this.lostRefusal = REFUSALS[decision.refuse];
    this.lost = describeRefusal(decision, this.holder);
    return new LeaseLost(this.lost);
  }

  private outcome(decision: Decision): gitWorker.MountLease {
    if ("refuse" in decision) {
      // A claim refused because another epoch holds the volume leaves this one free to claim again later.
      if (decision.refuse === "taken" || decision.refuse === "access_mode") {
        return { held: false, serveUntilUnixMs: 0, refusal: REFUSALS[decision.refuse], message: describeRefusal(decision, this.holder) };
      }
      this.lose(decision);
    }
    return this.state();
  }

  /** Decides on the owner ref's record and writes the decision by compare-and-swap, again on a lost race. */
  private async update(remote: OnRemote, fetchFirst: boolean, decide: (current: OwnerRecord | undefined, now: number) => Decision): Promise<Decision> {
    for (let attempt = 0; attempt < CAS_ATTEMPTS; attempt++) {
      if (fetchFirst || attempt > 0) await this.read(remote);
      const decision = decide(this.record, Date.now());
      if (!("write" in decision)) return decision;
      const next = await this.commitRecord(decision.write);
      const volumeId = this.holder.volumeId;
      const sent = monotonic();
      const result = await remote((repo) => pushUpdates(repo, [{ ref: ownerRef(volumeId), expected: this.oid, next }]));
      if (result.outcome === "pushed") {
        this.took(next, decision.write, sent);
        return decision;
      }
      if (result.outcome === "failed") throw new RemoteError(`the push of ${ownerRef(volumeId)} failed: ${result.message}`);
    }
    throw new RemoteError(`${ownerRef(this.holder.volumeId)} kept moving under ${CAS_ATTEMPTS} compare-and-swap attempts`);
  }

  private async read(remote: OnRemote): Promise<void> {
    await this.load(await remote((repo) => fetchOwner(repo, this.holder.volumeId)));
  }

  private async load(oid: string): Promise<void> {
    this.oid = oid;
    if (this.oid === "") {
      this.record = undefined;
      return;
    }
    const message = await runGit(this.local(), ["show", "-s", "--format=%B", this.oid]);
    try {
      this.record = parseRecord(message);
    } catch (err) {
      if (!(err instanceof RecordError)) throw err;
      throw new RemoteError(`${ownerRef(this.holder.volumeId)} on the remote is not an owner record (${err.message}); if no node mounts the volume, delete that ref`);
    }
  }

  /** A record this epoch wrote landed; one that holds the volume lets the mount serve from when it was sent. */
  private took(oid: string, record: OwnerRecord, sent: number): void {
    this.oid = oid;
    this.record = record;
    this.watch.wrote(this.holder.volumeId, oid, sent);
    if (!record.released) this.servingUntil = sent + serveFor(this.holder.leaseMs);
  }

  /**
   * The record's commit, written by this process: a git process here sat
   * between every commit and its push. Where the objects go is asked of git
   * once a lease.
   */
  private async commitRecord(record: OwnerRecord): Promise<string> {
    this.objectsDir ??= (await runGit(this.local(), ["rev-parse", "--path-format=absolute", "--git-path", "objects"])).trim();
    return writeLooseObject(this.objectsDir, "commit", recordCommit(record));
  }
}

/**
 * git's empty tree, which every repository holds without writing it; the
 * worker's repositories are SHA-1 (`git init --bare`, and a clone keeps the
 * remote's format, which must match).
 */
const EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904";

/**
 * Scratch directories for the records' files, kept for reuse: a batch
 * renewal rewrites the same files in place, where creating and removing
 * hundreds of files every interval was most of an idle node's file system work.
 */
const idleScratch: string[] = [];

/**
 * Owner records as root commits of the empty tree (records replace each
 * other, so the remote keeps no history of renewals), in one git process
 * however many there are: a batch renewal writes one per volume.
 */
export async function writeRecords(git: SimpleGit, records: OwnerRecord[]): Promise<string[]> {
  const scratch = idleScratch.pop() ?? (await fs.mkdtemp(path.join(os.tmpdir(), "git-csi-records-")));
  try {
    return await writeObjects(
      git,
      scratch,
      "commit",
      records.map((record) => recordCommit(record)),
    );
  } finally {
    idleScratch.push(scratch);
  }
}

/** The commit object `git commit-tree` writes for a record, dated by the record's time. */
function recordCommit(record: OwnerRecord): string {
  const signature = `${RECORD_AUTHOR} ${Math.floor(record.time / 1000)} +0000`;
  return `tree ${EMPTY_TREE}\nauthor ${signature}\ncommitter ${signature}\n\n${formatRecord(record)}`;
}
