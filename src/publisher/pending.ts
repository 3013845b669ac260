/** What the pending queue needs of an entry. */
export interface PendingEntry {
  readonly publishingId: bigint;
}

/**
 * The messages waiting for their confirm, in increasing ID order. Confirms mostly arrive in
 * order, so taking one is usually a look at the head; out-of-order confirms binary-search. Cheaper
 * than a Map keyed by bigint, whose hashing showed in the publisher's profile.
 *
 * A ring of slots (a power of two, grown by doubling, never shrunk): in the steady state pushing
 * and taking allocate nothing. Slots of entries taken out of order hold `undefined` until the head
 * or the tail passes them.
 */
export class PendingQueue<E extends PendingEntry> {
  #slots: Array<E | undefined> = new Array<E | undefined>(16).fill(undefined);
  #mask = 15;
  /** Physical index of the first slot in use. */
  #head = 0;
  /** Slots in use from the head, holes included; the first and the last hold entries. */
  #length = 0;
  #size = 0;

  /** Unconfirmed entries. */
  get size(): number {
    return this.#size;
  }

  #at(i: number): E | undefined {
    return this.#slots[(this.#head + i) & this.#mask];
  }

  /** Appends an entry; its ID must be above every entry's already in the queue. */
  push(entry: E): void {
    const last = this.#length > 0 ? this.#at(this.#length - 1)! : undefined;
    if (last !== undefined && entry.publishingId <= last.publishingId) {
      throw new RangeError(`pending IDs must increase: ${entry.publishingId} after ${last.publishingId}`);
    }
    if (this.#length === this.#slots.length) this.#grow();
    this.#slots[(this.#head + this.#length) & this.#mask] = entry;
    this.#length++;
    this.#size++;
  }

  #grow(): void {
    const slots = new Array<E | undefined>(this.#slots.length * 2).fill(undefined);
    for (let i = 0; i < this.#length; i++) slots[i] = this.#at(i);
    this.#slots = slots;
    this.#mask = slots.length - 1;
    this.#head = 0;
  }

  /** Removes and returns the entry with this ID, or `undefined` when none is pending. */
  take(publishingId: bigint): E | undefined {
    if (this.#length === 0) return undefined;
    let i = 0;
    const first = this.#at(0)!;
    if (first.publishingId !== publishingId) {
      i = this.#find(publishingId);
      if (i < 0) return undefined;
    }
    const slot = (this.#head + i) & this.#mask;
    const entry = this.#slots[slot]!;
    this.#slots[slot] = undefined;
    this.#size--;
    // Keep the first and the last slot in use holding entries.
    while (this.#length > 0 && this.#slots[this.#head] === undefined) {
      this.#head = (this.#head + 1) & this.#mask;
      this.#length--;
    }
    while (this.#length > 0 && this.#at(this.#length - 1) === undefined) this.#length--;
    if (this.#length === 0) this.#head = 0;
    return entry;
  }

  /** The entry with this ID, left in the queue, or `undefined` when none is pending. */
  get(publishingId: bigint): E | undefined {
    if (this.#length === 0) return undefined;
    const first = this.#at(0)!;
    if (first.publishingId === publishingId) return first;
    const i = this.#find(publishingId);
    return i < 0 ? undefined : this.#at(i);
  }

  /** Logical index of the entry with this ID, or -1. */
  #find(publishingId: bigint): number {
    let lo = 0;
    let hi = this.#length - 1;
    while (lo <= hi) {
      const mid = (lo + hi) >>> 1;
      // Nearest entry at or after mid (within [mid, hi]), else look before it.
      let j = mid;
      while (j <= hi && this.#at(j) === undefined) j++;
      if (j > hi) {
        hi = mid - 1;
        continue;
      }
      const id = this.#at(j)!.publishingId;
      if (id === publishingId) return j;
      if (id < publishingId) lo = j + 1;
      else hi = mid - 1;
    }
    return -1;
  }

  /** The unconfirmed entry with the lowest ID. */
  get first(): E | undefined {
    return this.#length > 0 ? this.#at(0) : undefined;
  }

  /** Unconfirmed entries in ID order. */
  *values(): IterableIterator<E> {
    for (let i = 0; i < this.#length; i++) {
      const e = this.#at(i);
      if (e !== undefined) yield e;
    }
  }

  /** Removes every entry. */
  clear(): void {
    this.#slots.fill(undefined);
    this.#head = 0;
    this.#length = 0;
    this.#size = 0;
  }
}
