/**
 * npm run bench:latency — send→confirm latency under an open-loop load, the raw client against each
 * dedup mode, over the same broker in the same run (issue 39).
 *
 * 1. The raw client's maximum rate on this machine is measured first (closed loop, as
 *    bench:publish's raw row: each send() awaited, every confirm heard).
 * 2. Each case then publishes 100 B messages on a fixed schedule at 25 %, 50 % and 75 % of that
 *    rate for BENCH_SECONDS (10): message i is due at t0 + i / rate, and its latency is measured from
 *    that due time, not from when it was issued, so a stall shows as latency of every message
 *    scheduled during it (no coordinated omission: a closed loop would wait out the stall and
 *    record one slow message). The generator wakes every millisecond and issues what is due.
 *    Each case runs first for BENCH_WARMUP_SECONDS (2) at the same rate, unrecorded.
 * 3. End to end at 50 %: from the due time to the verifying consumer's commit of that message
 *    (`waitForOffset` of its offset resolved), for a stream consumer and for a group of one member on
 *    a 3-partition super stream.
 *
 * Latencies go into an HDR histogram (hdr-histogram-js, µs, 3 significant digits) per case; each case
 * runs in a fresh process and sends its histogram back encoded. The bench prints p50 / p99 / p99.9 /
 * max per case and load, writes docs/latency.svg (the percentile distributions at 50 %, raw against
 * dedup, log scales), and prints the rows as JSON on its last line.
 */
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as hdr from 'hdr-histogram-js';
import type { Histogram } from 'hdr-histogram-js';
import {
  StreamDedupPublisher,
  StreamVerifyingConsumer,
  SuperStreamDedupPublisher,
  SuperStreamVerifyingConsumer,
  type StreamDedupPublisherOptions,
} from 'stream-dedup/stream';
import { changelogStreamName } from '../src/group/consumer.js';
import { allConfirmed, CONNECTION, connectClient, measureInChild, median, uniqueName } from './common.js';
import { renderPercentileSvg } from './latency-svg.js';
import { settleCounter } from './settle-counter.js';

const SECONDS = Number(process.env.BENCH_SECONDS ?? 10);
const WARMUP_SECONDS = Number(process.env.BENCH_WARMUP_SECONDS ?? 2);
const LOADS = (process.env.BENCH_LOADS ?? '0.25,0.5,0.75').split(',').map(Number);
const MAX_COUNT = Number(process.env.BENCH_MAX_COUNT ?? 100_000);
const MAX_ROUNDS = Number(process.env.BENCH_MAX_ROUNDS ?? 3);
const SIZE = 100;
const SVG = process.env.BENCH_SVG ?? new URL('../docs/latency.svg', import.meta.url).pathname;
/**
 * Opt-in (profiling, issue 39): BENCH_TRACE_SLOW=<ms> makes each child print to stderr, per run, a
 * timeline of 100 ms buckets (BENCH_TRACE_BUCKET) (by due time from the schedule's start) whose slowest message took more
 * than <ms>: the bucket's max latency, how late the generator issued its messages (a late issue means
 * the event loop was busy — GC or CPU — rather than waiting on the broker or the store), and how many
 * were slow.
 */
const TRACE_SLOW_MS =
  process.env.BENCH_TRACE_SLOW === undefined ? undefined : Number(process.env.BENCH_TRACE_SLOW);
const TRACE_BUCKET_MS = Number(process.env.BENCH_TRACE_BUCKET ?? 100);
let traceT0 = 0;
let traceLatency: number[] = [];
let traceIssueLag: number[] = [];
let traceSlow: number[] = [];

/** The cases: the raw client, then each dedup mode; `e2e-*` are measured at 50 % only. */
const CASES = ['raw', 'outbox', 'outbox+fsync', 'reserve', 'keyed', 'sub-entries'] as const;
const E2E_CASES = ['e2e-stream', 'e2e-group'] as const;
type CaseName = (typeof CASES)[number] | (typeof E2E_CASES)[number];

const newHistogram = (): Histogram =>
  hdr.build({
    lowestDiscernibleValue: 1,
    highestTrackableValue: 120_000_000,
    numberOfSignificantValueDigits: 3,
  });

