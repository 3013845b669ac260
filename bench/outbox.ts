/**
 * The transactional outbox relay's cases of `npm run bench:publish` (issue 35), in the same run as
 * the raw client: relay throughput from a table pre-filled with `count` rows (the ratio is to the
 * raw client publishing the same bodies), the at-least-once relay written the usual way from the
 * same rows, commit-to-confirm latency at 1 000 and 10 000 committed rows/s (an open-loop schedule;
 * latency from each row's COMMIT to the relay's confirm of it), and duplicates after 20 SIGKILLs of each relay. Needs PostgreSQL
 * (`bash scripts/postgres.sh up`; STREAM_DEDUP_PG_URL).
 */
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import * as hdr from 'hdr-histogram-js';
import pg from 'pg';
import { Offset } from 'rabbitmq-stream-js-client';
import { migrate, PgOutbox, PgOutboxRelay } from 'stream-dedup/postgres';
import { readStreamToEnd } from 'stream-dedup/stream';
import { CONNECTION, connectClient, uniqueName } from './common.js';
import type { CpuWindow } from './cpu-meter.js';
import { createNaiveOutbox, fillNaiveOutbox, runNaiveRelay } from './outbox-naive-relay.js';

/** The PostgreSQL server of the benches. */
export const PG_URL =
  process.env.STREAM_DEDUP_PG_URL ?? 'postgres://stream_dedup:stream-dedup@127.0.0.1:5433/stream_dedup';
const PRODUCER = 'bench-outbox';
const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

