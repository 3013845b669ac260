/**
 * The verifying stream consumer (LevelDB commit per batch of 1 000) against the raw client's
 * consumer reading the same 100 000 messages from the same stream, in one run; on a stream of one
 * message per entry, or of sub-entry batches of 100 (docs/design.md §10).
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Offset } from 'rabbitmq-stream-js-client';
import { StreamVerifyingConsumer } from 'stream-dedup/stream';
import { CONNECTION, connectClient, measureInChild, median, publishStamped, uniqueName } from './common.js';

export interface ConsumerRates {
  readonly messages: number;
  readonly rawPerSec: number;
  readonly verifyingPerSec: number;
  /** Median time of the verifying consumer's open(), in ms: not part of the rates. */
  readonly verifyingOpenMs: number;
}

/**
 * Sub-entry batches of this many messages, one batch per chunk: the raw client's consumer reads
 * only a chunk's first batch (README, "Sub-entry batching"), so the stream is written one batch at
 * a time (maxInFlight = the batch) for the baseline to read every message.
 */
const BATCH = 100;

function fill(stream: string, dir: string, count: number, batched: boolean): Promise<void> {
  return publishStamped(count, {
    stream,
    createStream: true,
    producerName: 'bench-consumer-source',
    store: join(dir, 'producer'),
    ...(batched ? { subEntry: { size: BATCH }, maxInFlight: BATCH, maxBatch: BATCH } : {}),
  });
}

/**
 * Both sides are timed from their first message to their last (for the verifying consumer: to the
 * last commit): reading throughput, without the one-time costs of connecting and, for the
 * verifying consumer, opening LevelDB (printed apart as its open time).
 */
async function raw(stream: string, count: number): Promise<number> {
  const client = await connectClient();
  try {
    let seen = 0;
    let t0 = 0;
    let consumerId = '';
    await new Promise<void>((resolve, reject) => {
      client
        .declareConsumer({ stream, offset: Offset.first() }, () => {
          if (seen++ === 0) t0 = performance.now();
          if (seen === count) resolve();
        })
        .then((c) => (consumerId = c.extendedId), reject);
    });
    const seconds = (performance.now() - t0) / 1000;
    if (consumerId !== '') await client.closeConsumer(consumerId);
    return count / seconds;
  } finally {
    await client.close();
  }
}

async function verifying(stream: string, dir: string, count: number, round: number): Promise<number> {
  let t0 = 0;
  const opening = performance.now();
  const consumer = await StreamVerifyingConsumer.open({
    connection: CONNECTION,
    stream,
    consumerName: `bench-${round}`,
    store: join(dir, `consumer-${round}`),
    commitEvery: 1_000,
    handler: (_message, tx) => {
      if (t0 === 0) t0 = performance.now();
      tx.put('last', 'x');
    },
  });
  openMs.push(performance.now() - opening);
  await consumer.waitForOffset(BigInt(count - 1));
  const seconds = (performance.now() - t0) / 1000;
  if (consumer.stats.new !== count)
    throw new Error(`verifying consumer applied ${consumer.stats.new} of ${count}`);
  await consumer.close();
  return count / seconds;
}

/** How long each verifying consumer's open() took (store, connection, subscription). */
const openMs: number[] = [];

/**
 * One measurement in this process, for a child started by {@link measureConsumers}: a warm-up
 * read, then the timed one. Prints `{ rate, openMs }`.
 */
async function child(mode: string, stream: string, dir: string, count: number, round: number): Promise<void> {
  const rate =
    mode === 'raw'
      ? (await raw(stream, count), await raw(stream, count))
      : (await verifying(stream, dir, count, -1 - round), await verifying(stream, dir, count, round));
  process.stdout.write(`${JSON.stringify({ rate, openMs: openMs.at(-1) ?? 0 })}\n`);
}

/**
 * Publishes `count` stamped messages, then reads them `rounds` times each way, interleaved, each
 * read in a fresh process (as JMH forks per benchmark: the client's delivery call sites would
 * otherwise see both consumers' callbacks and turn polymorphic).
 */
export async function measureConsumers(count = 100_000, rounds = 9, batched = false): Promise<ConsumerRates> {
  const dir = await mkdtemp(join(tmpdir(), 'bench-consumer-'));
  const stream = uniqueName(batched ? 'bench-consumer-batched' : 'bench-consumer');
  const client = await connectClient();
  const measureIn = async (
    mode: 'raw' | 'verifying',
    round: number,
  ): Promise<{ rate: number; openMs: number }> =>
    measureInChild(import.meta.url, [mode, stream, dir, String(count), String(round)], {
      STREAM_DEDUP_BENCH_CONSUMER: '1',
    });
  try {
    await fill(stream, dir, count, batched);
    const r: number[] = [];
    const v: number[] = [];
    const opens: number[] = [];
    for (let i = 0; i < rounds; i++) {
      r.push((await measureIn('raw', i)).rate);
      const verified = await measureIn('verifying', i);
      v.push(verified.rate);
      opens.push(verified.openMs);
    }
    return {
      messages: count,
      rawPerSec: median(r),
      verifyingPerSec: median(v),
      verifyingOpenMs: median(opens),
    };
  } finally {
    await client.deleteStream({ stream }).catch(() => undefined);
    await client.close();
    await rm(dir, { recursive: true, force: true });
  }
}

if (process.env.STREAM_DEDUP_BENCH_CONSUMER === '1') {
  const [mode, stream, dir, count, round] = process.argv.slice(2) as [string, string, string, string, string];
  await child(mode, stream, dir, Number(count), Number(round));
  process.exit(0);
}
