/**
 * The `window(W)` policy (RFC 4303 anti-replay, with the RFC 6479 ring of 32-bit blocks), and the
 * tracker factories: `highest` is the `W = 1` case of this policy, run by its own O(1) class.
 */
import { decodeTrackerState, encodeWindowState, type TrackerState } from './codec.js';
import { HighestTracker } from './highest.js';
import {
  assertSkippedFrom,
  assertTrackerId,
  checkAboveHighest,
  checkPolicySpec,
  DUPLICATE,
  MAX_DECLARED_RANGES,
  NEW,
  NO_GAPS,
  notNewError,
  STALE,
  MAX_ID,
  type CheckResult,
  type IdRange,
  type PolicySpec,
  type RecordResult,
  type SequenceTracker,
} from './types.js';

/**
 * A {@link SequenceTracker} for the `window` policy. Create it with
 * `createTracker({ kind: 'window', size })`.
 *
 * The window covers `[highest - size + 1, highest]`:
 * - `id > highest`: `new`, with `skipped` when IDs were jumped over (they may still arrive);
 * - inside the window: `duplicate` if recorded, `new` otherwise;
 * - `id <= highest - size`: `stale`.
 *
 * When `record` moves the window, IDs that leave it unrecorded are returned as confirmed gaps,
 * except those at or below the floor (the first recorded ID minus one: a consumer may start in the
 * middle of a stream). A jump of any size costs O(size / 32): the IDs that never entered the window
 * are reported as one range, not visited one by one.
 *
 * @remarks Since 0.1.0
 */
export class WindowTracker implements SequenceTracker {
  /** `{ kind: 'window', size }`, frozen. */
  readonly spec: PolicySpec;
  readonly #size: number;
  // The ring: ceil(size / 32) + 1 blocks, so that advancing can clear whole blocks ahead of the
  // highest ID without touching any ID inside the window. Bits ahead of #pos in #pos's block are 0.
  readonly #blocks: Uint32Array;
  readonly #bits: number;
  #highest = 0n;
  // True when highest + 1 takes the in-order path: something was recorded (the first record sets
  // the floor) and highest < 2^64 - 1.
  #hasNext = false;
  // Ring position of the bit for `highest`.
  #pos: number;
  // How many of the oldest window slots are at or below the floor (never reported as gaps).
  #floorSlots = 0;
  // Ranges the producer declared skipped (x-dedup-skip-from) that still reach into the window
  // (as declared, merged), ascending, disjoint, not adjacent, at most MAX_DECLARED_RANGES: their
  // IDs leave it as skips, not gaps. Undefined when there are none (the hot paths test one field).
  #declared: IdRange[] | undefined;

  /**
   * An empty tracker.
   *
   * @throws TypeError when `size` is not a number.
   * @throws RangeError when `size` is not an integer from 1 to 2^20.
   */
  constructor(size: number) {
    this.spec = checkPolicySpec({ kind: 'window', size });
    this.#size = size;
    this.#blocks = new Uint32Array(Math.ceil(size / 32) + 1);
    this.#bits = this.#blocks.length * 32;
    this.#pos = size - 1;
  }

  /** A tracker with a decoded, consistency-checked state. @internal */
  static fromState(state: Extract<TrackerState, { kind: 'window' }>): WindowTracker {
    const { size, highest, floor } = state;
    const tracker = new WindowTracker(size);
    if (highest === 0n) return tracker;
    // The bitmap starts at ring position 0, so `highest` is at size - 1 (as after a first record).
    tracker.#blocks.set(state.words);
    tracker.#highest = highest;
    tracker.#hasNext = highest !== MAX_ID;
    const belowWindow = highest - BigInt(size);
    tracker.#floorSlots = floor > belowWindow ? Number(floor - belowWindow) : 0;
    if (state.declared.length > 0) tracker.#declared = [...state.declared];
    return tracker;
  }

  /** The highest recorded ID; `0n` before anything was recorded. */
  get highest(): bigint {
    return this.#highest;
  }

