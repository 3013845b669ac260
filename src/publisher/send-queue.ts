/**
 * The messages between `send()` and the confirm, in ID order through four stages: parked (no
 * room under `maxInFlight`: unwritten, unsent, renumbered after an abort), batched (the next group
 * commit), committing (the group commit being written), pending (written and sent, unconfirmed).
 */
import type { Entry } from './entry.js';
import { PendingQueue } from './pending.js';

export class SendQueue {
  /** Written and sent, waiting for the confirm. */
  readonly pending: PendingQueue<Entry> = new PendingQueue<Entry>();
  /** Parked sends, from #parkedHead on (a queue without O(n) shifts). */
  #parked: Entry[] = [];
  #parkedHead = 0;
  #batch: Entry[] = [];
  /** Messages of the group commit being written: neither batched nor pending meanwhile. */
  #committing = 0;
  readonly #maxInFlight: number;

  constructor(maxInFlight: number) {
    this.#maxInFlight = maxInFlight;
  }

  /** Messages accepted and not yet confirmed. */
  get inFlight(): number {
    return this.#parked.length - this.#parkedHead + this.#batch.length + this.#committing + this.pending.size;
  }

  /** Whether the next group commit has messages. */
  get hasBatch(): boolean {
    return this.#batch.length > 0;
  }

  /**
   * Queues an accepted message for the next group commit, or parks it while others are parked or
   * there is no room. Returns true when it joined the batch.
   */
  add(entry: Entry): boolean {
    if (this.#parked.length > this.#parkedHead || this.inFlight >= this.#maxInFlight) {
      this.#parked.push(entry);
      return false;
    }
    this.#batch.push(entry);
    return true;
  }

  /** Takes up to `max` batched messages as the group commit being written. */
  beginCommit(max: number): Entry[] {
    const batch = this.#batch.length <= max ? this.#batch : this.#batch.slice(0, max);
    this.#batch = batch === this.#batch ? [] : this.#batch.slice(batch.length);
    this.#committing = batch.length;
    return batch;
  }

  /** The group commit was written (its messages are pending now), or failed (`written` false). */
  endCommit(batch: readonly Entry[], written: boolean): void {
    this.#committing = 0;
    if (written) for (const e of batch) this.pending.push(e);
  }

  /** Moves parked sends into the batch while there is room; true when any moved. */
  refill(): boolean {
    let moved = false;
    while (
      this.#parked.length > this.#parkedHead &&
      this.#batch.length + this.#committing + this.pending.size < this.#maxInFlight
    ) {
      this.#batch.push(this.#parked[this.#parkedHead++]!);
      moved = true;
    }
    if (this.#parkedHead > 1024 && this.#parkedHead * 2 > this.#parked.length) {
      this.#parked = this.#parked.slice(this.#parkedHead);
      this.#parkedHead = 0;
    }
    return moved;
  }

  /** The position of a parked entry (for {@link SendQueue.parkedAt}), or -1 when it is not parked. */
  parkedIndex(entry: Entry): number {
    return this.#parked.indexOf(entry, this.#parkedHead);
  }

  /** The parked entry at a position; later positions hold later IDs. */
  parkedAt(i: number): Entry | undefined {
    return this.#parked[i];
  }

  /** Takes the parked entry at a position out of the queue. */
  unpark(i: number): void {
    this.#parked.splice(i, 1);
  }

  /** Takes the parked messages out of the queue. */
  takeParked(): Entry[] {
    const taken = this.#parked.slice(this.#parkedHead);
    this.#parked = [];
    this.#parkedHead = 0;
    return taken;
  }

  /** Takes the batched messages out of the queue. */
  takeBatch(): Entry[] {
    return this.#batch.splice(0);
  }
}
