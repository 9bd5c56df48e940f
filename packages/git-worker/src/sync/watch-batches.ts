/**
 * When the writes of a watcher batch ended, by how @parcel/watcher 2.x
 * delivers batches (its Debounce.cc): a batch more than MAX_WAIT_MS after the
 * last one goes out at once; any other is held until MIN_WAIT_MS pass without
 * an event, so its last write is at least that old. One write often makes two
 * batches (the data, then the mtime the kernel sets on close): counting the
 * quiet from the second one's arrival would add MIN_WAIT_MS to every commit.
 */
const MIN_WAIT_MS = 50;
const MAX_WAIT_MS = 500;
/** The callback of the batch before may have run late on a busy event loop: only a batch well inside the window counts as held. */
const HELD_BELOW_MS = MAX_WAIT_MS - 2 * MIN_WAIT_MS;

export class WatchBatches {
  private lastArrival = Number.NEGATIVE_INFINITY;

  /** A batch arrived at `arrival` (ms); answers the latest time its writes can have happened. */
  writtenBy(arrival: number): number {
    const held = arrival - this.lastArrival < HELD_BELOW_MS;
    this.lastArrival = arrival;
    return held ? arrival - MIN_WAIT_MS : arrival;
  }
}
