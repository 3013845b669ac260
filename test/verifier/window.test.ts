import { describe, expect, it } from 'vitest';
import {
  createTracker,
  decodeTracker,
  MAX_DECLARED_RANGES,
  MAX_WINDOW_SIZE,
  type SequenceTracker,
} from '../../src/verifier/index.js';

const MAX = 2n ** 64n - 1n;

function windowOf(size: number, ...ids: bigint[]): SequenceTracker {
  const tracker = createTracker({ kind: 'window', size });
  for (const id of ids) tracker.record(id);
  return tracker;
}

function outcome(tracker: SequenceTracker, id: bigint): string {
  return tracker.check(id).outcome;
}

describe('window policy - outcomes', () => {
  it('window - accepts ids above the highest as new', () => {
    const tracker = windowOf(8, 10n);
    expect(tracker.check(11n)).toEqual({ outcome: 'new' });
  });

  it('window - accepts a late id inside the window as new, then calls it a duplicate', () => {
    const tracker = windowOf(8, 10n, 12n);
    expect(tracker.check(11n)).toEqual({ outcome: 'new' });
    expect(tracker.record(11n).confirmedGaps).toEqual([]);
    expect(tracker.check(11n)).toEqual({ outcome: 'duplicate' });
  });

  it('window - calls a recorded id inside the window a duplicate', () => {
    const tracker = windowOf(8, 10n, 11n, 12n);
    for (const id of [10n, 11n, 12n]) expect(tracker.check(id)).toEqual({ outcome: 'duplicate' });
  });

  it('window - calls ids at or below highest - size stale, even when they were recorded', () => {
    const tracker = windowOf(4, 1n, 2n, 3n, 4n, 5n, 6n);
    // window(4) at highest 6 covers 3..6
    expect(outcome(tracker, 3n)).toBe('duplicate');
    expect(outcome(tracker, 2n)).toBe('stale');
    expect(outcome(tracker, 1n)).toBe('stale');
  });

  it('window - refuses to record a duplicate or a stale id and keeps its state', () => {
    const tracker = windowOf(4, 1n, 2n, 3n, 4n, 5n, 6n);
    const before = tracker.encode();
    expect(() => tracker.record(6n)).toThrow(/duplicate/);
    expect(() => tracker.record(4n)).toThrow(RangeError);
    expect(() => tracker.record(2n)).toThrow(/stale/);
    expect(tracker.encode()).toEqual(before);
  });

  it('window - check never changes the tracker', () => {
    const tracker = windowOf(64, 100n, 103n);
    const before = tracker.encode();
    for (const id of [1n, 50n, 99n, 100n, 101n, 103n, 104n, 10_000n, MAX]) tracker.check(id);
    expect(tracker.encode()).toEqual(before);
  });

  it('window - returns shared frozen results for the common outcomes', () => {
    const tracker = windowOf(8, 10n);
    expect(tracker.check(11n)).toBe(tracker.check(11n));
    expect(tracker.check(10n)).toBe(tracker.check(10n));
    expect(Object.isFrozen(tracker.check(1n))).toBe(true);
    expect(Object.isFrozen(tracker.record(11n))).toBe(true);
  });
});