  /** {@inheritDoc SequenceTracker.check} */
  check(id: bigint): CheckResult {
    // The in-order case first: for IDs below 2^63 V8 compiles `id - highest === 1n` to machine
    // arithmetic (no allocation, no call).
    if (typeof id === 'bigint' && id - this.#highest === 1n && this.#hasNext) return NEW;
    const highest = this.#highest;
    const above = checkAboveHighest(id, highest);
    if (above !== undefined) return above;
    const offset = Number(highest - id); // exact whenever it matters: compared with size <= 2^20
    if (offset >= this.#size) return STALE;
    let pos = this.#pos - offset;
    if (pos < 0) pos += this.#bits;
    return (this.#blocks[pos >>> 5]! >>> (pos & 31)) & 1 ? DUPLICATE : NEW;
  }

  /** {@inheritDoc SequenceTracker.record} */
  record(id: bigint, skippedFrom?: bigint): RecordResult {
    if (skippedFrom === undefined && this.#declared === undefined) {
      if (typeof id === 'bigint' && id - this.#highest === 1n && this.#hasNext) return this.#advanceOne(id);
      return this.#record(id);
    }
    assertTrackerId(id);
    if (skippedFrom !== undefined) assertSkippedFrom(skippedFrom, id);
    const result = this.#record(id);
    // A declaration is rare: only then is the list copied. At most MAX_DECLARED_RANGES are kept;
    // the oldest beyond it is forgotten (its missing IDs are then reported as gaps: loud, never
    // silent), so a producer declaring on every message costs bounded time and state.
    if (skippedFrom !== undefined) {
      const added = addRange(this.#declared, skippedFrom, id - 1n);
      this.#declared =
        added.length > MAX_DECLARED_RANGES ? added.slice(added.length - MAX_DECLARED_RANGES) : added;
    }
    const declared = this.#declared!;
    const gaps =
      result.confirmedGaps.length === 0 ? NO_GAPS : withoutDeclared(result.confirmedGaps, declared);
    // Ranges wholly left of the window are done with (in place: a clone copies the list).
    const lowest = this.#highest - BigInt(this.#size) + 1n;
    let done = 0;
    while (done < declared.length && declared[done]!.to < lowest) done++;
    if (done === declared.length) this.#declared = undefined;
    else if (done > 0) declared.splice(0, done);
    return gaps;
  }

  #record(id: bigint): RecordResult {
    if (typeof id === 'bigint' && id - this.#highest === 1n && this.#hasNext) return this.#advanceOne(id);
    assertTrackerId(id);
    const highest = this.#highest;
    if (id > highest) {
      if (highest === 0n) return this.#start(id);
      return this.#advance(id, Number(id - highest));
    }
    const offset = Number(highest - id);
    if (offset >= this.#size) throw notNewError(id, 'stale');
    let pos = this.#pos - offset;
    if (pos < 0) pos += this.#bits;
    const block = pos >>> 5;
    const mask = 1 << (pos & 31);
    const word = this.#blocks[block]!;
    if ((word & mask) !== 0) throw notNewError(id, 'duplicate');
    this.#blocks[block] = word | mask;
    return NO_GAPS;
  }

  /** {@inheritDoc SequenceTracker.clone} */
  clone(): WindowTracker {
    const copy = new WindowTracker(this.#size);
    copy.#blocks.set(this.#blocks);
    copy.#highest = this.#highest;
    copy.#hasNext = this.#hasNext;
    copy.#pos = this.#pos;
    copy.#floorSlots = this.#floorSlots;
    if (this.#declared !== undefined) copy.#declared = [...this.#declared];
    return copy;
  }

  /** {@inheritDoc SequenceTracker.encode} */
  encode(): Uint8Array {
    const size = this.#size;
    const highest = this.#highest;
    let floor: bigint;
    if (this.#floorSlots > 0) floor = highest - BigInt(size - this.#floorSlots);
    else floor = highest > BigInt(size) ? highest - BigInt(size) : 0n;
    // Copy the window's bits out of the ring, oldest first, 32 at a time.
    const blocks = this.#blocks;
    const words = new Uint32Array(Math.ceil(size / 32));
    let start = this.#pos - (size - 1);
    if (start < 0) start += this.#bits;
    const shift = start & 31;
    let block = start >>> 5;
    for (let i = 0; i < words.length; i++) {
      const nextBlock = block + 1 === blocks.length ? 0 : block + 1;
      words[i] =
        shift === 0 ? blocks[block]! : (blocks[block]! >>> shift) | (blocks[nextBlock]! << (32 - shift));
      block = nextBlock;
    }
    const rest = size & 31;
    if (rest !== 0) words[words.length - 1]! &= (1 << rest) - 1; // bits beyond `highest`
    return encodeWindowState(size, highest, floor, words, this.#declared);
  }

  /** The first record: it sets the floor, and nothing can be a gap yet. */
  #start(id: bigint): RecordResult {
    this.#floorSlots = this.#size - 1;
    this.#setBit(this.#pos);
    this.#highest = id;
    this.#hasNext = id !== MAX_ID;
    return NO_GAPS;
  }

  /** `#advance(id, 1)`, the in-order case, without bigint arithmetic unless a gap is confirmed. */
  #advanceOne(id: bigint): RecordResult {
    const blocks = this.#blocks;
    let result = NO_GAPS;
    // The oldest slot (ID id - size) leaves the window.
    if (this.#floorSlots > 0) {
      this.#floorSlots--;
    } else {
      let leaving = this.#pos - (this.#size - 1);
      if (leaving < 0) leaving += this.#bits;
      if (((blocks[leaving >>> 5]! >>> (leaving & 31)) & 1) === 0) {
        const gap = id - BigInt(this.#size);
        result = { confirmedGaps: [{ from: gap, to: gap }] };
      }
    }
    let pos = this.#pos + 1;
    if (pos === this.#bits) pos = 0;
    // Entering a block: its bits belong to IDs older than the window.
    if ((pos & 31) === 0) blocks[pos >>> 5] = 1;
    else blocks[pos >>> 5]! |= 1 << (pos & 31);
    this.#pos = pos;
    this.#highest = id;
    this.#hasNext = id !== MAX_ID;
    return result;
  }

  /** Moves the window up by `distance` (= id - highest, inexact above 2^53 where only `> size` matters). */
  #advance(id: bigint, distance: number): RecordResult {
    const size = this.#size;
    const blocks = this.#blocks;
    const highest = this.#highest;
    // The `leaving` oldest slots of the window leave it; the first `ignored` are below the floor.
    const leaving = distance < size ? distance : size;
    const ignored = leaving < this.#floorSlots ? leaving : this.#floorSlots;
    this.#floorSlots -= ignored;
    let gaps: IdRange[] | undefined;
    if (ignored < leaving) {
      let start = this.#pos - (size - 1) + ignored;
      if (start < 0) start += this.#bits;
      gaps = unsetRuns(blocks, this.#bits, start, leaving - ignored, highest - BigInt(size - 1 - ignored));
    }
    if (distance >= size) {
      if (distance > size) {
        // highest + 1 .. id - size never entered the window: one range, however long. (It never
        // touches a range from the old window, whose last slot is the recorded `highest`.)
        (gaps ??= []).push({ from: highest + 1n, to: id - BigInt(size) });
      }
      blocks.fill(0);
      this.#pos = size - 1;
    } else {
      const oldPos = this.#pos;
      let pos = oldPos + distance;
      // Clear the blocks entered (whole blocks: their bits belong to IDs older than the window).
      const entered = (pos >>> 5) - (oldPos >>> 5);
      let block = oldPos >>> 5;
      for (let k = 0; k < entered; k++) {
        block = block + 1 === blocks.length ? 0 : block + 1;
        blocks[block] = 0;
      }
      if (pos >= this.#bits) pos -= this.#bits;
      this.#pos = pos;
    }
    this.#setBit(this.#pos);
    this.#highest = id;
    this.#hasNext = id !== MAX_ID;
    return gaps === undefined ? NO_GAPS : { confirmedGaps: gaps };
  }

  #setBit(pos: number): void {
    this.#blocks[pos >>> 5]! |= 1 << (pos & 31);
  }
}

/** Adds `from..to` to ascending, disjoint, non-adjacent `ranges` (a new array), merging where they touch. */
function addRange(ranges: readonly IdRange[] | undefined, from: bigint, to: bigint): IdRange[] {
  const out: IdRange[] = [];
  let lo = from;
  let hi = to;
  let placed = false;
  for (const r of ranges ?? []) {
    if (r.to + 1n < lo) out.push(r);
    else if (hi + 1n < r.from) {
      if (!placed) out.push({ from: lo, to: hi });
      placed = true;
      out.push(r);
    } else {
      if (r.from < lo) lo = r.from;
      if (r.to > hi) hi = r.to;
    }
  }
  if (!placed) out.push({ from: lo, to: hi });
  return out;
}

/** `gaps` without the IDs of `declared` (both ascending and disjoint), as a record result. */
function withoutDeclared(gaps: readonly IdRange[], declared: readonly IdRange[]): RecordResult {
  const out: IdRange[] = [];
  for (const gap of gaps) {
    let from = gap.from;
    for (const d of declared) {
      if (d.to < from || d.from > gap.to) continue;
      if (d.from > from) out.push({ from, to: d.from - 1n });
      from = d.to + 1n;
      if (from > gap.to) break;
    }
    if (from <= gap.to) out.push({ from, to: gap.to });
  }
  return out.length === 0 ? NO_GAPS : { confirmedGaps: out };
}

/**
 * The runs of unset bits among `count` ring positions from `start` (wrapping at `bits`), as ID
 * ranges where the bit at `start` is ID `firstId`. Skips whole blocks that are all set or all
 * unset. Returns `undefined` when every bit is set (the common case: no allocation).
 */
function unsetRuns(
  blocks: Uint32Array,
  bits: number,
  start: number,
  count: number,
  firstId: bigint,
): IdRange[] | undefined {
  let runs: IdRange[] | undefined;
  let runStart = -1;
  let j = 0;
  while (j < count) {
    let pos = start + j;
    if (pos >= bits) pos -= bits;
    const word = blocks[pos >>> 5]!;
    const bit = pos & 31;
    if (bit === 0 && count - j >= 32 && (word === 0xffff_ffff || word === 0)) {
      if (word === 0) {
        if (runStart < 0) runStart = j;
      } else if (runStart >= 0) {
        (runs ??= []).push({ from: firstId + BigInt(runStart), to: firstId + BigInt(j - 1) });
        runStart = -1;
      }
      j += 32;
      continue;
    }
    if (((word >>> bit) & 1) === 0) {
      if (runStart < 0) runStart = j;
    } else if (runStart >= 0) {
      (runs ??= []).push({ from: firstId + BigInt(runStart), to: firstId + BigInt(j - 1) });
      runStart = -1;
    }
    j++;
  }
  if (runStart >= 0)
    (runs ??= []).push({ from: firstId + BigInt(runStart), to: firstId + BigInt(count - 1) });
  return runs;
}

/**
 * Creates an empty tracker for a policy.
 *
 * @throws TypeError when `spec` is not an object, or a window `size` is not a number.
 * @throws RangeError when `kind` is unknown, or a window `size` is not an integer from 1 to 2^20.
 * @example
 * ```ts
 * const tracker = createTracker({ kind: 'window', size: 1024 });
 * tracker.record(1n);
 * tracker.record(3n);
 * tracker.check(2n); // { outcome: 'new' }: 2 is late, but inside the window
 * tracker.check(3n); // { outcome: 'duplicate' }
 * ```
 * @remarks Since 0.1.0
 */
export function createTracker(spec: PolicySpec): SequenceTracker {
  const checked = checkPolicySpec(spec);
  return checked.kind === 'highest' ? new HighestTracker() : new WindowTracker(checked.size);
}

/**
 * Rebuilds a tracker from {@link SequenceTracker.encode}'s output; it behaves exactly like the
 * tracker that was encoded.
 *
 * @throws TypeError when `bytes` is not a Uint8Array.
 * @throws DedupError `DEDUP_STORE_CORRUPT` for any malformed input (truncated, trailing bytes,
 * unknown version or kind, inconsistent fields); never another error for a Uint8Array.
 * @example
 * ```ts
 * const bytes = await db.get(key, { valueEncoding: 'view' });
 * const tracker = bytes === undefined ? createTracker(spec) : decodeTracker(bytes);
 * ```
 * @remarks Since 0.1.0
 */
export function decodeTracker(bytes: Uint8Array): SequenceTracker {
  const state = decodeTrackerState(bytes);
  return state.kind === 'highest' ? new HighestTracker(state.highest) : WindowTracker.fromState(state);
}
