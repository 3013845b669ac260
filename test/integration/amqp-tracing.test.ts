import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { SpanKind } from '@opentelemetry/api';
import type { ReadableSpan } from '@opentelemetry/sdk-trace-base';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { AmqpDedupPublisher, AmqpVerifyingConsumer } from '../../src/amqp.js';
import { StreamVerifyingConsumer } from '../../src/stream.js';
import { AMQP_URL, STREAM_CONNECTION, uniqueName } from '../support/broker.js';
import { useClient } from '../support/stream.js';
import { useTempDir } from '../support/tmp.js';
import { installTracing } from '../support/tracing.js';

// The AMQP 0-9-1 twin of tracing.test.ts: the trace context travels in the AMQP message's headers
// (application properties in the stream) from AmqpDedupPublisher.send() to AmqpVerifyingConsumer.
const CHILD = fileURLToPath(new URL('../fixtures/traced-crash-child.ts', import.meta.url));
const client = useClient();
const tempDir = useTempDir();
let tracing: ReturnType<typeof installTracing>;
const queues: string[] = [];

beforeEach(() => {
  tracing = installTracing();
});
afterEach(async () => {
  await tracing.uninstall();
  for (const stream of queues.splice(0)) await client().deleteStream({ stream });
});

async function newQueue(prefix: string): Promise<string> {
  const queue = uniqueName(prefix);
  await client().createStream({ stream: queue, arguments: {} });
  queues.push(queue);
  return queue;
}

function spans(operation: string): ReadableSpan[] {
  return tracing.exporter
    .getFinishedSpans()
    .filter((s) => s.attributes['messaging.operation.type'] === operation);
}

/** Reads the queue with an AMQP 0-9-1 verifying consumer until `offset` is committed. */
async function consume(queue: string, store: string, offset: bigint): Promise<void> {
  const consumer = await AmqpVerifyingConsumer.open({
    url: AMQP_URL,
    queue,
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

describe('tracing over AMQP 0-9-1 - one trace from send() through the broker to the commit', () => {
  it('send span (producer), process span linked to it, settle span for the batch', async () => {
    const queue = await newQueue('amqp-traced');
    const dir = await tempDir();
    const publisher = await AmqpDedupPublisher.open({
      url: AMQP_URL,
      queue,
      producerName: 'amqp-traced',
      store: join(dir, 'pub'),
    });
    const { publishingId } = await publisher.send(Buffer.from('a'), { headers: { kind: 'order' } });
    await publisher.close();
    await consume(queue, join(dir, 'con'), 0n);

    const [send] = spans('send');
    expect(send).toBeDefined();
    expect(send!.name).toBe(`send ${queue}`);
    expect(send!.kind).toBe(SpanKind.PRODUCER);
    expect(send!.attributes).toMatchObject({
      'messaging.system': 'rabbitmq',
      'messaging.destination.name': queue,
      'messaging.message.id': publishingId.toString(),
      'stream_dedup.producer': 'amqp-traced',
      'stream_dedup.outcome': 'published',
    });
    const [processed] = spans('process');
    expect(processed).toBeDefined();
    expect(processed!.name).toBe(`process ${queue}`);
    expect(processed!.kind).toBe(SpanKind.CONSUMER);
    expect(processed!.attributes).toMatchObject({
      'messaging.destination.name': queue,
      'messaging.consumer.group.name': 'traced',
      'messaging.message.id': '1',
      'stream_dedup.producer': 'amqp-traced',
      'stream_dedup.offset': '0',
    });
    // One trace: the consumer's span is linked to the producer's, whose context the AMQP headers carried.
    expect(processed!.links.map((l) => l.context)).toEqual([
      expect.objectContaining({ traceId: send!.spanContext().traceId, spanId: send!.spanContext().spanId }),
    ]);
    const [settled] = spans('settle');
    expect(settled).toBeDefined();
    expect(settled!.attributes).toMatchObject({
      'messaging.destination.name': queue,
      'messaging.batch.message_count': 1,
      'stream_dedup.offset': '0',
    });
  });

  it('a StreamVerifyingConsumer reading what AmqpDedupPublisher sent links to the same send span', async () => {
    const queue = await newQueue('amqp-traced-stream');
    const dir = await tempDir();
    const publisher = await AmqpDedupPublisher.open({
      url: AMQP_URL,
      queue,
      producerName: 'amqp-traced',
      store: join(dir, 'pub'),
    });
    await publisher.send(Buffer.from('a'));
    await publisher.close();
    const consumer = await StreamVerifyingConsumer.open({
      connection: STREAM_CONNECTION,
      stream: queue,
      consumerName: 'traced',
      store: join(dir, 'con'),
      handler: () => undefined,
    });
    await consumer.waitForOffset(0n).finally(() => consumer.close());
    const [send] = spans('send');
    const [processed] = spans('process');
    expect(processed!.links.map((l) => l.context.spanId)).toEqual([send!.spanContext().spanId]);
  });

  it('a message re-sent by the next life after a SIGKILL carries the trace of the send() that wrote it', async () => {
    const queue = await newQueue('amqp-traced-crash');
    const dir = await tempDir();
    const store = join(dir, 'pub');
    const traceId = 'b2'.repeat(16);
    const child = spawn(process.execPath, ['--import', 'tsx', CHILD, queue, store, traceId, 'amqp'], {
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
    const publisher = await AmqpDedupPublisher.open({
      url: AMQP_URL,
      queue,
      producerName: 'traced-crash',
      store,
    });
    expect(publisher.openReport).toMatchObject({ resent: 1 });
    await publisher.close();
    expect(publisher.stats.confirmed).toBe(1);
    await consume(queue, join(dir, 'con'), 0n);
    const [processed] = spans('process');
    expect(processed!.links.map((l) => l.context.traceId)).toEqual([traceId]);
    // This process's own spans are of other traces: the link is the only way to the child's.
    expect(processed!.spanContext().traceId).not.toBe(traceId);
  }, 60_000);
});