/** A body of SIZE bytes whose first 8 carry the message's index (for the end-to-end cases). */
function bodyOf(i: number): Buffer {
  const b = Buffer.alloc(SIZE, 0x61);
  b.writeUInt32BE(Math.floor(i / 2 ** 32), 0);
  b.writeUInt32BE(i >>> 0, 4);
  return b;
}
const indexOf = (body: Buffer): number => body.readUInt32BE(0) * 2 ** 32 + body.readUInt32BE(4);

/**
 * The open-loop generator: calls `issue(i, due)` for every message whose due time (ms, on
 * performance.now()) has come, waking every millisecond, until `count` are issued. `issue` may be
 * async (the raw client's buffered send): the generator awaits it, so a send that blocks delays the
 * next issue — and that delay is charged to the messages' latency, measured from `due`.
 */
async function runSchedule(
  rate: number,
  count: number,
  issue: (i: number, due: number) => void | Promise<void>,
): Promise<void> {
  const t0 = performance.now() + 5;
  const period = 1000 / rate;
  let issued = 0;
  if (TRACE_SLOW_MS !== undefined) {
    traceT0 = t0;
    traceLatency = [];
    traceIssueLag = [];
    traceSlow = [];
  }
  while (issued < count) {
    const due = Math.min(count, Math.floor((performance.now() - t0) / period) + 1);
    while (issued < due) {
      if (TRACE_SLOW_MS !== undefined) {
        const b = Math.floor((issued * period) / TRACE_BUCKET_MS);
        traceIssueLag[b] = Math.max(traceIssueLag[b] ?? 0, performance.now() - (t0 + issued * period));
      }
      const r = issue(issued, t0 + issued * period);
      if (r !== undefined) await r;
      issued++;
    }
    if (issued < count) await new Promise((resolve) => setTimeout(resolve, 1));
  }
}

/** Records `performance.now() - due` in µs (at least 1). */
function record(h: Histogram, due: number): void {
  const latency = performance.now() - due;
  h.recordValue(Math.max(1, Math.round(latency * 1000)));
  if (TRACE_SLOW_MS !== undefined) {
    const b = Math.floor((due - traceT0) / TRACE_BUCKET_MS);
    traceLatency[b] = Math.max(traceLatency[b] ?? 0, latency);
    if (latency > TRACE_SLOW_MS) traceSlow[b] = (traceSlow[b] ?? 0) + 1;
  }
}

/** BENCH_TRACE_SLOW: prints the run's slow buckets to stderr (see TRACE_SLOW_MS). */
function printTrace(label: string): void {
  if (TRACE_SLOW_MS === undefined) return;
  const lines = [
    `trace ${label} (schedule start at ${traceT0.toFixed(0)} ms of the process): ${TRACE_BUCKET_MS} ms buckets with a message slower than ${TRACE_SLOW_MS} ms`,
  ];
  for (let b = 0; b < traceLatency.length; b++) {
    const max = traceLatency[b] ?? 0;
    if (max <= TRACE_SLOW_MS) continue;
    lines.push(
      `  due +${String(b * TRACE_BUCKET_MS).padStart(6)} ms  max ${max.toFixed(1).padStart(7)} ms  issue lag ${(traceIssueLag[b] ?? 0).toFixed(1).padStart(7)} ms  slow ${traceSlow[b] ?? 0}`,
    );
  }
  process.stderr.write(`${lines.join('\n')}\n`);
}

/** The raw client's named publisher, every send awaited (its buffer), confirms heard by ID. */
async function rawCase(rate: number, count: number, h: Histogram): Promise<void> {
  const client = await connectClient();
  const stream = uniqueName('bench-lat-raw');
  await client.createStream({ stream, arguments: {} });
  try {
    const publisher = await client.declarePublisher({ stream, publisherRef: 'bench-lat-raw' });
    const dueById = new Map<bigint, number>();
    const all = new Promise<void>((resolve, reject) => {
      let confirmed = 0;
      publisher.on('publish_confirm', (err, ids) => {
        if (err !== null) return reject(new Error(`publish error ${err}`));
        for (const id of ids) {
          const due = dueById.get(id);
          if (due === undefined) continue;
          dueById.delete(id);
          record(h, due);
          confirmed++;
        }
        if (confirmed >= count) resolve();
      });
    });
    const body = bodyOf(0);
    await runSchedule(rate, count, async (_i, due) => {
      const { publishingId } = await publisher.send(body);
      dueById.set(publishingId, due);
    });
    await publisher.flush();
    await all;
    await client.deletePublisher(publisher.extendedId);
  } finally {
    await client.deleteStream({ stream });
    await client.close();
  }
}

