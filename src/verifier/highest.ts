/**
 * The `highest` policy: accept an ID iff it is above the highest recorded one. It is exactly
 * `window(1)` (same outcomes, same gaps), written as its own class so that the hot path is a few
 * bigint comparisons and allocates nothing.
 */
import { encodeHighestState } from './codec.js';
import {
  assertTrackerId,
  DUPLICATE,
  HIGHEST_SPEC,
  NEW,
  NO_GAPS,
  notNewError,
  STALE,
  type CheckResult,
  type PolicySpec,
  type RecordResult,
  type SequenceTracker,
} from './types.js';

/**
 * A {@link SequenceTracker} for the `highest` policy. Create it with `createTracker({ kind: 'highest' })`.
 *
 * - `id > highest`: `new`; with `skipped` when IDs were jumped over.
 * - `id === highest`: `duplicate`.
 * - `id < highest`: `stale` (an old repeat, or a reordered new message that this policy loses).
 *
 * Recording `id > highest + 1` confirms the gap `highest + 1 .. id - 1` at once: with a window of
 * one, no jumped-over ID can be accepted later.
 *
 * @remarks Since 0.1.0
 */
export class HighestTracker implements SequenceTracker {
  /** Always `{ kind: 'highest' }`. */
  readonly spec: PolicySpec = HIGHEST_SPEC;
  #highest: bigint;
  // highest + 1, kept so that the in-order case needs no bigint arithmetic.
  #next: bigint;

  /**
   * @param highest - the highest recorded ID, `0n` for an empty tracker (trusted: callers check it).
   */
  constructor(highest = 0n) {
    this.#highest = highest;
    this.#next = highest + 1n;
  }

  /** The highest recorded ID; `0n` before anything was recorded. */
  get highest(): bigint {
    return this.#highest;
  }

  /** {@inheritDoc SequenceTracker.check} */
  check(id: bigint): CheckResult {
    assertTrackerId(id);
    const highest = this.#highest;
    if (id > highest) {
      if (id === this.#next || highest === 0n) return NEW;
      return { outcome: 'new', skipped: { from: this.#next, to: id - 1n } };
    }
    return id === highest ? DUPLICATE : STALE;
  }

  /** {@inheritDoc SequenceTracker.record} */
  record(id: bigint): RecordResult {
    assertTrackerId(id);
    const highest = this.#highest;
    if (id <= highest) throw notNewError(id, id === highest ? 'duplicate' : 'stale');
    const next = this.#next;
    this.#highest = id;
    this.#next = id + 1n;
    if (id === next || highest === 0n) return NO_GAPS;
    return { confirmedGaps: [{ from: next, to: id - 1n }] };
  }

  /** {@inheritDoc SequenceTracker.clone} */
  clone(): HighestTracker {
    return new HighestTracker(this.#highest);
  }

  /** {@inheritDoc SequenceTracker.encode} */
  encode(): Uint8Array {
    return encodeHighestState(this.#highest);
  }
}