describe('window policy - gaps', () => {
  it('window - reports the ids jumped over as skipped, without confirming them while they are in the window', () => {
    const tracker = windowOf(8, 10n);
    expect(tracker.check(14n)).toEqual({ outcome: 'new', skipped: { from: 11n, to: 13n } });
    expect(tracker.record(14n).confirmedGaps).toEqual([]);
  });

  it('window - reports ids that left the window unseen as a confirmed gap', () => {
    const tracker = windowOf(4, 10n, 11n, 13n, 14n);
    // 12 is in the window 11..14; it leaves when 16 arrives (window 13..16)
    expect(tracker.record(15n).confirmedGaps).toEqual([]);
    expect(tracker.record(16n).confirmedGaps).toEqual([{ from: 12n, to: 12n }]);
  });

  it('window - does not confirm a skipped id that arrived late inside the window', () => {
    const tracker = windowOf(4, 10n, 13n);
    tracker.record(11n);
    tracker.record(12n);
    expect(tracker.record(20n).confirmedGaps).toEqual([{ from: 14n, to: 16n }]);
  });

  it('window - merges adjacent unseen ids into one range', () => {
    const tracker = windowOf(8, 1n, 2n, 6n, 9n);
    // window 2..9: 3..5 and 7..8 unseen; 10..13 move 2..5 out, 14..17 move 6..9 out
    expect(tracker.record(13n).confirmedGaps).toEqual([{ from: 3n, to: 5n }]);
    expect(tracker.record(17n).confirmedGaps).toEqual([{ from: 7n, to: 8n }]);
  });

  it('window - on a jump past the window reports the unseen ids of the old window and the never-seen ids apart', () => {
    const tracker = windowOf(4, 10n, 11n, 12n, 13n, 16n);
    // window 13..16: 14 and 15 unseen; jumping to 30 (window 27..30) also passes 17..26
    expect(tracker.record(30n).confirmedGaps).toEqual([
      { from: 14n, to: 15n },
      { from: 17n, to: 26n },
    ]);
  });

  it('window - keeps separate gap ranges apart', () => {
    const tracker = windowOf(8, 1n, 3n, 5n, 8n);
    expect(tracker.record(20n).confirmedGaps).toEqual([
      { from: 2n, to: 2n },
      { from: 4n, to: 4n },
      { from: 6n, to: 7n },
      { from: 9n, to: 12n },
    ]);
  });

  it('window - never reports ids at or below the first recorded id minus one as gaps', () => {
    const tracker = windowOf(4, 100n);
    // window 97..100; 97..99 are below the floor: a consumer may start mid-stream
    expect(tracker.record(101n).confirmedGaps).toEqual([]);
    expect(tracker.record(110n).confirmedGaps).toEqual([{ from: 102n, to: 106n }]);
  });

  it('window - still accepts ids below the first recorded one as new while they are inside the window', () => {
    const tracker = windowOf(4, 100n);
    expect(tracker.check(98n)).toEqual({ outcome: 'new' });
    tracker.record(98n);
    expect(tracker.check(98n)).toEqual({ outcome: 'duplicate' });
    expect(tracker.check(96n)).toEqual({ outcome: 'stale' });
  });

  it('window - reports a jump of 2^63 as one range without visiting the ids', () => {
    const tracker = windowOf(65_536, 1n, 2n);
    const started = performance.now();
    const gaps = tracker.record(2n ** 63n).confirmedGaps;
    expect(performance.now() - started).toBeLessThan(100);
    expect(gaps).toEqual([{ from: 3n, to: 2n ** 63n - 65_536n }]);
    expect(tracker.check(2n ** 63n - 65_535n)).toEqual({ outcome: 'new' });
    expect(tracker.check(2n ** 63n - 65_536n)).toEqual({ outcome: 'stale' });
  });

  it('window - handles jumps of exactly size - 1, size and size + 1', () => {
    // size - 1: 4..10 leave (4..9 below the floor, 10 recorded); then size: all of 11..18 leave
    const a = windowOf(8, 10n, 11n);
    expect(a.record(18n).confirmedGaps).toEqual([]);
    expect(a.record(26n).confirmedGaps).toEqual([{ from: 12n, to: 17n }]);
    // size: every slot of the old window leaves, and no id skips the window entirely
    const b = windowOf(8, 10n, 12n);
    expect(b.record(20n).confirmedGaps).toEqual([{ from: 11n, to: 11n }]);
    expect(outcome(b, 13n)).toBe('new');
    // size + 1: one id (13) never entered the window
    const c = windowOf(8, 10n, 12n);
    expect(c.record(21n).confirmedGaps).toEqual([
      { from: 11n, to: 11n },
      { from: 13n, to: 13n },
    ]);
  });
});

