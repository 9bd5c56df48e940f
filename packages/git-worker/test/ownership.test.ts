import * as assert from "node:assert/strict";
import { test } from "node:test";
import fc from "fast-check";
import { decideClaim, decideRelease, decideRenew, formatRecord, type Holder, type OwnerRecord, parseRecord, serveFor } from "../src/lease/ownership";

const LEASE_MS = 90_000;

test("an owner record reads back exactly as it was written", () => {
  const record: OwnerRecord = { volumeId: "pvc-1", node: "node-a", epoch: "e1", accessMode: "ReadWriteOnce", time: 1_700_000_000_123, expires: 1_700_000_090_123, released: false };
  assert.deepEqual(parseRecord(formatRecord(record)), record);
  assert.throws(() => parseRecord("not a record"), /the owner record has no/);
});

test("claim, renew and release follow spec 000, and no decision reads a wall clock", () => {
  const a: Holder = { volumeId: "v", node: "a", epoch: "ea", accessMode: "ReadWriteOnce", leaseMs: LEASE_MS, continues: false };
  const b: Holder = { ...a, node: "b", epoch: "eb" };
  const claimed = decideClaim(undefined, a, { now: 1000, watchedMs: 0, serving: true });
  assert.ok("write" in claimed);
  const held = claimed.write;
  assert.equal(held.expires, 1000 + LEASE_MS);
  // Another epoch, on this node or another, is refused until it has watched the record unchanged for a whole lease.
  assert.deepEqual(decideClaim(held, { ...a, epoch: "ea2" }, { now: 2000, watchedMs: 0, serving: true }), { refuse: "taken", record: held, leftMs: LEASE_MS });
  assert.deepEqual(decideClaim(held, b, { now: 2000, watchedMs: LEASE_MS - 1, serving: true }), { refuse: "taken", record: held, leftMs: 1 });
  // A taker's wall clock an hour ahead changes nothing: the record's times decide nothing.
  assert.equal((decideClaim(held, b, { now: held.expires + 3_600_000, watchedMs: 10, serving: true }) as { refuse: string }).refuse, "taken");
  // The other access mode is refused whatever was watched: the mode is immutable.
  assert.equal((decideClaim(held, { ...b, accessMode: "ReadWriteOncePod" }, { now: 2000, watchedMs: LEASE_MS, serving: true }) as { refuse: string }).refuse, "access_mode");
  // The record's time, for people, always moves on: a writer whose clock is behind writes just after the last record's, so each record is a new commit.
  const renewed = decideRenew(held, a, 500, true);
  assert.ok("write" in renewed && renewed.write.time === 1001 && renewed.write.expires === 1001 + LEASE_MS);
  // Once its mount stopped serving by its own clock, the epoch never renews or reclaims; another takes over after its watch.
  assert.equal((decideRenew(held, a, 0, false) as { refuse: string }).refuse, "expired");
  assert.equal((decideClaim(held, a, { now: 0, watchedMs: 0, serving: false }) as { refuse: string }).refuse, "expired");
  const taken = decideClaim(held, b, { now: 0, watchedMs: LEASE_MS, serving: true });
  assert.ok("write" in taken && taken.write.epoch === "eb" && taken.write.time === 1001);
  // Release is idempotent and never clears a successor.
  assert.deepEqual(decideRelease(taken.write, "ea", 3000), { keep: taken.write });
  const released = decideRelease(taken.write, "eb", 3000);
  assert.ok("write" in released && released.write.released);
  assert.deepEqual(decideRelease(released.write, "eb", 4000), { keep: released.write });
  assert.equal((decideRenew(released.write, b, 4000, true) as { refuse: string }).refuse, "released");
  // A released volume is taken at once, with nothing watched.
  assert.ok("write" in decideClaim(released.write, { ...a, epoch: "ea2" }, { now: 5000, watchedMs: 0, serving: true }));
  // A restarted worker or mount owner claims the epoch it had again: another epoch followed it, so it never comes back.
  assert.equal((decideClaim(released.write, { ...a, continues: true }, { now: 5000, watchedMs: LEASE_MS, serving: true }) as { refuse: string }).refuse, "superseded");
  assert.equal((decideClaim(undefined, { ...a, continues: true }, { now: 0, watchedMs: 0, serving: true }) as { refuse: string }).refuse, "superseded");
  // A continuing epoch another epoch followed is superseded, never told it may take the volume over later.
  assert.equal((decideClaim(held, { ...b, epoch: "eb-old", continues: true }, { now: 0, watchedMs: 0, serving: true }) as { refuse: string }).refuse, "superseded");
  // The mount serves a tenth less than the lease after the renewal was sent.
  assert.equal(serveFor(LEASE_MS), LEASE_MS - LEASE_MS / 10);
});

