import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { DedupError } from '../src/errors.js';
import { decodeScopeKey, encodeScopeKey, scopeKeyPrefix, type Scope } from '../src/identity/scope-key.js';
import {
  createTracker,
  decodeTracker,
  MAX_DECLARED_RANGES,
  ScopedVerifier,
  type CheckResult,
  type IdRange,
  type PolicySpec,
  type SequenceTracker,
} from '../src/verifier/index.js';

// The seed is set globally by property-tests/setup.ts; no test here fixes its own.

const MAX = 2n ** 64n - 1n;

/**
 * The reference model of window(size) (docs/design.md §5), written for clarity, not speed: the set of every
 * recorded ID, the highest, and the floor (first recorded ID minus one).
 */
class ModelTracker {
  readonly recorded = new Set<bigint>();
  highest = 0n;
  floor = 0n;

  constructor(readonly size: bigint) {}

  check(id: bigint): CheckResult {
    if (id > this.highest) {
      if (this.highest === 0n || id === this.highest + 1n) return { outcome: 'new' };
      return { outcome: 'new', skipped: { from: this.highest + 1n, to: id - 1n } };
    }
    if (id <= this.highest - this.size) return { outcome: 'stale' };
    return { outcome: this.recorded.has(id) ? 'duplicate' : 'new' };
  }

  /**
   * The ranges declared skipped that still reach into the window, merged; the lowest are forgotten
   * beyond MAX_DECLARED_RANGES (as the tracker documents). Left-of-window ones are dropped: IDs
   * left of the window are never reported again.
   */
  declared: IdRange[] = [];

  /**
   * Records `id` (which must be new) and returns the IDs that left the window unrecorded, except
   * those declared skipped (by this message's `skippedFrom` or an earlier one's still kept).
   */
  record(id: bigint, skippedFrom?: bigint): IdRange[] {
    const gaps = this.#record(id);
    if (skippedFrom !== undefined) {
      const all = [...this.declared, { from: skippedFrom, to: id - 1n }].sort((a, b) =>
        a.from < b.from ? -1 : 1,
      );
      const merged: IdRange[] = [];
      for (const r of all) {
        const last = merged[merged.length - 1];
        if (last !== undefined && r.from <= last.to + 1n)
          merged[merged.length - 1] = { from: last.from, to: r.to > last.to ? r.to : last.to };
        else merged.push(r);
      }
      this.declared = merged.slice(-MAX_DECLARED_RANGES);
    }
    const result = withoutDeclared(gaps, this.declared);
    this.declared = this.declared.filter((r) => r.to > this.highest - this.size);
    return result;
  }

  #record(id: bigint): IdRange[] {
    const gaps: IdRange[] = [];
    if (this.highest === 0n) {
      this.floor = id - 1n;
    } else if (id > this.highest) {
      // IDs in (highest - size, id - size] leave the window now; those above the floor and never
      // recorded are gaps. The ones above `highest` were never recorded at all.
      const lowest =
        this.highest - this.size + 1n > this.floor ? this.highest - this.size + 1n : this.floor + 1n;
      const last = id - this.size;
      for (let x = lowest; x <= last && x <= this.highest; x++) {
        if (!this.recorded.has(x)) addRange(gaps, x, x);
      }
      if (last > this.highest) addRange(gaps, this.highest + 1n, last);
    }
    if (id > this.highest) this.highest = id;
    this.recorded.add(id);
    return gaps;
  }
}

/** `gaps` without any ID of `declared` (plain interval arithmetic, one declared range at a time). */
function withoutDeclared(gaps: readonly IdRange[], declared: readonly IdRange[]): IdRange[] {
  let rest: IdRange[] = [...gaps];
  for (const d of declared) {
    rest = rest.flatMap((g) => {
      if (d.to < g.from || d.from > g.to) return [g];
      const parts: IdRange[] = [];
      if (g.from < d.from) parts.push({ from: g.from, to: d.from - 1n });
      if (d.to < g.to) parts.push({ from: d.to + 1n, to: g.to });
      return parts;
    });
  }
  const merged: IdRange[] = [];
  for (const g of rest) addRange(merged, g.from, g.to);
  return merged;
}

