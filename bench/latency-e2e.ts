/**
 * bench:latency's end-to-end cases (issue 39 item 2): from a message's due time on the publisher's
 * open-loop schedule to the moment its consumer is done with it, with the publisher and the
 * consumer in two processes of their own (one JS thread running both saturated: 4.7 s p50 at 50 %
 * load, the figure measuring the bench, not the library).
 *
 * The parent creates the stream (or the 3-partition super stream) and starts the consumer's
 * process; once it is subscribed, the publisher's process publishes warm-up + measured messages on
 * one schedule. Each 100 B body carries its due time as epoch ms (`performance.timeOrigin +
 * performance.now()`, a float64: both processes read the same system clock) and its index; the
 * consumer records `now − due` (µs) in an HDR histogram per second of the measured schedule,
 * skipping the warm-up messages, and sends the histograms back encoded. The per-second histograms
 * show whether the machine kept up: a p50 that grows from the first second to the last is a
 * backlog, not a latency.
 *
 * - `e2e-raw`: the raw client's named publisher → the raw client's consumer (`declareConsumer`):
 *   due time → delivery. The baseline of `e2e-stream`.
 * - `e2e-stream`: StreamDedupPublisher (outbox) → StreamVerifyingConsumer: due time → the commit
 *   of the batch holding the message (its `hooks.afterCommit`, once per batch for all its messages).
 * - `e2e-raw-super`: the raw client's super stream publisher (hash routing, 3 partitions) → its
 *   super stream consumer: due time → delivery. The baseline of `e2e-group`.
 * - `e2e-group`: SuperStreamDedupPublisher (outbox, hash routing) → a group of one member: due time
 *   → the commit of the batch holding the message (changelog entry confirmed, member's store
 *   written: `hooks.afterCommit`).
 */
import { spawn } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import * as hdr from 'hdr-histogram-js';
import type { Histogram } from 'hdr-histogram-js';
import { Offset } from 'rabbitmq-stream-js-client';
import {
  StreamDedupPublisher,
  StreamVerifyingConsumer,
  SuperStreamDedupPublisher,
  SuperStreamVerifyingConsumer,
} from 'stream-dedup/stream';
import { changelogStreamName } from '../src/group/consumer.js';
import { allConfirmed, CONNECTION, connectClient, measureInChild, uniqueName } from './common.js';
import { connectRawClient, newHistogram, runSchedule, SIZE, type ScheduleLag } from './latency-schedule.js';

export const E2E_CASES = ['e2e-raw', 'e2e-stream', 'e2e-raw-super', 'e2e-group'] as const;
export type E2eCase = (typeof E2E_CASES)[number];

/** What each end-to-end case measures (printed with the rows). */
export const E2E_MEANING: Readonly<Record<E2eCase, string>> = {
  'e2e-raw': 'raw named publisher → raw consumer, due time → delivery (baseline of e2e-stream)',
  'e2e-stream':
    'StreamDedupPublisher (outbox) → StreamVerifyingConsumer, due time → commit of the batch holding the message',
  'e2e-raw-super':
    'raw super stream publisher → raw super stream consumer, 3 partitions, due time → delivery (baseline of e2e-group)',
  'e2e-group':
    'SuperStreamDedupPublisher (outbox) → group of one member, 3 partitions, due time → commit (changelog confirmed, store written)',
};

const PARTITIONS = 3;
const GROUP_NAME = 'bench-lat-group';
const CHILD_ENV = { STREAM_DEDUP_BENCH_LATENCY_E2E: '1' };

const isSuper = (name: E2eCase): boolean => name === 'e2e-raw-super' || name === 'e2e-group';
const epochNow = (): number => performance.timeOrigin + performance.now();

/** Message i's body: its due time (epoch ms, float64) in bytes 0-7, i in bytes 8-15. */
function bodyOf(i: number, dueEpochMs: number): Buffer {
  const b = Buffer.alloc(SIZE, 0x61);
  b.writeDoubleBE(dueEpochMs, 0);
  b.writeUInt32BE(Math.floor(i / 2 ** 32), 8);
  b.writeUInt32BE(i >>> 0, 12);
  return b;
}
const indexOf = (body: Buffer): number => body.readUInt32BE(8) * 2 ** 32 + body.readUInt32BE(12);

