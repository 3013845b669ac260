/**
 * npm run bench:outbox — the outbox relay's throughput and latency alone (issue 35 "Measure"),
 * quick enough to re-run on a quiet machine (about 60 s with the defaults):
 * - the raw client publishing `BENCH_COUNT` (100 000) bodies of 100 B (named publisher, confirms)
 *   and `PgOutboxRelay` relaying the same bodies from a table pre-filled with as many rows, in
 *   alternating rounds (`BENCH_ROUNDS`, 2; the relay's batchSize `BENCH_OUTBOX_BATCH`, its default
 *   when unset); the medians and the median of the per-round ratios;
 * - commit-to-confirm latency at 1 000 and 10 000 committed rows/s for `BENCH_OUTBOX_SECONDS` (5)
 *   each: p50/p99/max from the application's COMMIT to the relay's confirm.
 * - each round also runs the floor (PostgreSQL alone reading and deleting as many rows, nothing
 *   published) and reads the CPU seconds every process spent in each case's window (this process,
 *   the broker, PostgreSQL: bench/cpu-meter.ts, which counts every broker and PostgreSQL process on
 *   the machine). Two bounds on the relay's rate, each a ratio to the raw client like the relay's:
 *   `raw-publish bound`, the machine's cores divided by the raw client's CPU per row plus the
 *   floor's (a relay that publishes one entry per message, as the raw client does); and
 *   `own-send bound`, the cores divided by the floor's CPU per row plus the broker's share of
 *   this relay's own run (it sends each numbered batch as one sub-entry, which costs the broker
 *   less per row than the raw client's entries; its own Node.js side counted as nothing). Neither
 *   is a bound on every conceivable relay: larger sub-entries cost the broker less again.
 * Prints the load average with each figure, and a JSON line last. Needs the broker and PostgreSQL
 * (`bash scripts/postgres.sh up`; STREAM_DEDUP_PG_URL).
 */
import { availableParallelism, loadavg } from 'node:os';
import { allConfirmed, connectClient, uniqueName } from './common.js';
import { CpuWindow } from './cpu-meter.js';
import { commitToConfirmLatency, dbFloorThroughput, relayThroughput } from './outbox.js';

const COUNT = Number(process.env.BENCH_COUNT ?? 100_000);
const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 2);
const SECONDS = Number(process.env.BENCH_OUTBOX_SECONDS ?? 5);
/** The relay's batchSize in the throughput rounds (its default when unset). */
const BATCH =
  process.env.BENCH_OUTBOX_BATCH === undefined ? undefined : Number(process.env.BENCH_OUTBOX_BATCH);
const body = Buffer.alloc(100, 0x61);

const load = (): string => loadavg()[0]!.toFixed(1);
const median = (xs: readonly number[]): number => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 === 1 ? s[s.length >> 1]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
};

/** Messages/s of the raw client publishing COUNT bodies, every one confirmed. */
async function raw(cpu: CpuWindow): Promise<number> {
  const client = await connectClient();
  const stream = uniqueName('bench-raw-outbox');
  await client.createStream({ stream, arguments: {} });
  try {
    const publisher = await client.declarePublisher({ stream, publisherRef: 'bench-raw' });
    const all = allConfirmed(publisher, COUNT);
    cpu.start();
    const t0 = performance.now();
    for (let i = 1; i <= COUNT; i++) await publisher.send(body, {});
    await publisher.flush();
    await all;
    const rate = COUNT / ((performance.now() - t0) / 1000);
    cpu.stop();
    await client.deletePublisher(publisher.extendedId);
    return rate;
  } finally {
    await client.deleteStream({ stream });
    await client.close();
  }
}

