import assert from "node:assert/strict";
import { test } from "node:test";
import { servingClock } from "../src/fuse/binding";
import { type LiveSession, servingLeft } from "../src/sessions";

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
