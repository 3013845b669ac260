/**
 * The outbox relay, mixed configurations over time (REVIEW.md §7; review A found it). The rows a
 * relay numbered for its target stream stay bound to that target (`outbox.target`). A relay of the
 * same producer name reopened on ANOTHER stream (the stream renamed, a config change) recovers only
 * its own target: the rows numbered for the old one are never re-sent and the relay reports nothing
 * (no error, no event; only `outbox status` counted them), and the later rows were published
 * before them. Now the relay refuses at open, before anything is sent.
 *
 * Needs the broker and the project's PostgreSQL.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { DedupError } from '../../src/errors.js';
import { PgOutbox, PgOutboxRelay } from '../../src/postgres.js';
import { STREAM_CONNECTION, uniqueName } from '../support/broker.js';
import { useSchema } from '../support/postgres.js';
import { useClient } from '../support/stream.js';

const client = useClient();
const cleanups: Array<() => Promise<void>> = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup().catch(() => undefined);
});

describe('outbox relay reopened on another stream', () => {
  it('refuses at open, typed, when an earlier life numbered rows for its old stream: nothing sent, the rows kept', async () => {
    const db = await useSchema();
    cleanups.push(db.drop);
    const oldStream = uniqueName('outbox-target-old');
    const newStream = uniqueName('outbox-target-new');
    for (const stream of [oldStream, newStream]) {
      await client().createStream({ stream, arguments: {} });
      cleanups.push(async () => void (await client().deleteStream({ stream })));
    }
    const producerName = uniqueName('outbox-target-relay');
    const outbox = PgOutbox.create({ schema: db.schema, producerName });
    const c = await db.pool.connect();
    try {
      await c.query('BEGIN');
      for (let i = 0; i < 5; i++) await outbox.enqueue(c, Buffer.from(`m${i}`));
      await c.query('COMMIT');
      // A relay on oldStream died after committing its numbering of m0–m2, before sending.
      await c.query(
        `WITH moved AS (DELETE FROM "${db.schema}".outbox WHERE id IN (SELECT id FROM "${db.schema}".outbox ORDER BY id LIMIT 3)
                          RETURNING id, body, headers, created_at)
         INSERT INTO "${db.schema}".outbox_batches
         SELECT $2, $1, 1, array_agg(id ORDER BY id), array_agg(body ORDER BY id), jsonb_agg(headers ORDER BY id), min(created_at)
           FROM moved`,
        [oldStream, producerName],
      );
      await c.query(`INSERT INTO "${db.schema}".outbox_ids VALUES ($1, $2, 3)`, [producerName, oldStream]);
      await c.query(`INSERT INTO "${db.schema}".outbox_relays VALUES ($1, 1, 'old', now(), NULL)`, [
        producerName,
      ]);
    } finally {
      c.release();
    }
    let opened: unknown;
    let relay: PgOutboxRelay | undefined;
    try {
      relay = await PgOutboxRelay.open({
        pool: db.pool,
        schema: db.schema,
        producerName,
        stream: newStream,
        connection: STREAM_CONNECTION,
        pollIntervalMs: 200,
      });
      cleanups.push(() => relay!.close());
    } catch (err) {
      opened = err;
    }
    expect(relay).toBeUndefined();
    expect(opened).toBeInstanceOf(DedupError);
    expect((opened as DedupError).code).toBe('DEDUP_UNSAFE_OPTIONS');
    expect((opened as DedupError).message).toContain(oldStream);
    const kept = await db.pool.query<{ n: number }>(
      `SELECT ((SELECT count(*) FROM "${db.schema}".outbox) +
               (SELECT sum(cardinality(row_ids)) FROM "${db.schema}".outbox_batches))::int AS n`,
    );
    expect(kept.rows[0]!.n).toBe(5);
    // Nothing reached the new stream (stats: no chunk at all).
    expect((await client().streamStatsRequest(newStream)).lastChunkId).toBeLessThan(0n);
  }, 60_000);
});
