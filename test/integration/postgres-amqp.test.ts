/**
 * The AMQP 0-9-1 verifying consumer on the PostgreSQL store (issue 34): it shares the core, so the
 * same batch transaction holds the handler's SQL, the verifier state and the offset; its acks go
 * after COMMIT. Real broker, real server, a schema of the test's own.
 */
import { afterAll, describe, expect, it } from 'vitest';
import { identityHeaders } from '../../src/identity/headers.js';
import { postgresHandler } from '../../src/postgres/handler.js';
import { PostgresStore } from '../../src/postgres/store.js';
import { AmqpVerifyingConsumer } from '../../src/amqp.js';
import { AMQP_URL, uniqueName } from '../support/broker.js';
import { useSchema } from '../support/postgres.js';
import { useClient } from '../support/stream.js';

const client = useClient();
const cleanups: Array<() => Promise<void>> = [];
afterAll(async () => {
  for (const cleanup of cleanups.reverse()) await cleanup();
});

describe('AMQP 0-9-1 verifying consumer on PostgreSQL', () => {
  it('postgres - copies in a stream queue are applied once, in the SQL balance', async () => {
    const { pool, schema, drop } = await useSchema();
    cleanups.push(drop);
    await pool.query(`CREATE TABLE "${schema}".balances (account text PRIMARY KEY, amount bigint NOT NULL)`);
    await pool.query(`INSERT INTO "${schema}".balances VALUES ('main', 0)`);
    const queue = uniqueName('pg-amqp');
    await client().createStream({ stream: queue, arguments: {} });
    cleanups.push(() =>
      client()
        .deleteStream({ stream: queue })
        .then(() => undefined),
    );
    const publisher = await client().declarePublisher({ stream: queue });
    const sent: Array<[number, number]> = [
      [1, 5],
      [2, 10],
      [2, 10],
      [4, 100],
      [3, 1000],
      [1, 5],
    ];
    for (const [id, amount] of sent) {
      await publisher.send(Buffer.from(String(amount)), {
        applicationProperties: identityHeaders('ledger', BigInt(id)),
      });
    }
    await publisher.flush();
    await publisher.close();
    const store = await PostgresStore.open({ pool, schema });
    cleanups.push(() => store.close());
    const consumer = await AmqpVerifyingConsumer.open({
      url: AMQP_URL,
      queue,
      consumerName: 'amqp-ledger',
      store,
      handler: postgresHandler(async (message, { client: sql }) => {
        await sql.query(`UPDATE "${schema}".balances SET amount = amount + $1`, [
          Number(message.body.toString()),
        ]);
      }),
    });
    await consumer.waitForOffset(BigInt(sent.length - 1));
    expect(consumer.stats).toMatchObject({ new: 4, duplicate: 2 });
    await consumer.close();
    const { rows } = await pool.query<{ amount: string }>(`SELECT amount FROM "${schema}".balances`);
    expect(rows[0]!.amount).toBe('1115');
    const offsets = await pool.query<{ committed_offset: string }>(
      `SELECT committed_offset FROM "${schema}".consumer_offsets WHERE consumer = 'amqp-ledger'`,
    );
    expect(offsets.rows[0]!.committed_offset).toBe(String(sent.length - 1));
  });
});
