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

export type Refused = { refuse: Refusal; record: OwnerRecord | undefined };
export type Decision = { write: OwnerRecord } | { keep: OwnerRecord | undefined } | Refused;

/** Coordinator time: the writer's wall clock clamped by the durable floor. */
function recordTime(current: OwnerRecord | undefined, now: number): number {
  return Math.max(now, current?.time ?? 0);
}

function leaseFor(holder: Holder, time: number): OwnerRecord {
  return { volumeId: holder.volumeId, node: holder.node, epoch: holder.epoch, accessMode: holder.accessMode, time, expires: time + holder.leaseMs, released: false };
}

/** Whether the record's epoch owns the volume at time t. */
export function isActive(record: OwnerRecord | undefined, t: number): boolean {
  return record !== undefined && !record.released && t < record.expires;
}

/**
 * claim_mount: a new epoch takes a volume nobody holds (no record, released,
 * or expired); the same epoch again continues its lease while it is active.
 * An epoch whose lease ran out, that was released, or that another epoch
 * followed never comes back: only a new epoch takes the volume then.
 */
export function decideClaim(current: OwnerRecord | undefined, holder: Holder, now: number): { write: OwnerRecord } | Refused {
  const t = recordTime(current, now);
  if (current && current.accessMode !== holder.accessMode) return { refuse: "access_mode", record: current };
  if (current?.epoch === holder.epoch) return decideRenew(current, holder, now);
  if (isActive(current, t)) return { refuse: "taken", record: current };
  if (holder.continues) return { refuse: "superseded", record: current };
  return { write: leaseFor(holder, t) };
}

/**
 * renew_mount: only the epoch the record names, and only while its mount may
 * still serve: once the mount stopped serving it never serves again, so the
 * lease must run out for a successor rather than be kept alive.
 */
export function decideRenew(current: OwnerRecord | undefined, holder: Holder, now: number): { write: OwnerRecord } | Refused {
  const t = recordTime(current, now);
  if (!current || current.epoch !== holder.epoch) return { refuse: "superseded", record: current };
  if (current.released) return { refuse: "released", record: current };
  if (now >= serveUntil(current) || t >= current.expires) return { refuse: "expired", record: current };
  return { write: leaseFor(holder, t) };
}

/** release_mount: idempotent, and never clears another epoch's ownership. */
export function decideRelease(current: OwnerRecord | undefined, epoch: string, now: number): Decision {
  if (!current || current.epoch !== epoch || current.released) return { keep: current };
  const t = recordTime(current, now);
  return { write: { ...current, time: t, expires: t, released: true } };
}

/**
 * Whether an owner record is past the retention: no epoch held the volume
 * for that long. A released record expires at its release; an unreleased
 * one at the end of the lease its epoch last renewed, which a live epoch
 * keeps ahead of every synchronized clock, so its record is never past.
 */
export function pastRetention(record: OwnerRecord, now: number, retentionMs: number): boolean {
  return now >= record.expires + retentionMs;
}

/**
 * Until when the holder's mount may serve: the expiry less a tenth of the
 * lease, so a node whose clock runs up to that much behind another's stops
 * serving before the other can take the volume over.
 */
export function serveUntil(record: OwnerRecord): number {
  return record.expires - Math.floor((record.expires - record.time) / 10);
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
export function describeRefusal(refusal: Refusal, holder: Holder, record: OwnerRecord | undefined): string {
  // Never the epochs: they are the .rwo-session's contents, which no log shows.
  const owner = record ? `node ${record.node}` : "nobody";
  const until = record ? new Date(record.expires).toISOString() : "";
  switch (refusal) {
    case "taken":
      return `volume ${holder.volumeId} is held by ${owner} until ${until} unless it renews; an RWO volume has one mount session at a time. Stop the pod on ${record?.node} (unpublish and unstage the volume there), or wait for its lease to run out`;
    case "superseded":
      return `the mount epoch of volume ${holder.volumeId} on node ${holder.node} was taken over by ${owner}; this node's mount serves nothing more. Delete the pod on ${holder.node} so the volume is unpublished and unstaged here`;
    case "expired":
      return `the lease of the mount epoch of volume ${holder.volumeId} on node ${holder.node} ran out unrenewed at ${until}; an expired epoch never renews. Unpublish and unstage the volume (delete the pod), then stage it again`;
    case "released":
      return `the mount epoch of volume ${holder.volumeId} on node ${holder.node} was released; stage the volume again for a new epoch`;
    case "access_mode":
      return `volume ${holder.volumeId} is recorded as ${record?.accessMode} on the remote's owner ref; its access mode cannot change to ${holder.accessMode}`;
  }
}
