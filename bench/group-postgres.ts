/**
 * The take-over of a consumer group's partition on PostgreSQL (docs/design.md §13), for
 * `bench:verify` beside the changelog take-over of bench/group.ts: a 1-partition super stream
 * holding `history` messages whose group committed them all (the partition's offset row says
 * `history - 1`, set in SQL: the shared-database strategy reads that row and nothing else, so the
 * history's length is there only to show that it does not count). A member joins; its take-over
 * is timed from the broker's activation to its first delivery asked for (`AssignmentEvent.ms`).
 * Run alone: `tsx bench/group-postgres.ts [history] [runs]` (STREAM_DEDUP_PG_URL, the broker).
 */
import pg from 'pg';
import { migrate } from '../src/postgres/schema.js';
import { PostgresStore } from '../src/postgres/store.js';
import { sharedPartitionName } from '../src/group/shared-db-strategy.js';
import { SuperStreamVerifyingConsumer } from '../src/stream.js';
import type { AssignmentEvent } from '../src/group/types.js';
import { randomUUID } from 'node:crypto';
import { connect, type Client } from 'rabbitmq-stream-js-client';

// As bench/common.ts (not imported: it loads the built package, and this file runs from the sources).
const CONNECTION = {
  hostname: process.env.RABBITMQ_HOST ?? '127.0.0.1',
  port: Number(process.env.RABBITMQ_STREAM_PORT ?? 5552),
  username: process.env.RABBITMQ_USER ?? 'guest',
  password: process.env.RABBITMQ_PASSWORD ?? 'guest',
  vhost: process.env.RABBITMQ_VHOST ?? '/',
};
const connectClient = (): Promise<Client> => connect({ ...CONNECTION, addressResolver: { enabled: false } });
const uniqueName = (prefix: string): string => `${prefix}-${randomUUID().slice(0, 8)}`;

/** `count` plain messages (the history: never delivered to the member), in batches of 1 000. */
async function publishHistory(client: Client, stream: string, count: number): Promise<void> {
  const publisher = await client.declarePublisher({ stream });
  let confirmed = 0;
  let done = (): void => undefined;
  const all = new Promise<void>((resolve) => (done = resolve));
  publisher.on('publish_confirm', (_err, ids) => {
    confirmed += ids.length;
    if (confirmed >= count) done();
  });
  const body = Buffer.alloc(100, 0x61);
  for (let i = 0; i < count; i++) await publisher.send(body);
  await publisher.flush();
  await all;
  await publisher.close();
}

export interface PgTakeoverTimes {
  readonly history: number;
  /** Each take-over, from the broker's activation to the first delivery asked for (ms). */
  readonly takeoverMs: readonly number[];
}

const PG_URL =
  process.env.STREAM_DEDUP_PG_URL ?? 'postgres://stream_dedup:stream-dedup@127.0.0.1:5433/stream_dedup';

/** `runs` take-overs of a partition whose group committed `history` messages. */
export async function measurePgTakeover(history = 100_000, runs = 3): Promise<PgTakeoverTimes> {
  const client = await connectClient();
  const pool = new pg.Pool({ connectionString: PG_URL, connectionTimeoutMillis: 5_000 });
  const schema = `bench_${uniqueName('pg_takeover').replace(/[^a-z0-9_]/g, '_')}`.slice(0, 60);
  const superStream = uniqueName('bench-pg-takeover');
  const consumerName = 'bench-pg-takeover';
  try {
    await migrate(pool, { schema });
    await client.createSuperStream({ streamName: superStream, arguments: {} }, undefined, 1);
    const [partition] = (await client.queryPartitions({ superStream })) as [string];
    await publishHistory(client, partition, history);
    await pool.query(
      `INSERT INTO "${schema}".consumer_offsets (consumer, committed_offset) VALUES ($1, $2)`,
      [sharedPartitionName(consumerName, partition), String(history - 1)],
    );
    const store = await PostgresStore.open({ pool, schema });
    const takeoverMs: number[] = [];
    for (let i = 0; i < runs; i++) {
      let assigned = (_e: AssignmentEvent & { kind: 'assigned' }): void => undefined;
      const taken = new Promise<AssignmentEvent & { kind: 'assigned' }>((resolve) => (assigned = resolve));
      const member = await SuperStreamVerifyingConsumer.open({
        connection: CONNECTION,
        superStream,
        consumerName,
        store,
        handler: () => undefined,
        onAssignment: (e) => {
          if (e.kind === 'assigned') assigned(e);
        },
      });
      const event = await taken;
      await member.close();
      if (event.offset !== BigInt(history - 1))
        throw new Error(`took over at ${event.offset}, not ${history - 1}`);
      takeoverMs.push(event.ms);
    }
    await store.close();
    return { history, takeoverMs };
  } finally {
    await client.deleteSuperStream({ streamName: superStream }).catch(() => undefined);
    await client.close();
    await pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`).catch(() => undefined);
    await pool.end();
  }
}

if (process.argv[1]?.endsWith('group-postgres.ts')) {
  const [history, runs] = process.argv.slice(2).map(Number);
  const result = await measurePgTakeover(history || 100_000, runs || 3);
  process.stdout.write(`${JSON.stringify(result)}\n`);
  process.exit(0);
}