/**
 * Skip declarations to pair with a sequence: per ID, none (mostly) or how far back the declared
 * range starts (`skippedFrom = id - back`, kept at 1 or above; none for ID 1).
 */
const declarations = fc.array(
  fc.option(fc.oneof(fc.integer({ min: 1, max: 80 }), fc.constantFrom(1, 2, 31, 32, 33, 1_000_000)), {
    freq: 4,
  }),
  { maxLength: 300 },
);

function declaredFrom(id: bigint, back: number | null | undefined): bigint | undefined {
  if (back === null || back === undefined || id < 2n) return undefined;
  const from = id - BigInt(back);
  return from < 1n ? 1n : from;
}

/** Appends a range, merging it with the last one when adjacent. */
function addRange(ranges: IdRange[], from: bigint, to: bigint): void {
  const last = ranges[ranges.length - 1];
  if (last !== undefined && last.to + 1n === from) ranges[ranges.length - 1] = { from: last.from, to };
  else ranges.push({ from, to });
}

function showCheck(result: CheckResult): string {
  return result.skipped === undefined
    ? result.outcome
    : `${result.outcome} skipped ${result.skipped.from}..${result.skipped.to}`;
}

function showGaps(gaps: readonly IdRange[]): string {
  return gaps.map((gap) => `${gap.from}..${gap.to}`).join(',');
}

/** Fails with the step that differed (cheaper than a deep `expect` at every step). */
function same(actual: string, expected: string, what: string): void {
  if (actual !== expected) throw new Error(`${what}: got ${actual}, expected ${expected}`);
}

function throwsRangeError(run: () => unknown): boolean {
  try {
    run();
  } catch (err) {
    return err instanceof RangeError;
  }
  return false;
}

/** The largest distance by which an ID arrives after a higher one. */
function reorderDistance(ids: readonly bigint[]): bigint {
  let max = 0n;
  let distance = 0n;
  for (const id of ids) {
    if (max - id > distance) distance = max - id;
    if (id > max) max = id;
  }
  return distance;
}

/**
 * Increasing IDs (steps of 1, sometimes more), with duplicates inserted a little later and a
 * bounded shuffle (each swap moves an element at most 8 places).
 */
const reorderedSequence = fc
  .record({
    start: fc.oneof(fc.constant(1n), fc.bigInt(1n, 1_000n), fc.bigInt(1n, MAX - 20_000n)),
    steps: fc.array(
      fc.oneof(
        { weight: 8, arbitrary: fc.constant(1) },
        { weight: 2, arbitrary: fc.integer({ min: 2, max: 40 }) },
      ),
      { maxLength: 300, size: 'max' },
    ),
    duplicates: fc.array(fc.tuple(fc.nat(), fc.nat({ max: 20 })), { maxLength: 30, size: 'max' }),
    swaps: fc.array(fc.tuple(fc.nat(), fc.integer({ min: 1, max: 8 })), { maxLength: 60, size: 'max' }),
  })
  .map(({ start, steps, duplicates, swaps }) => {
    const ids = [start];
    for (const step of steps) ids.push(ids[ids.length - 1]! + BigInt(step));
    for (const [at, later] of duplicates) {
      const index = at % ids.length;
      ids.splice(Math.min(ids.length, index + 1 + later), 0, ids[index]!);
    }
    for (const [at, distance] of swaps) {
      const i = at % ids.length;
      const j = Math.min(ids.length - 1, i + distance);
      [ids[i], ids[j]] = [ids[j]!, ids[i]!];
    }
    return ids;
  });

/**
 * Arbitrary arrival orders: each ID is the highest so far plus a delta that may be negative (late
 * or repeated), small, or a huge jump; clamped to 1..2^64 - 1.
 */