/**
 * The model: three nodes, one owner ref. The ref is a compare-and-swap
 * register, as a forge's ref store is. Each node has a wall clock with any
 * skew, which the rules must never need, and a monotonic clock whose rate
 * differs from real time by up to 4%. A node follows what the mount owner
 * and the git worker do: claim with a new epoch once it has watched the
 * record unchanged for a lease, send renewals (alone, or with a push) that
 * land later while others act, serve FUSE operations only until its last
 * landed renewal's send time plus serveFor, and unstage (release) once it
 * lost the volume. A restart claims the epoch the node serves again, as the
 * mount owner does for a git worker that restarted.
 */
type Op = { kind: "advance"; ms: number } | { kind: "skew"; node: number; ms: number } | { kind: "claim" | "restart" | "send" | "push" | "land" | "write" | "unstage"; node: number };

interface Session {
  holder: Holder;
  version: number;
  record: OwnerRecord;
  /** By the node's monotonic clock. */
  serveUntil: number;
  lost: boolean;
  /** A renewal on its way to the remote: the record, the version it expects, when it was sent, and whether it carries a push. */
  inflight?: { record: OwnerRecord; expected: number; sent: number; push: boolean };
}

class Model {
  private realTime = 1_000_000;
  private readonly register: { version: number; record?: OwnerRecord } = { version: 0 };
  private readonly skew = [0, 0, 0];
  /** Each node's watch of the register: the version it saw and since when, by its monotonic clock. */
  private readonly watch: ({ version: number; since: number } | undefined)[] = [undefined, undefined, undefined];
  readonly sessions: (Session | undefined)[] = [undefined, undefined, undefined];
  private readonly superseded = new Set<string>();
  private epochs = 0;

  /** rates: each node's monotonic clock rate, per mille of real time. */
  constructor(private readonly rates: number[]) {}

  apply(op: Op): void {
    if (op.kind === "advance") this.realTime += op.ms;
    else if (op.kind === "skew") this.skew[op.node] = op.ms;
    else {
      const s = this.sessions[op.node];
      if (op.kind === "claim" && !s) this.claim(op.node);
      else if (s && op.kind !== "claim") this.step(op.kind, op.node, s);
    }
  }

  believes(node: number): boolean {
    const s = this.sessions[node];
    return s !== undefined && !s.lost && this.monotonic(node) < s.serveUntil;
  }

  private step(kind: "restart" | "send" | "push" | "land" | "write" | "unstage", node: number, s: Session): void {
    if (kind === "write") this.write(node, s);
    else if (kind === "land" && s.inflight) this.land(node, s, s.inflight);
    else if (s.inflight) return;
    else if (kind === "unstage") this.unstage(node, s);
    else if (s.lost) return;
    else if (!this.believes(node)) s.lost = true;
    else if (kind === "restart") this.restart(node, s);
    else this.send(node, s, kind === "push");
  }

  private monotonic(node: number): number {
    return Math.floor((this.realTime * this.rates[node]!) / 1000);
  }

  private wall(node: number): number {
    return this.realTime + this.skew[node]!;
  }

  /** A ref names a commit, and a commit is its content: writing the record the ref already names lands "up to date" and moves nothing. */
  private cas(expected: number, record: OwnerRecord): boolean {
    if (this.register.version !== expected) return false;
    if (formatRecord(record) === (this.register.record && formatRecord(this.register.record))) return true;
    if (this.register.record && this.register.record.epoch !== record.epoch) this.superseded.add(this.register.record.epoch);
    this.register.version++;
    this.register.record = record;
    return true;
  }

  /** A fetch of the owner ref: how long this node has seen it on one version. */
  private watched(node: number): number {
    const seen = this.watch[node];
    if (seen?.version === this.register.version) return this.monotonic(node) - seen.since;
    this.watch[node] = { version: this.register.version, since: this.monotonic(node) };
    return 0;
  }

