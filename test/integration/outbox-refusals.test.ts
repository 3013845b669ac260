/**
 * The outbox's refusals (issue 35), real broker and real PostgreSQL: poison rows are refused at
 * `enqueue` where they can be (a body over the frame size, headers the stream cannot carry), and a
 * poison row written around `enqueue` stops the relay with a typed error naming the row, which is
 * neither skipped nor deleted, and nothing after it is published; a wrong password, a missing schema,
 * a schema of another version and tables of another shape are typed errors at `open()` and nothing
 * is published.
 */
import pg from 'pg';
import { afterEach, describe, expect, it } from 'vitest';
import { DedupError } from '../../src/errors.js';
import { OutboxPoisonRowError, PgOutbox, PgOutboxRelay, type OutboxRelayEvent } from '../../src/postgres.js';
import { readStreamToEnd } from '../../src/transport/stream-ops.js';
import { STREAM_CONNECTION, uniqueName } from '../support/broker.js';
import { connectPool, PG_URL, uniqueSchema, useSchema } from '../support/postgres.js';
import { readAll, useClient } from '../support/stream.js';

const client = useClient();
const cleanups: Array<() => Promise<void>> = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

async function newStream(): Promise<string> {
  const stream = uniqueName('outbox-refusal');
  await client().createStream({ stream, arguments: {} });
  cleanups.push(
    async () =>
      void (await client()
        .deleteStream({ stream })
        .catch(() => undefined)),
  );
  return stream;
}

/** Opens a relay expected to be refused; returns what it threw. */
async function refused(options: Parameters<typeof PgOutboxRelay.open>[0]): Promise<unknown> {
  const startedAt = performance.now();
  const err = await PgOutboxRelay.open(options).then(
    async (relay) => {
      await relay.close();
      return new Error('open() resolved');
    },
    (e: unknown) => e,
  );
  console.log(
    `[outbox refusal] ${(err as Error).message} (${(performance.now() - startedAt).toFixed(0)} ms)`,
  );
  return err;
}

describe('outbox - poison rows', () => {
  it('enqueue refuses a body over the frame size and headers the stream cannot carry, and inserts nothing', async () => {
    const { pool, schema, drop } = await useSchema();
    cleanups.push(drop);
    const outbox = PgOutbox.create({ schema, producerName: 'poison-enqueue' });
    const sql = await pool.connect();
    try {
      await sql.query('BEGIN');
      await expect(outbox.enqueue(sql, Buffer.alloc(1_048_576))).rejects.toThrow(RangeError);
      await expect(
        outbox.enqueue(sql, Buffer.from('x'), { headers: { 'x-dedup-id': '5' } }),
      ).rejects.toThrow();
      await expect(outbox.enqueue(sql, Buffer.from('x'), { headers: { h: 'a\u0000b' } })).rejects.toThrow(
        RangeError,
      );
      await expect(outbox.enqueue(sql, Buffer.from('x'), { headers: { h: '\ud800' } })).rejects.toThrow(
        RangeError,
      );
      await expect(outbox.enqueue(sql, Buffer.from('x'), { headers: { h: 1.5 } })).rejects.toThrow();
      // The transaction is not aborted: the refusals came before any statement.
      await outbox.enqueue(sql, Buffer.from('fine'), { key: 'k' });
      await sql.query('COMMIT');
    } finally {
      sql.release();
    }
    const { rows } = await pool.query<{ n: number }>(`SELECT count(*)::int AS n FROM "${schema}".outbox`);
    expect(rows[0]!.n).toBe(1);
  });

  for (const poison of [
    { what: 'a 2 MiB body', body: Buffer.alloc(2 * 1_048_576, 0x61), headers: null },
    { what: 'a reserved x-dedup-id header', body: Buffer.from('p'), headers: { 'x-dedup-id': '1' } },
    { what: 'a nested object as a header', body: Buffer.from('p'), headers: { h: { nested: true } } },
  ]) {
    it(`a row with ${poison.what} written around enqueue stops the relay with an error naming it; nothing after it is published`, async () => {
      const { pool, schema, drop } = await useSchema();
      cleanups.push(drop);
      const stream = await newStream();
      const producerName = 'poison-relay';
      const outbox = PgOutbox.create({ schema, producerName });
      const sql = await pool.connect();
      try {
        await sql.query('BEGIN');
        await outbox.enqueue(sql, Buffer.from('before'));
        await sql.query('COMMIT');
      } finally {
        sql.release();
      }
      const inserted = await pool.query<{ id: string }>(
        `INSERT INTO "${schema}".outbox (producer_name, body, headers) VALUES ($1, $2, $3::jsonb) RETURNING id`,
        [producerName, poison.body, poison.headers === null ? null : JSON.stringify(poison.headers)],
      );
      const poisonId = BigInt(inserted.rows[0]!.id);
      const sql2 = await pool.connect();
      try {
        await sql2.query('BEGIN');
        await outbox.enqueue(sql2, Buffer.from('after'));
        await sql2.query('COMMIT');
      } finally {
        sql2.release();
      }
      const relayPool = await connectPool();
      cleanups.push(() => relayPool.end());
      const events: OutboxRelayEvent[] = [];
      const relay = await PgOutboxRelay.open({
        pool: relayPool,
        schema,
        producerName,
        stream,
        connection: STREAM_CONNECTION,
        onEvent: (e) => events.push(e),
      });
      cleanups.push(() => relay.close());
      const error = await relay.closed();
      expect(error).toBeInstanceOf(OutboxPoisonRowError);
      expect((error as OutboxPoisonRowError).rowId).toBe(poisonId);
      expect((error as OutboxPoisonRowError).code).toBe('DEDUP_BROKER_REFUSED');
      expect((error as Error).message).toContain(`row ${poisonId}`);
      console.log(`[outbox poison] ${poison.what}: ${(error as Error).message}`);
      // Not skipped: the poison row and the one after it wait; the one before it was published.
      const left = await pool.query<{ id: string }>(
        `SELECT id FROM "${schema}".outbox WHERE producer_name = $1 ORDER BY id`,
        [producerName],
      );
      expect(left.rows.map((r) => BigInt(r.id))).toContain(poisonId);
      expect(left.rows).toHaveLength(2);
      const bodies = (await readAll(client(), stream)).map((m) => m.content.toString());
      expect(bodies).toEqual(['before']);
    });
  }
});

