/**
 * The PostgreSQL verifying consumer (one transaction per batch of 1 000: the handlers' balance
 * UPDATEs, the verifier state, the offset) against what users write by hand today: the raw stream
 * consumer with a transaction per message (`BEGIN; INSERT INTO processed … ON CONFLICT DO NOTHING;`
 * the UPDATE when the insert took; `COMMIT`). Context rows: the LevelDB verifying consumer and the
 * raw consumer, on the same stream, in the same run.
 *
 * The stream holds `count` credits from 10 producers and a planted copy of every 20th one (re-sent
 * three messages later, as a publisher's retry does). Both SQL variants are checked against the
 * exactly-once fold (each account's balance counts each (producer, ID) once) after every
 * measurement: a variant that is fast and wrong fails the bench.
 */
import pg from 'pg';
import { Offset } from 'rabbitmq-stream-js-client';
import { identityHeaders } from 'stream-dedup';
import { migrate, PostgresStore, postgresHandler } from 'stream-dedup/postgres';
import { StreamVerifyingConsumer } from 'stream-dedup/stream';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { CONNECTION, connectClient, measureInChild, median, uniqueName } from './common.js';

/** The PostgreSQL server the bench uses (`bash scripts/postgres.sh up`). */
const PG_URL =
  process.env.STREAM_DEDUP_PG_URL ?? 'postgres://stream_dedup:stream-dedup@127.0.0.1:5433/stream_dedup';

const PRODUCERS = 10;
/** Every COPY_EVERY-th credit is sent again COPY_DELAY messages later. */
const COPY_EVERY = 20;
const COPY_DELAY = 3;

export type PostgresMode = 'raw' | 'hand' | 'level' | 'postgres';

export interface PostgresRates {
  /** Distinct credits in the stream; the stream holds `entries` messages with the copies. */
  readonly messages: number;
  readonly entries: number;
  readonly rounds: number;
  /** Median msg/s of each mode, first message to last (connecting and opening apart). */
  readonly perSec: Readonly<Record<PostgresMode, number>>;
}

/** Credit `i`: its producer, publishing ID, account and amount. */
function creditOf(i: number): { producer: string; id: bigint; account: string; amount: number } {
  return {
    producer: `bench-p${i % PRODUCERS}`,
    id: BigInt(Math.floor(i / PRODUCERS) + 1),
    account: `acct-${i % PRODUCERS}`,
    amount: (i % 7) + 1,
  };
}

/** The stream's order: credit indexes, with the planted copies. */
function streamOrder(count: number): number[] {
  const order: number[] = [];
  const copies: Array<[number, number]> = []; // [due position, credit]
  for (let i = 0; i < count; i++) {
    order.push(i);
    if (i % COPY_EVERY === 0) copies.push([order.length + COPY_DELAY, i]);
    while (copies.length > 0 && copies[0]![0] <= order.length) order.push(copies.shift()![1]);
  }
  for (const [, i] of copies) order.push(i);
  return order;
}

/** The exactly-once fold: each account's balance with each credit counted once. */
function fold(count: number): Map<string, number> {
  const balances = new Map<string, number>();
  for (let i = 0; i < count; i++) {
    const { account, amount } = creditOf(i);
    balances.set(account, (balances.get(account) ?? 0) + amount);
  }
  return balances;
}

async function fill(stream: string, count: number): Promise<number> {
  const client = await connectClient();
  try {
    await client.createStream({ stream, arguments: {} });
    const publisher = await client.declarePublisher({ stream });
    const order = streamOrder(count);
    for (const i of order) {
      const { producer, id, account, amount } = creditOf(i);
      await publisher.send(Buffer.from(`${account} ${amount}`), {
        applicationProperties: identityHeaders(producer, id),
      });
    }
    await publisher.flush();
    await publisher.close();
    return order.length;
  } finally {
    await client.close();
  }
}

/** Parses a credit's body: `account amount`. */
function parse(body: Buffer): [string, number] {
  const text = body.toString();
  const space = text.indexOf(' ');
  return [text.slice(0, space), Number(text.slice(space + 1))];
}

