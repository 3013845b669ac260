// Exactly-once into PostgreSQL (README "Exactly-once into PostgreSQL"): the stream holds credit-17
// twice; the verifying consumer's handler updates a balance row through the batch's transaction,
// which also commits the verifier state and the offset, so credit-17 counts once. Needs the broker
// and a PostgreSQL server (`bash scripts/postgres.sh up`; STREAM_DEDUP_PG_URL or DATABASE_URL).
//   npx tsx examples/postgres.ts
import pg from 'pg';
import { connect } from 'rabbitmq-stream-js-client';
import { identityHeaders } from 'stream-dedup';
import { migrate, PostgresStore, postgresHandler } from 'stream-dedup/postgres';
import { StreamVerifyingConsumer } from 'stream-dedup/stream';

const connection = {
  hostname: process.env.RABBITMQ_HOST ?? '127.0.0.1',
  port: Number(process.env.RABBITMQ_STREAM_PORT ?? 5552),
};
const stream = `example-postgres-${Date.now()}`;
const schema = `example_${Date.now()}`;

const client = await connect({
  ...connection,
  username: process.env.RABBITMQ_USER ?? 'guest',
  password: process.env.RABBITMQ_PASSWORD ?? 'guest',
  vhost: '/',
});
await client.createStream({ stream, arguments: {} });
const publisher = await client.declarePublisher({ stream });
for (const [n, amount] of [
  [16, 5],
  [17, 10],
  [17, 10], // a retried publish: the same identity again
  [18, 1],
] as const) {
  await publisher.send(Buffer.from(String(amount)), {
    applicationProperties: identityHeaders('ledger', BigInt(n)),
  });
}
await publisher.flush();
await client.close();

const pool = new pg.Pool({
  connectionString:
    process.env.STREAM_DEDUP_PG_URL ??
    process.env.DATABASE_URL ??
    'postgres://stream_dedup:stream-dedup@127.0.0.1:5433/stream_dedup',
});
try {
  await migrate(pool, { schema }); // the library's tables (once, at deploy time)
  await pool.query(`CREATE TABLE "${schema}".balances (account text PRIMARY KEY, amount bigint NOT NULL)`);
  await pool.query(`INSERT INTO "${schema}".balances VALUES ('main', 0)`);

  const store = await PostgresStore.open({ pool, schema });
  const consumer = await StreamVerifyingConsumer.open({
    connection,
    stream,
    consumerName: 'balance-projection',
    store,
    handler: postgresHandler(async (message, { client: sql }) => {
      await sql.query(`UPDATE "${schema}".balances SET amount = amount + $1 WHERE account = 'main'`, [
        Number(message.body.toString()),
      ]);
    }),
    onEvent: (event) =>
      console.log('verifier:', event.kind, 'publishingId' in event ? `credit-${event.publishingId}` : ''),
  });
  await consumer.waitForOffset(3n);
  await consumer.close();
  await store.close();
  const { rows } = await pool.query<{ amount: string }>(`SELECT amount FROM "${schema}".balances`);
  console.log(`balance ${rows[0]!.amount} (credit-17 applied once: 5 + 10 + 1 = 16)`);
  if (rows[0]!.amount !== '16') throw new Error(`balance ${rows[0]!.amount}, expected 16`);
} finally {
  await pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`).catch(() => undefined);
  await pool.end();
}
