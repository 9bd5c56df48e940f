import assert from "node:assert/strict";
import { test } from "node:test";
import { servingClock } from "../src/fuse/binding";
import { createLogger } from "@git-csi/logging";
import { OperationMetrics } from "@git-csi/metrics";
import { gitWorker } from "@git-csi/protos";
import { type LiveSession, MountSessions, servingLeft } from "../src/sessions";

/** A session as the hand-over reads it: only its serving time and loss count. */
function session(serveUntil: number, lost?: string): LiveSession {
  const mount = { unmount: async () => undefined, serveUntil: () => undefined, fence: () => undefined, sync: async () => false, invalidate: () => undefined, switchRoot: () => undefined };
  return { stagingPath: "/staging", mount, workerInstance: "", epoch: "e", serveUntil, lost };
}

test("a restarted git worker is told the mount's serving time left on CLOCK_BOOTTIME, none once it is over or lost, and unknown without a session", () => {
  const before = servingClock();
  const left = servingLeft(session(before + 5_000));
  assert.ok(left > 0 && left <= 5_000, `${left} ms left`);
  assert.equal(servingLeft(session(servingClock())), -1, "a deadline reached leaves none");
  assert.equal(servingLeft(session(servingClock() - 1_000)), -1);
  assert.equal(servingLeft(session(servingClock() + 5_000, "the lease ran out unrenewed")), -1, "a lost epoch has none, whatever its deadline said");
  assert.equal(servingLeft(undefined), 0, "a mount owner that restarted does not know");
  assert.equal(servingLeft(session(Infinity)), 0, "a mount without a lease's end tells nothing");
});

test("an unstage's session is renewed while it flushes, but no publish sees it; a renewal answered after its end changes nothing", () => {
  const sessions = new MountSessions(createLogger("test", "error"), new OperationMetrics());
  const live = session(servingClock() + 5_000);
  sessions.add("v", live);
  assert.equal(sessions.leave("v"), live);
  assert.equal(sessions.get("v"), undefined, "no publish binds to a stage whose mount is gone");
  assert.equal(sessions.has("v"), false);
  assert.deepEqual(sessions.renewed(), [["v", live]], "the renewal keeps it");
  assert.equal(sessions.leave("v"), live, "a retried unstage finds it again");
  const held = { held: true, refusal: gitWorker.LeaseRefusal.LEASE_REFUSAL_NONE, serveUntilUnixMs: Date.now() + 60_000, message: "" } as gitWorker.MountLease;
  sessions.applyLease("v", live, held);
  assert.ok(live.serveUntil > servingClock() + 30_000, "the leaving session serves longer");
  sessions.end("v");
  assert.deepEqual(sessions.renewed(), []);
  const before = live.serveUntil;
  sessions.applyLease("v", live, { ...held, serveUntilUnixMs: Date.now() + 120_000 });
  sessions.applyLease("v", live, { ...held, held: false, refusal: gitWorker.LeaseRefusal.LEASE_REFUSAL_SUPERSEDED, message: "taken" });
  assert.equal(live.serveUntil, before, "an ended session's deadline stays");
  assert.equal(live.lost, undefined, "an ended session is not fenced by a late answer");
});
