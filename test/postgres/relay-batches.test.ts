import { describe, expect, it } from 'vitest';
import { SentBatches } from '../../src/postgres/outbox/relay-batches.js';

describe('SentBatches', () => {
  it('completes a record once every ID sent in it is confirmed, in any order, and counts its rows', () => {
    const batches = new SentBatches();
    batches.add(1n, 3, 3); // IDs 1–3
    batches.add(4n, 4, 2); // IDs 4–7, a recovered record whose 4 and 5 the broker held: 6, 7 sent
    batches.add(8n, 1, 1);
    expect(batches.confirm(8n)).toBe(true);
    expect(batches.confirm(2n)).toBe(false);
    expect(batches.confirm(7n)).toBe(false);
    expect(batches.confirm(6n)).toBe(true);
    expect(batches.confirm(99n)).toBe(false); // no record holds it
    expect(batches.hasDone).toBe(true);
    const done = batches.takeDone();
    expect(done.map((b) => b.first)).toEqual([8n, 4n]);
    expect(batches.hasDone).toBe(false);
    expect(batches.deleted(done)).toEqual({ count: 3, lastId: 8n });
    expect(batches.confirm(1n)).toBe(false);
    expect(batches.confirm(3n)).toBe(true);
    expect(batches.deleted(batches.takeDone())).toEqual({ count: 3, lastId: 3n });
  });
});
