/**
 * Profiling aid for the outbox relay (issue 35), not part of `npm run bench:*`: fills a schema of
 * its own with `PROFILE_ROWS` (100 000) rows of 100 B, runs PgOutboxRelay to the last confirm with
 * every RelayDb statement timed (by kind, and the reads/moves in sequence, to see a cost that grows
 * along the table), prints rows/s, then drops the schema and the stream. `PROFILE_BATCH` sets
 * batchSize; `PROFILE_KEEP=1` keeps the filled schema unrelayed (for EXPLAIN by hand) and prints
 * its name. Run: `node --import tsx bench/outbox-profile.ts` (add `--cpu-prof` for the relay's CPU).
 */
import pg from 'pg';
import { migrate, PgOutboxRelay } from '../src/postgres.js';
import { RelayDb } from '../src/postgres/outbox/relay-db.js';
import { CONNECTION, connectClient, uniqueName } from './common.js';
import { PG_URL } from './outbox.js';

const ROWS = Number(process.env.PROFILE_ROWS ?? 100_000);
const BATCH = process.env.PROFILE_BATCH === undefined ? undefined : Number(process.env.PROFILE_BATCH);
const body = Buffer.alloc(100, 0x61);

const kind = (text: string): string =>
  text.startsWith('BEGIN')
    ? 'read'
    : text.startsWith('WITH ids')
      ? 'move'
      : text.trimStart().startsWith('DELETE') || text.includes(' COMMIT')
        ? 'delete+commit'
        : text.slice(0, 24).replace(/\s+/g, ' ');
const totals = new Map<string, { n: number; ms: number }>();
const series: { kind: string; at: number; ms: number }[] = [];
// eslint-disable-next-line @typescript-eslint/unbound-method -- wrapped and called with its `this`
const run = RelayDb.prototype.run;
RelayDb.prototype.run = function (this: RelayDb, client, text, values) {
  const t0 = performance.now();
  const p = run.call(this, client, text, values);
  const k = kind(text);
  void p.then(
    () => {
      const ms = performance.now() - t0;
      const e = totals.get(k) ?? { n: 0, ms: 0 };
      e.n++;
      e.ms += ms;
      totals.set(k, e);
      series.push({ kind: k, at: t0, ms });
    },
    () => undefined,
  );
  return p;
} as typeof run;

const pool = new pg.Pool({ connectionString: PG_URL, max: 6 });
const schema = `prof35_${process.pid}`;
await migrate(pool, { schema });
for (let from = 0; from < ROWS; from += 10_000) {
  const n = Math.min(10_000, ROWS - from);
  await pool.query(
    `INSERT INTO "${schema}".outbox (producer_name, body) SELECT 'prof', unnest($1::bytea[])`,
    [Array.from({ length: n }, () => body)],
  );
}
if (process.env.PROFILE_KEEP === '1') {
  console.log(`kept schema ${schema} with ${ROWS} rows`);
  await pool.end();
  process.exit(0);
}
const client = await connectClient();
const stream = uniqueName('prof35');
await client.createStream({ stream, arguments: {} });
try {
  let confirmed = 0;
  let done: () => void = () => undefined;
  const all = new Promise<void>((resolve) => (done = resolve));
  const t0 = performance.now();
  const relay = await PgOutboxRelay.open({
    pool,
    schema,
    producerName: 'prof',
    stream,
    connection: CONNECTION,
    ...(BATCH === undefined ? {} : { batchSize: BATCH }),
    onEvent: (e) => {
      if (e.type === 'confirmed' && (confirmed += e.count) >= ROWS) done();
    },
  });
  await all;
  const seconds = (performance.now() - t0) / 1000;
  await relay.close();
  console.log(`${ROWS} rows in ${seconds.toFixed(2)} s: ${Math.round(ROWS / seconds)} rows/s`);
  for (const [k, e] of totals)
    console.log(`  ${k}: ${e.n} × ${(e.ms / e.n).toFixed(2)} ms = ${Math.round(e.ms)} ms`);
  for (const k of ['read', 'move']) {
    const xs = series.filter((s) => s.kind === k).map((s) => s.ms);
    const tenth = Math.max(1, Math.floor(xs.length / 10));
    const parts: string[] = [];
    for (let i = 0; i < xs.length; i += tenth) {
      const part = xs.slice(i, i + tenth);
      parts.push((part.reduce((a, b) => a + b, 0) / part.length).toFixed(1));
    }
    console.log(`  ${k} ms by tenth of the run: ${parts.join(' ')}`);
  }
} finally {
  await client.deleteStream({ stream }).catch(() => undefined);
  await client.close();
  await pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
  await pool.end();
}
process.exit(0);
