/**
 * The vocabulary of the consumer-side sequence policies (docs/design.md §5), and the few runtime
 * definitions every policy shares: limits, argument checks and the shared result objects.
 */

/**
 * Which sequence policy a {@link SequenceTracker} applies to one scope.
 *
 * - `highest`: accept an ID iff it is above the highest recorded one. O(1) state. Safe only when
 *   order per producer is preserved end to end; exactly `window` with `size: 1`.
 * - `window`: an RFC 4303 / RFC 6479 style bitmap of the last `size` IDs below and including the
 *   highest: unseen IDs inside it are accepted, repeats are duplicates, IDs left of it are `stale`.
 *   `size` is an integer from 1 to {@link MAX_WINDOW_SIZE}.
 *
 * @example
 * ```ts
 * const strict: PolicySpec = { kind: 'highest' };
 * const tolerant: PolicySpec = { kind: 'window', size: 1024 };
 * ```
 * @remarks Since 0.1.0
 */
export type PolicySpec =
  | {
      /** Only IDs above the highest seen are new. */
      readonly kind: 'highest';
    }
  | {
      /** Unseen IDs within `size` below the highest seen are new too. */
      readonly kind: 'window';
      /** The window's width in IDs (1 to `MAX_WINDOW_SIZE`). */
      readonly size: number;
    };

/**
 * An inclusive range of publishing IDs, `from <= to`.
 *
 * @remarks Since 0.1.0
 */
export interface IdRange {
  /** The first ID of the range. */
  readonly from: bigint;
  /** The last ID of the range (inclusive). */
  readonly to: bigint;
}

/**
 * How a tracker classifies an ID.
 *
 * - `new`: never recorded, and inside or above the window: process it.
 * - `duplicate`: recorded before and still inside the window: suppress its effect.
 * - `stale`: left of the window. Ambiguous (an old repeat or a very late new message), so it is
 *   reported as such and never silently counted as a duplicate.
 *
 * @remarks Since 0.1.0
 */
export type Outcome = 'new' | 'duplicate' | 'stale';

/**
 * What {@link SequenceTracker.check} found.
 *
 * @remarks Since 0.1.0
 */
export interface CheckResult {
  /** The classification of the ID. */
  readonly outcome: Outcome;
  /**
   * Only for a `new` ID above `highest + 1` once something was recorded: the IDs jumped over.
   * This is a *reported* gap: under a window policy those IDs may still arrive inside the window.
   * A gap is *confirmed* only by {@link RecordResult.confirmedGaps}.
   */
  readonly skipped?: IdRange;
}

/**
 * What {@link SequenceTracker.record} changed.
 *
 * @remarks Since 0.1.0
 */
export interface RecordResult {
  /**
   * IDs that left the window without ever being recorded: a *confirmed* gap, in ascending order,
   * adjacent ranges merged. IDs at or below the tracker's floor (the first recorded ID minus one)
   * and IDs their producer declared skipped (`record`'s `skippedFrom`) are never reported. Empty
   * (and shared, frozen) in the common case.
   */
  readonly confirmedGaps: readonly IdRange[];
}

/**
 * The sequence memory of one scope (consumer, tenant, producer): pure, synchronous, no I/O.
 *
 * Use it transactionally (docs/design.md §5, "commit with the effect"): `check` an ID, apply the effect,
 * `record` on a {@link SequenceTracker.clone | clone}, persist `clone.encode()` in the same batch as
 * the effect, and only then replace the tracker with the clone.
 *
 * IDs are publishing IDs: `bigint` from 1 to 2^64 - 1.
 *
 * @example
 * ```ts
 * let tracker = createTracker({ kind: 'window', size: 1024 });
 * if (tracker.check(17n).outcome === 'new') {
 *   const next = tracker.clone();
 *   next.record(17n);
 *   await db.batch([effect, { type: 'put', key, value: next.encode() }]);
 *   tracker = next;
 * }
 * ```
 * @remarks Since 0.1.0
 */
export interface SequenceTracker {
  /** The policy this tracker applies (frozen). */
  readonly spec: PolicySpec;
  /** The highest recorded ID; `0n` before anything was recorded. */
  readonly highest: bigint;
  /**
   * Classifies an ID without changing anything.
   *
   * @throws TypeError when `id` is not a bigint.
   * @throws RangeError when `id` is not between 1 and 2^64 - 1.
   */
  check(id: bigint): CheckResult;
  /**
   * Records an ID as processed. Call it only after the effect of the message is committed, and
   * only for an ID that {@link SequenceTracker.check} reports as `new`.
   *
   * `skippedFrom` is the message's declared skip (`MessageIdentity.skippedFrom`, from its
   * `x-dedup-skip-from` header): its producer never used IDs `skippedFrom .. id - 1`. Those IDs
   * are then never reported in {@link RecordResult.confirmedGaps}, now or when they leave the
   * window; one of them that does arrive is still judged by the window like any other ID. A
   * `window` tracker keeps the last {@link MAX_DECLARED_RANGES} declarations that reach into it.
   *
   * @throws TypeError when `id` or `skippedFrom` is not a bigint.
   * @throws RangeError when `id` is out of range, `check(id).outcome` is not `new`, or
   * `skippedFrom` is not between 1 and `id - 1`.
   * @remarks `skippedFrom` since 0.2.0.
   */
  record(id: bigint, skippedFrom?: bigint): RecordResult;
  /** An independent copy: changes to one are never seen by the other. */
  clone(): SequenceTracker;
  /** The versioned binary form, readable by `decodeTracker`. */
  encode(): Uint8Array;
}

