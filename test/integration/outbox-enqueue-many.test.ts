/**
 * PgOutbox.enqueueMany against the real PostgreSQL and broker (issue 35): one INSERT for many rows
 * in the caller's transaction — committed rows published once, in the items' order, with their
 * keys and headers; a rolled-back call publishes nothing; a refused item inserts nothing and leaves
 * the transaction usable.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { PgOutbox, PgOutboxRelay } from '../../src/postgres.js';
import { STREAM_CONNECTION, uniqueName } from '../support/broker.js';
import { useSchema } from '../support/postgres.js';
import { readAll, useClient } from '../support/stream.js';

const client = useClient();
const cleanups: Array<() => Promise<void>> = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup().catch(() => undefined);
});

describe('PgOutbox.enqueueMany', () => {
  it('inserts many rows with one statement in the caller’s transaction; the relay publishes them once, in order', async () => {
    const db = await useSchema();
    cleanups.push(db.drop);
    const stream = uniqueName('outbox-many');
    await client().createStream({ stream, arguments: {} });
    cleanups.push(async () => {
      await client().deleteStream({ stream });
    });
    const producerName = uniqueName('relay');
    const outbox = PgOutbox.create({ schema: db.schema, producerName });
    const items = Array.from({ length: 1_000 }, (_, i) => ({
      body: Buffer.from(`m${i}`),
      key: `k${i % 7}`,
      ...(i % 2 === 0 ? { headers: { n: i + 1, t: 'even' } } : {}),
    }));
    const c = await db.pool.connect();
    let ids: bigint[];
    try {
      await c.query('BEGIN');
      await outbox.enqueueMany(c, [{ body: Buffer.from('rolled-back') }, { body: Buffer.from('too') }]);
      await c.query('ROLLBACK');
      await c.query('BEGIN');
      ids = (await outbox.enqueueMany(c, items)).map((r) => r.id);
      // A refused item: nothing inserted, nothing sent, the transaction still usable.
      await expect(
        outbox.enqueueMany(c, [{ body: Buffer.from('x') }, { body: Buffer.from('y'), key: 'a\u0000' }]),
      ).rejects.toThrow(/^items\[1\]: /);
      await c.query('COMMIT');
    } finally {
      c.release();
    }
    const stored = await db.pool.query<{ id: string; body: Buffer; message_key: string }>(
      `SELECT id, body, message_key FROM "${db.schema}".outbox ORDER BY id`,
    );
    expect(stored.rows.map((r) => BigInt(r.id))).toEqual(ids);
    expect(stored.rows.map((r) => r.body.toString())).toEqual(items.map((i) => i.body.toString()));
    expect(stored.rows.map((r) => r.message_key)).toEqual(items.map((i) => i.key));

    let confirmed = 0;
    let all: () => void = () => undefined;
    const allConfirmed = new Promise<void>((resolve) => (all = resolve));
    const relay = await PgOutboxRelay.open({
      pool: db.pool,
      schema: db.schema,
      producerName,
      stream,
      connection: STREAM_CONNECTION,
      onEvent: (e) => {
        if (e.type === 'confirmed' && (confirmed += e.count) >= items.length) all();
      },
    });
    cleanups.push(() => relay.close());
    await allConfirmed;
    const messages = await readAll(client(), stream);
    expect(messages.map((m) => m.content.toString())).toEqual(items.map((i) => i.body.toString()));
    expect(messages.map((m) => String(m.applicationProperties?.['x-dedup-id']))).toEqual(
      items.map((_, i) => String(i + 1)),
    );
    expect(messages[0]!.applicationProperties).toMatchObject({ n: 1, t: 'even' });
    expect(messages[1]!.applicationProperties?.['t']).toBeUndefined();
  });
});