describe('outbox - refusals at open', () => {
  it('a wrong password, a missing schema, a schema of another version and tables of another shape: DEDUP_STORE_REFUSED, nothing published', async () => {
    const stream = await newStream();
    const good = await useSchema();
    cleanups.push(good.drop);
    // A committed row waits in the good schema: a relay that got past its checks would publish it.
    const outbox = PgOutbox.create({ schema: good.schema, producerName: 'refused' });
    const sql = await good.pool.connect();
    await sql.query('BEGIN');
    await outbox.enqueue(sql, Buffer.from('must not be published'));
    await sql.query('COMMIT');
    sql.release();

    const wrong = new pg.Pool({
      connectionString: PG_URL.replace(/:[^:@/]*@/, ':wrong-password@'),
      connectionTimeoutMillis: 5_000,
    });
    wrong.on('error', () => undefined);
    cleanups.push(() => wrong.end());
    const base = { producerName: 'refused', stream, connection: STREAM_CONNECTION } as const;
    const password = await refused({ ...base, pool: wrong, schema: good.schema });
    expect(password).toBeInstanceOf(DedupError);
    expect((password as DedupError).code).toBe('DEDUP_STORE_REFUSED');
    expect((password as Error).message).toMatch(/password/);

    const missing = await refused({ ...base, pool: good.pool, schema: uniqueSchema('sd_missing') });
    expect((missing as DedupError).code).toBe('DEDUP_STORE_REFUSED');

    await good.pool.query(`UPDATE "${good.schema}".stream_dedup_meta SET version = 99`);
    const other = await refused({ ...base, pool: good.pool, schema: good.schema });
    expect((other as DedupError).code).toBe('DEDUP_STORE_REFUSED');
    expect((other as Error).message).toMatch(/version 99/);

    // The version is right but the tables are not the ones migrate() made: a column dropped, one
    // of another type (a half-migrated schema, a table made by hand).
    await good.pool.query(`UPDATE "${good.schema}".stream_dedup_meta SET version = 1`);
    await good.pool.query(`ALTER TABLE "${good.schema}".outbox_batches DROP COLUMN headers`);
    await good.pool.query(`ALTER TABLE "${good.schema}".outbox_ids ALTER COLUMN last_assigned TYPE numeric`);
    // Without it every numbering's ON CONFLICT fails (42P10).
    await good.pool.query(`ALTER TABLE "${good.schema}".outbox_ids DROP CONSTRAINT outbox_ids_pkey`);
    // A column of its own every numbering's INSERT would leave empty; one with a default is fine.
    await good.pool.query(`ALTER TABLE "${good.schema}".outbox_batches ADD COLUMN shard int`);
    await good.pool.query(`UPDATE "${good.schema}".outbox_batches SET shard = 1`);
    await good.pool.query(`ALTER TABLE "${good.schema}".outbox_batches ALTER COLUMN shard SET NOT NULL`);
    await good.pool.query(
      `ALTER TABLE "${good.schema}".outbox_relays ADD COLUMN note text NOT NULL DEFAULT ''`,
    );
    const shape = await refused({ ...base, pool: good.pool, schema: good.schema });
    expect((shape as DedupError).code).toBe('DEDUP_STORE_REFUSED');
    expect((shape as Error).message).toMatch(/outbox_batches\.headers is missing/);
    expect((shape as Error).message).toMatch(/outbox_ids\.last_assigned is numeric, not int8/);
    expect((shape as Error).message).toMatch(/outbox_ids has no primary key \(producer_name, target\)/);
    expect((shape as Error).message).toMatch(/outbox_batches\.shard is NOT NULL with no default/);
    expect((shape as Error).message).not.toMatch(/outbox_relays\.note/);

    // The library's own reader: an empty stream answers at once (readAll's marker would be its only message).
    expect(await readStreamToEnd(STREAM_CONNECTION, stream)).toEqual([]);
    const { rows } = await good.pool.query<{ n: number }>(
      `SELECT count(*)::int AS n FROM "${good.schema}".outbox`,
    );
    expect(rows[0]!.n).toBe(1);
  });
});