describe('window policy - boundaries', () => {
  it('window - accepts the boundary ids 1 and 2^64 - 1', () => {
    const tracker = windowOf(16, 1n);
    expect(tracker.check(MAX)).toEqual({ outcome: 'new', skipped: { from: 2n, to: MAX - 1n } });
    expect(tracker.record(MAX).confirmedGaps).toEqual([{ from: 2n, to: MAX - 16n }]);
    expect(outcome(tracker, MAX)).toBe('duplicate');
    expect(outcome(tracker, MAX - 15n)).toBe('new');
    expect(outcome(tracker, MAX - 16n)).toBe('stale');
    expect(outcome(tracker, 1n)).toBe('stale');
  });

  it('window - takes 2^64 - 1 in order and then refuses 2^64 with RangeError', () => {
    const tracker = windowOf(8, MAX - 2n, MAX - 1n);
    expect(tracker.check(MAX)).toEqual({ outcome: 'new' });
    expect(tracker.record(MAX).confirmedGaps).toEqual([]);
    expect(() => tracker.check(MAX + 1n)).toThrow(RangeError);
    expect(() => tracker.record(MAX + 1n)).toThrow(RangeError);
    expect(outcome(tracker, MAX - 7n)).toBe('new');
  });

  it('window - takes 1 as the first id of an empty tracker, with the floor at 0', () => {
    const tracker = createTracker({ kind: 'window', size: 4 });
    expect(tracker.check(1n)).toEqual({ outcome: 'new' });
    tracker.record(1n);
    expect(tracker.check(1n)).toEqual({ outcome: 'duplicate' });
    tracker.record(3n);
    expect(tracker.record(9n).confirmedGaps).toEqual([
      { from: 2n, to: 2n },
      { from: 4n, to: 5n },
    ]);
  });

  it('window - throws RangeError for 0, negative and above-u64 ids and TypeError for non-bigints', () => {
    const tracker = windowOf(8, 5n);
    for (const id of [0n, -1n, MAX + 1n]) {
      expect(() => tracker.check(id)).toThrow(RangeError);
      expect(() => tracker.record(id)).toThrow(RangeError);
    }
    const notBigints: unknown[] = [5, '5', undefined, null, {}];
    for (const id of notBigints) {
      expect(() => tracker.check(id as bigint)).toThrow(TypeError);
      expect(() => tracker.record(id as bigint)).toThrow(TypeError);
    }
  });

  it('window - of size 1 behaves like highest', () => {
    const w = windowOf(1, 5n);
    const h = createTracker({ kind: 'highest' });
    h.record(5n);
    for (const id of [4n, 5n, 6n, 9n]) expect(w.check(id)).toEqual(h.check(id));
    expect(w.record(9n)).toEqual(h.record(9n));
    expect(w.record(10n)).toEqual(h.record(10n));
  });

  it('window - of size 65536 accepts reordering up to 65535 ids and calls 65536 behind stale', () => {
    const tracker = windowOf(65_536, 1n);
    tracker.record(100_000n);
    expect(outcome(tracker, 100_000n - 65_535n)).toBe('new');
    expect(outcome(tracker, 100_000n - 65_536n)).toBe('stale');
    tracker.record(100_000n - 65_535n);
    expect(outcome(tracker, 100_000n - 65_535n)).toBe('duplicate');
    expect(tracker.record(100_001n).confirmedGaps).toEqual([]);
    expect(outcome(tracker, 100_000n - 65_535n)).toBe('stale');
    expect(tracker.record(100_002n).confirmedGaps).toEqual([
      { from: 100_000n - 65_534n, to: 100_000n - 65_534n },
    ]);
  });

  it('window - of the largest size works', () => {
    const tracker = windowOf(MAX_WINDOW_SIZE, 10n, 20n);
    expect(outcome(tracker, 15n)).toBe('new');
    expect(tracker.record(20n + BigInt(MAX_WINDOW_SIZE) + 1n).confirmedGaps).toEqual([
      { from: 11n, to: 19n },
      { from: 21n, to: 21n },
    ]);
  });

  it('window - keeps exact confirmed gaps across many ring wrap-arounds, at every block boundary', () => {
    for (const size of [1, 31, 32, 33, 63, 64, 65, 100]) {
      const tracker = createTracker({ kind: 'window', size });
      const gaps: bigint[] = [];
      let last = 0n;
      for (let id = 1n; id <= 5_000n; id++) {
        if (id % 7n === 3n) continue;
        for (const range of tracker.record(id).confirmedGaps) {
          for (let g = range.from; g <= range.to; g++) gaps.push(g);
        }
        last = id;
      }
      const expected: bigint[] = [];
      for (let id = 2n; id <= last - BigInt(size); id++) if (id % 7n === 3n) expected.push(id);
      expect(gaps, `size ${size}`).toEqual(expected);
    }
  });
});