const CORES = availableParallelism();
/** CPU seconds per 100 000 rows, by process: "node 0.52 + broker 0.53 + PostgreSQL 0.00 = 1.05". */
const per100k = (w: CpuWindow): string => {
  const k = 100_000 / COUNT;
  const s = w.spent;
  return (
    `node ${(s.node * k).toFixed(2)} + broker ${(s.broker * k).toFixed(2)} + PostgreSQL ${(s.postgres * k).toFixed(2)} ` +
    `= ${(w.total * k).toFixed(2)} CPU s per 100 000 (${(w.total / w.wallSeconds).toFixed(2)} of ${CORES} cores busy)`
  );
};
const started = performance.now();
const raws: number[] = [];
const relays: number[] = [];
const ratios: number[] = [];
const floors: number[] = [];
const bounds: number[] = [];
const ownBounds: number[] = [];
const cpu: { raw: number; floor: number; relay: number }[] = [];
for (let round = 1; round <= ROUNDS; round++) {
  const rawCpu = new CpuWindow();
  const relayCpu = new CpuWindow();
  const floorCpu = new CpuWindow();
  const r = await raw(rawCpu);
  const o = await relayThroughput(COUNT, body, BATCH === undefined ? {} : { batchSize: BATCH }, relayCpu);
  const f = await dbFloorThroughput(COUNT, body, 2_000, floorCpu);
  // With every core busy all the time a relay reaches CORES ÷ its CPU per row, never more; at
  // least it spends the floor's and what its publishing costs: the raw client's publish, or the
  // broker's share of this relay's own sub-entry sends (its Node.js side counted as nothing).
  const bound = (CORES * rawCpu.wallSeconds) / (rawCpu.total + floorCpu.total);
  const ownBound = (CORES * rawCpu.wallSeconds) / (floorCpu.total + relayCpu.spent.broker);
  raws.push(r);
  relays.push(o);
  ratios.push(o / r);
  floors.push(f / r);
  bounds.push(bound);
  ownBounds.push(ownBound);
  cpu.push({ raw: rawCpu.total, floor: floorCpu.total, relay: relayCpu.total });
  console.log(
    `round ${round}: raw ${Math.round(r)} msg/s, relay ${Math.round(o)} rows/s, ratio ${(o / r).toFixed(3)}; ` +
      `floor ${Math.round(f)} rows/s (${(f / r).toFixed(3)}); on ${CORES} cores raw-publish bound ${bound.toFixed(3)}, own-send bound ${ownBound.toFixed(3)} (load ${load()})\n` +
      `  CPU, raw:   ${per100k(rawCpu)}\n  CPU, floor: ${per100k(floorCpu)}\n  CPU, relay: ${per100k(relayCpu)}`,
  );
}
const ratio = median(ratios);
if (ROUNDS > 0)
  console.log(
    `relay from ${COUNT} pre-filled rows (batchSize ${BATCH ?? 'default'}): ${Math.round(median(relays))} rows/s against raw ${Math.round(median(raws))} msg/s: ` +
      `${ratio.toFixed(3)}× (target 0.8: ${ratio >= 0.8 ? 'met' : 'NOT met'}); bounds: raw-publish ${median(bounds).toFixed(3)}×, own-send ${median(ownBounds).toFixed(3)}×`,
  );
const latency = [];
for (const rate of (process.env.BENCH_OUTBOX_RATES ?? '1000,10000').split(',').map(Number)) {
  const l = await commitToConfirmLatency(rate, SECONDS);
  latency.push(l);
  console.log(
    `commit-to-confirm at ${rate} rows/s (committed ${l.committedRate}/s, ${l.rows} rows): p50 ${l.p50.toFixed(1)} ms, ` +
      `p99 ${l.p99.toFixed(1)} ms, max ${l.max.toFixed(1)} ms; to a consumer's delivery p50 ${l.delivered.p50.toFixed(1)} ms, ` +
      `p99 ${l.delivered.p99.toFixed(1)} ms (load ${load()})` +
      (rate === 1_000 ? ` (target p99 ≤ 50 ms: ${l.p99 <= 50 ? 'met' : 'NOT met'})` : ''),
  );
}
console.log(`took ${((performance.now() - started) / 1000).toFixed(0)} s`);
console.log(
  JSON.stringify({
    count: COUNT,
    raw: Math.round(median(raws)),
    relay: Math.round(median(relays)),
    ratio: Number(ratio.toFixed(3)),
    floorRatio: Number(median(floors).toFixed(3)),
    rawPublishBound: Number(median(bounds).toFixed(3)),
    ownSendBound: Number(median(ownBounds).toFixed(3)),
    cpuSecondsPerRound: cpu,
    latency,
  }),
);
process.exit(0);