/** A pool, a migrated schema of its own and a stream; `drop()` removes all three. */
async function setUp(prefix: string) {
  const pool = new pg.Pool({ connectionString: PG_URL, max: 10 });
  pool.on('error', () => undefined);
  const schema = `bench_${prefix}_${process.pid}_${Date.now().toString(36)}`;
  await migrate(pool, { schema });
  const client = await connectClient();
  const stream = uniqueName(`bench-${prefix}`);
  await client.createStream({ stream, arguments: {} });
  return {
    pool,
    schema,
    client,
    stream,
    drop: async () => {
      await client.deleteStream({ stream }).catch(() => undefined);
      await client.close().catch(() => undefined);
      await pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`).catch(() => undefined);
      await pool.end();
    },
  };
}

/** Inserts `count` outbox rows as `enqueue` writes them (body only), 10 000 a statement. */
async function fillOutbox(pool: pg.Pool, schema: string, count: number, bodyOf: (i: number) => Buffer) {
  for (let from = 0; from < count; from += 10_000) {
    const bodies = Array.from({ length: Math.min(10_000, count - from) }, (_, i) => bodyOf(from + i));
    await pool.query(`INSERT INTO "${schema}".outbox (producer_name, body) SELECT $1, unnest($2::bytea[])`, [
      PRODUCER,
      bodies,
    ]);
  }
}

/**
 * Rows/s of PgOutboxRelay from `count` pre-filled rows: open() to the last row's confirm. `cpu`,
 * when given, is started and stopped around that window (the fill is outside it).
 */
export async function relayThroughput(
  count: number,
  body: Buffer,
  options: { batchSize?: number; maxInFlight?: number } = {},
  cpu?: CpuWindow,
): Promise<number> {
  const s = await setUp('relay');
  try {
    await fillOutbox(s.pool, s.schema, count, () => body);
    let confirmed = 0;
    let done: () => void = () => undefined;
    const all = new Promise<void>((resolve) => (done = resolve));
    cpu?.start();
    const t0 = performance.now();
    const relay = await PgOutboxRelay.open({
      pool: s.pool,
      schema: s.schema,
      producerName: PRODUCER,
      stream: s.stream,
      connection: s.client,
      ...options,
      onEvent: (e) => {
        if (e.type === 'confirmed' && (confirmed += e.count) >= count) done();
      },
    });
    await all;
    const rate = count / ((performance.now() - t0) / 1000);
    cpu?.stop();
    await relay.close();
    return rate;
  } finally {
    await s.drop();
  }
}

/** Rows/s of the at-least-once relay (bench/outbox-naive-relay.ts) from `count` pre-filled rows. */
export async function naiveThroughput(count: number, body: Buffer): Promise<number> {
  const s = await setUp('naive');
  try {
    await createNaiveOutbox(s.pool, s.schema);
    await fillNaiveOutbox(s.pool, s.schema, count, () => body);
    const t0 = performance.now();
    await runNaiveRelay({
      pool: s.pool,
      schema: s.schema,
      client: s.client,
      stream: s.stream,
      untilEmpty: true,
    });
    return count / ((performance.now() - t0) / 1000);
  } finally {
    await s.drop();
  }
}

/**
 * Rows/s at which PostgreSQL alone reads and deletes `count` pre-filled rows, `batch` at a time, in
 * one statement each (`DELETE … WHERE id IN (SELECT … ORDER BY id LIMIT n) RETURNING body`), with
 * nothing published: the least any relay that removes its rows does per row (issue 35's bound). A
 * relay that publishes them too cannot go faster than this on the same server, whatever its design.
 * `cpu`, when given, spans the reads and deletes (the fill is outside it).
 */
export async function dbFloorThroughput(
  count: number,
  body: Buffer,
  batch = 2_000,
  cpu?: CpuWindow,
): Promise<number> {
  const s = await setUp('floor');
  try {
    await createNaiveOutbox(s.pool, s.schema);
    await fillNaiveOutbox(s.pool, s.schema, count, () => body);
    const table = `"${s.schema}".naive_outbox`;
    let removed = 0;
    cpu?.start();
    const t0 = performance.now();
    for (;;) {
      const { rowCount } = await s.pool.query(
        `DELETE FROM ${table} WHERE id IN (SELECT id FROM ${table} ORDER BY id LIMIT $1) RETURNING body`,
        [batch],
      );
      if ((rowCount ?? 0) === 0) break;
      removed += rowCount ?? 0;
    }
    const rate = count / ((performance.now() - t0) / 1000);
    cpu?.stop();
    if (removed !== count) throw new Error(`the floor case removed ${removed} rows of ${count}`);
    return rate;
  } finally {
    await s.drop();
  }
}

/** What {@link commitToConfirmLatency} measured, in ms. */
export interface LatencyResult {
  readonly targetRate: number;
  readonly committedRate: number;
  readonly rows: number;
  readonly p50: number;
  readonly p99: number;
  readonly max: number;
  /** From the COMMIT to a consumer's delivery (the broker stored it; the relay's bookkeeping aside). */
  readonly delivered: { readonly p50: number; readonly p99: number; readonly max: number };
}

/**
 * Commits rows at `rate` rows/s for `seconds` on an open-loop schedule (row i is due at
 * t0 + i/rate; up to 8 concurrent transactions each commit the rows due when it starts), with the
 * relay running, and records for each row the time from its application's COMMIT returning to the
 * relay's `confirmed` event covering its publishing ID (the broker's confirm handled, its batch
 * record deleted), and to a consumer's delivery of it (the broker stored it). A consumer maps publishing IDs (the stamped `x-dedup-id`) to rows. The first half
 * second is a warm-up, not recorded.
 */
export async function commitToConfirmLatency(rate: number, seconds: number): Promise<LatencyResult> {
  const s = await setUp(`latency${rate}`);
  const build = () =>
    hdr.build({
      lowestDiscernibleValue: 1,
      highestTrackableValue: 60_000_000,
      numberOfSignificantValueDigits: 3,
    });
  const histogram = build();
  const deliveries = build();
  try {
    const outbox = PgOutbox.create({ schema: s.schema, producerName: PRODUCER });
    const relayPool = new pg.Pool({ connectionString: PG_URL, max: 4 });
    relayPool.on('error', () => undefined);
    const total = Math.round(rate * seconds);
    const warmUp = Math.round(rate * 0.5);
    const committedAt = new Float64Array(total);
    /** The relay's confirmed events: the highest ID covered and when, in order. */
    const confirms: { lastId: bigint; at: number }[] = [];
    let confirmedRows = 0;
    let allConfirmed: () => void = () => undefined;
    const everythingConfirmed = new Promise<void>((resolve) => (allConfirmed = resolve));
    const relay = await PgOutboxRelay.open({
      pool: relayPool,
      schema: s.schema,
      producerName: PRODUCER,
      stream: s.stream,
      connection: CONNECTION,
      onEvent: (e) => {
        if (e.type !== 'confirmed') return;
        confirms.push({ lastId: e.lastId, at: performance.now() });
        if ((confirmedRows += e.count) >= total) allConfirmed();
      },
    });
    let t0 = 0;
    const dueAt = (i: number): number => t0 + (i * 1000) / rate;
    const pidOf = new Map<number, bigint>();
    const deliveredAt = new Float64Array(total);
    let allReceived: () => void = () => undefined;
    const everythingReceived = new Promise<void>((resolve) => (allReceived = resolve));
    const consumer = await s.client.declareConsumer(
      { stream: s.stream, offset: Offset.first() },
      (message) => {
        const i = Number(message.content.toString());
        deliveredAt[i] = performance.now();
        pidOf.set(i, BigInt(String(message.applicationProperties?.['x-dedup-id'])));
        if (pidOf.size === total) allReceived();
      },
    );
    t0 = performance.now() + 50;
    let next = 0;
    const committer = async (): Promise<void> => {
      while (next < total) {
        const now = performance.now();
        if (dueAt(next) > now) {
          await sleep(Math.max(0, Math.min(5, dueAt(next) - now)));
          continue;
        }
        // Claim the due rows before any await: the other committers move `next` meanwhile.
        const from = next;
        while (next < total && dueAt(next) <= now) next++;
        const to = next;
        const sql = await s.pool.connect();
        try {
          await sql.query('BEGIN');
          // One INSERT for the transaction's rows (one round trip per row held the application
          // at 3 000-4 300 rows/s on this machine, below the 10 000 rows/s case).
          await outbox.enqueueMany(
            sql,
            Array.from({ length: to - from }, (_, k) => ({ body: Buffer.from(String(from + k)) })),
          );
          await sql.query('COMMIT');
          const at = performance.now();
          for (let i = from; i < to; i++) committedAt[i] = at;
        } finally {
          sql.release();
        }
      }
    };
    await Promise.all(Array.from({ length: 8 }, committer));
    const committedRate = total / ((performance.now() - t0) / 1000);
    await Promise.race([Promise.all([everythingConfirmed, everythingReceived]), sleep(60_000)]);
    await s.client.closeConsumer(consumer.extendedId);
    await relay.close();
    await relayPool.end();
    for (let i = warmUp; i < total; i++) {
      const pid = pidOf.get(i);
      if (pid === undefined) continue;
      deliveries.recordValue(Math.max(1, Math.round((deliveredAt[i]! - committedAt[i]!) * 1000)));
      let lo = 0;
      let hi = confirms.length - 1;
      while (lo < hi) {
        const mid = (lo + hi) >> 1;
        if (confirms[mid]!.lastId >= pid) hi = mid;
        else lo = mid + 1;
      }
      const c = confirms[lo];
      if (c === undefined || c.lastId < pid) continue;
      histogram.recordValue(Math.max(1, Math.round((c.at - committedAt[i]!) * 1000)));
    }
    return {
      targetRate: rate,
      committedRate: Math.round(committedRate),
      rows: histogram.totalCount,
      p50: histogram.getValueAtPercentile(50) / 1000,
      p99: histogram.getValueAtPercentile(99) / 1000,
      max: histogram.maxValue / 1000,
      delivered: {
        p50: deliveries.getValueAtPercentile(50) / 1000,
        p99: deliveries.getValueAtPercentile(99) / 1000,
        max: deliveries.maxValue / 1000,
      },
    };
  } finally {
    histogram.destroy();
    deliveries.destroy();
    await s.drop();
  }
}

const CHILD = fileURLToPath(new URL('./outbox-child.ts', import.meta.url));

/** What {@link duplicatesAfterKills} found for one relay. */
export interface KillResult {
  readonly relay: 'exactly-once' | 'at-least-once';
  readonly kills: number;
  readonly rows: number;
  readonly inStream: number;
  readonly duplicates: number;
  readonly lost: number;
}

/** How many times each body (a row index) is in the stream. */
async function countCopies(
  stream: string,
  rows: number,
): Promise<{ total: number; dup: number; lost: number }> {
  const seen = new Uint16Array(rows);
  const records = await readStreamToEnd(CONNECTION, stream, { timeoutMs: 120_000 });
  for (const r of records) seen[Number(r.body.toString())]!++;
  let dup = 0;
  let lost = 0;
  for (const n of seen) {
    if (n > 1) dup += n - 1;
    if (n === 0) lost++;
  }
  return { total: records.length, dup, lost };
}

/**
 * Each life is killed at a random time up to this many ms after it began publishing. With 150 ms
 * the exactly-once relay, at 82 500 rows/s on a quiet machine, emptied the 150 000 rows after 15 kills
 * of the 20 asked (2026-12-04): 20 lives of up to 50 ms publish about 40 000 rows at that rate.
 */
const KILL_WINDOW_MS = Number(process.env.BENCH_OUTBOX_KILL_WINDOW_MS ?? 50);

/** SIGKILLs per relay in the duplicates row (issue 35: 20). */
const KILLS = 20;

/**
 * `rows` pre-filled rows relayed by processes SIGKILLed `kills` times (each 0–KILL_WINDOW_MS ms after it said
 * it was publishing), then one last process to the end; counts the copies in the stream.
 */
export async function duplicatesAfterKills(
  relay: KillResult['relay'],
  rows: number,
  kills: number,
): Promise<KillResult> {
  const s = await setUp(relay === 'exactly-once' ? 'kills' : 'naivekills');
  try {
    const bodyOf = (i: number): Buffer => Buffer.from(String(i));
    if (relay === 'exactly-once') await fillOutbox(s.pool, s.schema, rows, bodyOf);
    else {
      await createNaiveOutbox(s.pool, s.schema);
      await fillNaiveOutbox(s.pool, s.schema, rows, bodyOf);
    }
    const args = JSON.stringify({
      relay,
      url: PG_URL,
      schema: s.schema,
      stream: s.stream,
      producerName: PRODUCER,
    });
    let killed = 0;
    for (;;) {
      const child = spawn(process.execPath, [...process.execArgv, CHILD, args], {
        stdio: ['ignore', 'pipe', 'inherit'],
      });
      const exited = once(child, 'exit');
      const lines = createInterface({ input: child.stdout });
      let publishing = false;
      for await (const line of lines) {
        if (line === 'publishing') {
          publishing = true;
          break;
        }
      }
      if (publishing && killed < kills) {
        await sleep(Math.random() * KILL_WINDOW_MS);
        child.kill('SIGKILL');
        const [, signal] = (await exited) as [number | null, NodeJS.Signals | null];
        if (signal === 'SIGKILL') killed++;
        else break; // It reached the end before the kill.
        continue;
      }
      // The last life: to the end (it prints `done` and exits 0 when the table is empty).
      const [code] = (await exited) as [number | null];
      if (code !== 0) throw new Error(`the last ${relay} relay exited with ${code}`);
      break;
    }
    const copies = await countCopies(s.stream, rows);
    return { relay, kills: killed, rows, inStream: copies.total, duplicates: copies.dup, lost: copies.lost };
  } finally {
    await s.drop();
  }
}

/** The outbox's latency and kill rows of the run, printed, and returned for the JSON line. */
export async function outboxExtras(): Promise<{ latency: LatencyResult[]; kills: KillResult[] }> {
  const latency = [
    await commitToConfirmLatency(1_000, Number(process.env.BENCH_OUTBOX_SECONDS ?? 5)),
    await commitToConfirmLatency(10_000, Number(process.env.BENCH_OUTBOX_SECONDS ?? 5)),
  ];
  for (const l of latency) {
    console.log(
      `outbox commit-to-confirm at ${l.targetRate} rows/s (committed ${l.committedRate}/s, ${l.rows} rows): ` +
        `p50 ${l.p50.toFixed(1)} ms, p99 ${l.p99.toFixed(1)} ms, max ${l.max.toFixed(1)} ms` +
        (l.targetRate === 1_000 ? ` (target p99 ≤ 50 ms: ${l.p99 <= 50 ? 'met' : 'NOT met'})` : ''),
    );
  }
  const rows = Number(process.env.BENCH_OUTBOX_KILL_ROWS ?? 150_000);
  const kills = [
    await duplicatesAfterKills('at-least-once', rows, KILLS),
    await duplicatesAfterKills('exactly-once', rows, KILLS),
  ];
  for (const k of kills) {
    console.log(
      `${k.relay} relay, ${k.kills} SIGKILLs over ${k.rows} rows: ${k.duplicates} duplicates, ${k.lost} lost (${k.inStream} in the stream)` +
        (k.kills < KILLS
          ? ` — fewer than the ${KILLS} asked: the relay emptied the table first (BENCH_OUTBOX_KILL_WINDOW_MS, BENCH_OUTBOX_KILL_ROWS)`
          : ''),
    );
  }
  return { latency, kills };
}
