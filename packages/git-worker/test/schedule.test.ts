import assert from "node:assert/strict";
import { test } from "node:test";
import { type Clock, RETRY_MIN_MS, retryDelay, type ScheduledTrigger, SyncScheduler } from "../src/sync/schedule";

/** A clock that moves only when the test says, firing what falls due in time order. */
class FakeClock implements Clock {
  private time = 1_000_000;
  private timers: { at: number; fire: () => void; seq: number }[] = [];
  private seq = 0;

  now(): number {
    return this.time;
  }

  after(ms: number, fire: () => void): () => void {
    const timer = { at: this.time + ms, fire, seq: this.seq++ };
    this.timers.push(timer);
    return () => {
      this.timers = this.timers.filter((t) => t !== timer);
    };
  }

  advance(ms: number): void {
    const until = this.time + ms;
    for (;;) {
      const due = this.timers.filter((t) => t.at <= until).sort((a, b) => a.at - b.at || a.seq - b.seq)[0];
      if (!due) break;
      this.timers = this.timers.filter((t) => t !== due);
      this.time = due.at;
      due.fire();
    }
    this.time = until;
  }

  get waiting(): number {
    return this.timers.length;
  }
}

const TIMING = { quiesceMs: 2_000, maxLatencyMs: 10_000 };

/** A scheduler on a fake clock; a fired sync does what react says (by default nothing). */
function scheduler(work = { has: true }, react: (s: SyncScheduler) => void = () => undefined) {
  const clock = new FakeClock();
  const fired: { trigger: ScheduledTrigger; at: number }[] = [];
  const start = clock.now();
  const s: SyncScheduler = new SyncScheduler(
    clock,
    () => work.has,
    (trigger) => {
      fired.push({ trigger, at: clock.now() - start });
      react(s);
    },
  );
  return { clock, fired, s };
}

/** What a sync that pushed tells the scheduler while writes go on. */
function pushedWithWritesPending(s: SyncScheduler): void {
  s.syncStarts();
  s.pushStarts();
  s.pushed(true);
}

test("a write is committed after push.quiesce of quiet, and each write restarts the quiet", () => {
  const { clock, fired, s } = scheduler();
  s.arm(TIMING);
  s.wrote();
  clock.advance(1_500);
  s.wrote();
  clock.advance(1_999);
  assert.deepEqual(fired, [], "1.5 s and then 1.999 s of quiet are not push.quiesce");
  clock.advance(1);
  assert.deepEqual(fired, [{ trigger: "quiesce", at: 3_500 }]);
});

test("the quiet counts from when a write was made, not from when the watcher told of it", () => {
  const { clock, fired, s } = scheduler();
  s.arm(TIMING);
  s.wrote(clock.now());
  clock.advance(60);
  // A batch the watcher held 50 ms: its writes were made by 10.
  s.wrote(clock.now() - 50);
  clock.advance(TIMING.quiesceMs - 51);
  assert.deepEqual(fired, []);
  clock.advance(1);
  assert.deepEqual(fired, [{ trigger: "quiesce", at: 10 + TIMING.quiesceMs }]);
});

test("writes that never stop are pushed every push.maxLatency, counted from the oldest write the remote lacks", () => {
  const { clock, fired, s } = scheduler({ has: true }, pushedWithWritesPending);
  s.arm(TIMING);
  for (let t = 0; t < 25_000; t += 1_000) {
    s.wrote();
    clock.advance(1_000);
  }
  assert.deepEqual(fired, [
    { trigger: "maxLatency", at: 10_000 },
    { trigger: "maxLatency", at: 20_000 },
  ]);
});

test("after a push the latency bound starts again from the next write, and from the push for what is still pending", () => {
  const { clock, fired, s } = scheduler();
  s.arm(TIMING);
  s.wrote();
  clock.advance(500);
  pushedWithWritesPending(s);
  assert.equal(fired.length, 0, "the sync began by hand: neither timer fires for it");
  clock.advance(10_000);
  assert.deepEqual(fired, [{ trigger: "maxLatency", at: 10_500 }], "still pending at the push: the bound counts from the push");
});

test("a push that left nothing pending starts no latency timer; the next write does, from itself", () => {
  const work = { has: true };
  const { clock, fired, s } = scheduler(work);
  s.arm(TIMING);
  s.wrote();
  s.syncStarts();
  s.pushStarts();
  work.has = false;
  s.pushed(false);
  s.caughtUp();
  assert.equal(clock.waiting, 0, "nothing waits: no timer runs");
  clock.advance(60_000);
  work.has = true;
  s.wrote();
  clock.advance(TIMING.quiesceMs);
  assert.deepEqual(fired, [{ trigger: "quiesce", at: 62_000 }]);
});

test("a commit holding changes starts the latency bound from the commit when no write did", () => {
  const { clock, fired, s } = scheduler();
  s.arm(TIMING);
  clock.advance(3_000);
  s.committed();
  clock.advance(4_000);
  s.ensureLatency();
  clock.advance(5_999);
  assert.deepEqual(fired, []);
  clock.advance(1);
  assert.deepEqual(fired, [{ trigger: "maxLatency", at: 13_000 }]);
});

test("failures retry with doubling backoff from 5 s, capped by push.maxLatency, and a new failure replaces the retry", () => {
  assert.deepEqual(
    [1, 2, 3, 4].map((n) => retryDelay(n, 60_000)),
    [5_000, 10_000, 20_000, 40_000],
  );
  assert.equal(retryDelay(5, 60_000), 60_000, "never beyond push.maxLatency");
  assert.equal(retryDelay(40, 10 * 60_000), RETRY_MIN_MS * 2 ** 6, "the doubling stops at the seventh failure");
  assert.equal(retryDelay(3, undefined), RETRY_MIN_MS, "unarmed: the minimum");
  const { clock, fired, s } = scheduler();
  s.arm({ quiesceMs: 1_000, maxLatencyMs: 60_000 });
  s.failed(1);
  clock.advance(4_000);
  s.failed(2);
  clock.advance(9_999);
  assert.deepEqual(fired, [], "the second failure replaced the first retry");
  clock.advance(1);
  assert.deepEqual(fired, [{ trigger: "a failed commit or push", at: 14_000 }]);
});

test("an unarmed volume schedules nothing, and disarming cancels what was scheduled", () => {
  const { clock, fired, s } = scheduler();
  s.wrote();
  s.ensureLatency();
  assert.equal(clock.waiting, 0, "no class: no timer");
  s.arm(TIMING);
  s.wrote();
  s.failed(1);
  s.arm(undefined);
  s.disarm();
  clock.advance(60_000);
  assert.deepEqual(fired, []);
});

test("a stopped scheduler starts no timer and fires none it had", () => {
  const { clock, fired, s } = scheduler();
  s.arm(TIMING);
  s.wrote();
  s.stop();
  s.wrote();
  s.restartQuiesce();
  s.ensureLatency();
  clock.advance(60_000);
  assert.deepEqual(fired, []);
  assert.equal(clock.waiting, 0);
});
