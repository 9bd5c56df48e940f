import * as assert from "node:assert/strict";
import { test } from "node:test";
import fc from "fast-check";
import { decideClaim, decideRelease, decideRenew, formatRecord, type Holder, type OwnerRecord, parseRecord, serveUntil } from "../src/ownership";

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
  let realTime = 1_000_000;
  const register: { version: number; record?: OwnerRecord } = { version: 0 };
  const skew = [0, 0, 0];
  const sessions: (Session | undefined)[] = [undefined, undefined, undefined];
  const superseded = new Set<string>();
  let epochs = 0;
  const clock = (node: number) => realTime + skew[node]!;

  const cas = (expected: number, record: OwnerRecord): boolean => {
    if (register.version !== expected) return false;
    if (register.record && register.record.epoch !== record.epoch) superseded.add(register.record.epoch);
    register.version++;
    register.record = record;
    return true;
  };
  const believes = (node: number) => {
    const s = sessions[node];
    return s !== undefined && !s.lost && clock(node) < s.serveUntil;
  };
  /** A fenced step: renewal from the record last written, one fetch and decision again on a lost race. */
  const fencedRenewal = (node: number): boolean => {
    const s = sessions[node]!;
    for (let attempt = 0; attempt < 2; attempt++) {
      const decision = decideRenew(s.record, s.holder, clock(node));
      if (!("write" in decision)) {
        s.lost = true;
        return false;
      }
      if (cas(s.version, decision.write)) {
        s.version = register.version;
        s.record = decision.write;
        s.serveUntil = serveUntil(decision.write);
        return true;
      }
      if (!register.record) {
        s.lost = true;
        return false;
      }
      s.version = register.version;
      s.record = register.record;
    }
    return false;
  };

  for (const op of ops) {
    if (op.kind === "advance") realTime += op.ms;
    else if (op.kind === "skew") skew[op.node] = Math.max(-maxSkewMs, Math.min(maxSkewMs, op.ms));
    else {
      const node = op.node;
      const s = sessions[node];
      if (op.kind === "claim" && !s) {
        const holder: Holder = { volumeId: "v", node: `n${node}`, epoch: `e${++epochs}`, accessMode: "ReadWriteOnce", leaseMs: LEASE_MS, continues: false };
        const version = register.version;
        const decision = decideClaim(register.record, holder, clock(node));
        if ("write" in decision && cas(version, decision.write)) {
          sessions[node] = { holder, version: register.version, record: decision.write, serveUntil: serveUntil(decision.write), lost: false };
        }
      } else if (op.kind === "restart" && s && !s.lost) {
        const version = register.version;
        const decision = decideClaim(register.record, { ...s.holder, continues: true }, clock(node));
        if (!("write" in decision)) s.lost = true;
        else {
          assert.ok(!superseded.has(s.holder.epoch), `superseded epoch ${s.holder.epoch} took the volume back`);
          if (cas(version, decision.write)) {
            s.version = register.version;
            s.record = decision.write;
            s.serveUntil = serveUntil(decision.write);
          }
        }
      } else if (op.kind === "renew" && s && !s.lost) {
        if (clock(node) >= s.serveUntil) s.lost = true;
        else fencedRenewal(node);
      } else if (op.kind === "push" && s && !s.lost) {
        const epoch = s.holder.epoch;
        if (fencedRenewal(node)) {
          // The push landed atomically with the renewal: the register names its epoch.
          assert.equal(register.record?.epoch, epoch);
          assert.ok(!superseded.has(epoch), `a push of superseded epoch ${epoch} landed`);
        }
      } else if (op.kind === "write" && s) {
        if (believes(node)) {
          if (!checkServing) continue;
          assert.equal(register.record?.epoch, s.holder.epoch, `node ${node} served a write for epoch ${s.holder.epoch} while the owner ref names ${register.record?.epoch}`);
          assert.ok(!register.record?.released);
        } else {
          s.lost = true;
        }
      } else if (op.kind === "unstage" && s) {
        const decision = decideRelease(register.record, s.holder.epoch, clock(node));
        if ("write" in decision) cas(register.version, decision.write);
        sessions[node] = undefined;
      }
    }
    // Never two current epochs: at most one node serves at any moment.
    if (checkServing) assert.ok([0, 1, 2].filter(believes).length <= 1, `two nodes serve at once: ${JSON.stringify(sessions)}`);
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
