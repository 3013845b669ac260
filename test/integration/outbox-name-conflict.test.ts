/**
 * Two outboxes relaying one producer name into one stream (review A, REVIEW.md §2): the broker
 * deduplicates per (stream, producer name), so one's rows are dropped as duplicates of the other's
 * IDs, and confirmed. Real broker, real PostgreSQL.
 * - Two schemas of one database: the name lock is database-wide (target + producer name), so the
 *   second relay never becomes active; it stops with `DEDUP_NAME_CONFLICT` naming the other, its
 *   rows untouched.
 * - Two databases (no lock spans them): the relay compares the broker's last ID with what its own
 *   outbox numbered before it deletes confirmed rows; the one behind stops with
 *   `DEDUP_NAME_CONFLICT` and keeps the rows the broker dropped.
 */
import type pg from 'pg';
import { afterEach, describe, expect, it } from 'vitest';
import { DedupError } from '../../src/errors.js';
import { PgOutbox, PgOutboxRelay } from '../../src/postgres.js';
import { migrate } from '../../src/postgres/schema.js';
import { STREAM_CONNECTION, uniqueName } from '../support/broker.js';
import { connectPool, PG_URL, uniqueSchema, useSchema } from '../support/postgres.js';
import { readAll, useClient } from '../support/stream.js';

const client = useClient();
const cleanups: Array<() => Promise<void>> = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup().catch(() => undefined);
});
const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

async function useStream(): Promise<string> {
  const stream = uniqueName('outbox-shared');
  await client().createStream({ stream, arguments: {} });
  cleanups.push(async () => void (await client().deleteStream({ stream })));
  return stream;
}

async function enqueueMany(pool: pg.Pool, outbox: PgOutbox, prefix: string, n: number): Promise<void> {
  const c = await pool.connect();
  try {
    await c.query('BEGIN');
    for (let i = 0; i < n; i++) await outbox.enqueue(c, Buffer.from(`${prefix}-m${i}`));
    await c.query('COMMIT');
  } finally {
    c.release();
  }
}

/** Rows not yet confirmed and deleted: waiting in the outbox or numbered into batch records. */
async function rowsOf(pool: pg.Pool, schema: string): Promise<number> {
  const found = await pool.query<{ n: number }>(
    `SELECT ((SELECT count(*) FROM "${schema}".outbox)
           + (SELECT coalesce(sum(cardinality(row_ids)), 0) FROM "${schema}".outbox_batches))::int AS n`,
  );
  return found.rows[0]!.n;
}

/** What `closed()` gave within `ms`: the error's code, or 'running'. */
async function stoppedWith(relay: PgOutboxRelay, ms: number): Promise<string> {
  const error = await Promise.race([relay.closed(), sleep(ms).then(() => 'running' as const)]);
  if (error === 'running') return error;
  return error instanceof DedupError ? error.code : String(error);
}

