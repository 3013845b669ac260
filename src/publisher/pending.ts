/** What the pending queue needs of an entry. */
export interface PendingEntry {
  readonly publishingId: bigint;
}

/**
 * The messages waiting for their confirm, in increasing ID order. Confirms mostly arrive in
 * order, so taking one is usually a look at the head; out-of-order confirms binary-search. Cheaper
 * than a Map keyed by bigint, whose hashing showed in the publisher's profile.
 */
export class PendingQueue<E extends PendingEntry> {
  #items: Array<E | undefined> = [];
  #head = 0;
  #size = 0;

  /** Unconfirmed entries. */
  get size(): number {
    return this.#size;
  }

  /** Appends an entry; its ID must be above every entry's already in the queue. */
  push(entry: E): void {
    const last = this.#items.length > this.#head ? this.#items[this.#items.length - 1] : undefined;
    if (last !== undefined && entry.publishingId <= last.publishingId) {
      throw new RangeError(`pending IDs must increase: ${entry.publishingId} after ${last.publishingId}`);
    }
    this.#items.push(entry);
    this.#size++;
  }

  /** Removes and returns the entry with this ID, or `undefined` when none is pending. */
  take(publishingId: bigint): E | undefined {
    const items = this.#items;
    let i = this.#head;
    const first = items[i];
    if (first === undefined || first.publishingId !== publishingId) {
      // Binary search over [head, length); slots of taken entries hold undefined, so search by
      // the nearest defined neighbour.
      i = this.#find(publishingId);
      if (i < 0) return undefined;
    }
    const entry = items[i]!;
    items[i] = undefined;
    this.#size--;
    while (this.#head < items.length && items[this.#head] === undefined) this.#head++;
    if (this.#head === items.length) {
      this.#items = [];
      this.#head = 0;
    } else if (this.#head > 1024 && this.#head * 2 > items.length) {
      this.#items = items.slice(this.#head);
      this.#head = 0;
    }
    return entry;
  }

  #find(publishingId: bigint): number {
    const items = this.#items;
    let lo = this.#head;
    let hi = items.length - 1;
    while (lo <= hi) {
      const mid = (lo + hi) >>> 1;
      // Nearest defined slot at or after mid (within [mid, hi]), else before it.
      let j = mid;
      while (j <= hi && items[j] === undefined) j++;
      if (j > hi) {
        hi = mid - 1;
        continue;
      }
      const id = items[j]!.publishingId;
      if (id === publishingId) return j;
      if (id < publishingId) lo = j + 1;
      else hi = mid - 1;
    }
    return -1;
  }

  /** Unconfirmed entries in ID order. */
  *values(): IterableIterator<E> {
    const items = this.#items;
    for (let i = this.#head; i < items.length; i++) {
      const e = items[i];
      if (e !== undefined) yield e;
    }
  }

  /** Removes every entry. */
  clear(): void {
    this.#items = [];
    this.#head = 0;
    this.#size = 0;
  }
}
