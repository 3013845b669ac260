/**
 * The outbox relay's write path (docs/design.md §14, issue 35 "Measure"): after the application's
 * INSERT, each row is written once — the numbering DELETE that moves it into a batch record — and
 * nothing per row after the confirm (one record per batch is deleted). The relay used to UPDATE
 * every row at numbering and DELETE it after its confirm: ~30 µs a row here, which capped it near
 * 30 000 rows/s. Counted with PostgreSQL's own tuple counters (pg_stat_user_tables).
 */
import pg from 'pg';
import { afterEach, describe, expect, it } from 'vitest';
import { PgOutbox, PgOutboxRelay } from '../../src/postgres.js';
import { STREAM_CONNECTION, uniqueName } from '../support/broker.js';
import { PG_URL, useSchema } from '../support/postgres.js';
import { readAll, useClient } from '../support/stream.js';

const client = useClient();
const cleanups: Array<() => Promise<void>> = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup().catch(() => undefined);
});

interface TupleCounts {
  readonly ins: number;
  readonly upd: number;
  readonly del: number;
}

/** The tuple counters of `schema.table` (0 for a table the statistics do not know yet). */
async function counts(pool: pg.Pool, schema: string, table: string): Promise<TupleCounts> {
  const { rows } = await pool.query<TupleCounts>(
    `SELECT n_tup_ins::int AS ins, n_tup_upd::int AS upd, n_tup_del::int AS del
       FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = $2`,
    [schema, table],
  );
  return rows[0] ?? { ins: 0, upd: 0, del: 0 };
}

describe('outbox relay - writes', () => {
  it('writes each row once after its INSERT (its DELETE into a batch record), one record per batch', async () => {
    const db = await useSchema();
    cleanups.push(db.drop);
    const stream = uniqueName('outbox-writes');
    await client().createStream({ stream, arguments: {} });
    cleanups.push(async () => void (await client().deleteStream({ stream })));
    const producerName = uniqueName('outbox-writes');
    const outbox = PgOutbox.create({ schema: db.schema, producerName });
    const n = 300;
    const c = await db.pool.connect();
    try {
      for (let t = 0; t < 3; t++) {
        await c.query('BEGIN');
        for (let i = 0; i < n / 3; i++) await outbox.enqueue(c, Buffer.from(`m${t * (n / 3) + i}`));
        await c.query('COMMIT');
      }
    } finally {
      c.release();
    }
    // The relay's own pool: ending it ends its sessions, which flushes their statistics.
    const relayPool = new pg.Pool({ connectionString: PG_URL, max: 4 });
    relayPool.on('error', () => undefined);
    let confirmed = 0;
    let allConfirmed!: () => void;
    const done = new Promise<void>((resolve) => (allConfirmed = resolve));
    const relay = await PgOutboxRelay.open({
      pool: relayPool,
      schema: db.schema,
      producerName,
      stream,
      connection: STREAM_CONNECTION,
      batchSize: 100,
      onEvent: (e) => {
        if (e.type === 'confirmed' && (confirmed += e.count) >= n) allConfirmed();
      },
    });
    await done;
    await relay.close();
    await relayPool.end();
    expect((await readAll(client(), stream)).map((m) => m.content.toString())).toEqual(
      Array.from({ length: n }, (_, i) => `m${i}`),
    );
    // Statistics reach the shared counters when a session ends (no event to wait for): bounded poll.
    const deadline = Date.now() + 15_000;
    let outboxCounts = await counts(db.pool, db.schema, 'outbox');
    while (outboxCounts.del < n && Date.now() < deadline) {
      await new Promise((resolve) => setTimeout(resolve, 100));
      outboxCounts = await counts(db.pool, db.schema, 'outbox');
    }
    const batchCounts = await counts(db.pool, db.schema, 'outbox_batches');
    console.log(
      `[outbox writes] outbox ${JSON.stringify(outboxCounts)}, batches ${JSON.stringify(batchCounts)}`,
    );
    // (The application's INSERTs reach the counters when its own session flushes: not asserted.)
    expect(outboxCounts.upd).toBe(0);
    expect(outboxCounts.del).toBe(n);
    // At least one record per 100 rows (batchSize), at most one per row; never updated.
    expect(batchCounts.ins).toBeGreaterThanOrEqual(3);
    expect(batchCounts.ins).toBeLessThan(n);
    expect(batchCounts.upd).toBe(0);
  }, 60_000);
});
