/**
 * The verifying stream consumer (LevelDB commit per batch of 1 000) against the raw client's
 * consumer reading the same 100 000 messages from the same stream, in one run.
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Offset } from 'rabbitmq-stream-js-client';
import { StreamDedupPublisher, StreamVerifyingConsumer } from 'stream-dedup/stream';
import { CONNECTION, connectClient, uniqueName } from './common.js';

export interface ConsumerRates {
  readonly messages: number;
  readonly rawPerSec: number;
  readonly verifyingPerSec: number;
  /** Median time of the verifying consumer's open(), in ms: not part of the rates. */
  readonly verifyingOpenMs: number;
}

async function fill(stream: string, dir: string, count: number): Promise<void> {
  const pub = await StreamDedupPublisher.open({
    connection: CONNECTION,
    stream,
    createStream: true,
    producerName: 'bench-consumer-source',
    store: join(dir, 'producer'),
    durability: 'reserve',
  });
  const body = Buffer.alloc(100, 0x61);
  const sends: Promise<unknown>[] = [];
  for (let i = 0; i < count; i++) sends.push(pub.send(body));
  await Promise.all(sends);
  await pub.close();
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

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)]!;
}

/** Publishes `count` stamped messages, then reads them `rounds` times each way, interleaved. */
export async function measureConsumers(count = 100_000, rounds = 5): Promise<ConsumerRates> {
  const dir = await mkdtemp(join(tmpdir(), 'bench-consumer-'));
  const stream = uniqueName('bench-consumer');
  const client = await connectClient();
  try {
    await fill(stream, dir, count);
    await raw(stream, count); // warm-up
    await verifying(stream, dir, count, -1);
    const r: number[] = [];
    const v: number[] = [];
    for (let i = 0; i < rounds; i++) {
      r.push(await raw(stream, count));
      v.push(await verifying(stream, dir, count, i));
    }
    return {
      messages: count,
      rawPerSec: median(r),
      verifyingPerSec: median(v),
      verifyingOpenMs: median(openMs),
    };
  } finally {
    await client.deleteStream({ stream }).catch(() => undefined);
    await client.close();
    await rm(dir, { recursive: true, force: true });
  }
}
