/**
 * Runs work one piece at a time, in arrival order: each starts once every
 * earlier one settled, and a failure of one never stops the next.
 */
export class Serial {
  private tail: Promise<void> = Promise.resolve();

  run<T>(work: () => Promise<T>): Promise<T> {
    const result = this.tail.then(work, work);
    this.tail = result.then(
      () => undefined,
      () => undefined,
    );
    return result;
  }

  /** Settles (never rejects) once everything run so far settled. */
  idle(): Promise<void> {
    return this.tail;
  }
}

/**
 * A Serial per key, so that two calls for the same volume (a kubelet retry
 * racing its original) never interleave while other volumes go on; a key's
 * Serial is dropped once its work is done.
 */
export class KeyedSerial {
  private readonly serials = new Map<string, Serial>();

  run<T>(key: string, work: () => Promise<T>): Promise<T> {
    const serial = this.serials.get(key) ?? new Serial();
    this.serials.set(key, serial);
    const result = serial.run(work);
    const tail = serial.idle();
    void tail.then(() => {
      if (serial.idle() === tail) this.serials.delete(key);
    });
    return result;
  }
}
