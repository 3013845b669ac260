/**
 * npm run bench:latency — send→confirm latency under an open-loop load, the raw client against each
 * dedup mode, over the same broker in the same run (issue 39).
 *
 * 1. The raw client's maximum rate on this machine is measured first (closed loop, as
 *    bench:publish's raw row: each send() awaited, every confirm heard).
 * 2. Each case then publishes 100 B messages on a fixed schedule at 25 %, 50 % and 75 % of that
 *    rate for BENCH_SECONDS (5): message i is due at t0 + i / rate, and its latency is measured from
 *    that due time, not from when it was issued, so a stall shows as latency of every message
 *    scheduled during it (no coordinated omission: a closed loop would wait out the stall and
 *    record one slow message). The generator wakes every millisecond and issues what is due.
 *    Each case runs first for BENCH_WARMUP_SECONDS (1) at the same rate, unrecorded. (5 s and 1 s
 *    keep the default run under 5 minutes: 18 send→confirm cases, 4 end-to-end ones, each in fresh
 *    processes; at 50 % of 250 k msg/s, 5 s is 625 000 latencies, 625 above p99.9.)
 * 3. End to end at BENCH_E2E_LOADS (50 %), the publisher and the consumer in two processes of
 *    their own (bench/latency-e2e.ts): raw publisher → raw consumer (delivery) as the baseline of
 *    dedup outbox publisher → StreamVerifyingConsumer (commit), and raw super stream publisher →
 *    raw super stream consumer as the baseline of SuperStreamDedupPublisher → a group of one member
 *    (commit). When one of them did not keep up at 50 % (its p50 grew from the first second to the
 *    last) the output says so; BENCH_E2E_LOADS=0.5,0.25 measures every case at 25 % as well.
 *
 * BENCH_CASES (comma-separated names) runs only those cases; BENCH_MAX_RATE (msg/s) takes that as
 * the raw client's maximum instead of measuring it (A/B runs at the same rates). Latencies go into an HDR histogram
 * (hdr-histogram-js, µs, 3 significant digits) per case; each case runs in a fresh process and sends
 * its histogram back encoded. The bench prints p50 / p99 / p99.9 / max per case and load, writes
 * docs/latency.svg (BENCH_SVG: the percentile distributions at 50 %, raw against dedup, log scales)
 * and docs/latency-e2e.svg (BENCH_SVG_E2E: the end-to-end cases), its duration, and the rows as
 * JSON on its last line.
 */
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as hdr from 'hdr-histogram-js';
import type { Histogram } from 'hdr-histogram-js';
import { StreamDedupPublisher, type StreamDedupPublisherOptions } from 'stream-dedup/stream';
import { allConfirmed, CONNECTION, connectClient, measureInChild, median, uniqueName } from './common.js';
import { E2E_CASES, E2E_MEANING, measureE2e, type E2eCase } from './latency-e2e.js';
import { newHistogram, runSchedule, SIZE } from './latency-schedule.js';
import { renderPercentileSvg, type Series } from './latency-svg.js';
import { settleCounter } from './settle-counter.js';

const SECONDS = Number(process.env.BENCH_SECONDS ?? 5);
const WARMUP_SECONDS = Number(process.env.BENCH_WARMUP_SECONDS ?? 1);
const LOADS = (process.env.BENCH_LOADS ?? '0.25,0.5,0.75').split(',').map(Number);
const MAX_COUNT = Number(process.env.BENCH_MAX_COUNT ?? 100_000);
const MAX_ROUNDS = Number(process.env.BENCH_MAX_ROUNDS ?? 3);
/** The raw client's maximum (msg/s) to take instead of measuring it: A/B runs at the same rates. */
const FIXED_MAX = process.env.BENCH_MAX_RATE === undefined ? undefined : Number(process.env.BENCH_MAX_RATE);
/** The end-to-end cases' loads (each case at each; the first one's rows decide "did not keep up"). */
const E2E_LOADS = (process.env.BENCH_E2E_LOADS ?? '0.5').split(',').map(Number);
/** A case still running this long is stopped and reported as overloaded (75 % can be more than a mode sustains). */
const CASE_TIMEOUT_SECONDS = Number(
  process.env.BENCH_CASE_TIMEOUT_SECONDS ?? 2 * (WARMUP_SECONDS + SECONDS) + 15,
);
const SVG = process.env.BENCH_SVG ?? new URL('../docs/latency.svg', import.meta.url).pathname;
const SVG_E2E = process.env.BENCH_SVG_E2E ?? SVG.replace(/(\.svg)?$/, '-e2e.svg');