type DedupMode = 'outbox' | 'outbox+fsync' | 'reserve' | 'keyed' | 'sub-entries';

function dedupOptions(mode: DedupMode): Partial<StreamDedupPublisherOptions> {
  switch (mode) {
    case 'outbox':
      return { durability: 'outbox' };
    case 'outbox+fsync':
      return { durability: 'outbox', sync: true };
    case 'reserve':
      return { durability: 'reserve' };
    case 'keyed':
      return { durability: 'outbox', idMode: 'keyed' };
    case 'sub-entries':
      return { durability: 'outbox', subEntry: { size: 100 } };
  }
}

/** StreamDedupPublisher in `mode`; latency from the due time to the send's promise settling. */
async function dedupCase(mode: DedupMode, rate: number, count: number, h: Histogram): Promise<void> {
  const dir = await mkdtemp(join(tmpdir(), 'bench-lat-'));
  const stream = uniqueName('bench-lat-dedup');
  const client = await connectClient();
  await client.createStream({ stream, arguments: {} });
  try {
    const opened = performance.now();
    const pub = await StreamDedupPublisher.open({
      connection: CONNECTION,
      stream,
      producerName: 'bench-lat-dedup',
      store: join(dir, 'store'),
      ...(dedupOptions(mode) as object),
    });
    if (TRACE_SLOW_MS !== undefined)
      process.stderr.write(`open ${(performance.now() - opened).toFixed(1)} ms\n`);
    const body = bodyOf(0);
    const sends = settleCounter(count);
    await runSchedule(rate, count, (i, due) => {
      const sent = mode === 'keyed' ? pub.send(body, { key: `order-${i}` }) : pub.send(body);
      sends.add(sent.then(() => record(h, due)));
    });
    await sends.all;
    await pub.close();
  } finally {
    await client.deleteStream({ stream });
    await client.close();
    await rm(dir, { recursive: true, force: true });
  }
}

/**
 * Publish (outbox) → the verifying consumer's commit of that message: the handler reads the
 * message's index from its body and asks to hear when its offset is committed.
 */
async function e2eStream(rate: number, count: number, h: Histogram): Promise<void> {
  const dir = await mkdtemp(join(tmpdir(), 'bench-lat-e2e-'));
  const stream = uniqueName('bench-lat-e2e');
  const client = await connectClient();
  await client.createStream({ stream, arguments: {} });
  const dues = new Float64Array(count);
  const committed = settleCounter(count);
  try {
    const pub = await StreamDedupPublisher.open({
      connection: CONNECTION,
      stream,
      producerName: 'bench-lat-e2e',
      store: join(dir, 'producer'),
      durability: 'outbox',
    });
    // The stream is empty until the schedule starts: the handler never runs before `consumer` is set.
    const consumer: StreamVerifyingConsumer = await StreamVerifyingConsumer.open({
      connection: CONNECTION,
      stream,
      consumerName: 'bench-lat-e2e',
      store: join(dir, 'consumer'),
      handler: (message, tx) => {
        const due = dues[indexOf(message.body)]!;
        tx.put('last', 'x');
        committed.add(consumer.waitForOffset(message.offset).then(() => record(h, due)));
      },
    });
    const sends = settleCounter(count);
    await runSchedule(rate, count, (i, due) => {
      dues[i] = due;
      sends.add(pub.send(bodyOf(i)));
    });
    await sends.all;
    await pub.close();
    await consumer.waitForOffset(BigInt(count - 1));
    if (consumer.stats.new !== count) throw new Error(`consumer applied ${consumer.stats.new} of ${count}`);
    await committed.all;
    await consumer.close();
  } finally {
    await client.deleteStream({ stream });
    await client.close();
    await rm(dir, { recursive: true, force: true });
  }
}