/** The consumer's side of the clock: one histogram per second of the measured schedule. */
class Recorder {
  readonly perSecond: Histogram[];
  /** Latencies below 1 µs (recorded as 1 µs): a clock that disagrees between the processes. */
  early = 0;
  duplicates = 0;
  readonly #seen: Uint8Array;
  #distinct = 0;
  #done!: () => void;
  readonly done = new Promise<void>((resolve) => (this.#done = resolve));

  constructor(
    private readonly rate: number,
    private readonly warmup: number,
    count: number,
  ) {
    this.perSecond = Array.from({ length: Math.max(1, Math.ceil(count / rate)) }, newHistogram);
    this.#seen = new Uint8Array(warmup + count);
  }

  /** Message `index`, due at `due` (epoch ms), is done at `now` (epoch ms). */
  record(due: number, index: number, now: number): void {
    if (this.#seen[index] === 1) {
      this.duplicates++;
      return;
    }
    this.#seen[index] = 1;
    if (index >= this.warmup) {
      const us = Math.round((now - due) * 1000);
      if (us < 1) this.early++;
      const second = Math.min(this.perSecond.length - 1, Math.floor((index - this.warmup) / this.rate));
      this.perSecond[second]!.recordValue(Math.max(1, us));
    }
    if (++this.#distinct === this.#seen.length) this.#done();
  }

  /** A raw delivery: done now. */
  delivered(body: Buffer): void {
    this.record(body.readDoubleBE(0), indexOf(body), epochNow());
  }
}

/** Messages a verifying consumer handled whose batch is not committed yet, in offset order. */
class PendingCommits {
  #offsets: number[] = [];
  #dues: number[] = [];
  #indices: number[] = [];
  #head = 0;

  constructor(private readonly recorder: Recorder) {}

  push(offset: bigint, body: Buffer): void {
    this.#offsets.push(Number(offset));
    this.#dues.push(body.readDoubleBE(0));
    this.#indices.push(indexOf(body));
  }

  /** Every message up to `lastOffset` is committed now. */
  committed(lastOffset: bigint): void {
    const now = epochNow();
    const last = Number(lastOffset);
    let head = this.#head;
    while (head < this.#offsets.length && this.#offsets[head]! <= last) {
      this.recorder.record(this.#dues[head]!, this.#indices[head]!, now);
      head++;
    }
    if (head > 4096 && head * 2 > this.#offsets.length) {
      this.#offsets.splice(0, head);
      this.#dues.splice(0, head);
      this.#indices.splice(0, head);
      head = 0;
    }
    this.#head = head;
  }
}

/**
 * The consumer's process: subscribes, says so, records every message, and returns the histograms
 * (encoded). Its store is `<dir>/consumer` (the parent removes `dir`).
 */
async function consumerSide(
  name: E2eCase,
  target: string,
  dir: string,
  rate: number,
  warmup: number,
  count: number,
): Promise<{ readonly histograms: string[]; readonly early: number }> {
  const recorder = new Recorder(rate, warmup, count);
  const total = warmup + count;
  const ready = (): void => void process.stdout.write(`${JSON.stringify({ ready: true })}\n`);
  if (name === 'e2e-raw' || name === 'e2e-raw-super') {
    const client = await connectRawClient();
    const consumer =
      name === 'e2e-raw'
        ? await client.declareConsumer({ stream: target, offset: Offset.first() }, (m) =>
            recorder.delivered(m.content),
          )
        : await client.declareSuperStreamConsumer(
            { superStream: target, offset: Offset.first(), consumerRef: uniqueName('bench-lat-raw-super') },
            (m) => recorder.delivered(m.content),
          );
    ready();
    await recorder.done;
    await consumer.close();
    await client.close();
  } else if (name === 'e2e-stream') {
    const pending = new PendingCommits(recorder);
    const consumer = await StreamVerifyingConsumer.open({
      connection: CONNECTION,
      stream: target,
      consumerName: 'bench-lat-e2e',
      store: join(dir, 'consumer'),
      hooks: { afterCommit: ({ lastOffset }) => pending.committed(lastOffset) },
      handler: (message, tx) => {
        tx.put('last', 'x');
        pending.push(message.offset, message.body);
      },
    });
    ready();
    await recorder.done;
    const applied = consumer.stats.new;
    await consumer.close();
    if (applied !== total) throw new Error(`e2e-stream: the consumer applied ${applied} of ${total}`);
  } else {
    const pending = new Map<string, PendingCommits>();
    const of = (partition: string): PendingCommits => {
      let p = pending.get(partition);
      if (p === undefined) pending.set(partition, (p = new PendingCommits(recorder)));
      return p;
    };
    const member = await SuperStreamVerifyingConsumer.open({
      connection: CONNECTION,
      superStream: target,
      consumerName: GROUP_NAME,
      store: join(dir, 'consumer'),
      startFrom: 'first',
      hooks: { afterCommit: ({ partition, lastOffset }) => of(partition).committed(lastOffset) },
      handler: (message, tx, partition) => {
        tx.put('last', 'x');
        of(partition).push(message.offset, message.body);
      },
    });
    ready();
    await recorder.done;
    await member.close();
  }
  if (recorder.duplicates > 0) throw new Error(`${name}: ${recorder.duplicates} messages recorded twice`);
  return {
    histograms: recorder.perSecond.map((h) => hdr.encodeIntoCompressedBase64(h)),
    early: recorder.early,
  };
}

/** Resolves once `total` sends settled; rejects with the first failure. */
function allSettled(total: number): {
  readonly add: (p: Promise<unknown>) => void;
  readonly all: Promise<void>;
} {
  let settled = 0;
  let resolve!: () => void;
  let reject!: (e: unknown) => void;
  const all = new Promise<void>((res, rej) => ((resolve = res), (reject = rej)));
  const one = (): void => {
    if (++settled === total) resolve();
  };
  return { add: (p) => void p.then(one, reject), all };
}

/**
 * The publisher's process: `total` messages on the open-loop schedule, each body stamped with its
 * due time. Its store is `<dir>/producer`.
 */
async function publisherSide(
  name: E2eCase,
  target: string,
  dir: string,
  rate: number,
  total: number,
): Promise<void> {
  const origin = performance.timeOrigin;
  let lag: ScheduleLag;
  if (name === 'e2e-raw') {
    const client = await connectRawClient();
    const publisher = await client.declarePublisher({ stream: target, publisherRef: 'bench-lat-e2e-raw' });
    const all = allConfirmed(publisher, total);
    lag = await runSchedule(rate, total, async (i, due) => {
      await publisher.send(bodyOf(i, origin + due));
    });
    await publisher.flush();
    await all;
    await client.deletePublisher(publisher.extendedId);
    await client.close();
  } else if (name === 'e2e-raw-super') {
    let confirmed = 0;
    let done!: () => void;
    const all = new Promise<void>((resolve) => (done = resolve));
    const client = await connectRawClient({
      publish_confirm: ({ publishingIds }) => {
        confirmed += publishingIds.length;
        if (confirmed >= total) done();
      },
    });
    const publisher = await client.declareSuperStreamPublisher(
      { superStream: target, publisherRef: 'bench-lat-e2e-raw-super', routingStrategy: 'hash' },
      (_content, opts) => opts.messageProperties?.messageId,
    );
    lag = await runSchedule(rate, total, async (i, due) => {
      await publisher.send(bodyOf(i, origin + due), { messageProperties: { messageId: `order-${i}` } });
    });
    await all;
    await publisher.close();
    await client.close();
  } else {
    const sends = allSettled(total);
    if (name === 'e2e-stream') {
      const pub = await StreamDedupPublisher.open({
        connection: CONNECTION,
        stream: target,
        producerName: 'bench-lat-e2e',
        store: join(dir, 'producer'),
        durability: 'outbox',
      });
      lag = await runSchedule(rate, total, (i, due) => sends.add(pub.send(bodyOf(i, origin + due))));
      await sends.all;
      await pub.close();
    } else {
      const pub = await SuperStreamDedupPublisher.open({
        connection: CONNECTION,
        superStream: target,
        producerName: 'bench-lat-group',
        store: join(dir, 'producer'),
        durability: 'outbox',
        routing: { kind: 'hash', key: (_body, headers) => String(headers?.order) },
      });
      lag = await runSchedule(rate, total, (i, due) =>
        sends.add(pub.send(bodyOf(i, origin + due), { headers: { order: `order-${i}` } })),
      );
      await sends.all;
      await pub.close();
    }
  }
  process.stdout.write(`${JSON.stringify({ published: total, ...lag })}\n`);
}

export interface E2eMeasurement {
  /** Every measured message's latency (µs). */
  readonly histogram: Histogram;
  /** The same per second of the schedule (µs). */
  readonly perSecond: readonly Histogram[];
  /** Latencies below 1 µs (the two processes' clocks disagreeing by more than the latency). */
  readonly early: number;
  /** How late the publisher's generator issued (warm-up included): delay of the publisher's process. */
  readonly publisherLag: ScheduleLag;
}

/**
 * Starts this file as a child process with `args` and returns a reader of the JSON lines it prints
 * (its stderr is ours).
 */
function startChild(args: readonly string[]): {
  readonly next: () => Promise<Record<string, unknown>>;
  readonly kill: () => void;
} {
  const child = spawn(process.execPath, [...process.execArgv, fileURLToPath(import.meta.url), ...args], {
    env: { ...process.env, ...CHILD_ENV },
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  const exited = new Promise<string>((resolve) =>
    child.once('exit', (code, signal) => resolve(`exited (code ${code}, signal ${signal})`)),
  );
  const lines = createInterface({ input: child.stdout })[Symbol.asyncIterator]();
  const next = async (): Promise<Record<string, unknown>> => {
    for (;;) {
      const line = await lines.next();
      if (line.done === true) throw new Error(`the ${args[0]} process of ${args[1]} ${await exited}`);
      const text = line.value.trim();
      if (text.startsWith('{')) return JSON.parse(text) as Record<string, unknown>;
    }
  };
  return { next, kill: () => void (child.exitCode === null && child.kill()) };
}

/**
 * One end-to-end case: `warmup` messages then `count` measured ones at `rate` msg/s, the publisher
 * and the consumer in processes of their own. `'timeout'` when the case is not done within
 * `timeoutMs` (both processes killed, the streams deleted): the rate overloads it.
 */
export async function measureE2e(
  name: E2eCase,
  rate: number,
  warmup: number,
  count: number,
  timeoutMs: number,
): Promise<E2eMeasurement | 'timeout'> {
  const deadline = AbortSignal.timeout(timeoutMs);
  const client = await connectClient();
  const target = uniqueName(`bench-lat-${name}`);
  if (isSuper(name))
    await client.createSuperStream({ streamName: target, arguments: {} }, undefined, PARTITIONS);
  else await client.createStream({ stream: target, arguments: {} });
  const dir = await mkdtemp(join(tmpdir(), 'bench-lat-e2e-'));
  const args = (role: string, n: number): string[] => [role, name, target, dir, String(rate), String(n)];
  const consumer = startChild([...args('consumer', warmup), String(count)]);
  const timedOut = new Promise<'timeout'>((resolve) =>
    deadline.addEventListener('abort', () => resolve('timeout'), { once: true }),
  );
  try {
    if ((await Promise.race([consumer.next(), timedOut])) === 'timeout') return 'timeout';
    const published = await measureInChild<ScheduleLag>(
      import.meta.url,
      args('publisher', warmup + count),
      CHILD_ENV,
      { signal: deadline },
    ).catch((e: unknown) => {
      if (deadline.aborted) return 'timeout' as const;
      throw e;
    });
    if (published === 'timeout') return 'timeout';
    const result = await Promise.race([consumer.next(), timedOut]);
    if (result === 'timeout') return 'timeout';
    const perSecond = (result.histograms as string[]).map((s) => hdr.decodeFromCompressedBase64(s));
    const histogram = newHistogram();
    for (const h of perSecond) histogram.add(h);
    return { histogram, perSecond, early: result.early as number, publisherLag: published };
  } finally {
    consumer.kill();
    if (isSuper(name)) {
      const partitions = await client.queryPartitions({ superStream: target });
      if (name === 'e2e-group')
        for (const p of partitions)
          await client.deleteStream({ stream: changelogStreamName(p, GROUP_NAME) }).catch(() => undefined);
      await client.deleteSuperStream({ streamName: target });
    } else {
      await client.deleteStream({ stream: target });
    }
    await client.close();
    await rm(dir, { recursive: true, force: true });
  }
}

if (process.env.STREAM_DEDUP_BENCH_LATENCY_E2E === '1') {
  const [role, name, target, dir, rate, n, count] = process.argv.slice(2) as [
    'consumer' | 'publisher',
    E2eCase,
    string,
    string,
    string,
    string,
    string,
  ];
  if (role === 'consumer') {
    const result = await consumerSide(name, target, dir, Number(rate), Number(n), Number(count));
    process.stdout.write(`${JSON.stringify(result)}\n`);
  } else await publisherSide(name, target, dir, Number(rate), Number(n));
  process.exit(0);
}