/** Creates `balances_<tag>` (every account at 0) and `processed_<tag>`. */
async function createTables(sql: pg.Pool | pg.Client, schema: string, tag: string): Promise<void> {
  await sql.query(
    `CREATE TABLE "${schema}".balances_${tag} (account text PRIMARY KEY, amount bigint NOT NULL);
     CREATE TABLE "${schema}".processed_${tag} (producer text, id bigint, PRIMARY KEY (producer, id))`,
  );
  await sql.query(
    `INSERT INTO "${schema}".balances_${tag} SELECT 'acct-' || n, 0 FROM generate_series(0, ${PRODUCERS - 1}) n`,
  );
}

/** Throws unless `balances_<tag>` equals the exactly-once fold of `count` credits. */
async function checkFold(
  sql: pg.Pool | pg.Client,
  schema: string,
  tag: string,
  count: number,
): Promise<void> {
  const { rows } = await sql.query<{ account: string; amount: string }>(
    `SELECT account, amount FROM "${schema}".balances_${tag}`,
  );
  const expected = fold(count);
  for (const { account, amount } of rows) {
    if (Number(amount) !== (expected.get(account) ?? 0)) {
      throw new Error(
        `${tag}: ${account} holds ${amount}, the exactly-once fold is ${expected.get(account)}`,
      );
    }
  }
  if (rows.length !== expected.size)
    throw new Error(`${tag}: ${rows.length} accounts, expected ${expected.size}`);
}

/** The raw client's consumer, nothing done per message. */
async function raw(stream: string, entries: number): Promise<number> {
  const client = await connectClient();
  try {
    let seen = 0;
    let t0 = 0;
    let consumerId = '';
    await new Promise<void>((resolve, reject) => {
      client
        .declareConsumer({ stream, offset: Offset.first() }, () => {
          if (seen++ === 0) t0 = performance.now();
          if (seen === entries) resolve();
        })
        .then((c) => (consumerId = c.extendedId), reject);
    });
    const seconds = (performance.now() - t0) / 1000;
    if (consumerId !== '') await client.closeConsumer(consumerId);
    return entries / seconds;
  } finally {
    await client.close();
  }
}

/**
 * What users write by hand: the raw consumer queues the messages, one loop runs a transaction per
 * message on one connection (`processed` holds every (producer, ID) applied; a copy's INSERT does
 * nothing, and its UPDATE is skipped). No offset is stored (in its favour: a restart re-reads the
 * stream from the start, and `processed` absorbs it).
 */
async function hand(
  stream: string,
  entries: number,
  count: number,
  schema: string,
  tag: string,
): Promise<number> {
  const sql = new pg.Client({ connectionString: PG_URL });
  await sql.connect();
  const client = await connectClient();
  try {
    await createTables(sql, schema, tag);
    const queue: Array<{ applicationProperties?: Record<string, unknown>; content: Buffer }> = [];
    let wake: (() => void) | undefined;
    let t0 = 0;
    const consumer = await client.declareConsumer({ stream, offset: Offset.first() }, (message) => {
      if (t0 === 0) t0 = performance.now();
      queue.push(message);
      wake?.();
    });
    for (let done = 0; done < entries; done++) {
      while (queue.length === done) await new Promise<void>((resolve) => (wake = resolve));
      const message = queue[done]!;
      const props = message.applicationProperties ?? {};
      const [account, amount] = parse(message.content);
      await sql.query('BEGIN');
      const inserted = await sql.query(
        `INSERT INTO "${schema}".processed_${tag} (producer, id) VALUES ($1, $2) ON CONFLICT DO NOTHING`,
        [String(props['x-dedup-producer']), String(props['x-dedup-id'])],
      );
      if (inserted.rowCount === 1) {
        await sql.query(`UPDATE "${schema}".balances_${tag} SET amount = amount + $1 WHERE account = $2`, [
          amount,
          account,
        ]);
      }
      await sql.query('COMMIT');
    }
    const seconds = (performance.now() - t0) / 1000;
    await client.closeConsumer(consumer.extendedId);
    await checkFold(sql, schema, tag, count);
    return entries / seconds;
  } finally {
    await client.close();
    await sql.end();
  }
}

