/**
 * The store side of one producer: every group commit is one LevelDB batch holding the producer's
 * meta (last ID, reserved block, declared skip, outbox high-water mark), the batch as an outbox
 * segment (outbox durability), its key records, and the deletes of segments confirmed since.
 */
import { MAX_PUBLISHING_ID } from '../identity/publishing-id.js';
import type { IdMode, ProducerMeta } from '../store/codec.js';
import type { ProducerState } from '../store/store.js';
import type { Entry, Segment } from './entry.js';
import type { KeyedIds } from './keyed.js';
import type { PendingQueue } from './pending.js';
import type { ReconcilePlan } from './reconcile.js';
import type { SkipDeclaration } from './skip.js';
import type { Durability } from './types.js';

/** What a group commit of automatic or explicit IDs writes for keys: nothing. */
const NO_KEYS = Object.freeze({ keys: undefined, deleteKeySegments: Object.freeze([]) });

export class GroupCommitter {
  /** Highest ID durable in the store (meta.lastId, before the reserve rule below). */
  #lastDurable: bigint;
  #reservedUpTo: bigint;
  /** The highest ID written in an outbox commit, ever (meta.outboxHigh). */
  #outboxHigh: bigint;
  /** Outbox segments whose messages are all confirmed (or re-assigned): deleted by the next commit. */
  #segmentsToDelete: bigint[] = [];
  /** The lowest ID of the unconfirmed messages a fatal error let go (the store's lastId stays below it). */
  #droppedFrom: bigint | undefined;

  constructor(
    private readonly state: ProducerState,
    private readonly opts: {
      readonly durability: Durability;
      readonly idMode: IdMode;
      readonly reserveBlock: number;
    },
    plan: ReconcilePlan,
    private readonly skip: SkipDeclaration,
    private readonly keyed: KeyedIds | undefined,
    /** The unconfirmed messages: their lowest ID bounds the lastId a reserve block records. */
    private readonly pending: PendingQueue<Entry>,
    /** Sub-entry batching: cuts a group commit into batches and ties its messages to them. */
    private readonly cutBatches: ((batch: readonly Entry[]) => number[] | undefined) | undefined,
  ) {
    this.#lastDurable = plan.start;
    this.#reservedUpTo = plan.reservedUpTo;
    this.#outboxHigh = plan.outboxHigh;
  }

  /** The highest ID the store holds as written (where key retention is counted from). */
  get lastDurable(): bigint {
    return this.#lastDurable;
  }

  /** The end of the reserved block (0n in outbox durability until a reserve life wrote one). */
  get reservedUpTo(): bigint {
    return this.#reservedUpTo;
  }

  /** Whether a commit without messages has something to write (deletes, a skip to forget). */
  get hasWork(): boolean {
    return this.#segmentsToDelete.length > 0 || (this.keyed?.hasDeletes ?? false) || this.skip.metaDirty;
  }

  /**
   * Whether confirms left something to clear: whole confirmed segments (so that a restart re-sends
   * less) or a skip whose declaration was confirmed. What a confirm wakes the pump for, and what
   * `close()` still writes; key deletes are left to the next commit.
   */
  get hasConfirmWork(): boolean {
    return this.#segmentsToDelete.length > 0 || this.skip.metaDirty;
  }

  /** The broker confirmed `entry`: its segment goes with the next commit once all of it is confirmed. */
  confirmed(entry: Entry): void {
    if (entry.segment !== undefined && --entry.segment.remaining === 0) {
      this.#segmentsToDelete.push(entry.segment.firstId);
    }
  }

  /** Segments replaced by a re-assignment: deleted in the same write as their new copies. */
  replaceSegments(firstIds: readonly bigint[]): void {
    this.#segmentsToDelete.push(...firstIds);
    for (const id of firstIds) this.#replaced.add(id);
  }

  /** Segments {@link replaceSegments} named: never deleted by a write that lacks their new copies. */
  readonly #replaced = new Set<bigint>();

  /** A fatal error let `entry` go unconfirmed: no later reserve block may record its ID as landed. */
  letGo(entry: Entry): void {
    if (this.#droppedFrom === undefined || entry.publishingId < this.#droppedFrom) {
      this.#droppedFrom = entry.publishingId;
    }
  }

