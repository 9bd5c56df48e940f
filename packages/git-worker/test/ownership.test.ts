import * as assert from "node:assert/strict";
import { test } from "node:test";
import fc from "fast-check";
import { decideClaim, decideRelease, decideRenew, formatRecord, type Holder, type OwnerRecord, parseRecord, serveUntil } from "../src/lease/ownership";

const LEASE_MS = 90_000;

test("an owner record reads back exactly as it was written", () => {
  const record: OwnerRecord = { volumeId: "pvc-1", node: "node-a", epoch: "e1", accessMode: "ReadWriteOnce", time: 1_700_000_000_123, expires: 1_700_000_090_123, released: false };
  assert.deepEqual(parseRecord(formatRecord(record)), record);
  assert.throws(() => parseRecord("not a record"), /the owner record has no/);
});

test("claim, renew and release follow spec 000", () => {
  const a: Holder = { volumeId: "v", node: "a", epoch: "ea", accessMode: "ReadWriteOnce", leaseMs: LEASE_MS, continues: false };
  const b: Holder = { ...a, node: "b", epoch: "eb" };
  const claimed = decideClaim(undefined, a, 1000);
  assert.ok("write" in claimed);
  const held = claimed.write;
  assert.equal(held.expires, 1000 + LEASE_MS);
  // Another epoch, on this node or another, is refused while the lease lasts.
  assert.deepEqual(decideClaim(held, { ...a, epoch: "ea2" }, 2000), { refuse: "taken", record: held });
  assert.deepEqual(decideClaim(held, b, 2000), { refuse: "taken", record: held });
  // The other access mode is refused even after expiry: the mode is immutable.
  assert.equal((decideClaim(held, { ...b, accessMode: "ReadWriteOncePod" }, 1_000_000) as { refuse: string }).refuse, "access_mode");
  // The time floor: a clock that fell behind does not shorten the lease.
  const renewed = decideRenew(held, a, 500);
  assert.ok("write" in renewed && renewed.write.time === 1000 && renewed.write.expires === 1000 + LEASE_MS);
  // After expiry: the epoch never renews or reclaims; another takes over.
  assert.equal((decideRenew(held, a, held.expires) as { refuse: string }).refuse, "expired");
  assert.equal((decideClaim(held, a, held.expires) as { refuse: string }).refuse, "expired");
  const taken = decideClaim(held, b, held.expires);
  assert.ok("write" in taken && taken.write.epoch === "eb");
  // Release is idempotent and never clears a successor.
  assert.deepEqual(decideRelease(taken.write, "ea", held.expires + 1), { keep: taken.write });
  const released = decideRelease(taken.write, "eb", held.expires + 1);
  assert.ok("write" in released && released.write.released);
  assert.deepEqual(decideRelease(released.write, "eb", held.expires + 2), { keep: released.write });
  assert.equal((decideRenew(released.write, b, held.expires + 2) as { refuse: string }).refuse, "released");
  // A restarted worker or mount owner claims the epoch it had again: another epoch followed it, so it never comes back.
  assert.equal((decideClaim(released.write, { ...a, continues: true }, held.expires + 3) as { refuse: string }).refuse, "superseded");
  assert.equal((decideClaim(undefined, { ...a, continues: true }, 0) as { refuse: string }).refuse, "superseded");
  assert.ok("write" in decideClaim(released.write, { ...a, epoch: "ea2" }, held.expires + 3));
  assert.equal(serveUntil(held), held.expires - LEASE_MS / 10);
  // Past the serving margin the epoch no longer renews: its mount stopped serving for good.
  assert.equal((decideRenew(held, a, serveUntil(held)) as { refuse: string }).refuse, "expired");
});

/**
 * The model: three nodes, one owner ref. The ref is a compare-and-swap
 * register, as a forge's ref store is. Each node follows what the mount owner
 * and the git worker do: claim with a new epoch, renew on the record it last
 * wrote, push fenced by the owner ref, serve FUSE operations only while its
 * lease lasts by its own clock, and unstage (release) once it lost the volume.
 * A restart claims the epoch the node serves again, as the mount owner does
 * for a git worker that restarted; a lost epoch is never handed over.
 */
type Op = { kind: "advance"; ms: number } | { kind: "skew"; node: number; ms: number } | { kind: "claim" | "restart" | "renew" | "push" | "write" | "unstage"; node: number };

interface Session {
  holder: Holder;
  version: number;
  record: OwnerRecord;
  serveUntil: number;
  lost: boolean;
}

/** checkServing: clocks are close enough that serving by a node's own clock must be exclusive too. */
function runModel(ops: Op[], maxSkewMs: number, checkServing: boolean): void {
  const model = new Model(maxSkewMs, checkServing);
  for (const op of ops) {
    model.apply(op);
    // Never two current epochs: at most one node serves at any moment.
    if (checkServing) assert.ok([0, 1, 2].filter((n) => model.believes(n)).length <= 1, `two nodes serve at once: ${JSON.stringify(model.sessions)}`);
  }
}

/** Three nodes, one owner ref as a compare-and-swap register, and a real time each node sees with its skew. */
class Model {
  private realTime = 1_000_000;
  private readonly register: { version: number; record?: OwnerRecord } = { version: 0 };
  private readonly skew = [0, 0, 0];
  readonly sessions: (Session | undefined)[] = [undefined, undefined, undefined];
  private readonly superseded = new Set<string>();
  private epochs = 0;

  constructor(
    private readonly maxSkewMs: number,
    private readonly checkServing: boolean,
  ) {}