/** The LevelDB verifying consumer (commit per 1 000), a put per message as its effect. */
async function level(stream: string, entries: number, count: number, tag: string): Promise<number> {
  const dir = await mkdtemp(join(tmpdir(), 'bench-pg-level-'));
  try {
    let t0 = 0;
    const consumer = await StreamVerifyingConsumer.open({
      connection: CONNECTION,
      stream,
      consumerName: tag,
      store: join(dir, 'consumer'),
      commitEvery: 1_000,
      handler: (message, tx) => {
        if (t0 === 0) t0 = performance.now();
        const [account] = parse(message.body);
        tx.put(account, 'x');
      },
    });
    await consumer.waitForOffset(BigInt(entries - 1));
    const seconds = (performance.now() - t0) / 1000;
    const applied = consumer.stats.new;
    await consumer.close();
    if (applied !== count) throw new Error(`${tag}: applied ${applied} of ${count}`);
    return entries / seconds;
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

/** The PostgreSQL verifying consumer (commit per 1 000), the balance UPDATE on the batch's client. */
async function postgres(
  stream: string,
  entries: number,
  count: number,
  schema: string,
  tag: string,
): Promise<number> {
  const pool = new pg.Pool({ connectionString: PG_URL, max: 4 });
  try {
    await createTables(pool, schema, tag);
    const store = await PostgresStore.open({ pool, schema });
    let t0 = 0;
    const consumer = await StreamVerifyingConsumer.open({
      connection: CONNECTION,
      stream,
      consumerName: tag,
      store,
      commitEvery: 1_000,
      handler: postgresHandler(async (message, { client }) => {
        if (t0 === 0) t0 = performance.now();
        const [account, amount] = parse(message.body);
        await client.query(`UPDATE "${schema}".balances_${tag} SET amount = amount + $1 WHERE account = $2`, [
          amount,
          account,
        ]);
      }),
    });
    await consumer.waitForOffset(BigInt(entries - 1));
    const seconds = (performance.now() - t0) / 1000;
    const applied = consumer.stats.new;
    await consumer.close();
    await store.close();
    if (applied !== count) throw new Error(`${tag}: applied ${applied} of ${count}`);
    await checkFold(pool, schema, tag, count);
    return entries / seconds;
  } finally {
    await pool.end();
  }
}

/**
 * Fills a stream with `count` credits and their copies, then reads it `rounds` times each way,
 * interleaved, each read in a fresh process (bench/consumer.ts says why); every SQL result is
 * checked against the exactly-once fold. The schema and the stream are removed at the end.
 */
export async function measurePostgres(count = 5_000, rounds = 3): Promise<PostgresRates> {
  const stream = uniqueName('bench-postgres');
  const schema = `bench_pg_${process.pid}_${Date.now().toString(36)}`;
  const pool = new pg.Pool({ connectionString: PG_URL, connectionTimeoutMillis: 5_000 });
  const client = await connectClient();
  try {
    try {
      await migrate(pool, { schema });
    } catch (err) {
      throw new Error(
        `bench:verify needs PostgreSQL at ${PG_URL.replace(/:[^:@/]*@/, ':***@')}: \`bash scripts/postgres.sh up\``,
        {
          cause: err,
        },
      );
    }
    const entries = await fill(stream, count);
    const modes: PostgresMode[] = ['raw', 'hand', 'level', 'postgres'];
    const samples = new Map<PostgresMode, number[]>(modes.map((m) => [m, []]));
    for (let round = 0; round < rounds; round++) {
      for (const mode of modes) {
        const { rate } = await measureInChild<{ rate: number }>(
          import.meta.url,
          [mode, stream, String(entries), String(count), schema, `${mode}_${round}`],
          { STREAM_DEDUP_BENCH_POSTGRES: '1' },
        );
        samples.get(mode)!.push(rate);
      }
    }
    const perSec = Object.fromEntries(modes.map((m) => [m, median(samples.get(m)!)])) as Record<
      PostgresMode,
      number
    >;
    return { messages: count, entries, rounds, perSec };
  } finally {
    await client.deleteStream({ stream }).catch(() => undefined);
    await client.close();
    await pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`).catch(() => undefined);
    await pool.end();
  }
}

if (process.env.STREAM_DEDUP_BENCH_POSTGRES === '1') {
  const [mode, stream, entriesText, countText, schema, tag] = process.argv.slice(2) as [
    PostgresMode,
    string,
    string,
    string,
    string,
    string,
  ];
  const entries = Number(entriesText);
  const count = Number(countText);
  const rate =
    mode === 'raw'
      ? await raw(stream, entries)
      : mode === 'hand'
        ? await hand(stream, entries, count, schema, tag)
        : mode === 'level'
          ? await level(stream, entries, count, tag)
          : await postgres(stream, entries, count, schema, tag);
  process.stdout.write(`${JSON.stringify({ rate })}\n`);
  process.exit(0);
}
