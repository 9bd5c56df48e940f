import assert from "node:assert/strict";
import { test } from "node:test";
import { setImmediate as settle } from "node:timers/promises";
import { KeyedSerial, Serial } from "../src";

/** A piece of work that runs only when the test lets it finish, recording when it starts and ends. */
function gate(log: string[], name: string): { work: () => Promise<string>; finish: () => void; fail: (err: Error) => void } {
  let finish!: () => void;
  let fail!: (err: Error) => void;
  const done = new Promise<void>((resolve, reject) => {
    finish = resolve;
    fail = reject;
  });
  const work = async () => {
    log.push(`start ${name}`);
    try {
      await done;
    } finally {
      log.push(`end ${name}`);
    }
    return name;
  };
  return { work, finish: () => finish(), fail: (err) => fail(err) };
}

test("Serial runs work in arrival order, each after the one before settled", async () => {
  const log: string[] = [];
  const serial = new Serial();
  const [a, b, c] = ["a", "b", "c"].map((name) => gate(log, name));
  const results = [serial.run(a!.work), serial.run(b!.work), serial.run(c!.work)];
  await settle();
  assert.deepEqual(log, ["start a"]);
  c!.finish();
  b!.finish();
  await settle();
  assert.deepEqual(log, ["start a"], "b and c wait for a however soon they could finish");
  a!.finish();
  assert.deepEqual(await Promise.all(results), ["a", "b", "c"]);
  assert.deepEqual(log, ["start a", "end a", "start b", "end b", "start c", "end c"]);
});

test("a rejected piece of work rejects its own caller, the next one still runs, and idle waits for both", async () => {
  const log: string[] = [];
  const serial = new Serial();
  const [a, b] = ["a", "b"].map((name) => gate(log, name));
  const first = serial.run(a!.work);
  const second = serial.run(b!.work);
  let idle = false;
  const waiting = serial.idle().then(() => (idle = true));
  a!.fail(new Error("a failed"));
  await assert.rejects(first, /a failed/);
  await settle();
  assert.equal(idle, false, "idle before b settled");
  b!.finish();
  assert.equal(await second, "b");
  await waiting;
  assert.equal(idle, true);
  assert.deepEqual(log, ["start a", "end a", "start b", "end b"]);
});

test("KeyedSerial runs one key's work in order and other keys' work beside it", async () => {
  const log: string[] = [];
  const serial = new KeyedSerial();
  const [a1, a2, b1] = ["a1", "a2", "b1"].map((name) => gate(log, name));
  const a1Done = serial.run("a", a1!.work);
  const a2Done = serial.run("a", a2!.work);
  const b1Done = serial.run("b", b1!.work);
  await settle();
  assert.deepEqual(log, ["start a1", "start b1"], "b does not wait for a");
  b1!.finish();
  assert.equal(await b1Done, "b1");
  assert.deepEqual(log, ["start a1", "start b1", "end b1"], "a2 still waits for a1");
  a1!.fail(new Error("a1 failed"));
  await assert.rejects(a1Done, /a1 failed/);
  a2!.finish();
  assert.equal(await a2Done, "a2");
  assert.deepEqual(log, ["start a1", "start b1", "end b1", "end a1", "start a2", "end a2"]);
});

test("KeyedSerial serves a key again after its work is done", async () => {
  const serial = new KeyedSerial();
  assert.equal(await serial.run("a", () => Promise.resolve(1)), 1);
  await settle();
  await assert.rejects(
    serial.run("a", () => Promise.reject(new Error("second"))),
    /second/,
  );
  assert.equal(await serial.run("a", () => Promise.resolve(3)), 3);
});
