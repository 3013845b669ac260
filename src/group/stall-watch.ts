/**
 * Decides when a partition this member is subscribed to, but not active on, has stalled: new
 * input in the partition and no member applying it (docs/design.md §12, "a group stuck by the
 * broker"). Pure: the partition feeds it what it reads from the broker, and it answers whether to
 * look for a message, and from which offset.
 *
 * The measure of progress is the changelog's last publishing ID: a batch ending at offset L is
 * appended with ID L + 2 (ID 1 is the genesis), so with a last ID ≥ 2 everything up to offset
 * `lastId - 2` has been applied by some member. The stream's committed chunk ID is the offset of
 * the first message of its last committed chunk: a chunk beginning after the last applied offset
 * holds input not yet applied — unless it holds no message a consumer is delivered (a tracking
 * chunk), which only reading can tell: {@link StallWatch.foundNothing}.
 * Before any batch is in the changelog, only a chunk that arrived since the watch's first reading
 * counts (with `startFrom: 'next'`, the input already there is not the group's).
 *
 * Input inside the last chunk, after the last applied offset, is not seen until a later chunk
 * comes: a stall is detected at the next chunk.
 *
 * @internal
 */
export interface StallObservation {
  /** The changelog's last publishing ID (0n when it has none, or does not exist). */
  readonly lastId: bigint;
  /** The partition's committed chunk ID (the first offset of its last committed chunk). */
  readonly committedChunkId: bigint;
  /** When this was read, in ms (any monotonic clock). */
  readonly at: number;
}

/** How many stalledMs a probe that found nothing quiets the watch for (a tracking chunk, a slow read). */
const QUIET_AFTER_EMPTY_PROBE = 4;
/** Consecutive leaves double the time out of the group, up to 2^this times the first. */
const MAX_DOUBLINGS = 4;

/** @internal */
export class StallWatch {
  readonly #stalledMs: number;
  /** The changelog's last ID the current period is about; a change begins a new period. */
  #lastId: bigint | undefined;
  /**
   * The committed chunk ID at the first reading of this watch: before any changelog entry, only
   * later chunks count. Kept across {@link reset} (input that arrived while this member was out
   * of the group counts).
   */
  #baseline: bigint | undefined;
  /** Since when input has been waiting in this period. */
  #since: number | undefined;
  /** A probe found nothing: no other before this time. */
  #quietUntil = -Infinity;
  /** Leaves since the changelog last moved, and its last ID at the last of them. */
  #leaves = 0;
  #leftAt: bigint | undefined;

  /** @param stalledMs How long input may wait, with no change in the changelog, before a probe. */
  constructor(stalledMs: number) {
    this.#stalledMs = stalledMs;
  }

  /**
   * Takes one reading; answers the offset to look for a message from when input has waited for
   * `stalledMs` with the changelog unchanged, otherwise `undefined`. After an answer, the next
   * one comes only after another `stalledMs` (or once {@link reset} is called).
   */
  observe(o: StallObservation): bigint | undefined {
    this.#baseline ??= o.committedChunkId;
    if (this.#leftAt !== undefined && o.lastId !== this.#leftAt) {
      // The group moved on since this member last left: the next leave is a first one again.
      this.#leaves = 0;
      this.#leftAt = undefined;
    }
    if (o.lastId !== this.#lastId) {
      this.#lastId = o.lastId;
      this.#since = undefined;
      this.#quietUntil = -Infinity;
    }
    const applied = o.lastId >= 2n ? o.lastId - 2n : undefined;
    const waiting =
      applied !== undefined ? o.committedChunkId > applied : o.committedChunkId > this.#baseline;
    if (!waiting) {
      this.#since = undefined;
      return undefined;
    }
    this.#since ??= o.at;
    if (o.at - this.#since < this.#stalledMs || o.at < this.#quietUntil) return undefined;
    this.#since = o.at;
    // Before any entry: the last chunk is new (the baseline's own messages are not input).
    return applied !== undefined ? applied + 1n : o.committedChunkId;
  }

  /**
   * The probe answered at `at` found no message (a chunk without messages for consumers, such as
   * a tracking chunk, or a read that did not answer in time): no probe for a while.
   */
  foundNothing(at: number): void {
    this.#quietUntil = at + QUIET_AFTER_EMPTY_PROBE * this.#stalledMs;
  }

  /**
   * The member leaves the group now: answers how many times `firstLeaveMs` to stay out. Doubles
   * with every leave while the changelog does not move (up to 16): with more members than two,
   * or readings far apart, the times out grow until every member of a stuck group is out at once.
   */
  leaving(): number {
    const factor = 2 ** Math.min(this.#leaves, MAX_DOUBLINGS);
    this.#leaves++;
    this.#leftAt = this.#lastId;
    this.reset();
    return factor;
  }

  /**
   * Forgets the current period: a new subscription, this member active, or out of the group. The
   * first reading's chunk and the count of leaves stay.
   */
  reset(): void {
    this.#lastId = undefined;
    this.#since = undefined;
    this.#quietUntil = -Infinity;
  }
}