describe('outbox relay: two outboxes, one producer name, one stream', () => {
  it('two schemas of one database: one relay is active, the other stops with DEDUP_NAME_CONFLICT, nothing lost', async () => {
    const stream = await useStream();
    const producerName = uniqueName('relay-shared');
    const dbs = [await useSchema(), await useSchema()];
    for (const db of dbs) cleanups.push(db.drop);
    for (const [n, db] of dbs.entries()) {
      await enqueueMany(db.pool, PgOutbox.create({ schema: db.schema, producerName }), `s${n}`, 5);
    }
    const relays = await Promise.all(
      dbs.map((db) =>
        PgOutboxRelay.open({
          pool: db.pool,
          schema: db.schema,
          producerName,
          stream,
          connection: STREAM_CONNECTION,
          pollIntervalMs: 200,
          takeoverIntervalMs: 200,
        }),
      ),
    );
    for (const r of relays) cleanups.push(() => r.close());
    const active = relays.findIndex((r) => r.stats.isActive);
    expect(active).toBeGreaterThanOrEqual(0);
    const other = 1 - active;
    expect(relays[other]!.stats.isActive).toBe(false);
    const error = await relays[other]!.closed();
    expect(error).toBeInstanceOf(DedupError);
    expect((error as DedupError).code).toBe('DEDUP_NAME_CONFLICT');
    expect(error!.message).toContain(dbs[active]!.schema); // the other relay, named
    expect(error!.message).toContain(dbs[other]!.schema);
    while ((await rowsOf(dbs[active]!.pool, dbs[active]!.schema)) > 0) await sleep(50);
    const inStream = (await readAll(client(), stream)).map((m) => m.content.toString());
    expect(inStream).toEqual([0, 1, 2, 3, 4].map((i) => `s${active}-m${i}`));
    expect(await rowsOf(dbs[other]!.pool, dbs[other]!.schema)).toBe(5);
    expect(relays[other]!.stats.published).toBe(0);
    expect(await stoppedWith(relays[active]!, 10)).toBe('running');
  }, 60_000);

  it('two databases: the relay behind stops with DEDUP_NAME_CONFLICT before deleting rows the broker dropped', async () => {
    const stream = await useStream();
    const producerName = uniqueName('relay-shared');
    const first = await useSchema();
    cleanups.push(first.drop);
    // A second database on the same server (no advisory lock spans two databases).
    const database = uniqueSchema('sd_test_db');
    await first.pool.query(`CREATE DATABASE "${database}"`);
    cleanups.push(
      async () => void (await first.pool.query(`DROP DATABASE IF EXISTS "${database}" WITH (FORCE)`)),
    );
    const url = new URL(PG_URL);
    url.pathname = `/${database}`;
    const secondPool = await connectPool(url.toString());
    cleanups.push(() => secondPool.end());
    const secondSchema = uniqueSchema();
    await migrate(secondPool, { schema: secondSchema });
    const second = { pool: secondPool, schema: secondSchema };

    const open = (db: { pool: pg.Pool; schema: string }): Promise<PgOutboxRelay> =>
      PgOutboxRelay.open({
        pool: db.pool,
        schema: db.schema,
        producerName,
        stream,
        connection: STREAM_CONNECTION,
        pollIntervalMs: 100,
      });
    // Both open before either publishes: the check at open (the broker's last ID, 0) passes both.
    const relayA = await open(first);
    cleanups.push(() => relayA.close());
    const relayB = await open(second);
    cleanups.push(() => relayB.close());
    expect([relayA.stats.isActive, relayB.stats.isActive]).toEqual([true, true]);

    await enqueueMany(first.pool, PgOutbox.create({ schema: first.schema, producerName }), 'a', 5);
    while (relayA.stats.confirmed < 5) await sleep(20);
    // B numbers its 3 rows 1–3: the broker drops them as duplicates of A's, and confirms them.
    await enqueueMany(second.pool, PgOutbox.create({ schema: second.schema, producerName }), 'b', 3);
    const error = await Promise.race([relayB.closed(), sleep(10_000).then(() => 'running' as const)]);
    expect(error).toBeInstanceOf(DedupError);
    expect((error as DedupError).code).toBe('DEDUP_NAME_CONFLICT');
    expect((error as DedupError).message).toMatch(
      /was 5, above the 3 the outbox .* had numbered when the relay asked/,
    );
    // Kept, not deleted: the broker holds none of them.
    expect(await rowsOf(second.pool, second.schema)).toBe(3);
    expect(relayB.stats.confirmed).toBe(0);
    const inStream = (await readAll(client(), stream)).map((m) => m.content.toString());
    expect(inStream).toEqual(['a-m0', 'a-m1', 'a-m2', 'a-m3', 'a-m4']);
    // Reopened, B is refused at open: the broker is above its outbox.
    await expect(open(second)).rejects.toMatchObject({ code: 'DEDUP_SEQUENCE_REGRESSION' });
  }, 60_000);
});