/** The same through a 3-partition super stream and a group of one member (changelog per batch). */
async function e2eGroup(rate: number, count: number, h: Histogram): Promise<void> {
  const dir = await mkdtemp(join(tmpdir(), 'bench-lat-group-'));
  const superStream = uniqueName('bench-lat-group');
  const consumerName = 'bench-lat-group';
  const client = await connectClient();
  await client.createSuperStream({ streamName: superStream, arguments: {} }, undefined, 3);
  const dues = new Float64Array(count);
  const committed = settleCounter(count);
  let member: SuperStreamVerifyingConsumer | undefined;
  let applied = 0;
  let handledAll = (): void => undefined;
  const allHandled = new Promise<void>((resolve) => (handledAll = resolve));
  try {
    const pub = await SuperStreamDedupPublisher.open({
      connection: CONNECTION,
      superStream,
      producerName: 'bench-lat-group',
      store: join(dir, 'producer'),
      durability: 'outbox',
      routing: { kind: 'hash', key: (_body, headers) => String(headers?.order) },
    });
    member = await SuperStreamVerifyingConsumer.open({
      connection: CONNECTION,
      superStream,
      consumerName,
      store: join(dir, 'member'),
      startFrom: 'first',
      handler: (message, tx, partition) => {
        applied++;
        const due = dues[indexOf(message.body)]!;
        tx.put('last', 'x');
        committed.add(member!.waitForOffset(partition, message.offset).then(() => record(h, due)));
        if (applied === count) handledAll();
      },
    });
    const sends = settleCounter(count);
    await runSchedule(rate, count, (i, due) => {
      dues[i] = due;
      sends.add(pub.send(bodyOf(i), { headers: { order: `order-${i}` } }));
    });
    await sends.all;
    await pub.close();
    await allHandled;
    await committed.all;
    if (applied !== count) throw new Error(`group applied ${applied} of ${count}`);
  } finally {
    const partitions = member?.partitions ?? [];
    await member?.close();
    for (const p of partitions)
      await client.deleteStream({ stream: changelogStreamName(p, consumerName) }).catch(() => undefined);
    await client.deleteSuperStream({ streamName: superStream });
    await client.close();
    await rm(dir, { recursive: true, force: true });
  }
}

/** The raw client's closed-loop rate (bench:publish's raw row), msg/s. */
async function rawMax(count: number): Promise<number> {
  const client = await connectClient();
  const stream = uniqueName('bench-lat-max');
  await client.createStream({ stream, arguments: {} });
  try {
    const publisher = await client.declarePublisher({ stream, publisherRef: 'bench-lat-max' });
    const all = allConfirmed(publisher, count);
    const body = bodyOf(0);
    const t0 = performance.now();
    for (let i = 0; i < count; i++) await publisher.send(body);
    await publisher.flush();
    await all;
    const rate = count / ((performance.now() - t0) / 1000);
    // Deleting a stream while the client still has a publisher on it hangs the client (seen here).
    await client.deletePublisher(publisher.extendedId);
    return rate;
  } finally {
    await client.deleteStream({ stream });
    await client.close();
  }
}

/** One measurement in this process (a child): prints `{ histogram }` (compressed base64) or `{ rate }`. */
async function child(name: CaseName | 'max', rate: number, count: number): Promise<void> {
  if (name === 'max') {
    await rawMax(count);
    process.stdout.write(`${JSON.stringify({ rate: await rawMax(count) })}\n`);
    return;
  }
  const run = (n: number, h: Histogram): Promise<void> =>
    name === 'raw'
      ? rawCase(rate, n, h)
      : name === 'e2e-stream'
        ? e2eStream(rate, n, h)
        : name === 'e2e-group'
          ? e2eGroup(rate, n, h)
          : dedupCase(name, rate, n, h);
  // A warm-up run of the same case at the same rate (its latencies dropped): the first seconds of
  // a process measure the JIT, not the case.
  await run(Math.max(1, Math.round(rate * WARMUP_SECONDS)), newHistogram());
  printTrace(`${name} warm-up`);
  const h = newHistogram();
  await run(count, h);
  printTrace(`${name} measured`);
  process.stdout.write(`${JSON.stringify({ histogram: hdr.encodeIntoCompressedBase64(h) })}\n`);
}

