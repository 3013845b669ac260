/**
 * The messages between `send()` and the confirm, in ID order through four stages: parked (no
 * room under `maxInFlight`: unwritten, unsent, renumbered after an abort: a parked send's final
 * ID is given as it leaves parking), batched (the next group
 * commit), committing (the group commit being written), pending (written and sent, unconfirmed).
 */
import type { Entry } from './entry.js';
import { headersSize } from './message.js';
import { PendingQueue } from './pending.js';

/** What the queue tells its owner when parked sends are aborted. */
export interface ParkedRenumbering {
  /**
   * Aborted parked sends renumber the later ones (automatic and keyed IDs: no hole), or keep every
   * ID (explicit IDs: the caller's).
   */
  readonly renumber: boolean;
  /**
   * The owner's last assigned ID (renumbering only). The live parked sends hold the IDs just
   * below and up to it, in order: the owner lowers it by one at each abort of a parked send.
   */
  lastAssigned(): bigint;
  /** An aborted send had `abortedId`; `heir` (if any) has that ID now. */
  moved(abortedId: bigint, heir: Entry | undefined): void;
}

export class SendQueue {
  /** Written and sent, waiting for the confirm. */
  readonly pending: PendingQueue<Entry> = new PendingQueue<Entry>();
  /** Parked sends, from #parkedHead on (a queue without O(n) shifts); aborted ones among them. */
  #parked: Entry[] = [];
  #parkedHead = 0;
  /**
   * Parked sends aborted and still in `#parked` (lazy deletion): skipped when the head reaches
   * them, or taken out by one pass ({@link SendQueue.compact}) once they are at least as many as
   * the live ones. Each aborted entry is thus visited O(1) times, so aborting k of n parked sends
   * costs O(n + k) whether one signal aborts them all or each has its own (issue 32, item 9).
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

  /** Parked sends not aborted. */
  get #liveParked(): number {
    return this.#parked.length - this.#parkedHead - this.#dropped;
  }

  /** Sends parked for room under `maxInFlight` (aborted ones not counted). */
  get parked(): number {
    return this.#liveParked;
  }

  /** Messages accepted and not yet confirmed. */
  get inFlight(): number {
    return this.#liveParked + this.#batch.length + this.#committing + this.pending.size;
  }

  /** Whether the next group commit has messages. */
  get hasBatch(): boolean {
    return this.#batch.length > 0;
  }

  /**
   * Before the owner assigns a new ID: when every parked send was aborted, the aborted ones are
   * taken out (each once), so that a skip declaration one of them carried goes to the new send.
   */
  beforeAssign(): void {
    if (this.#dropped > 0 && this.#liveParked === 0) this.compact();
  }

  /**
   * Queues an accepted message for the next group commit, or parks it while others are parked or
   * there is no room. Returns true when it joined the batch.
   */
  add(entry: Entry): boolean {
    this.beforeAssign();
    if (this.#liveParked > 0 || this.inFlight >= this.#maxInFlight) {
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

  /**
   * Moves parked sends into the batch while there is room; true when any moved. Aborted ones at
   * the head are skipped; a renumbered send gets its ID here, as it leaves parking: the one after
   * the last ID outside parking.
   */
  refill(): boolean {
    const { renumber } = this.#renumbering;
    let moved = false;
    let nextId = renumber ? this.#renumbering.lastAssigned() - BigInt(this.#liveParked) + 1n : 0n;
    /** An aborted send met at the head: the next live one inherits its ID (and a skip it declared). */
    let orphan = false;
    while (this.#parked.length > this.#parkedHead) {
      const e = this.#parked[this.#parkedHead]!;
      if (e.extra?.dropped === true) {
        this.#parkedHead++;
        this.#dropped--;
        this.work++;
        orphan = renumber;
        continue;
      }
      if (orphan) {
        this.#renumbering.moved(nextId, e);
        orphan = false;
      }
      if (this.#batch.length + this.#committing + this.pending.size >= this.#maxInFlight) break;
      this.#parkedHead++;
      if (renumber) this.#assign(e, nextId++);
      if (e.extra !== undefined) e.extra.parked = false;
      this.#batch.push(e);
      this.work++;
      moved = true;
    }
    if (orphan) this.#renumbering.moved(nextId, undefined);
    if (this.#parkedHead > 1024 && this.#parkedHead * 2 > this.#parked.length) {
      this.work += this.#parked.length - this.#parkedHead;
      this.#parked = this.#parked.slice(this.#parkedHead);
      this.#parkedHead = 0;
    }
    return moved;
  }

  /** A renumbered parked send's ID (unwritten, unsent, unseen by any caller). */
  #assign(e: Entry, id: bigint): void {
    e.publishingId = id;
  }

  /** Whether an entry (one with a signal: its `extra` says) waits for room. */
  isParked(entry: Entry): boolean {
    return entry.extra?.parked === true;
  }

  /**
   * Marks a parked entry aborted, in O(1): it stays in place until the head reaches it or a
   * compaction takes it out, its body and headers released at once (it is never written nor sent).
   * The owner lowers its last assigned ID at once.
   */
  drop(entry: Entry): void {
    const extra = entry.extra!;
    extra.parked = false;
    extra.dropped = true;
    entry.release();
    this.#dropped++;
  }

  /**
   * Aborted entries still parked (lazy deletion) and the body and header bytes they hold (0: each
   * lets go at its abort). The abort property checks it; O(parked). @internal
   */
  abortedParked(): { entries: number; bytes: number } {
    let bytes = 0;
    for (let i = this.#parkedHead; i < this.#parked.length; i++) {
      const e = this.#parked[i]!;
      if (e.extra?.dropped === true) bytes += e.body.length + headersSize(e.headers);
    }
    return { entries: this.#dropped, bytes };
  }

  /** Compacts when the aborted parked entries are at least as many as the live ones (amortised O(1) per abort). */
  compactIfWorthIt(): void {
    if (this.#dropped > 0 && this.#dropped >= this.#liveParked) this.compact();
  }

  /**
   * Takes the aborted parked entries out in one pass and gives each live one its ID: the later
   * ones move down by the number of aborted ones before them, so an abort leaves no hole.
   * `always`: even with no aborted entry left in the queue (the head may have skipped them, and
   * the live ones still hold the IDs they had when parked).
   */
  compact(always = false): void {
    if (this.#dropped === 0 && !always) return;
    const { renumber } = this.#renumbering;
    let nextId = renumber ? this.#renumbering.lastAssigned() - BigInt(this.#liveParked) + 1n : 0n;
    const parked = this.#parked;
    const kept: Entry[] = [];
    let orphan = false;
    for (let i = this.#parkedHead; i < parked.length; i++) {
      const e = parked[i]!;
      this.work++;
      if (e.extra?.dropped === true) {
        orphan = renumber;
        continue;
      }
      if (orphan) {
        this.#renumbering.moved(nextId, e);
        orphan = false;
      }
      if (renumber) this.#assign(e, nextId++);
      kept.push(e);
    }
    if (orphan) this.#renumbering.moved(nextId, undefined);
    this.#parked = kept;
    this.#parkedHead = 0;
    this.#dropped = 0;
  }

  /** Takes the parked messages out of the queue (aborted ones left out, the others with their IDs). */
  takeParked(): Entry[] {
    this.compact(true);
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
