import type { AccessModeName } from "@git-csi/protos";

/**
 * The ownership rules of spec 000, free of git: what claim_mount, renew_mount
 * and release_mount write to the volume's owner ref given what it holds now.
 * The ref's compare-and-swap makes each decision atomic; the model test
 * drives these functions through random interleavings.
 */

/** What the owner ref's commit records. */
export interface OwnerRecord {
  volumeId: string;
  node: string;
  epoch: string;
  accessMode: AccessModeName;
  /** The record's time: the writer's clock, never behind the previous record's (the time floor). */
  time: number;
  /** When the lease runs out unless renewed. */
  expires: number;
  released: boolean;
}

/** The mount session asking. */
export interface Holder {
  volumeId: string;
  node: string;
  epoch: string;
  accessMode: AccessModeName;
  leaseMs: number;
  /** The epoch may have served already: it may only continue a record that names it. */
  continues: boolean;
}

export type Refusal = "expired" | "released" | "taken" | "superseded" | "access_mode";

/** leftMs: how much longer a taker must watch the record unchanged ("taken"). */
export type Refused = { refuse: Refusal; record: OwnerRecord | undefined; leftMs?: number };
export type Decision = { write: OwnerRecord } | { keep: OwnerRecord | undefined } | Refused;

/**
 * The record's time, for people: the writer's wall clock, and always after
 * the previous record's. No decision reads it, but it makes each record's
 * commit new: a renewal that wrote the very commit the ref names would land
 * as "up to date" and move nothing a taker watches.
 */
function recordTime(current: OwnerRecord | undefined, now: number): number {
  return current ? Math.max(now, current.time + 1) : now;
}

function leaseFor(holder: Holder, time: number): OwnerRecord {
  return { volumeId: holder.volumeId, node: holder.node, epoch: holder.epoch, accessMode: holder.accessMode, time, expires: time + holder.leaseMs, released: false };
}

/** The lease an unreleased record's epoch holds: a length the writer set, not a time any reader compares its clock to. */
export function leaseOf(record: OwnerRecord): number {
  return record.expires - record.time;
}

/**
 * How long a node must have watched a record unchanged, by its own monotonic
 * clock, before it takes the volume from that record's epoch: the whole lease.
 */
export function watchLeft(record: OwnerRecord, watchedMs: number): number {
  return Math.max(0, leaseOf(record) - watchedMs);
}

/** What the claiming node knows by itself. */
export interface LocalView {
  /** Its wall clock, for the record's time alone. */
  now: number;
  /** How long it has seen the owner ref on this record, by its monotonic clock. */
  watchedMs: number;
  /** Whether the holder's own mount may still serve, by that clock. */
  serving: boolean;
}

/**
 * claim_mount: a new epoch takes a volume nobody holds (no record, or a
 * released one) at once, and one whose record it has watched unchanged for a
 * whole lease by its own clock: the holder's renewals stopped, so its mount
 * stopped serving (serveFor). The same epoch again continues while the
 * record names it. An epoch that was released or that another epoch
 * followed never comes back.
 */
export function decideClaim(current: OwnerRecord | undefined, holder: Holder, local: LocalView): { write: OwnerRecord } | Refused {
  if (current && current.accessMode !== holder.accessMode) return { refuse: "access_mode", record: current };
  if (current?.epoch === holder.epoch) return decideRenew(current, holder, local.now, local.serving);
  if (holder.continues) return { refuse: "superseded", record: current };
  const leftMs = current && !current.released ? watchLeft(current, local.watchedMs) : 0;
  if (leftMs > 0) return { refuse: "taken", record: current, leftMs };
  return { write: leaseFor(holder, recordTime(current, local.now)) };
}

/**
 * renew_mount: only the epoch the record names, and only while its mount may
 * still serve by the node's own clock: once the mount stopped serving it
 * never serves again, so the lease must run out for a successor rather than
 * be kept alive.
 */
export function decideRenew(current: OwnerRecord | undefined, holder: Holder, now: number, serving: boolean): { write: OwnerRecord } | Refused {
  if (!current || current.epoch !== holder.epoch) return { refuse: "superseded", record: current };
  if (current.released) return { refuse: "released", record: current };
  if (!serving) return { refuse: "expired", record: current };
  return { write: leaseFor(holder, recordTime(current, now)) };
}

/** release_mount: idempotent, and never clears another epoch's ownership. */
export function decideRelease(current: OwnerRecord | undefined, epoch: string, now: number): Decision {
  if (!current || current.epoch !== epoch || current.released) return { keep: current };
  const t = recordTime(current, now);
  return { write: { ...current, time: t, expires: t, released: true } };
}

