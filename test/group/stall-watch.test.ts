import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { watchTimings } from '../../src/group/partition-watch.js';
import { StallWatch, type StallObservation } from '../../src/group/stall-watch.js';

const STALLED_MS = 6_000;
/** The changelog's last ID after a batch ending at offset `last`. */
const idAfter = (last: bigint): bigint => last + 2n;

describe('stalled-partition watch - when input waits with no member applying it', () => {
  it('probes once input has waited stalledMs with the changelog unchanged, from the first offset not applied', () => {
    const watch = new StallWatch(STALLED_MS);
    const at = (ms: number, committedChunkId = 120n): StallObservation => ({
      lastId: idAfter(99n),
      committedChunkId,
      at: ms,
    });
    expect(watch.observe(at(0, 90n))).toBeUndefined(); // a new period: the last chunk is applied
    expect(watch.observe(at(1_000, 90n))).toBeUndefined();
    expect(watch.observe(at(2_000))).toBeUndefined(); // chunk 120 waits from here
    expect(watch.observe(at(7_999))).toBeUndefined();
    expect(watch.observe(at(8_000))).toBe(100n);
    // Not again at the next reading: another stalledMs first.
    expect(watch.observe(at(9_000))).toBeUndefined();
    expect(watch.observe(at(14_000))).toBe(100n);
  });

  it('a changelog that moves is progress: the wait starts again', () => {
    const watch = new StallWatch(STALLED_MS);
    expect(watch.observe({ lastId: idAfter(10n), committedChunkId: 50n, at: 0 })).toBeUndefined();
    expect(watch.observe({ lastId: idAfter(10n), committedChunkId: 50n, at: 1_000 })).toBeUndefined();
    for (let t = 2_000, last = 11n; t < 30_000; t += 1_000, last++) {
      expect(watch.observe({ lastId: idAfter(last), committedChunkId: 50n, at: t })).toBeUndefined();
    }
  });

  it('before any entry, only a chunk newer than the first reading counts, and the probe starts at it', () => {
    const watch = new StallWatch(STALLED_MS);
    // 'next': what was in the partition before is not the group's input.
    expect(watch.observe({ lastId: 0n, committedChunkId: 500n, at: 0 })).toBeUndefined();
    expect(watch.observe({ lastId: 0n, committedChunkId: 500n, at: 10_000 })).toBeUndefined();
    expect(watch.observe({ lastId: 0n, committedChunkId: 530n, at: 11_000 })).toBeUndefined();
    expect(watch.observe({ lastId: 0n, committedChunkId: 530n, at: 17_000 })).toBe(530n);
    // Out of the group and back (reset): the first reading's chunk still decides, so the input
    // that waited counts again. Only the genesis (ID 1): the same rule.
    watch.reset();
    expect(watch.observe({ lastId: 1n, committedChunkId: 530n, at: 20_000 })).toBeUndefined();
    expect(watch.observe({ lastId: 1n, committedChunkId: 530n, at: 26_000 })).toBe(530n);
    const fresh = new StallWatch(STALLED_MS);
    expect(fresh.observe({ lastId: 1n, committedChunkId: 530n, at: 0 })).toBeUndefined();
    expect(fresh.observe({ lastId: 1n, committedChunkId: 530n, at: 60_000 })).toBeUndefined();
  });

  it('a probe that found nothing (a tracking chunk, a slow read) quiets the watch for 4 × stalledMs, not for good', () => {
    const watch = new StallWatch(STALLED_MS);
    const lastId = idAfter(99n);
    watch.observe({ lastId, committedChunkId: 100n, at: 0 });
    expect(watch.observe({ lastId, committedChunkId: 100n, at: 6_000 })).toBe(100n);
    watch.foundNothing(6_500);
    expect(watch.observe({ lastId, committedChunkId: 100n, at: 20_000 })).toBeUndefined();
    expect(watch.observe({ lastId, committedChunkId: 101n, at: 30_000 })).toBeUndefined();
    expect(watch.observe({ lastId, committedChunkId: 101n, at: 30_500 })).toBe(100n);
  });

  it('leaving: the time out doubles with each leave while the changelog stays, up to 16 times, and starts over once it moves', () => {
    const watch = new StallWatch(STALLED_MS);
    const stuck = idAfter(99n);
    watch.observe({ lastId: stuck, committedChunkId: 100n, at: 0 });
    expect([1, 2, 3, 4, 5, 6].map(() => watch.leaving())).toEqual([1, 2, 4, 8, 16, 16]);
    watch.observe({ lastId: stuck, committedChunkId: 100n, at: 1_000 });
    expect(watch.leaving()).toBe(16);
    watch.observe({ lastId: idAfter(150n), committedChunkId: 160n, at: 2_000 });
    expect(watch.leaving()).toBe(1);
  });

  it('timings: a sixth of stalledMs between readings (1 to 10 s); out of the group longer than a member stays in a stuck one', () => {
    expect(watchTimings(60_000)).toEqual({ checkMs: 10_000, leaveMs: 95_000 });
    expect(watchTimings(6_000)).toEqual({ checkMs: 1_000, leaveMs: 14_000 });
    expect(watchTimings(1)).toEqual({ checkMs: 1_000, leaveMs: 8_001 });
    expect(watchTimings(600_000).checkMs).toBe(10_000);
  });

  it('property: a probe only after stalledMs of unapplied input with an unchanged changelog, from past what is applied; and a stall that lasts is always probed', () => {
    const step = fc.record({
      dt: fc.integer({ min: 0, max: 3_000 }),
      batch: fc.option(fc.integer({ min: 1, max: 40 }), { freq: 3 }),
      chunk: fc.option(fc.integer({ min: 1, max: 40 }), { freq: 2 }),
      empty: fc.boolean(),
    });
    fc.assert(
      fc.property(fc.array(step, { maxLength: 60 }), fc.integer({ min: 500, max: 3_000 }), (steps, check) => {
        const watch = new StallWatch(STALLED_MS);
        let at = 0;
        let applied = -1n; // the last offset applied; -1n: nothing yet
        let chunk = 0n;
        let lastId = 0n;
        /** When the watch first saw the current lastId. */
        let periodStart = 0;
        let seenLastId: bigint | undefined;
        let lastProbe = -Infinity;
        let quietUntil = -Infinity;
        const read = (): bigint | undefined => {
          if (lastId !== seenLastId) {
            seenLastId = lastId;
            periodStart = at;
            lastProbe = -Infinity;
            quietUntil = -Infinity;
          }
          const from = watch.observe({ lastId, committedChunkId: chunk, at });
          if (from !== undefined) {
            expect(at - periodStart).toBeGreaterThanOrEqual(STALLED_MS);
            expect(at - lastProbe).toBeGreaterThanOrEqual(STALLED_MS);
            expect(at).toBeGreaterThanOrEqual(quietUntil);
            expect(from).toBeLessThanOrEqual(chunk);
            if (lastId >= 2n) expect(from).toBe(lastId - 1n);
            lastProbe = at;
          }
          return from;
        };
        for (const s of steps) {
          at += s.dt;
          if (s.chunk !== null) chunk += BigInt(s.chunk);
          if (s.batch !== null && applied < chunk + 40n) {
            applied += BigInt(s.batch);
            lastId = idAfter(applied);
          }
          const from = read();
          if (from !== undefined && s.empty) {
            watch.foundNothing(at);
            quietUntil = at + 4 * STALLED_MS;
          }
        }
        // Then input arrives and nobody applies it: readings every `check` ms find it.
        at += check;
        read();
        chunk = (applied > chunk ? applied : chunk) + 1n;
        const stalledFrom = at;
        let probed: bigint | undefined;
        while (probed === undefined && at - stalledFrom <= 5 * STALLED_MS + 2 * check) {
          at += check;
          probed = read();
        }
        expect(probed).toBeDefined();
      }),
    );
  });
});
