import { describe, expect, it } from 'vitest';
import { createTracker } from '../../src/verifier/index.js';

const MAX = 2n ** 64n - 1n;

function recorded(...ids: bigint[]) {
  const tracker = createTracker({ kind: 'highest' });
  for (const id of ids) tracker.record(id);
  return tracker;
}

describe('highest policy', () => {
  it('highest - starts empty with highest 0 and a frozen spec', () => {
    const tracker = createTracker({ kind: 'highest' });
    expect(tracker.highest).toBe(0n);
    expect(tracker.spec).toEqual({ kind: 'highest' });
    expect(Object.isFrozen(tracker.spec)).toBe(true);
  });

  it('highest - accepts any first id as new without reporting the ids below it as skipped', () => {
    const tracker = createTracker({ kind: 'highest' });
    expect(tracker.check(1_000n)).toEqual({ outcome: 'new' });
    expect(tracker.record(1_000n).confirmedGaps).toEqual([]);
    expect(tracker.highest).toBe(1_000n);
  });

  it('highest - accepts the next id as new and records it without a gap', () => {
    const tracker = recorded(5n);
    expect(tracker.check(6n)).toEqual({ outcome: 'new' });
    expect(tracker.record(6n).confirmedGaps).toEqual([]);
  });

  it('highest - reports the ids jumped over as skipped', () => {
    expect(recorded(5n).check(9n)).toEqual({ outcome: 'new', skipped: { from: 6n, to: 8n } });
  });

  it('highest - confirms the jumped-over ids as a gap when recording (a window of one cannot take them later)', () => {
    const tracker = recorded(5n);
    expect(tracker.record(9n).confirmedGaps).toEqual([{ from: 6n, to: 8n }]);
    expect(tracker.check(7n)).toEqual({ outcome: 'stale' });
  });

  it('highest - calls the highest id a duplicate', () => {
    expect(recorded(5n).check(5n)).toEqual({ outcome: 'duplicate' });
  });

  it('highest - calls any id below the highest stale, never a duplicate', () => {
    const tracker = recorded(3n, 5n);
    expect(tracker.check(3n)).toEqual({ outcome: 'stale' }); // recorded, but the policy cannot know
    expect(tracker.check(4n)).toEqual({ outcome: 'stale' }); // never seen: a reordered message it loses
  });

  it('highest - refuses to record a duplicate or a stale id, and keeps its state', () => {
    const tracker = recorded(5n);
    expect(() => tracker.record(5n)).toThrow(RangeError);
    expect(() => tracker.record(4n)).toThrow(/stale/);
    expect(tracker.highest).toBe(5n);
  });

  it('highest - accepts the boundary ids 1 and 2^64 - 1', () => {
    const tracker = createTracker({ kind: 'highest' });
    expect(tracker.record(1n).confirmedGaps).toEqual([]);
    expect(tracker.check(MAX)).toEqual({ outcome: 'new', skipped: { from: 2n, to: MAX - 1n } });
    expect(tracker.record(MAX).confirmedGaps).toEqual([{ from: 2n, to: MAX - 1n }]);
    expect(tracker.check(MAX)).toEqual({ outcome: 'duplicate' });
  });

  it('highest - takes 2^64 - 1 in order and then refuses 2^64 with RangeError', () => {
    const tracker = recorded(MAX - 2n, MAX - 1n);
    expect(tracker.check(MAX)).toEqual({ outcome: 'new' });
    expect(tracker.record(MAX).confirmedGaps).toEqual([]);
    expect(() => tracker.check(MAX + 1n)).toThrow(RangeError);
    expect(() => tracker.record(MAX + 1n)).toThrow(RangeError);
    expect(tracker.highest).toBe(MAX);
  });

  it('highest - reports a jump of 2^63 as one range', () => {
    const tracker = recorded(1n);
    expect(tracker.record(2n ** 63n + 1n).confirmedGaps).toEqual([{ from: 2n, to: 2n ** 63n }]);
  });

  it('highest - throws RangeError for 0, negative and above-u64 ids and TypeError for non-bigints', () => {
    const tracker = recorded(5n);
    for (const id of [0n, -1n, MAX + 1n]) {
      expect(() => tracker.check(id)).toThrow(RangeError);
      expect(() => tracker.record(id)).toThrow(RangeError);
    }
    for (const id of [1, '1', undefined, null]) {
      expect(() => tracker.check(id as unknown as bigint)).toThrow(TypeError);
      expect(() => tracker.record(id as unknown as bigint)).toThrow(TypeError);
    }
  });

  it('highest - check never changes the tracker', () => {
    const tracker = recorded(5n);
    const before = tracker.encode();
    for (const id of [1n, 5n, 6n, 100n, MAX]) tracker.check(id);
    expect(tracker.encode()).toEqual(before);
  });

  it('highest - a clone and its original change independently', () => {
    const original = recorded(5n);
    const clone = original.clone();
    clone.record(6n);
    expect(original.highest).toBe(5n);
    expect(original.check(6n)).toEqual({ outcome: 'new' });
    original.record(10n);
    expect(clone.highest).toBe(6n);
  });

  it('highest - returns shared frozen results for the common outcomes', () => {
    const tracker = recorded(5n);
    expect(Object.isFrozen(tracker.check(6n))).toBe(true);
    expect(tracker.check(6n)).toBe(tracker.check(6n));
    expect(tracker.check(5n)).toBe(tracker.check(5n));
    const result = tracker.record(6n);
    expect(Object.isFrozen(result)).toBe(true);
    expect(Object.isFrozen(result.confirmedGaps)).toBe(true);
  });
});
