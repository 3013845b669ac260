// The transactional outbox (README "Transactional outbox (PostgreSQL)"): an order service INSERTs
// the order and enqueues its event in ONE transaction, so the event exists exactly when the order
// does; a relay publishes committed events into a stream, exactly once, in commit order. An order
// whose transaction rolls back publishes nothing. Needs the broker and a PostgreSQL server
// (`bash scripts/postgres.sh up`; STREAM_DEDUP_PG_URL or DATABASE_URL). It deletes what it creates.
//   npx tsx examples/postgres-outbox.ts
import pg from 'pg';
import { connect } from 'rabbitmq-stream-js-client';
import { migrate, PgOutbox, PgOutboxRelay } from 'stream-dedup/postgres';
import { readStreamToEnd } from 'stream-dedup/stream';

const connection = {
  hostname: process.env.RABBITMQ_HOST ?? '127.0.0.1',
  port: Number(process.env.RABBITMQ_STREAM_PORT ?? 5552),
  username: process.env.RABBITMQ_USER ?? 'guest',
  password: process.env.RABBITMQ_PASSWORD ?? 'guest',
  vhost: '/',
};
const stream = `example-outbox-${Date.now()}`;
const schema = `example_outbox_${Date.now()}`;

const pool = new pg.Pool({
  connectionString:
    process.env.STREAM_DEDUP_PG_URL ??
    process.env.DATABASE_URL ??
    'postgres://stream_dedup:stream-dedup@127.0.0.1:5433/stream_dedup',
});
// pg gives a client checked out of a pool no 'error' listener of its own: a server that goes away
// while the client is held (or in the moment it is handed over) would crash the process. One
// listener on every new connection, for its whole life; the client's next query fails instead.
pool.on('connect', (client) => client.on('error', (err) => console.error(`PostgreSQL: ${err.message}`)));
pool.on('error', (err) => console.error(`PostgreSQL (an idle connection): ${err.message}`));
const admin = await connect(connection);
await admin.createStream({ stream, arguments: {} });
try {
  await migrate(pool, { schema }); // the library's tables, outbox included (once, at deploy time)
  await pool.query(
    `CREATE TABLE "${schema}".orders (id int PRIMARY KEY, item text NOT NULL, total int NOT NULL)`,
  );
  const outbox = PgOutbox.create({ schema, producerName: 'orders-svc' });

  /** The order service: the order row and its event commit together, or neither does. */
  async function placeOrder(id: number, item: string, total: number): Promise<void> {
    const sql = await pool.connect();
    try {
      await sql.query('BEGIN');
      await sql.query(`INSERT INTO "${schema}".orders (id, item, total) VALUES ($1, $2, $3)`, [
        id,
        item,
        total,
      ]);
      await outbox.enqueue(sql, Buffer.from(JSON.stringify({ type: 'order-placed', id, item, total })), {
        key: `order-${id}`,
      });
      if (total <= 0) throw new Error(`order ${id}: a total must be positive`);
      await sql.query('COMMIT');
    } catch (err) {
      await sql.query('ROLLBACK');
      throw err;
    } finally {
      sql.release();
    }
  }

  await placeOrder(1, 'tea', 4);
  await placeOrder(2, 'cups', 12);
  await placeOrder(3, 'refund', -3).catch((err: Error) => console.log(`rolled back: ${err.message}`));
  await placeOrder(4, 'kettle', 30);

  // The relay: one active per producer name (others wait as standbys); it publishes every
  // committed event with a publishing ID the broker deduplicates, and deletes it after its confirm.
  let confirmed = 0;
  let allThree: () => void = () => undefined;
  const published = new Promise<void>((resolve) => (allThree = resolve));
  const relay = await PgOutboxRelay.open({
    pool,
    schema,
    producerName: 'orders-svc',
    stream,
    connection,
    onEvent: (event) => {
      if (event.type === 'confirmed' && (confirmed += event.count) >= 3) allThree();
    },
  });
  await published;
  await relay.close();

  const events = await readStreamToEnd(connection, stream);
  for (const e of events) {
    console.log(
      `stream: ${e.body.toString()} (${e.applicationProperties['x-dedup-producer']}#${e.applicationProperties['x-dedup-id']})`,
    );
  }
  const { rows } = await pool.query<{ n: number }>(`SELECT count(*)::int AS n FROM "${schema}".orders`);
  console.log(`orders: ${rows[0]!.n}, events: ${events.length}`);
  if (events.length !== 3 || rows[0]!.n !== 3) throw new Error('expected 3 orders and 3 events');
} finally {
  await admin.deleteStream({ stream });
  await admin.close();
  await pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`).catch(() => undefined);
  await pool.end();
  console.log(`deleted stream ${stream}`);
}