export interface LatencyRow {
  readonly name: CaseName;
  readonly load: number;
  readonly rate: number;
  readonly count: number;
  /** Percentiles in ms. */
  readonly p50: number;
  readonly p99: number;
  readonly p999: number;
  readonly max: number;
}

const ms = (us: number): number => Number((us / 1000).toFixed(3));

async function main(): Promise<void> {
  const env = { STREAM_DEDUP_BENCH_LATENCY: '1' };
  const maxRates: number[] = [];
  for (let r = 0; r < MAX_ROUNDS; r++) {
    maxRates.push(
      (await measureInChild<{ rate: number }>(import.meta.url, ['max', '0', String(MAX_COUNT)], env)).rate,
    );
  }
  const max = median(maxRates);
  console.log(
    `raw client's closed-loop maximum: ${Math.round(max)} msg/s (median of ${maxRates.map(Math.round).join(', ')})`,
  );
  const rows: LatencyRow[] = [];
  const histograms = new Map<string, Histogram>();
  const measure = async (name: CaseName, load: number): Promise<void> => {
    const rate = Math.max(1, Math.round(max * load));
    const count = Math.max(1, Math.round(rate * SECONDS));
    const { histogram } = await measureInChild<{ histogram: string }>(
      import.meta.url,
      [name, String(rate), String(count)],
      env,
    );
    const h = hdr.decodeFromCompressedBase64(histogram);
    if (h.totalCount !== count) throw new Error(`${name} at ${load}: ${h.totalCount} latencies of ${count}`);
    histograms.set(`${name}@${load}`, h);
    const row: LatencyRow = {
      name,
      load,
      rate,
      count,
      p50: ms(h.getValueAtPercentile(50)),
      p99: ms(h.getValueAtPercentile(99)),
      p999: ms(h.getValueAtPercentile(99.9)),
      max: ms(h.maxValue),
    };
    rows.push(row);
    console.log(
      `${`${name} @ ${load * 100} %`.padEnd(28)} ${String(rate).padStart(7)} msg/s  p50 ${row.p50.toFixed(2).padStart(8)} ms  p99 ${row.p99.toFixed(2).padStart(8)} ms  p99.9 ${row.p999.toFixed(2).padStart(8)} ms  max ${row.max.toFixed(2).padStart(8)} ms`,
    );
  };
  for (const load of LOADS) for (const name of CASES) await measure(name, load);
  for (const name of E2E_CASES) await measure(name, 0.5);
  const svgLoad = LOADS.includes(0.5) ? 0.5 : LOADS[0]!;
  const series = [...CASES, ...E2E_CASES]
    .map((name) => ({ name, h: histograms.get(`${name}@${svgLoad}`) }))
    .filter((s): s is { name: CaseName; h: Histogram } => s.h !== undefined);
  await writeFile(
    SVG,
    renderPercentileSvg(
      `send→confirm (and end-to-end) latency at ${svgLoad * 100} % of the raw client's maximum (${Math.round(max * svgLoad)} msg/s, 100 B)`,
      series.map(({ name, h }) => ({ name, percentiles: percentileCurve(h) })),
    ),
  );
  console.log(`wrote ${SVG}`);
  console.log(JSON.stringify({ bench: 'latency', rawMaxPerSec: Math.round(max), seconds: SECONDS, rows }));
}

/** The histogram's latency (ms) at percentiles 0 … 99.999 on a log scale of 1 / (1 − p). */
function percentileCurve(h: Histogram): Array<{ percentile: number; ms: number }> {
  const points: Array<{ percentile: number; ms: number }> = [];
  for (let nines = 0; nines <= 5; nines += 0.05) {
    const percentile = 100 * (1 - 10 ** -nines);
    points.push({ percentile, ms: h.getValueAtPercentile(percentile) / 1000 });
  }
  points.push({ percentile: 100, ms: h.maxValue / 1000 });
  return points;
}

if (process.env.STREAM_DEDUP_BENCH_LATENCY === '1') {
  const [name, rate, count] = process.argv.slice(2) as [CaseName | 'max', string, string];
  await child(name, Number(rate), Number(count));
  process.exit(0);
} else {
  await main();
}