/** The largest publishing ID (u64). @internal */
export const MAX_ID = 0xffff_ffff_ffff_ffffn;

/**
 * The largest `window` size a {@link PolicySpec} may ask for: 2^20 IDs (128 KiB of bitmap).
 *
 * @remarks Since 0.1.0
 */
export const MAX_WINDOW_SIZE = 1_048_576;

/** Throws unless `id` is a publishing ID. Kept tiny so the hot paths inline it. @internal */
export function assertTrackerId(id: unknown): asserts id is bigint {
  if (typeof id !== 'bigint') throw new TypeError(`id must be a bigint, got ${typeof id}`);
  if (id < 1n || id > MAX_ID) throw new RangeError(`id must be between 1 and 2^64 - 1, got ${id}`);
}

/**
 * How many declared skips a `window` tracker keeps at once (those still reaching into its window);
 * beyond it the oldest is forgotten, and its missing IDs are reported as gaps.
 *
 * @remarks Since 0.2.0
 */
export const MAX_DECLARED_RANGES = 32;

/** Throws unless `skippedFrom` can declare a skip before `id` (1 <= skippedFrom < id). @internal */
export function assertSkippedFrom(skippedFrom: unknown, id: bigint): asserts skippedFrom is bigint {
  if (typeof skippedFrom !== 'bigint') {
    throw new TypeError(`skippedFrom must be a bigint, got ${typeof skippedFrom}`);
  }
  if (skippedFrom < 1n || skippedFrom >= id) {
    throw new RangeError(`skippedFrom must be between 1 and id - 1 (${id - 1n}), got ${skippedFrom}`);
  }
}

/** The frozen `highest` spec every highest tracker shares. @internal */
export const HIGHEST_SPEC: PolicySpec = Object.freeze({ kind: 'highest' });

/**
 * Checks a policy spec and returns a frozen copy of it (so `tracker.spec` cannot be changed later).
 *
 * @throws TypeError when `spec` is not an object, or `size` is not a number.
 * @throws RangeError when `kind` is unknown, or `size` is not an integer from 1 to 2^20.
 * @internal
 */
export function checkPolicySpec(spec: unknown): PolicySpec {
  if (typeof spec !== 'object' || spec === null) {
    throw new TypeError(`policy spec must be an object, got ${spec === null ? 'null' : typeof spec}`);
  }
  const { kind, size } = spec as { kind?: unknown; size?: unknown };
  if (kind === 'highest') return HIGHEST_SPEC;
  if (kind !== 'window')
    throw new RangeError(`policy kind must be 'highest' or 'window', got ${String(kind)}`);
  if (typeof size !== 'number') throw new TypeError(`window size must be a number, got ${typeof size}`);
  if (!Number.isInteger(size) || size < 1 || size > MAX_WINDOW_SIZE) {
    throw new RangeError(`window size must be an integer from 1 to ${MAX_WINDOW_SIZE}, got ${size}`);
  }
  return Object.freeze({ kind: 'window', size });
}

// Shared, frozen results: the common outcomes allocate nothing.
/** @internal */
export const NEW: CheckResult = Object.freeze({ outcome: 'new' });
/** @internal */
export const DUPLICATE: CheckResult = Object.freeze({ outcome: 'duplicate' });
/** @internal */
export const STALE: CheckResult = Object.freeze({ outcome: 'stale' });
/** @internal */
export const NO_GAPS: RecordResult = Object.freeze({ confirmedGaps: Object.freeze([]) });

/**
 * `check` of an ID above the tracker's highest (after the in-order fast path each tracker
 * inlines): `new`, with the skipped range when it jumps; undefined at or below the highest, where
 * each policy answers its own way. Throws unless `id` is an ID.
 * @internal
 */
export function checkAboveHighest(id: unknown, highest: bigint): CheckResult | undefined {
  assertTrackerId(id);
  if (id <= highest) return undefined;
  if (highest === 0n) return NEW;
  return { outcome: 'new', skipped: { from: highest + 1n, to: id - 1n } };
}

/** The error `record` throws for an ID that `check` would not call `new`. @internal */
export function notNewError(id: bigint, outcome: Outcome): RangeError {
  return new RangeError(`id ${id} is ${outcome}: record only IDs that check() reports as new`);
}
