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

  /** The position of a parked entry, or -1 when it is not parked. */
  parkedIndex(entry: Entry): number {
    return this.#parked.indexOf(entry, this.#parkedHead);
  }

  /**
   * Takes the parked entry at position `i` out of the queue, and closes the hole its ID leaves:
   * each later parked entry (unwritten, unsent, unseen by any caller) takes the ID before it.
   * Returns the entry that now has the removed ID, if any, and the last ID still handed out.
   */
  unparkAndRenumber(i: number): { heir: Entry | undefined; lastAssigned: bigint } {
    const removed = this.#parked.splice(i, 1)[0]!;
    let id = removed.publishingId;
    for (let j = i, e = this.#parked[j]; e !== undefined; e = this.#parked[++j]) {
      const next = e.publishingId;
      e.publishingId = id;
      if (e.keyRecord !== undefined && e.keyRecord.inFlight === e) e.keyRecord.publishingId = id;
      id = next;
    }
    return { heir: this.#parked[i], lastAssigned: id - 1n };
  }

  /** Takes the parked entry at a position out of the queue, leaving the IDs as they are. */
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