  apply(op: Op): void {
    if (op.kind === "advance") this.realTime += op.ms;
    else if (op.kind === "skew") this.skew[op.node] = Math.max(-this.maxSkewMs, Math.min(this.maxSkewMs, op.ms));
    else {
      const s = this.sessions[op.node];
      if (op.kind === "claim" && !s) this.claim(op.node);
      else if (op.kind === "restart" && s && !s.lost) this.restart(op.node, s);
      else if (op.kind === "renew" && s && !s.lost) {
        if (this.clock(op.node) >= s.serveUntil) s.lost = true;
        else this.fencedRenewal(op.node);
      } else if (op.kind === "push" && s && !s.lost) this.push(op.node, s);
      else if (op.kind === "write" && s) this.write(op.node, s);
      else if (op.kind === "unstage" && s) this.unstage(op.node, s);
    }
  }

  believes(node: number): boolean {
    const s = this.sessions[node];
    return s !== undefined && !s.lost && this.clock(node) < s.serveUntil;
  }

  private clock(node: number): number {
    return this.realTime + this.skew[node]!;
  }

  private cas(expected: number, record: OwnerRecord): boolean {
    if (this.register.version !== expected) return false;
    if (this.register.record && this.register.record.epoch !== record.epoch) this.superseded.add(this.register.record.epoch);
    this.register.version++;
    this.register.record = record;
    return true;
  }

  private claim(node: number): void {
    const holder: Holder = { volumeId: "v", node: `n${node}`, epoch: `e${++this.epochs}`, accessMode: "ReadWriteOnce", leaseMs: LEASE_MS, continues: false };
    const version = this.register.version;
    const decision = decideClaim(this.register.record, holder, this.clock(node));
    if ("write" in decision && this.cas(version, decision.write)) {
      this.sessions[node] = { holder, version: this.register.version, record: decision.write, serveUntil: serveUntil(decision.write), lost: false };
    }
  }

  private restart(node: number, s: Session): void {
    const version = this.register.version;
    const decision = decideClaim(this.register.record, { ...s.holder, continues: true }, this.clock(node));
    if (!("write" in decision)) s.lost = true;
    else {
      assert.ok(!this.superseded.has(s.holder.epoch), `superseded epoch ${s.holder.epoch} took the volume back`);
      if (this.cas(version, decision.write)) {
        s.version = this.register.version;
        s.record = decision.write;
        s.serveUntil = serveUntil(decision.write);
      }
    }
  }

  /** A fenced step: renewal from the record last written, one fetch and decision again on a lost race. */
  private fencedRenewal(node: number): boolean {
    const s = this.sessions[node]!;
    for (let attempt = 0; attempt < 2; attempt++) {
      const decision = decideRenew(s.record, s.holder, this.clock(node));
      if (!("write" in decision)) {
        s.lost = true;
        return false;
      }
      if (this.cas(s.version, decision.write)) {
        s.version = this.register.version;
        s.record = decision.write;
        s.serveUntil = serveUntil(decision.write);
        return true;
      }
      if (!this.register.record) {
        s.lost = true;
        return false;
      }
      s.version = this.register.version;
      s.record = this.register.record;
    }
    return false;
  }

  private push(node: number, s: Session): void {
    const epoch = s.holder.epoch;
    if (!this.fencedRenewal(node)) return;
    // The push landed atomically with the renewal: the register names its epoch.
    assert.equal(this.register.record?.epoch, epoch);
    assert.ok(!this.superseded.has(epoch), `a push of superseded epoch ${epoch} landed`);
  }

  private write(node: number, s: Session): void {
    if (!this.believes(node)) {
      s.lost = true;
      return;
    }
    if (!this.checkServing) return;
    assert.equal(this.register.record?.epoch, s.holder.epoch, `node ${node} served a write for epoch ${s.holder.epoch} while the owner ref names ${this.register.record?.epoch}`);
    assert.ok(!this.register.record?.released);
  }

  private unstage(node: number, s: Session): void {
    const decision = decideRelease(this.register.record, s.holder.epoch, this.clock(node));
    if ("write" in decision) this.cas(this.register.version, decision.write);
    this.sessions[node] = undefined;
  }
}

const node = fc.integer({ min: 0, max: 2 });
const opOf = (maxSkewMs: number) =>
  fc.oneof(
    fc.record({ kind: fc.constant("advance" as const), ms: fc.integer({ min: 0, max: LEASE_MS }) }),
    fc.record({ kind: fc.constant("skew" as const), node, ms: fc.integer({ min: -maxSkewMs, max: maxSkewMs }) }),
    fc.record({ kind: fc.constantFrom("claim" as const, "restart" as const, "renew" as const, "push" as const, "write" as const, "unstage" as const), node }),
  );

test("model: clocks within half the serving margin of each other never give two serving epochs, and no stale epoch's push or write is accepted", () => {
  const maxSkewMs = LEASE_MS / 20;
  fc.assert(
    fc.property(fc.array(opOf(maxSkewMs), { minLength: 1, maxLength: 200, size: "max" }), (ops) => runModel(ops, maxSkewMs, true)),
    { numRuns: 2000 },
  );
});

test("model: with clocks far apart a node may serve too long, but the owner ref still never accepts a superseded epoch's push", () => {
  const maxSkewMs = LEASE_MS * 2;
  fc.assert(
    fc.property(fc.array(opOf(maxSkewMs), { minLength: 1, maxLength: 200, size: "max" }), (ops) => runModel(ops, maxSkewMs, false)),
    { numRuns: 2000 },
  );
});
