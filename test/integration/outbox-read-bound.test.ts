/**
 * The numbering's read is bounded in bytes (REVIEW.md §6): `batchSize` rows of up to 1 MiB each
 * were read at once (500 MiB with the defaults). A read stops after READ_BYTES of bodies (one larger
 * row alone), reports that more wait, and the next read takes the rest, in id order.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { PgOutbox } from '../../src/postgres.js';
import { READ_BYTES, RelayDb } from '../../src/postgres/outbox/relay-db.js';
import { useSchema } from '../support/postgres.js';

const cleanups: Array<() => Promise<void>> = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup().catch(() => undefined);
});

describe('outbox relay - the numbering read', () => {
  it('reads at most READ_BYTES of bodies per numbering; the next read takes the rest in order', async () => {
    const db = await useSchema();
    cleanups.push(db.drop);
    const producerName = 'read-bound';
    const outbox = PgOutbox.create({ schema: db.schema, producerName });
    const size = 1_000_000;
    const n = Math.ceil(READ_BYTES / size) + 3;
    const c = await db.pool.connect();
    try {
      await c.query('BEGIN');
      for (let i = 0; i < n; i++) await outbox.enqueue(c, Buffer.alloc(size, i));
      await c.query('COMMIT');
      const relayDb = new RelayDb(db.schema, producerName, 30_000);
      const epoch = await relayDb.takeover(c, 'test', undefined, ['s']);
      const place = () => ({ target: 's', headers: undefined });
      const first = await relayDb.assign(c, epoch, 500, place);
      const firstRows = first.batches.flatMap((b) => b.rows);
      expect(firstRows.reduce((sum, r) => sum + r.body.length, 0)).toBeLessThanOrEqual(READ_BYTES + size);
      expect(firstRows.length).toBeLessThan(n);
      expect(first.more).toBe(true);
      const second = await relayDb.assign(c, epoch, 500, place);
      const all = [...firstRows, ...second.batches.flatMap((b) => b.rows)];
      expect(all.map((r) => r.body[0])).toEqual(Array.from({ length: n }, (_, i) => i));
      expect(all.map((r) => r.publishingId)).toEqual(Array.from({ length: n }, (_, i) => BigInt(i + 1)));
      expect(second.more).toBe(false);
    } finally {
      c.release();
    }
  }, 60_000);
});
