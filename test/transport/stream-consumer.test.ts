import type { ClientParams } from 'rabbitmq-stream-js-client';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { StreamVerifyingConsumer } from '../../src/transport/stream-consumer.js';
import {
  clientCodecs,
  clientResponseDecoder,
  deliverFrame,
  encodeChunk,
  encodeMessage,
  type ClientResponseDecoder,
} from '../support/chunks.js';
import { memoryStore } from '../support/memory-store.js';

/** A stand-in for the stream client: records its listeners, subscriptions and whether it was closed. */
interface FakeClient {
  readonly listeners: NonNullable<ClientParams['listeners']>;
  subscriptions: number;
  closed: boolean;
  /** The consumer connection's response decoder (the client's own): the test feeds it bytes. */
  readonly decoder: ClientResponseDecoder;
  declareConsumer(): Promise<object>;
  /** Where the consumer hooks its chunk decoder; declareConsumer opens the connection through it, as the client's does. */
  getConnection(): Promise<{ decoder: ClientResponseDecoder }>;
  close(): Promise<void>;
}

/** Each `connect()` of the consumer: its parameters, and the connect to answer (or fail). */
interface PendingConnect {
  readonly listeners: NonNullable<ClientParams['listeners']>;
  readonly answer: (client: FakeClient) => void;
}

const connects: PendingConnect[] = [];

function fakeClient(listeners: NonNullable<ClientParams['listeners']>): FakeClient {
  return {
    listeners,
    subscriptions: 0,
    closed: false,
    decoder: clientResponseDecoder(),
    async declareConsumer() {
      await this.getConnection();
      this.subscriptions++;
      return {
        extendedId: `consumer-${this.subscriptions}`,
        getConnectionInfo: () => ({ host: 'fake', port: 5552 }),
      };
    },
    getConnection() {
      return Promise.resolve({ decoder: this.decoder });
    },
    close() {
      this.closed = true;
      return Promise.resolve();
    },
  };
}

// The consumer's only way to the broker: `connectStreamClient` (the connection check, then the
// client library's `connect`). Each call is parked until the test answers it: no broker needed.
vi.mock(import('../../src/transport/stream-probe.js'), async (importOriginal) => ({
  ...(await importOriginal()),
  connectStreamClient: (params: ClientParams) =>
    new Promise((resolve) => {
      connects.push({ listeners: params.listeners ?? {}, answer: resolve });
    }) as never,
}));

async function nextConnect(count: number): Promise<PendingConnect> {
  await vi.waitFor(() => expect(connects.length).toBeGreaterThanOrEqual(count));
  return connects[count - 1]!;
}

afterEach(() => {
  connects.length = 0;
});

describe('stream verifying consumer shutdown', () => {
  it('close() during a reconnect closes the connection the reconnect opens (no subscription left behind)', async () => {
    const store = await memoryStore();
    const opening = StreamVerifyingConsumer.open({
      stream: 'ledger',
      consumerName: 'balance-projection',
      store,
      handler: () => undefined,
      reconnect: { initialDelayMs: 1, maxDelayMs: 1 },
    });
    const first = await nextConnect(1);
    const client1 = fakeClient(first.listeners);
    first.answer(client1);
    const consumer = await opening;
    expect(client1.subscriptions).toBe(1);

    // The connection drops: the consumer reconnects, and its connect is under way when close() comes.
    client1.listeners.connection_closed?.(false);
    const second = await nextConnect(2);
    expect(client1.closed).toBe(true);
    const closing = consumer.close();
    const client2 = fakeClient(second.listeners);
    second.answer(client2);
    await closing;

    // The reconnect completed during close(): it subscribed, and its connection must not stay open.
    expect(client2.subscriptions).toBe(1);
    expect(client2.closed).toBe(true);
    expect(connects).toHaveLength(2);
    await store.close();
  });

  it('close() with the subscription up closes its connection once', async () => {
    const store = await memoryStore();
    const opening = StreamVerifyingConsumer.open({
      stream: 'ledger',
      consumerName: 'balance-projection',
      store,
      handler: () => undefined,
    });
    const first = await nextConnect(1);
    const client = fakeClient(first.listeners);
    const close = vi.spyOn(client, 'close');
    first.answer(client);
    const consumer = await opening;
    await consumer.close();
    expect(close).toHaveBeenCalledTimes(1);
    expect(await consumer.closed()).toBeUndefined();
    await store.close();
  });
});

describe('stream verifying consumer - a chunk that does not decode', () => {
  it('stops the consumer with DEDUP_STREAM_UNREADABLE naming the stream and the cause, nothing of the chunk applied', async () => {
    const store = await memoryStore();
    const applied: bigint[] = [];
    const opening = StreamVerifyingConsumer.open({
      stream: 'ledger',
      consumerName: 'balance-projection',
      store,
      handler: (message) => void applied.push(message.offset),
    });
    const first = await nextConnect(1);
    const client = fakeClient(first.listeners);
    first.answer(client);
    const consumer = await opening;
    const record = encodeMessage({
      body: Buffer.from('x'),
      properties: { 'x-dedup-producer': 'p', 'x-dedup-id': '1' },
    });
    // An lz4 batch: a codec stream-dedup does not read.
    client.decoder.add(deliverFrame(encodeChunk([{ records: [record, record], codec: 3 }])), clientCodecs);
    const error = await consumer.closed();
    expect(error).toMatchObject({
      code: 'DEDUP_STREAM_UNREADABLE',
      message: expect.stringMatching(/cannot read stream "ledger": .*lz4/) as unknown,
    });
    expect(applied).toEqual([]);
    expect(client.closed).toBe(true);
    await store.close();
  });
});