/**
 * Whether the record's epoch may still hold the volume, by what this node
 * watched: unreleased and not yet seen unchanged for a whole lease. For the
 * collection, which deletes nothing such an epoch may still use.
 */
export function mayHold(record: OwnerRecord, watchedMs: number): boolean {
  return !record.released && watchLeft(record, watchedMs) > 0;
}

/**
 * Whether an owner record is past the retention: this node watched it
 * unchanged for that long after no epoch held the volume, at once for a
 * released record and a lease into the watch for an unreleased one.
 */
export function pastRetention(record: OwnerRecord, watchedMs: number, retentionMs: number): boolean {
  return watchedMs >= (record.released ? 0 : leaseOf(record)) + retentionMs;
}

/**
 * How long a mount may serve after the renewal that landed was sent, by the
 * holder's monotonic clock: the lease less a tenth, so a holder whose clock
 * runs up to that much slower than a taker's still stops serving before the
 * taker has watched a whole lease.
 */
export function serveFor(leaseMs: number): number {
  return leaseMs - Math.floor(leaseMs / 10);
}

const RECORD_TITLE = "git-csi owner record";

/** The commit message of an owner record: readable in `git log`, parsed back exactly. */
export function formatRecord(record: OwnerRecord): string {
  return [
    `${RECORD_TITLE} of ${record.volumeId}`,
    "",
    `volume: ${record.volumeId}`,
    `node: ${record.node}`,
    `epoch: ${record.epoch}`,
    `access-mode: ${record.accessMode}`,
    `time: ${record.time} (${new Date(record.time).toISOString()})`,
    `expires: ${record.expires} (${new Date(record.expires).toISOString()})`,
    `released: ${record.released}`,
    "",
  ].join("\n");
}

export class RecordError extends Error {}

export function parseRecord(message: string): OwnerRecord {
  const fields = new Map<string, string>();
  for (const line of message.split("\n")) {
    const match = /^([a-z-]+): (.*)$/.exec(line);
    if (match) fields.set(match[1]!, match[2]!);
  }
  const field = (name: string): string => {
    const value = fields.get(name);
    if (value === undefined) throw new RecordError(`the owner record has no ${name}`);
    return value;
  };
  const millis = (name: string): number => {
    const value = Number(field(name).split(" ")[0]);
    if (!Number.isSafeInteger(value)) throw new RecordError(`the owner record's ${name} is not a time`);
    return value;
  };
  const accessMode = field("access-mode");
  if (accessMode !== "ReadWriteOnce" && accessMode !== "ReadWriteOncePod") throw new RecordError(`the owner record's access-mode ${accessMode} is unknown`);
  const released = field("released");
  if (released !== "true" && released !== "false") throw new RecordError("the owner record's released is neither true nor false");
  return { volumeId: field("volume"), node: field("node"), epoch: field("epoch"), accessMode, time: millis("time"), expires: millis("expires"), released: released === "true" };
}

/** What an operator reads when the volume's ownership refuses a mount session. */
export function describeRefusal(refused: Refused, holder: Holder): string {
  // Never the epochs: they are the .rwo-session's contents, which no log shows.
  const { record } = refused;
  const owner = record ? `node ${record.node}` : "nobody";
  const seconds = (ms: number) => `${Math.ceil(ms / 1000)} s`;
  switch (refused.refuse) {
    case "taken":
      return `volume ${holder.volumeId} is held by ${owner}; an RWO volume has one mount session at a time. This node takes it over only once it has seen the owner record unchanged for a whole lease (${seconds(leaseOf(record!))}) by its own clock, ${seconds(refused.leftMs ?? 0)} from now if ${record?.node} renews no more. Stop the pod on ${record?.node} (unpublish and unstage the volume there), or wait`;
    case "superseded":
      return `the mount epoch of volume ${holder.volumeId} on node ${holder.node} was taken over by ${owner}; this node's mount serves nothing more. Delete the pod on ${holder.node} so the volume is unpublished and unstaged here`;
    case "expired":
      return `the lease of the mount epoch of volume ${holder.volumeId} on node ${holder.node} ran out unrenewed: no renewal landed within its serving time, by this node's clock; an expired epoch never renews. Delete the pod: once no pod on the node uses the mount, the volume is unstaged, or staged again with a new epoch by the next pod's publish on this node`;
    case "released":
      return `the mount epoch of volume ${holder.volumeId} on node ${holder.node} was released; stage the volume again for a new epoch`;
    case "access_mode":
      return `volume ${holder.volumeId} is recorded as ${record?.accessMode} on the remote's owner ref; its access mode cannot change to ${holder.accessMode}`;
  }
}
