/**
 * revA (hostile review), outbox relay: mixed configurations over time (REVIEW.md §7). The rows a
 * relay numbered for its target stream stay bound to that target (`outbox.target`). A relay of the
 * same producer name reopened on ANOTHER stream (the stream renamed, a config change) recovers only
 * its own target: the rows numbered for the old one are never re-sent and the relay reports nothing
 * (no error, no event; only `outbox status` counts them as numbered-waiting), and the later rows
 * are published before them. The partitions check exists for super streams only; a plain stream's
 * target change is neither followed nor refused.
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

describe('revA: outbox relay reopened on another stream', () => {
  it('publishes (or refuses loudly) the rows an earlier life numbered for its old stream', async () => {
    const db = await useSchema();
    cleanups.push(db.drop);
    const oldStream = uniqueName('reva-old');
    const newStream = uniqueName('reva-new');
    for (const stream of [oldStream, newStream]) {
      await client().createStream({ stream, arguments: {} });
      cleanups.push(async () => void (await client().deleteStream({ stream })));
    }
    const producerName = uniqueName('reva-relay');
    const outbox = PgOutbox.create({ schema: db.schema, producerName });
    const c = await db.pool.connect();
    try {
      await c.query('BEGIN');
      for (let i = 0; i < 5; i++) await outbox.enqueue(c, Buffer.from(`m${i}`));
      await c.query('COMMIT');
      // A relay on oldStream died after committing its numbering of m0–m2, before sending.
      await c.query(
        `UPDATE "${db.schema}".outbox SET target = $1, publishing_id = n.pid
         FROM (SELECT id, row_number() OVER (ORDER BY id) AS pid FROM "${db.schema}".outbox ORDER BY id LIMIT 3) n
         WHERE outbox.id = n.id`,
        [oldStream],
      );
      await c.query(`INSERT INTO "${db.schema}".outbox_ids VALUES ($1, $2, 3)`, [producerName, oldStream]);
      await c.query(`INSERT INTO "${db.schema}".outbox_relays VALUES ($1, 1, 'old', now(), NULL)`, [producerName]);
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
      opened = err; // a typed refusal is an acceptable outcome
    }
    if (relay === undefined) {
      expect(opened).toBeDefined();
      return;
    }
    await sleep(3_000);
    const left = await db.pool.query(`SELECT convert_from(body, 'UTF8') AS b FROM "${db.schema}".outbox ORDER BY id`);
    const published = (await readAll(client(), newStream)).map((m) => m.content.toString());
    const stoppedWith = await Promise.race([relay.closed(), sleep(10).then(() => 'running')]);
    // Either every row reached the relay's stream in order, or the relay stopped with an error.
    expect({ published, left: left.rows.map((r: { b: string }) => r.b), stoppedWith }).toEqual({
      published: ['m0', 'm1', 'm2', 'm3', 'm4'],
      left: [],
      stoppedWith: 'running',
    });
  }, 60_000);
});
