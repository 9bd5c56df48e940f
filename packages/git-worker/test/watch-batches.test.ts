import assert from "node:assert/strict";
import * as fs from "node:fs/promises";
import * as path from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { test } from "node:test";
import watcher from "@parcel/watcher";
import { WatchBatches } from "../src/sync/watch-batches";
import { tempDir } from "./remote";

test("a batch held by the watcher counts from MIN_WAIT before it came; one after a long quiet from when it came", () => {
  const batches = new WatchBatches();
  assert.equal(batches.writtenBy(10_000), 10_000, "the first batch goes out at once");
  assert.equal(batches.writtenBy(10_060), 10_010, "60 ms later: held 50 ms for quiet");
  assert.equal(batches.writtenBy(10_460), 10_460, "400 ms after the last: maybe sent at once, so no earlier than it came");
  assert.equal(batches.writtenBy(11_000), 11_000);
});

test("with the real watcher, no batch is ever counted from before its last write", async (t) => {
  const dir = await tempDir(t, "watch-batches");
  const file = path.join(dir, "config.yaml");
  await fs.writeFile(file, "a\n");
  const batches = new WatchBatches();
  const seen: { arrival: number; writtenBy: number }[] = [];
  const subscription = await watcher.subscribe(dir, (err) => {
    assert.ifError(err);
    const arrival = Date.now();
    seen.push({ arrival, writtenBy: batches.writtenBy(arrival) });
  });
  t.after(() => subscription.unsubscribe());
  let held = 0;
  for (let round = 0; round < 6; round++) {
    // A write and the mode change after it: two events a few ms apart, often two batches.
    await fs.appendFile(file, `${round}\n`);
    await sleep(round);
    // Taken before the call: its event cannot be older.
    const lastWrite = Date.now();
    await fs.chmod(file, round % 2 ? 0o644 : 0o640);
    const from = seen.length;
    await sleep(300);
    const told = seen.slice(from);
    assert.ok(told.length > 0, `round ${round}: the watcher told of the writes`);
    const last = told.at(-1)!;
    assert.ok(last.writtenBy >= lastWrite - 1, `round ${round}: the last batch counts from ${last.writtenBy}, before the write at ${lastWrite}`);
    if (last.writtenBy < last.arrival) held++;
  }
  t.diagnostic(`${held} of 6 rounds ended in a held batch`);
});