  private claim(node: number): void {
    const holder: Holder = { volumeId: "v", node: `n${node}`, epoch: `e${++this.epochs}`, accessMode: "ReadWriteOnce", leaseMs: LEASE_MS, continues: false };
    const version = this.register.version;
    const sent = this.monotonic(node);
    const decision = decideClaim(this.register.record, holder, { now: this.wall(node), watchedMs: this.watched(node), serving: true });
    if ("write" in decision && this.cas(version, decision.write)) {
      this.sessions[node] = { holder, version: this.register.version, record: decision.write, serveUntil: sent + serveFor(LEASE_MS), lost: false };
    }
  }

  /** The git worker restarted: its claim of the same epoch, from the record on the remote, lands at once. */
  private restart(node: number, s: Session): void {
    const version = this.register.version;
    const sent = this.monotonic(node);
    const decision = decideClaim(this.register.record, { ...s.holder, continues: true }, { now: this.wall(node), watchedMs: this.watched(node), serving: true });
    if (!("write" in decision)) {
      s.lost = true;
      return;
    }
    assert.ok(!this.superseded.has(s.holder.epoch), `superseded epoch ${s.holder.epoch} took the volume back`);
    if (this.cas(version, decision.write)) this.took(s, decision.write, sent);
  }

  /** A renewal (with a push, or alone) decided on the record the node last wrote, sent now, landing at a later "land". */
  private send(node: number, s: Session, push: boolean): void {
    const decision = decideRenew(s.record, s.holder, this.wall(node), true);
    if (!("write" in decision)) s.lost = true;
    else s.inflight = { record: decision.write, expected: s.version, sent: this.monotonic(node), push };
  }

  private land(node: number, s: Session, inflight: NonNullable<Session["inflight"]>): void {
    s.inflight = undefined;
    if (!this.cas(inflight.expected, inflight.record)) {
      // The owner ref moved: the node fetches it and decides again at its next send.
      if (this.register.record?.epoch !== s.holder.epoch || this.register.record.released) s.lost = true;
      else [s.version, s.record] = [this.register.version, this.register.record];
      return;
    }
    this.took(s, inflight.record, inflight.sent);
    // The push landed atomically with the renewal: the register names its epoch, never a superseded one.
    if (inflight.push) assert.ok(!this.superseded.has(s.holder.epoch), `a push of superseded epoch ${s.holder.epoch} landed (node ${node})`);
  }

  private took(s: Session, record: OwnerRecord, sent: number): void {
    s.version = this.register.version;
    s.record = record;
    s.serveUntil = sent + serveFor(LEASE_MS);
  }

  private write(node: number, s: Session): void {
    if (!this.believes(node)) {
      s.lost = true;
      return;
    }
    assert.equal(this.register.record?.epoch, s.holder.epoch, `node ${node} served a write for epoch ${s.holder.epoch} while the owner ref names ${this.register.record?.epoch}`);
    assert.ok(!this.register.record?.released);
  }

  private unstage(node: number, s: Session): void {
    const decision = decideRelease(this.register.record, s.holder.epoch, this.wall(node));
    if ("write" in decision) this.cas(this.register.version, decision.write);
    this.sessions[node] = undefined;
  }
}

const node = fc.integer({ min: 0, max: 2 });
const ops = fc.array(
  fc.oneof(
    fc.record({ kind: fc.constant("advance" as const), ms: fc.integer({ min: 0, max: LEASE_MS }) }),
    fc.record({ kind: fc.constant("skew" as const), node, ms: fc.integer({ min: -3_600_000, max: 3_600_000 }) }),
    fc.record({ kind: fc.constantFrom("claim" as const, "restart" as const, "send" as const, "push" as const, "land" as const, "write" as const, "unstage" as const), node }),
  ),
  { minLength: 1, maxLength: 200, size: "max" },
);
const rates = fc.array(fc.integer({ min: 960, max: 1040 }), { minLength: 3, maxLength: 3 });

test("model: wall clocks an hour apart and monotonic clocks 4% apart never give two serving epochs, and no stale epoch's push or write is accepted", () => {
  fc.assert(
    fc.property(rates, ops, (rates, ops) => {
      const model = new Model(rates);
      for (const op of ops) {
        model.apply(op);
        assert.ok([0, 1, 2].filter((n) => model.believes(n)).length <= 1, `two nodes serve at once: ${JSON.stringify(model.sessions)}`);
      }
    }),
    { numRuns: 2000 },
  );
});
