import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { SpanKind } from '@opentelemetry/api';
import type { ReadableSpan } from '@opentelemetry/sdk-trace-base';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import {
  StreamDedupPublisher,
  StreamVerifyingConsumer,
  SuperStreamDedupPublisher,
  SuperStreamVerifyingConsumer,
} from '../../src/stream.js';
import { STREAM_CONNECTION, uniqueName } from '../support/broker.js';
import { useClient } from '../support/stream.js';
import { useSuperStreams } from '../support/superstream.js';
import { useTempDir } from '../support/tmp.js';
import { installTracing } from '../support/tracing.js';

const CHILD = fileURLToPath(new URL('../fixtures/traced-crash-child.ts', import.meta.url));
const client = useClient();
const superStream = useSuperStreams(client);
const tempDir = useTempDir();
let tracing: ReturnType<typeof installTracing>;
const streams: string[] = [];

beforeEach(() => {
  tracing = installTracing();
});
afterEach(async () => {
  await tracing.uninstall();
  for (const stream of streams.splice(0)) await client().deleteStream({ stream });
});

async function newStream(prefix: string): Promise<string> {
  const stream = uniqueName(prefix);
  await client().createStream({ stream, arguments: {} });
  streams.push(stream);
  return stream;
}

function spans(operation: string): ReadableSpan[] {
  return tracing.exporter
    .getFinishedSpans()
    .filter((s) => s.attributes['messaging.operation.type'] === operation);
}

/** Reads the stream with a verifying consumer until `offset` is committed. */
async function consume(stream: string, store: string, offset: bigint): Promise<void> {
  const consumer = await StreamVerifyingConsumer.open({
    connection: STREAM_CONNECTION,
    stream,
    consumerName: 'traced',
    store,
    handler: () => undefined,
  });
  try {
    await consumer.waitForOffset(offset);
  } finally {
    await consumer.close();
  }
}

describe('tracing - one trace from send() through the broker to the commit', () => {
  it('send span (producer), process span linked to it, settle span for the batch', async () => {
    const stream = await newStream('traced');
    const dir = await tempDir();
    const publisher = await StreamDedupPublisher.open({
      connection: STREAM_CONNECTION,
      stream,
      producerName: 'traced',
      store: join(dir, 'pub'),
    });
    const { publishingId } = await publisher.send(Buffer.from('a'), { headers: { kind: 'order' } });
    await publisher.close();
    await consume(stream, join(dir, 'con'), 0n);

    const [send] = spans('send');
    expect(send).toBeDefined();
    expect(send!.name).toBe(`send ${stream}`);
    expect(send!.kind).toBe(SpanKind.PRODUCER);
    expect(send!.attributes).toMatchObject({
      'messaging.system': 'rabbitmq',
      'messaging.destination.name': stream,
      'messaging.message.id': publishingId.toString(),
      'stream_dedup.producer': 'traced',
      'stream_dedup.outcome': 'published',
    });
    const [processed] = spans('process');
    expect(processed!.kind).toBe(SpanKind.CONSUMER);
    expect(processed!.attributes).toMatchObject({
      'messaging.destination.name': stream,
      'messaging.consumer.group.name': 'traced',
      'messaging.message.id': '1',
      'stream_dedup.offset': '0',
    });
    // The consumer's span is linked to the producer's (the context travelled in the message).
    expect(processed!.links.map((l) => l.context)).toEqual([
      expect.objectContaining({ traceId: send!.spanContext().traceId, spanId: send!.spanContext().spanId }),
    ]);
    const [settled] = spans('settle');
    expect(settled!.attributes).toMatchObject({
      'messaging.batch.message_count': 1,
      'stream_dedup.offset': '0',
    });
  });

  it('a message re-sent by the next life after a SIGKILL carries the trace of the send() that wrote it', async () => {
    const stream = await newStream('traced-crash');
    const dir = await tempDir();
    const store = join(dir, 'pub');
    const traceId = 'a1'.repeat(16);
    const child = spawn(process.execPath, ['--import', 'tsx', CHILD, stream, store, traceId], {
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    try {
      const lines = createInterface({ input: child.stdout });
      const [line] = (await Promise.race([
        once(lines, 'line'),
        once(child, 'exit').then(([code]) => {
          throw new Error(`the child exited (${String(code)}) before persisting`);
        }),
      ])) as [string];
      expect(line).toBe('persisted');
    } finally {
      child.kill('SIGKILL');
      if (child.exitCode === null && child.signalCode === null) await once(child, 'exit');
    }
    // The next life re-sends the outbox's message (it never reached the broker).
    const publisher = await StreamDedupPublisher.open({
      connection: STREAM_CONNECTION,
      stream,
      producerName: 'traced-crash',
      store,
    });
    expect(publisher.openReport).toMatchObject({ resent: 1 });
    await publisher.close();
    expect(publisher.stats.confirmed).toBe(1);
    await consume(stream, join(dir, 'con'), 0n);
    const [processed] = spans('process');
    expect(processed!.links.map((l) => l.context.traceId)).toEqual([traceId]);
  }, 60_000);
});

describe('tracing - a consumer group member', () => {
  it('process and settle spans name the partition (messaging.destination.name) and the group, linked to the super stream send', async () => {
    const name = await superStream('traced-group', 2);
    const dir = await tempDir();
    const publisher = await SuperStreamDedupPublisher.open({
      connection: STREAM_CONNECTION,
      superStream: name,
      producerName: 'traced-group',
      store: join(dir, 'pub'),
      routing: { kind: 'hash', key: (body) => Buffer.from(body).toString() },
    });
    const { partition } = await publisher.send(Buffer.from('order-1'));
    await publisher.close();
    const member = await SuperStreamVerifyingConsumer.open({
      connection: STREAM_CONNECTION,
      superStream: name,
      consumerName: 'traced',
      store: join(dir, 'member'),
      startFrom: 'first',
      handler: () => undefined,
    });
    try {
      await member.waitForOffset(partition, 0n);
    } finally {
      await member.close();
      // The changelogs the member made (a partition it never committed on may have none).
      for (const p of publisher.partitions)
        await client()
          .deleteStream({ stream: `${p}.traced.changelog` })
          .catch(() => undefined);
    }
    const [send] = spans('send');
    expect(send!.attributes).toMatchObject({
      'messaging.destination.name': name,
      'messaging.destination.partition.id': partition,
    });
    const [processed] = spans('process');
    expect(processed!.name).toBe(`process ${partition}`);
    expect(processed!.attributes).toMatchObject({
      'messaging.destination.name': partition,
      'messaging.consumer.group.name': 'traced',
      'stream_dedup.offset': '0',
    });
    expect(processed!.links.map((l) => l.context.spanId)).toEqual([send!.spanContext().spanId]);
    const [settled] = spans('settle');
    expect(settled!.name).toBe(`settle ${partition}`);
    expect(settled!.attributes).toMatchObject({
      'messaging.destination.name': partition,
      'messaging.consumer.group.name': 'traced',
    });
  });
});