const wanderingSequence = fc
  .array(
    fc.oneof(
      { weight: 10, arbitrary: fc.integer({ min: -150, max: 150 }).map(BigInt) },
      { weight: 10, arbitrary: fc.integer({ min: -4, max: 4 }).map(BigInt) },
      { weight: 1, arbitrary: fc.bigInt(0n, 2n ** 63n) },
      { weight: 1, arbitrary: fc.constant(MAX) },
    ),
    { maxLength: 200, size: 'max' },
  )
  .chain((deltas) =>
    fc.bigInt(1n, 1_000n).map((start) => {
      const ids: bigint[] = [];
      let max = start;
      for (const delta of deltas) {
        let id = max + delta;
        if (id < 1n) id = 1n;
        if (id > MAX) id = MAX;
        ids.push(id);
        if (id > max) max = id;
      }
      return ids;
    }),
  );

const windowSize = fc.oneof(
  fc.integer({ min: 1, max: 70 }),
  fc.constantFrom(31, 32, 33, 63, 64, 65, 96, 100, 1_024, 65_536),
);

const policySpec: fc.Arbitrary<PolicySpec> = fc.oneof(
  fc.constant({ kind: 'highest' as const }),
  windowSize.map((size) => ({ kind: 'window' as const, size })),
);

/** Runs `ids` against `tracker`, recording every `new` ID (with its declared skip, if any). */
function feed(
  tracker: SequenceTracker,
  ids: readonly bigint[],
  skips: ReadonlyArray<number | null> = [],
): void {
  for (const [i, id] of ids.entries()) {
    if (tracker.check(id).outcome === 'new') tracker.record(id, declaredFrom(id, skips[i]));
  }
}

