/**
 * revA (hostile review), outbox relay identity (REVIEW.md §2): the relay's "one active relay" lock
 * and its lease are per (schema, producer name), but the broker deduplicates per (stream, producer
 * name). Two outboxes (two schemas: two services, or a copy of one) whose relays use the same
 * producer name on the same stream are both active; both number from 1; the broker drops one
 * relay's rows as duplicates AND CONFIRMS them; the relay deletes them: silent loss. The
 * DEDUP_SEQUENCE_REGRESSION check runs only at open, and both open before either publishes. The
 * LevelDB publisher has a watch on the broker's last ID for this (design §4.6); the relay none.
 *
 * Needs the broker and the project's PostgreSQL.
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
const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

describe('revA: two outboxes, one producer name, one stream', () => {
  it('publishes every committed row of both, or stops with a typed error; never deletes an unstored row', async () => {
    const stream = uniqueName('reva-shared');
    await client().createStream({ stream, arguments: {} });
    cleanups.push(async () => void (await client().deleteStream({ stream })));
    const producerName = uniqueName('reva-relay');
    const dbs = [await useSchema(), await useSchema()];
    for (const db of dbs) cleanups.push(db.drop);
    for (const [n, db] of dbs.entries()) {
      const outbox = PgOutbox.create({ schema: db.schema, producerName });
      const c = await db.pool.connect();
      await c.query('BEGIN');
      for (let i = 0; i < 5; i++) await outbox.enqueue(c, Buffer.from(`s${n}-m${i}`));
      await c.query('COMMIT');
      c.release();
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
        }),
      ),
    );
    for (const r of relays) cleanups.push(() => r.close());
    await sleep(3_000);
    const left = await Promise.all(
      dbs.map(async (db) => Number((await db.pool.query(`SELECT count(*) FROM "${db.schema}".outbox`)).rows[0].count)),
    );
    const stopped = await Promise.all(
      relays.map((r) => Promise.race([r.closed().then((e) => (e as { code?: string } | undefined)?.code ?? String(e)), sleep(10).then(() => 'running')])),
    );
    const inStream = (await readAll(client(), stream)).map((m) => m.content.toString()).sort();
    const stoppedTyped = stopped.some((s) => s !== 'running');
    // Rows deleted from an outbox must be in the stream (unless a relay stopped with an error).
    expect({ inStream: inStream.length, left, stoppedTyped }).toEqual(
      stoppedTyped ? { inStream: expect.any(Number), left: expect.any(Array), stoppedTyped } : { inStream: 10, left: [0, 0], stoppedTyped },
    );
    expect(inStream.length + left[0]! + left[1]!).toBe(10);
  }, 60_000);
});