/** The send→confirm cases: the raw client, then each dedup mode (the end-to-end ones: bench/latency-e2e.ts). */
const CASES = ['raw', 'outbox', 'outbox+fsync', 'reserve', 'keyed', 'sub-entries'] as const;
type SendCase = (typeof CASES)[number];
type CaseName = SendCase | E2eCase;

/** A body of SIZE bytes. */
const bodyOf = (): Buffer => Buffer.alloc(SIZE, 0x61);

/** Records `performance.now() - due` in µs (at least 1). */
function record(h: Histogram, due: number): void {
  h.recordValue(Math.max(1, Math.round((performance.now() - due) * 1000)));
}

/** The raw client's named publisher, every send awaited (its buffer), confirms heard by ID. */
async function rawCase(rate: number, count: number, h: Histogram, stream: string): Promise<void> {
  const client = await connectClient();
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
    const body = bodyOf();
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
async function dedupCase(
  mode: DedupMode,
  rate: number,
  count: number,
  h: Histogram,
  stream: string,
  dir: string,
): Promise<void> {
  const client = await connectClient();
  await client.createStream({ stream, arguments: {} });
  try {
    const pub = await StreamDedupPublisher.open({
      connection: CONNECTION,
      stream,
      producerName: 'bench-lat-dedup',
      store: dir,
      ...(dedupOptions(mode) as object),
    });
    const body = bodyOf();
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

/** Deletes what a killed child left (missing streams are fine). */
async function deleteStreams(streams: readonly string[]): Promise<void> {
  const client = await connectClient();
  try {
    for (const stream of streams) await client.deleteStream({ stream }).catch(() => undefined);
  } finally {
    await client.close();
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
    const body = bodyOf();
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

/**
 * One measurement in this process (a child): prints `{ histogram }` (compressed base64) or
 * `{ rate }`. The warm-up run uses the stream `<stream>-w` and the store `<dir>/w`, the measured
 * one `<stream>` and `<dir>/m`: the parent removes them when it has to kill this process.
 */
async function child(
  name: SendCase | 'max',
  rate: number,
  count: number,
  stream: string,
  dir: string,
): Promise<void> {
  if (name === 'max') {
    await rawMax(count);
    process.stdout.write(`${JSON.stringify({ rate: await rawMax(count) })}\n`);
    return;
  }
  const run = (n: number, h: Histogram, phase: 'w' | 'm'): Promise<void> => {
    const at = phase === 'w' ? `${stream}-w` : stream;
    return name === 'raw' ? rawCase(rate, n, h, at) : dedupCase(name, rate, n, h, at, join(dir, phase));
  };
  // A warm-up run of the same case at the same rate (its latencies dropped): the first seconds of
  // a process measure the JIT, not the case.
  await run(Math.max(1, Math.round(rate * WARMUP_SECONDS)), newHistogram(), 'w');
  const h = newHistogram();
  await run(count, h, 'm');
  process.stdout.write(`${JSON.stringify({ histogram: hdr.encodeIntoCompressedBase64(h) })}\n`);
}

export interface LatencyRow {
  readonly name: CaseName;
  readonly load: number;
  readonly rate: number;
  readonly count: number;
  /** Percentiles in ms; `null` when the case was stopped at its deadline (`timedOut`). */
  readonly p50: number | null;
  readonly p99: number | null;
  readonly p999: number | null;
  readonly max: number | null;
  /** The case did not finish within BENCH_CASE_TIMEOUT_SECONDS: this rate overloads it. */
  readonly timedOut?: boolean;
  /** End-to-end cases: the p50 (ms) of the first and of the last second of the schedule. */
  readonly firstSecondP50?: number;
  readonly lastSecondP50?: number;
  /** End-to-end cases: whether the machine kept up (see {@link keptUp}). */
  readonly keptUp?: boolean;
  /** End-to-end cases: how late (ms) the publisher's generator issued at worst (its process's delay). */
  readonly publisherMaxLagMs?: number;
}

const ms = (us: number): number => Number((us / 1000).toFixed(3));

/**
 * Whether a run kept up with its schedule: a backlog makes the p50 grow second by second. Not kept
 * up: the last second's p50 above twice the first's and 5 ms more than it, or either over 1 s (a
 * backlog that began in the warm-up grows by less than 2× in the measured seconds: seen at load 5).
 */
function keptUp(firstP50: number, lastP50: number): boolean {
  return lastP50 <= Math.max(2 * firstP50, firstP50 + 5) && Math.max(firstP50, lastP50) < 1000;
}

/** BENCH_CASES (comma-separated case names; default: all), checked before anything runs. */
function selectedCases(): { readonly send: SendCase[]; readonly e2e: E2eCase[] } {
  const all: readonly CaseName[] = [...CASES, ...E2E_CASES];
  const names = process.env.BENCH_CASES?.split(',').map((n) => n.trim()) ?? all;
  for (const n of names)
    if (!all.includes(n as CaseName))
      throw new RangeError(`BENCH_CASES: unknown case ${n} (cases: ${all.join(', ')})`);
  return {
    send: CASES.filter((n) => names.includes(n)),
    e2e: E2E_CASES.filter((n) => names.includes(n)),
  };
}

async function main(): Promise<void> {
  const started = performance.now();
  const selected = selectedCases();
  const env = { STREAM_DEDUP_BENCH_LATENCY: '1' };
  const maxRates: number[] = FIXED_MAX === undefined ? [] : [FIXED_MAX];
  for (let r = 0; FIXED_MAX === undefined && r < MAX_ROUNDS; r++) {
    maxRates.push(
      (await measureInChild<{ rate: number }>(import.meta.url, ['max', '0', String(MAX_COUNT)], env)).rate,
    );
  }
  const max = median(maxRates);
  console.log(
    `raw client's closed-loop maximum: ${Math.round(max)} msg/s (${FIXED_MAX === undefined ? `median of ${maxRates.map(Math.round).join(', ')}` : 'BENCH_MAX_RATE'})`,
  );
  const rows: LatencyRow[] = [];
  const histograms = new Map<string, Histogram>();
  const report = (row: LatencyRow, h: Histogram | undefined, note = ''): void => {
    if (h !== undefined) histograms.set(`${row.name}@${row.load}`, h);
    rows.push(row);
    const f = (v: number | null): string => (v === null ? '-' : v.toFixed(2)).padStart(8);
    console.log(
      `${`${row.name} @ ${row.load * 100} %`.padEnd(28)} ${String(row.rate).padStart(7)} msg/s  p50 ${f(row.p50)} ms  p99 ${f(row.p99)} ms  p99.9 ${f(row.p999)} ms  max ${f(row.max)} ms${note}`,
    );
  };
  const timedOut = (name: CaseName, load: number, rate: number, count: number): void =>
    report(
      { name, load, rate, count, p50: null, p99: null, p999: null, max: null, timedOut: true },
      undefined,
      `  (stopped: not done in ${CASE_TIMEOUT_SECONDS} s, this rate overloads the case)`,
    );
  const percentiles = (h: Histogram) => ({
    p50: ms(h.getValueAtPercentile(50)),
    p99: ms(h.getValueAtPercentile(99)),
    p999: ms(h.getValueAtPercentile(99.9)),
    max: ms(h.maxValue),
  });
  const rateAt = (load: number): number => Math.max(1, Math.round(max * load));
  const countAt = (load: number): number => Math.max(1, Math.round(rateAt(load) * SECONDS));
  const measure = async (name: SendCase, load: number): Promise<void> => {
    const rate = rateAt(load);
    const count = countAt(load);
    const stream = uniqueName('bench-lat-case');
    const dir = await mkdtemp(join(tmpdir(), 'bench-lat-'));
    const deadline = AbortSignal.timeout(CASE_TIMEOUT_SECONDS * 1000);
    let histogram: string;
    try {
      ({ histogram } = await measureInChild<{ histogram: string }>(
        import.meta.url,
        [name, String(rate), String(count), stream, dir],
        env,
        { signal: deadline },
      ));
    } catch (e) {
      if (!deadline.aborted) throw e;
      await deleteStreams([`${stream}-w`, stream]);
      return timedOut(name, load, rate, count);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
    const h = hdr.decodeFromCompressedBase64(histogram);
    if (h.totalCount !== count) throw new Error(`${name} at ${load}: ${h.totalCount} latencies of ${count}`);
    report({ name, load, rate, count, ...percentiles(h) }, h);
  };
  const measureEndToEnd = async (name: E2eCase, load: number): Promise<boolean> => {
    const rate = rateAt(load);
    const count = countAt(load);
    const measured = await measureE2e(
      name,
      rate,
      Math.max(1, Math.round(rate * WARMUP_SECONDS)),
      count,
      CASE_TIMEOUT_SECONDS * 1000,
    );
    if (measured === 'timeout') {
      timedOut(name, load, rate, count);
      return false;
    }
    const { histogram: h, perSecond, early, publisherLag } = measured;
    if (h.totalCount !== count) throw new Error(`${name} at ${load}: ${h.totalCount} latencies of ${count}`);
    const firstSecondP50 = ms(perSecond[0]!.getValueAtPercentile(50));
    const lastSecondP50 = ms(perSecond.at(-1)!.getValueAtPercentile(50));
    const ok = keptUp(firstSecondP50, lastSecondP50);
    report(
      {
        name,
        load,
        rate,
        count,
        ...percentiles(h),
        firstSecondP50,
        lastSecondP50,
        keptUp: ok,
        publisherMaxLagMs: ms(publisherLag.maxLagMs * 1000),
      },
      h,
      `  (p50 first s ${firstSecondP50.toFixed(2)} → last s ${lastSecondP50.toFixed(2)} ms${ok ? '' : ': NOT kept up, a backlog grew'}${early > 0 ? `; ${early} latencies < 1 µs` : ''}; publisher issued up to ${publisherLag.maxLagMs.toFixed(1)} ms late, ${publisherLag.lateSlices} wake-ups > 10 ms late)`,
    );
    return ok;
  };
  for (const load of LOADS) for (const name of selected.send) await measure(name, load);
  if (selected.e2e.length > 0) {
    console.log('end to end, publisher and consumer in two processes of their own:');
    for (const name of selected.e2e) console.log(`  ${name.padEnd(14)} ${E2E_MEANING[name]}`);
  }
  const e2eLoads = [...E2E_LOADS];
  let allKeptUp = true;
  for (const name of selected.e2e) allKeptUp = (await measureEndToEnd(name, e2eLoads[0]!)) && allKeptUp;
  if (!allKeptUp && e2eLoads.length === 1) {
    // Not measured again at a lower load by default: 4 more cases (~1.5 min on a busy machine)
    // would take the default run past 5 minutes. The rows say how late the publisher issued.
    console.log(
      `end to end at ${e2eLoads[0]! * 100} %: this machine did not keep up (the p50 grew over the run); BENCH_E2E_LOADS=${e2eLoads[0]},0.25 measures a lower load as well`,
    );
  }
  for (const load of e2eLoads.slice(1)) for (const name of selected.e2e) await measureEndToEnd(name, load);
  await writeSvgs(max, selected, e2eLoads, histograms);
  const seconds = Math.round((performance.now() - started) / 1000);
  console.log(`bench:latency took ${seconds} s`);
  console.log(
    JSON.stringify({
      bench: 'latency',
      rawMaxPerSec: Math.round(max),
      seconds: SECONDS,
      durationSeconds: seconds,
      rows,
    }),
  );
}

/**
 * docs/latency.svg (BENCH_SVG): send→confirm, raw against each dedup mode at 50 % (or the first
 * load measured); docs/latency-e2e.svg (BENCH_SVG_E2E): the end-to-end cases at each load measured
 * (a second picture: their scale is another one). A picture without a case is not written.
 */
async function writeSvgs(
  max: number,
  selected: { readonly send: readonly SendCase[]; readonly e2e: readonly E2eCase[] },
  e2eLoads: readonly number[],
  histograms: ReadonlyMap<string, Histogram>,
): Promise<void> {
  const svgLoad = LOADS.includes(0.5) ? 0.5 : LOADS[0]!;
  const rate = (load: number): string =>
    `${load * 100} % of the raw client's maximum (${Math.round(max * load)} msg/s, 100 B)`;
  const curve = (name: CaseName, load: number, label: string, colour: number): Series[] => {
    const h = histograms.get(`${name}@${load}`);
    return h === undefined
      ? []
      : [
          {
            name: label,
            colour,
            percentiles: percentileCurve(h),
            baseline: name === 'raw' || name === 'e2e-raw' || name === 'e2e-raw-super',
            dashed: load !== e2eLoads[0] && E2E_CASES.includes(name as E2eCase),
          },
        ];
  };
  const send = selected.send.flatMap((name, i) => curve(name, svgLoad, name, i));
  if (send.length > 0) {
    await writeFile(SVG, renderPercentileSvg(`send→confirm latency at ${rate(svgLoad)}`, send));
    console.log(`wrote ${SVG}`);
  }
  const several = e2eLoads.length > 1;
  const e2e = e2eLoads.flatMap((load) =>
    selected.e2e.flatMap((name, i) => curve(name, load, several ? `${name} @ ${load * 100} %` : name, i)),
  );
  if (e2e.length > 0) {
    await writeFile(
      SVG_E2E,
      renderPercentileSvg(
        `end to end, publish → delivery (raw) or commit (dedup), at ${several ? e2eLoads.map((l) => `${l * 100} %`).join(' and ') : rate(e2eLoads[0]!)}`,
        e2e,
      ),
    );
    console.log(`wrote ${SVG_E2E}`);
  }
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
  const [name, rate, count, stream, dir] = process.argv.slice(2) as [
    SendCase | 'max',
    string,
    string,
    string,
    string,
  ];
  await child(name, Number(rate), Number(count), stream, dir);
  process.exit(0);
} else if (process.env.STREAM_DEDUP_BENCH_LATENCY_E2E !== '1') {
  await main();
}