describe('verifier properties', () => {
  it('window - equals the exact set model for every sequence reordered by less than the window', () => {
    fc.assert(
      fc.property(reorderedSequence, fc.nat({ max: 80 }), declarations, (ids, extra, skips) => {
        const size = Math.min(1_048_576, Number(reorderDistance(ids)) + 1 + extra);
        let tracker = createTracker({ kind: 'window', size });
        const model = new ModelTracker(BigInt(size));
        let accepted = 0;
        for (const [step, id] of ids.entries()) {
          const result = tracker.check(id);
          same(showCheck(result), showCheck(model.check(id)), `window(${size}) step ${step} check ${id}`);
          if (result.outcome === 'stale') throw new Error(`id ${id} stale within the reorder bound`);
          if (result.outcome === 'new') {
            accepted++;
            const from = declaredFrom(id, skips[step]);
            same(
              showGaps(tracker.record(id, from).confirmedGaps),
              showGaps(model.record(id, from)),
              `step ${step} record ${id}${from === undefined ? '' : ` skipped from ${from}`}`,
            );
            // The declared skips travel with the state: a copy or a decoded tracker goes on alike.
            if (step % 5 === 0) tracker = tracker.clone();
            else if (step % 7 === 0) tracker = decodeTracker(tracker.encode());
          } else if (!throwsRangeError(() => tracker.record(id))) {
            throw new Error(`record(${id}) of a duplicate did not throw RangeError`);
          }
        }
        // Without stale outcomes the window is exact deduplication: every distinct ID once.
        expect(accepted).toBe(new Set(ids).size);
      }),
      { numRuns: 2_000 },
    );
  });

  it('highest - is exactly window(1): same outcomes and same confirmed gaps on any sequence', () => {
    const ids = fc.array(
      fc.oneof(fc.bigInt(1n, 40n), fc.bigInt(1n, MAX), fc.constant(MAX), fc.constant(1n)),
      { maxLength: 200, size: 'max' },
    );
    fc.assert(
      fc.property(fc.oneof(ids, wanderingSequence), declarations, (sequence, skips) => {
        const highest = createTracker({ kind: 'highest' });
        const window = createTracker({ kind: 'window', size: 1 });
        for (const [step, id] of sequence.entries()) {
          const result = highest.check(id);
          same(showCheck(result), showCheck(window.check(id)), `step ${step} check ${id}`);
          if (result.outcome === 'new') {
            const from = declaredFrom(id, skips[step]);
            same(
              showGaps(highest.record(id, from).confirmedGaps),
              showGaps(window.record(id, from).confirmedGaps),
              `record ${id}${from === undefined ? '' : ` skipped from ${from}`}`,
            );
          } else if (
            !throwsRangeError(() => highest.record(id)) ||
            !throwsRangeError(() => window.record(id))
          ) {
            throw new Error(`record(${id}) of a ${result.outcome} id did not throw RangeError`);
          }
          same(String(highest.highest), String(window.highest), `highest after ${id}`);
        }
      }),
      { numRuns: 1_000 },
    );
  });

  it('codec - a decoded tracker behaves exactly like the original on any continuation', () => {
    fc.assert(
      fc.property(
        policySpec,
        wanderingSequence,
        wanderingSequence,
        declarations,
        (spec, prefix, continuation, skips) => {
          const original = createTracker(spec);
          feed(original, prefix, skips);
          const bytes = original.encode();
          const decoded = decodeTracker(bytes);
          expect(decoded.spec).toEqual(original.spec);
          expect(Buffer.from(decoded.encode()).equals(bytes)).toBe(true);
          // Every ID of the window (and one on either side) is classified alike.
          const size = spec.kind === 'window' ? BigInt(spec.size) : 1n;
          if (size <= 2_048n) {
            for (let id = original.highest - size; id <= original.highest + 1n; id++) {
              if (id >= 1n && id <= MAX)
                same(showCheck(decoded.check(id)), showCheck(original.check(id)), `probe ${id}`);
            }
          }
          // Continue from where the prefix stopped, so the continuation meets the window.
          const base = original.highest;
          for (const [step, raw] of continuation.entries()) {
            const shifted = base + raw - 500n;
            const id = shifted < 1n ? 1n : shifted > MAX ? MAX : shifted;
            const result = original.check(id);
            same(showCheck(decoded.check(id)), showCheck(result), `step ${step} check ${id}`);
            if (result.outcome === 'new') {
              const from = declaredFrom(id, skips[skips.length - 1 - step]);
              same(
                showGaps(decoded.record(id, from).confirmedGaps),
                showGaps(original.record(id, from).confirmedGaps),
                `record ${id}`,
              );
            }
          }
          expect(Buffer.from(decoded.encode()).equals(original.encode())).toBe(true);
        },
      ),
      { numRuns: 1_000 },
    );
  });

  it('codec - decodeTracker on arbitrary bytes throws only DedupError DEDUP_STORE_CORRUPT, and anything it accepts re-encodes identically', () => {
    const u64 = (value: bigint) => {
      const bytes = new Uint8Array(8);
      new DataView(bytes.buffer).setBigUint64(0, value);
      return [...bytes];
    };
    // Plausible window states (small size, small highest and floor, a bitmap of about the right
    // length, often tidied so that only one rule is broken, or none) reach the deep consistency
    // checks; plain random bytes exercise the envelope.
    const windowish = fc
      .record({
        size: fc.integer({ min: 0, max: 70 }),
        highest: fc.bigInt(0n, 80n),
        floor: fc.bigInt(0n, 80n),
        lengthDelta: fc.constantFrom(0, 0, 0, -1, 1),
        bitmap: fc.uint8Array({ minLength: 10, maxLength: 10 }),
        tidy: fc.boolean(),
      })
      .map(({ size, highest, floor, lengthDelta, bitmap, tidy }) => {
        const length = Math.max(0, Math.ceil(size / 8) + lengthDelta);
        const map = bitmap.slice(0, length);
        if (tidy && size > 0 && length === Math.ceil(size / 8)) {
          if ((size & 7) !== 0) map[length - 1]! &= (1 << (size & 7)) - 1; // clear the padding
          map[(size - 1) >>> 3]! |= 1 << ((size - 1) & 7); // record `highest`
          floor = highest > 0n ? highest - 1n - (floor % highest) : 0n;
        }
        const header = [1, 2, size >>> 24, (size >>> 16) & 0xff, (size >>> 8) & 0xff, size & 0xff];
        return Uint8Array.from([...header, ...u64(highest), ...u64(floor), ...map]);
      });
    const enveloped = fc
      .tuple(fc.constantFrom(0, 1, 1, 2), fc.constantFrom(0, 1, 2, 3), fc.uint8Array({ maxLength: 30 }))
      .map(([version, kind, rest]) => Uint8Array.from([version, kind, ...rest]));
    // Real window states with declared skips (format version 2), a few bytes of their tail changed:
    // the skip list's own checks (count, order, bounds, length).
    const withSkips = fc
      .record({
        size: fc.integer({ min: 1, max: 40 }),
        ids: fc.array(fc.bigInt(1n, 60n), { minLength: 1, maxLength: 30 }),
        skips: declarations,
        edits: fc.array(fc.tuple(fc.nat({ max: 40 }), fc.nat({ max: 255 })), { maxLength: 3 }),
        cut: fc.constantFrom(0, 0, 0, 1, 8, 16),
      })
      .map(({ size, ids, skips, edits, cut }) => {
        const tracker = createTracker({ kind: 'window', size });
        feed(tracker, ids, skips);
        const bytes = tracker.encode();
        for (const [back, value] of edits) {
          const at = bytes.length - 1 - (back % Math.min(bytes.length, 40));
          bytes[at] = value;
        }
        return bytes.slice(0, bytes.length - Math.min(cut, bytes.length));
      });
    fc.assert(
      fc.property(fc.oneof(fc.uint8Array({ maxLength: 40 }), enveloped, windowish, withSkips), (bytes) => {
        let tracker: SequenceTracker;
        try {
          tracker = decodeTracker(bytes);
        } catch (err) {
          if (!(err instanceof DedupError) || err.code !== 'DEDUP_STORE_CORRUPT') throw err;
          return;
        }
        if (!Buffer.from(tracker.encode()).equals(bytes))
          throw new Error('accepted a non-canonical encoding');
        tracker.check(1n);
        tracker.check(MAX);
      }),
      { numRuns: 100_000 },
    );
  });

  it('scope key - is injective, keeps each consumer under its prefix, and decodes to the same scope', () => {
    const tricky = fc.string({ unit: fc.constantFrom(':', '0', '1', '9', 'a'), maxLength: 6 });
    const component = (minLength: number) =>
      fc.oneof(
        tricky.filter((text) => text.length >= minLength),
        fc.string({ unit: 'binary', minLength, maxLength: 8 }),
        fc.constantFrom('__proto__', 'constructor', 'prototype'),
      );
    const scope: fc.Arbitrary<Scope> = fc.record({
      consumer: component(1),
      tenant: component(0),
      producer: component(1),
    });
    fc.assert(
      fc.property(fc.array(scope, { maxLength: 20 }), (scopes) => {
        const byKey = new Map<string, string>();
        for (const s of scopes) {
          const key = encodeScopeKey(s);
          const identity = JSON.stringify([s.consumer, s.tenant, s.producer]);
          const previous = byKey.get(key);
          if (previous !== undefined && previous !== identity)
            throw new Error(`${previous} and ${identity} share ${key}`);
          byKey.set(key, identity);
          expect(decodeScopeKey(key)).toEqual(s);
          for (const other of scopes) {
            const sharesPrefix = key.startsWith(scopeKeyPrefix(other.consumer));
            if (sharesPrefix !== (other.consumer === s.consumer)) {
              throw new Error(`prefix of ${JSON.stringify(other.consumer)} vs key ${JSON.stringify(key)}`);
            }
          }
        }
      }),
      { numRuns: 500 },
    );
  });

  it('scoped - behaves like a plain Map of trackers under any mix of check, record, set and eviction', () => {
    const key = fc.constantFrom('1:a0:1:p', '1:b0:1:p', '__proto__');
    const op = fc.oneof(
      {
        weight: 6,
        arbitrary: fc.record({ kind: fc.constant('check' as const), key, id: fc.bigInt(1n, 40n) }),
      },
      {
        weight: 6,
        arbitrary: fc.record({ kind: fc.constant('record' as const), key, id: fc.bigInt(1n, 40n) }),
      },
      { weight: 1, arbitrary: fc.record({ kind: fc.constant('set' as const), key, id: fc.bigInt(1n, 40n) }) },
      {
        weight: 1,
        arbitrary: fc.record({ kind: fc.constant('evict' as const), key, id: fc.bigInt(0n, 5n) }),
      },
    );
    fc.assert(
      fc.property(policySpec, fc.array(op, { maxLength: 80, size: 'max' }), (spec, ops) => {
        const verifier = new ScopedVerifier(spec);
        const model = new Map<string, { tracker: SequenceTracker; lastSeenMs: number }>();
        let now = 0;
        for (const [step, { kind, key, id }] of ops.entries()) {
          now++;
          if (kind === 'check') {
            const expected = (model.get(key)?.tracker ?? createTracker(spec)).check(id);
            same(showCheck(verifier.check(key, id)), showCheck(expected), `step ${step} check ${key} ${id}`);
          } else if (kind === 'record') {
            const entry = model.get(key) ?? { tracker: createTracker(spec), lastSeenMs: now };
            let expected: string;
            try {
              expected = showGaps(entry.tracker.record(id).confirmedGaps);
              entry.lastSeenMs = now;
              model.set(key, entry);
            } catch {
              expected = 'throws';
            }
            let actual: string;
            try {
              actual = showGaps(verifier.record(key, id, now).confirmedGaps);
            } catch {
              actual = 'throws';
            }
            same(actual, expected, `step ${step} record ${key} ${id}`);
          } else if (kind === 'set') {
            const tracker = createTracker(spec);
            tracker.record(id);
            model.set(key, { tracker: tracker.clone(), lastSeenMs: now });
            verifier.set(key, tracker, now);
          } else {
            const ttl = Number(id);
            let evicted = 0;
            for (const [k, entry] of model) {
              if (now - entry.lastSeenMs > ttl) {
                model.delete(k);
                evicted++;
              }
            }
            same(String(verifier.evictIdle(now, ttl)), String(evicted), `step ${step} evict`);
          }
          same(String(verifier.size), String(model.size), `step ${step} size`);
        }
      }),
      { numRuns: 1_000 },
    );
  });

  it('window - recorded ids and confirmed gaps partition exactly the ids from the floor to highest - size', () => {
    fc.assert(
      fc.property(policySpec, wanderingSequence, (spec, ids) => {
        const tracker = createTracker(spec);
        const size = spec.kind === 'window' ? BigInt(spec.size) : 1n;
        const model = new ModelTracker(size);
        const recorded = new Set<bigint>();
        const gaps: IdRange[] = [];
        const staleUnrecorded = new Set<bigint>();
        for (const [step, id] of ids.entries()) {
          const result = tracker.check(id);
          same(showCheck(result), showCheck(model.check(id)), `step ${step} check ${id}`);
          if (result.outcome === 'new') {
            const confirmed = tracker.record(id).confirmedGaps;
            same(showGaps(confirmed), showGaps(model.record(id)), `step ${step} record ${id}`);
            gaps.push(...confirmed);
            recorded.add(id);
          } else if (result.outcome === 'stale' && !recorded.has(id)) {
            staleUnrecorded.add(id);
          }
        }
        if (recorded.size === 0) return;
        const floor = model.floor;
        const bound = tracker.highest - size; // the highest ID that has left the window
        // Gaps ascend without overlap, lie in (floor, bound] and hold no recorded ID.
        let previous = floor;
        let gapIds = 0n;
        for (const gap of gaps) {
          if (gap.from <= previous || gap.to < gap.from || gap.to > bound) {
            throw new Error(
              `gap ${gap.from}..${gap.to} out of order or range (floor ${floor}, bound ${bound})`,
            );
          }
          previous = gap.to;
          gapIds += gap.to - gap.from + 1n;
        }
        const inGap = (id: bigint) => gaps.some((gap) => gap.from <= id && id <= gap.to);
        let recordedBelow = 0n;
        for (const id of recorded) {
          if (inGap(id)) throw new Error(`recorded id ${id} reported as a gap`);
          if (id > floor && id <= bound) recordedBelow++;
        }
        // Disjoint and inside the range, so equal counts mean the union is the whole range.
        const expected = bound > floor ? bound - floor : 0n;
        same(String(recordedBelow + gapIds), String(expected), `ids from ${floor + 1n} to ${bound}`);
        // A stale ID that was never recorded is below the floor or a confirmed gap: never lost silently.
        for (const id of staleUnrecorded) {
          if (id > floor && !inGap(id))
            throw new Error(`stale id ${id} neither below the floor nor in a gap`);
        }
      }),
      { numRuns: 3_000 },
    );
  });
});
