/**
 * The messages between `send()` and the confirm, in ID order through four stages: parked (no
 * room under `maxInFlight`: unwritten, unsent, renumbered after an abort), batched (the next group
 * commit), committing (the group commit being written), pending (written and sent, unconfirmed).
 */
import type { Entry } from './entry.js';
import { PendingQueue } from './pending.js';

/** What the queue tells its owner when it renumbers parked sends after aborts. */
export interface ParkedRenumbering {
  /**
   * Aborted parked sends renumber the later ones (automatic and keyed IDs: no hole), or keep every
   * ID (explicit IDs: the caller's).
   */
  readonly renumber: boolean;
  /** An aborted send had `abortedId`; `heir` (if any) has that ID now. */
  moved(abortedId: bigint, heir: Entry | undefined): void;
}

export class SendQueue {
  /** Written and sent, waiting for the confirm. */
  readonly pending: PendingQueue<Entry> = new PendingQueue<Entry>();
  /** Parked sends, from #parkedHead on (a queue without O(n) shifts). */
  #parked: Entry[] = [];
  #parkedHead = 0;
  /**
   * Parked sends aborted and still in `#parked`: taken out, and the later ones renumbered, by one
   * pass ({@link SendQueue.compact}) however many were aborted, so that one signal aborting k of n
   * parked sends costs O(n + k), not O(n) per abort.
   */
  #dropped = 0;
  #batch: Entry[] = [];
  /** Messages of the group commit being written: neither batched nor pending meanwhile. */
  #committing = 0;
  readonly #maxInFlight: number;
  readonly #renumbering: ParkedRenumbering;
  /**
   * Parked entries visited or moved since the queue was made: the cost model of the abort
   * property (property-tests/publisher-model.test.ts), counted rather than timed. @internal
   */
  work = 0;

  constructor(maxInFlight: number, renumbering: ParkedRenumbering) {
    this.#maxInFlight = maxInFlight;
    this.#renumbering = renumbering;
  }

  /** Messages accepted and not yet confirmed. */
  get inFlight(): number {
    return (
      this.#parked.length -
      this.#parkedHead -
      this.#dropped +
      this.#batch.length +
      this.#committing +
      this.pending.size
    );
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
    this.compact();
    if (this.#parked.length > this.#parkedHead || this.inFlight >= this.#maxInFlight) {
      if (entry.extra !== undefined) entry.extra.parked = true;
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
    this.compact();
    let moved = false;
    while (
      this.#parked.length > this.#parkedHead &&
      this.#batch.length + this.#committing + this.pending.size < this.#maxInFlight
    ) {
      const e = this.#parked[this.#parkedHead++]!;
      if (e.extra !== undefined) e.extra.parked = false;
      this.#batch.push(e);
      this.work++;
      moved = true;
    }
    if (this.#parkedHead > 1024 && this.#parkedHead * 2 > this.#parked.length) {
      this.work += this.#parked.length - this.#parkedHead;
      this.#parked = this.#parked.slice(this.#parkedHead);
      this.#parkedHead = 0;
    }
    return moved;
  }

  /** Whether an entry (one with a signal: its `extra` says) waits for room. */
  isParked(entry: Entry): boolean {
    return entry.extra?.parked === true;
  }

  /**
   * Marks a parked entry aborted, in O(1): the next {@link SendQueue.compact} takes it out (and
   * renumbers the later ones). The owner lowers its last assigned ID at once.
   */
  drop(entry: Entry): void {
    const extra = entry.extra!;
    extra.parked = false;
    extra.dropped = true;
    this.#dropped++;
  }

  /** Whether aborted entries wait for {@link SendQueue.compact}. */
  get hasDropped(): boolean {
    return this.#dropped > 0;
  }

  /**
   * Takes the aborted parked entries out in one pass and closes the holes their IDs leave: each
   * later parked entry (unwritten, unsent, unseen by any caller) moves down by the number of
   * aborted ones before it. Runs before anything reads a parked ID or assigns a new one.
   */
  compact(): void {
    if (this.#dropped === 0) return;
    const { renumber } = this.#renumbering;
    const parked = this.#parked;
    const kept: Entry[] = [];
    let removed = 0n;
    /** Effective IDs of aborted entries waiting for the next survivor, which inherits them. */
    let orphans: bigint[] | undefined;
    for (let i = this.#parkedHead; i < parked.length; i++) {
      const e = parked[i]!;
      this.work++;
      if (e.extra?.dropped === true) {
        if (renumber) {
          (orphans ??= []).push(e.publishingId - removed);
          removed++;
        }
        continue;
      }
      if (removed > 0n) {
        const id = e.publishingId - removed;
        e.publishingId = id;
        if (e.keyRecord !== undefined && e.keyRecord.inFlight === e) e.keyRecord.publishingId = id;
      }
      if (orphans !== undefined) {
        for (const id of orphans) this.#renumbering.moved(id, e);
        orphans = undefined;
      }
      kept.push(e);
    }
    if (orphans !== undefined) for (const id of orphans) this.#renumbering.moved(id, undefined);
    this.#parked = kept;
    this.#parkedHead = 0;
    this.#dropped = 0;
  }

  /** Takes the parked messages out of the queue. */
  takeParked(): Entry[] {
    this.compact();
    const taken = this.#parked.slice(this.#parkedHead);
    for (const e of taken) if (e.extra !== undefined) e.extra.parked = false;
    this.#parked = [];
    this.#parkedHead = 0;
    return taken;
  }

  /** Takes the batched messages out of the queue. */
  takeBatch(): Entry[] {
    return this.#batch.splice(0);
  }
}
