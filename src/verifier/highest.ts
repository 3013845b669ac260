/**
 * The `highest` policy: accept an ID iff it is above the highest recorded one. It is exactly
 * `window(1)` (same outcomes, same gaps), written as its own class so that the in-order path is one
 * subtraction and one comparison, and allocates nothing.
 */
import { encodeHighestState } from './codec.js';
import {
  assertSkippedFrom,
  assertTrackerId,
  checkAboveHighest,
  DUPLICATE,
  HIGHEST_SPEC,
  NEW,
  NO_GAPS,
  notNewError,
  STALE,
  MAX_ID,
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
 * one, no jumped-over ID can be accepted later. IDs the message declares skipped are not a gap.
 *
 * @remarks Since 0.1.0
 */
export class HighestTracker implements SequenceTracker {
  /** Always `{ kind: 'highest' }`. */
  readonly spec: PolicySpec = HIGHEST_SPEC;
  #highest: bigint;
  // False only when highest = 2^64 - 1: no ID can follow it.
  #hasNext: boolean;

  /**
   * @param highest - the highest recorded ID, `0n` for an empty tracker (trusted: callers check it).
   */
  constructor(highest = 0n) {
    this.#highest = highest;
    this.#hasNext = highest !== MAX_ID;
  }

  /** The highest recorded ID; `0n` before anything was recorded. */
  get highest(): bigint {
    return this.#highest;
  }

  /** {@inheritDoc SequenceTracker.check} */
  check(id: bigint): CheckResult {
    // The in-order case first. For IDs below 2^63 V8 compiles `id - highest === 1n` to machine
    // arithmetic: no allocation, no call (a stored `highest + 1n` would cost both).
    if (typeof id === 'bigint' && id - this.#highest === 1n && this.#hasNext) return NEW;
    const highest = this.#highest;
    const above = checkAboveHighest(id, highest);
    if (above !== undefined) return above;
    return id === highest ? DUPLICATE : STALE;
  }

  /** {@inheritDoc SequenceTracker.record} */
  record(id: bigint, skippedFrom?: bigint): RecordResult {
    if (typeof id === 'bigint' && id - this.#highest === 1n && this.#hasNext && skippedFrom === undefined) {
      this.#highest = id;
      this.#hasNext = id !== MAX_ID;
      return NO_GAPS;
    }
    assertTrackerId(id);
    const highest = this.#highest;
    if (skippedFrom !== undefined) assertSkippedFrom(skippedFrom, id);
    if (id <= highest) throw notNewError(id, id === highest ? 'duplicate' : 'stale');
    this.#highest = id;
    this.#hasNext = id !== MAX_ID;
    // The jumped-over IDs are confirmed missing at once, except those the producer declared skipped.
    const last = skippedFrom === undefined ? id - 1n : skippedFrom - 1n;
    if (highest === 0n || last <= highest) return NO_GAPS;
    return { confirmedGaps: [{ from: highest + 1n, to: last }] };
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