describe('window policy - specs and clones', () => {
  it('window - rejects sizes outside 1..2^20 and non-integers with RangeError', () => {
    for (const size of [0, -1, MAX_WINDOW_SIZE + 1, 1.5, Number.NaN, Infinity]) {
      expect(() => createTracker({ kind: 'window', size })).toThrow(RangeError);
    }
  });

  it('window - rejects a non-number size with TypeError, an unknown kind with RangeError, a non-object spec with TypeError', () => {
    expect(() => createTracker({ kind: 'window', size: '8' as unknown as number })).toThrow(TypeError);
    expect(() => createTracker({ kind: 'latest' } as unknown as { kind: 'highest' })).toThrow(RangeError);
    expect(() => createTracker(null as unknown as { kind: 'highest' })).toThrow(TypeError);
  });

  it('window - freezes its spec, a copy of the one given', () => {
    const spec = { kind: 'window' as const, size: 8 };
    const tracker = createTracker(spec);
    expect(tracker.spec).toEqual(spec);
    expect(Object.isFrozen(tracker.spec)).toBe(true);
  });

  it('window - a clone and its original change independently', () => {
    const original = windowOf(8, 10n, 12n);
    const clone = original.clone();
    clone.record(11n);
    expect(outcome(original, 11n)).toBe('new');
    expect(outcome(clone, 11n)).toBe('duplicate');
    original.record(30n);
    expect(clone.highest).toBe(12n);
    expect(outcome(clone, 12n)).toBe('duplicate');
    expect(outcome(original, 12n)).toBe('stale');
    expect(clone.record(13n).confirmedGaps).toEqual([]);
  });
});

describe('declared skips (x-dedup-skip-from)', () => {
  it('highest - the declared part of a jump is not a gap; the rest still is', () => {
    const tracker = createTracker({ kind: 'highest' });
    tracker.record(10n);
    expect(tracker.record(20n, 15n).confirmedGaps).toEqual([{ from: 11n, to: 14n }]);
    expect(tracker.record(30n, 21n).confirmedGaps).toEqual([]);
  });

  it('window - declared IDs leave the window as skips, undeclared ones as gaps, later or at once', () => {
    const tracker = windowOf(4, 10n);
    // 11..19 jumped over; 11..15 are declared skipped. 11..15 never entered the window (one range,
    // minus the declared part: nothing); 16..19 are inside it and may still arrive.
    expect(tracker.record(20n, 11n).confirmedGaps).toEqual([]);
    expect(tracker.check(18n)).toEqual({ outcome: 'new' }); // a contradicting late ID is still judged
    tracker.record(18n);
    expect(tracker.record(30n).confirmedGaps).toEqual([{ from: 21n, to: 26n }]);
  });

  it('window - a declared range survives encode/decode until it has left the window', () => {
    const tracker = windowOf(8, 1n);
    tracker.record(6n, 2n);
    const decoded = decodeTracker(tracker.encode());
    expect(tracker.encode()[0]).toBe(2); // the format version that carries declared skips
    expect(decoded.record(20n).confirmedGaps).toEqual([{ from: 7n, to: 12n }]);
    expect(decoded.encode()[0]).toBe(1); // left the window: nothing to carry any more
  });

  it('refuses a skippedFrom that is not a bigint between 1 and id - 1, and changes nothing', () => {
    for (const tracker of [createTracker({ kind: 'highest' }), windowOf(8)]) {
      tracker.record(5n);
      expect(() => tracker.record(9n, 9n)).toThrow(RangeError);
      expect(() => tracker.record(9n, 0n)).toThrow(RangeError);
      expect(() => tracker.record(9n, 7 as unknown as bigint)).toThrow(TypeError);
      expect(tracker.highest).toBe(5n);
      expect(tracker.record(9n, 6n).confirmedGaps).toEqual([]);
    }
  });
});

describe('declared skips - bounded', () => {
  it('keeps the last MAX_DECLARED_RANGES declarations; an older one left behind is reported as a gap', () => {
    const tracker = createTracker({ kind: 'window', size: 1_000 });
    tracker.record(1n);
    // IDs 3, 5, 7, …: each declares the one before it skipped, 40 declarations in the window.
    for (let id = 3n; id <= 81n; id += 2n) expect(tracker.record(id, id - 1n).confirmedGaps).toEqual([]);
    expect(tracker.encode().length).toBe(22 + 125 + 4 + 16 * MAX_DECLARED_RANGES);
    // Everything leaves the window: the 8 forgotten declarations (2, 4, …, 16) come out as gaps.
    const gaps = tracker.record(5_000n).confirmedGaps;
    expect(gaps.slice(0, 8)).toEqual(
      [2n, 4n, 6n, 8n, 10n, 12n, 14n, 16n].map((id) => ({ from: id, to: id })),
    );
    expect(gaps.slice(8)).toEqual([{ from: 82n, to: 4_000n }]); // the window is now 4 001..5 000
  });
});
