/**
 * Two StreamVerifyingConsumers under one consumer name on one stream, each with a PostgreSQL store of
 * its own on one schema (issue 34, fencing): they fence each other, and each fenced one subscribes
 * again from the stored offset through the broker (Resubscriber.rewind) instead of stopping. Real
 * broker, real server.
 */
import { afterAll, describe, expect, it } from 'vitest';
import { identityHeaders } from '../../src/identity/headers.js';
import { postgresHandler } from '../../src/postgres/handler.js';
import { PostgresStore } from '../../src/postgres/store.js';
import { StreamVerifyingConsumer } from '../../src/stream.js';
import { STREAM_CONNECTION, uniqueName } from '../support/broker.js';
import { PG_URL, useSchema } from '../support/postgres.js';
import { useClient } from '../support/stream.js';

const client = useClient();
const cleanups: Array<() => Promise<void>> = [];
afterAll(async () => {
  for (const cleanup of cleanups.reverse()) await cleanup();
});

describe('stream verifying consumers on PostgreSQL under one name', () => {
  it('postgres - two processes under one name on one stream fence each other and both go on: every (producer, ID) applied once', async () => {
    const { pool, schema, drop } = await useSchema();
    cleanups.push(drop);
    await pool.query(`CREATE TABLE "${schema}".applied (id text NOT NULL, amount bigint NOT NULL)`);
    const stream = uniqueName('pg-fence');
    await client().createStream({ stream, arguments: {} });
    cleanups.push(() =>
      client()
        .deleteStream({ stream })
        .then(() => undefined),
    );
    // 300 messages: producers p and q, 120 IDs each, 60 copies planted 5 behind.
    const publisher = await client().declarePublisher({ stream });
    const plan: Array<[string, number]> = [];
    for (let id = 1; id <= 120; id++) {
      plan.push(['p', id], ['q', id]);
      if (id % 4 === 0) plan.push(plan[plan.length - 5]!, plan[plan.length - 6]!);
    }
    for (const [producer, id] of plan) {
      await publisher.send(Buffer.from(String(id)), {
        applicationProperties: identityHeaders(producer, BigInt(id)),
      });
    }
    await publisher.flush();
    await publisher.close();
    const open = async (): Promise<StreamVerifyingConsumer> => {
      const store = await PostgresStore.open({ connectionString: PG_URL, schema });
      cleanups.push(() => store.close());
      return StreamVerifyingConsumer.open({
        stream,
        consumerName: 'ledger',
        connection: STREAM_CONNECTION,
        store,
        commitEvery: 5,
        handler: postgresHandler(async (message, { client: sql }) => {
          const { producerName, publishingId } = message.identity!;
          await sql.query(`INSERT INTO "${schema}".applied (id, amount) VALUES ($1, $2)`, [
            `${producerName}/${publishingId}`,
            Number(message.body.toString()),
          ]);
        }),
      });
    };
    const consumers = await Promise.all([open(), open()]);
    const started = Date.now();
    await Promise.all(consumers.map((c) => c.waitForOffset(BigInt(plan.length - 1))));
    const took = Date.now() - started;
    for (const c of consumers) await c.close();
    const fences = consumers.map((c) => c.stats.fences);
    expect(fences[0]! + fences[1]!).toBeGreaterThan(0);
    const { rows } = await pool.query<{ id: string; n: string }>(
      `SELECT id, count(*) AS n FROM "${schema}".applied GROUP BY id`,
    );
    expect(rows.length).toBe(240);
    expect(rows.filter((r) => r.n !== '1')).toEqual([]);
    const sum = await pool.query<{ s: string }>(`SELECT sum(amount) AS s FROM "${schema}".applied`);
    expect(Number(sum.rows[0]!.s)).toBe(2 * ((120 * 121) / 2));
    const offset = await pool.query<{ committed_offset: string }>(
      `SELECT committed_offset FROM "${schema}".consumer_offsets WHERE consumer = 'ledger'`,
    );
    expect(offset.rows[0]!.committed_offset).toBe(String(plan.length - 1));
    console.log(`[postgres fence stream] fences ${fences.join(', ')}, ${took} ms`);
  }, 60_000);
});
