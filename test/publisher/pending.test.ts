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

  it('refuses an id not above the last one', () => {
    const queue = new PendingQueue<{ publishingId: bigint }>();
    queue.push({ publishingId: 5n });
    expect(() => queue.push({ publishingId: 5n })).toThrow(RangeError);
  });
});
