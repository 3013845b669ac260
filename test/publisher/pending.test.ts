import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { PendingQueue } from '../../src/publisher/pending.js';

describe('pending queue', () => {
  it('takes entries in any order and keeps the rest in id order (model: a sorted Map)', () => {
    fc.assert(
      fc.property(
        fc.uniqueArray(fc.bigInt({ min: 1n, max: 10_000n }), { minLength: 1, maxLength: 300 }),
        fc.array(fc.nat(), { maxLength: 400 }),
        (raw, picks) => {
          const ids = [...raw].sort((a, b) => (a < b ? -1 : 1));
          const queue = new PendingQueue<{ publishingId: bigint }>();
          const model = new Map<bigint, { publishingId: bigint }>();
          for (const id of ids) {
            const e = { publishingId: id };
            queue.push(e);
            model.set(id, e);
          }
          for (const p of picks) {
            // Mostly the head (confirms in order), sometimes any id, sometimes one not pending.
            const id = p % 3 === 0 ? ids[p % ids.length]! : p % 3 === 1 ? [...model.keys()][0] : BigInt(p);
            if (id === undefined) continue;
            expect(queue.take(id)).toBe(model.get(id));
            model.delete(id);
            expect(queue.size).toBe(model.size);
          }
          expect([...queue.values()]).toEqual([...model.values()]);
        },
      ),
    );
  });

  it("interleaves pushes and takes across the ring's wrap-around and growth (model: a sorted Map)", () => {
    fc.assert(
      fc.property(
        fc.array(
          // More pushes than takes: the queue fills, wraps around and grows.
          fc.oneof(
            { arbitrary: fc.record({ push: fc.integer({ min: 1, max: 3 }) }), weight: 5 },
            { arbitrary: fc.record({ take: fc.nat() }), weight: 2 },
            { arbitrary: fc.record({ takeHead: fc.constant(true) }), weight: 2 },
          ),
          { maxLength: 600, size: 'large' },
        ),
        (ops) => {
          const queue = new PendingQueue<{ publishingId: bigint }>();
          const model = new Map<bigint, { publishingId: bigint }>();
          let next = 0n;
          for (const op of ops) {
            if ('push' in op) {
              next += BigInt(op.push);
              const e = { publishingId: next };
              queue.push(e);
              model.set(next, e);
            } else {
              const keys = [...model.keys()];
              const id =
                'takeHead' in op
                  ? keys[0]
                  : keys.length > 0 && op.take % 4 !== 0
                    ? keys[op.take % keys.length]
                    : BigInt(op.take);
              if (id === undefined) continue;
              expect(queue.take(id)).toBe(model.get(id));
              model.delete(id);
            }
            expect(queue.size).toBe(model.size);
          }
          expect([...queue.values()]).toEqual([...model.values()]);
          // The highest pending ID bounds the next push, whatever was taken around it.
          const highest = [...model.keys()].at(-1);
          if (highest !== undefined) expect(() => queue.push({ publishingId: highest })).toThrow(RangeError);
        },
      ),
      { numRuns: 300 },
    );
  });

  it('refuses an id not above the last one', () => {
    const queue = new PendingQueue<{ publishingId: bigint }>();
    queue.push({ publishingId: 5n });
    expect(() => queue.push({ publishingId: 5n })).toThrow(RangeError);
  });
});