  /**
   * Writes one group commit. `asOutbox` writes the batch as an outbox segment whatever the
   * durability (the messages `open()` re-assigns: their old segments go in the same write).
   */
  async write(batch: readonly Entry[], asOutbox: boolean = this.opts.durability === 'outbox'): Promise<void> {
    const last = batch.length > 0 ? batch[batch.length - 1]!.publishingId : this.#lastDurable;
    // Retention is counted back from what this write makes durable, not from the last ID handed
    // out: IDs accepted and not yet written are taken back by an abort (waiting sends) or lost in a
    // crash, and the last ID with them. Counted from them, a key inside the retention of that lower
    // last ID lost its record: its next repeat was published again (the publisher model, issue 39).
    this.keyed?.prune(last);
    const deleteSegments = this.#segmentsToDelete;
    this.#segmentsToDelete = [];
    const skipDirty = this.skip.metaDirty;
    const { keys, deleteKeySegments } = this.keyed?.takeCommit(batch) ?? NO_KEYS;
    // Decided before the write and recorded by it: a re-send, in this life or the next, rebuilds
    // the same entries (docs/design.md §10).
    const batches = batch.length > 1 ? this.cutBatches?.(batch) : undefined;
    if (asOutbox) {
      let segment: Segment | undefined;
      if (batch.length > 0) {
        segment = { firstId: batch[0]!.publishingId, remaining: batch.length };
        for (const e of batch) e.segment = segment;
      }
      // Raised once the store holds it: a failed write followed by another (close's clean-up) recorded
      // an outbox high-water mark above IDs never stored, and the next life refused them
      // (DEDUP_ID_REGRESSION) although their senders were told they were never written.
      const outboxHigh = last > this.#outboxHigh ? last : this.#outboxHigh;
      const meta = this.#meta(last, this.#reservedUpTo, outboxHigh);
      await this.#commit(
        { meta, segment: batch, batches, deleteSegments, keys, deleteKeySegments },
        deleteSegments,
        skipDirty,
      );
      this.#outboxHigh = outboxHigh;
      this.#lastDurable = last;
    } else if (
      last > this.#reservedUpTo ||
      deleteSegments.length > 0 ||
      deleteKeySegments.length > 0 ||
      (keys !== undefined && keys.length > 0) ||
      this.skip.metaDirty
    ) {
      // Reserve a block past the batch before any of it leaves, so a restart skips it all. With
      // explicit IDs nothing is skipped (the caller chooses the IDs, and resumes after the broker's
      // last one): the block is the ceiling that open() checks the broker against, and an ID above
      // it takes a new one. One write per block rather than per batch: a LevelDB round trip in
      // every batch holds up the pump.
      const reservedUpTo =
        last > this.#reservedUpTo ? last + BigInt(this.opts.reserveBlock) : this.#reservedUpTo;
      const capped = reservedUpTo > MAX_PUBLISHING_ID ? MAX_PUBLISHING_ID : reservedUpTo;
      // Automatic IDs record the last ID below every unconfirmed or unsent one: where the broker
      // cannot tell its last ID (AMQP 0-9-1) the next life declares its skip from just above it,
      // so that a message lost on the wire at a crash falls inside the declared range.
      let lowest = this.pending.first?.publishingId ?? batch[0]?.publishingId;
      if (this.#droppedFrom !== undefined && (lowest === undefined || this.#droppedFrom < lowest)) {
        lowest = this.#droppedFrom; // a fatal error let go of unconfirmed messages from here
      }
      const lastId =
        this.opts.idMode === 'explicit' || lowest === undefined || lowest > last ? last : lowest - 1n;
      await this.#commit(
        { meta: this.#meta(lastId, capped, this.#outboxHigh), deleteSegments, keys, deleteKeySegments },
        deleteSegments,
        skipDirty,
      );
      this.#reservedUpTo = capped;
      this.#lastDurable = last;
    }
  }

  /** The meta record; the skip it carries is then written (or forgotten). */
  #meta(lastId: bigint, reservedUpTo: bigint, outboxHigh: bigint): ProducerMeta {
    this.skip.metaDirty = false;
    return {
      idMode: this.opts.idMode,
      lastId,
      reservedUpTo,
      skipFrom: this.skip.persisted,
      outboxHigh,
    };
  }

  /**
   * One store write. When it fails, what it was to clear stays to clear: the confirmed segments it
   * was to delete go back (a later write, close's clean-up, deletes them; lost, the next life would
   * re-send them) and a skip declaration it carried is still to be written. Segments a
   * re-assignment replaced do not go back: their new copies were in the failed write, and deleted
   * alone by a later one their messages would be lost (the store keeps them for the next open).
   */
  async #commit(
    write: Parameters<ProducerState['commit']>[0],
    deleteSegments: readonly bigint[],
    skipDirty: boolean,
  ): Promise<void> {
    try {
      await this.state.commit(write);
      for (const id of deleteSegments) this.#replaced.delete(id);
    } catch (err) {
      this.#segmentsToDelete.unshift(...deleteSegments.filter((id) => !this.#replaced.has(id)));
      if (skipDirty) this.skip.metaDirty = true;
      throw err;
    }
  }
}
