/**
 * A stream consumer with `startFrom: 'next'` that loses its connection before its first commit:
 * the loss drops the uncommitted batch, and the resubscription must start at the first offset
 * delivered, not at 'next' again (which delivered neither the dropped batch nor what was written
 * while away: silent loss). Found by the hostile review (revB finding 1). Against a stand-in for
 * the stream client (no broker); about 100 ms.
 */
import type { Client, ClientParams } from 'rabbitmq-stream-js-client';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { VerifyingConsumerCore } from '../../src/consumer/core.js';
import type { ChunkIdentity } from '../../src/store/chunk-identity.js';
import { identityHeaders } from '../../src/identity/headers.js';
import { decodeOffset, offsetKey } from '../../src/store/consumer-keys.js';
import { StreamVerifyingConsumer } from '../../src/transport/stream-consumer.js';
import { clientResponseDecoder, type ClientResponseDecoder } from '../support/chunks.js';
import { memoryStore } from '../support/memory-store.js';

/** A delivery as the fake hands it to the consumer. */
interface FakeMessage {
  readonly offset: bigint;
  readonly content: Buffer;
  readonly applicationProperties: Record<string, string | number>;
  readonly messageAnnotations: Record<string, never>;
  readonly chunk: ChunkIdentity;
}

/** A stand-in for the stream client: answers stats, records the subscription's offset and its callback. */
interface FakeClient {
  readonly decoder: ClientResponseDecoder;
  offsetAsked: bigint | string | undefined;
  deliver: ((message: FakeMessage) => void) | undefined;
  lose: (() => void) | undefined;
  streamStatsRequest(
    stream: string,
  ): Promise<{ firstChunkId: bigint; lastChunkId: bigint; committedChunkId: bigint }>;
  declareConsumer(
    params: { offset: { type: string; value?: bigint }; connectionClosedListener?: () => void },
    handle: (message: FakeMessage) => void,
  ): Promise<object>;
  getConnection(): Promise<{ decoder: ClientResponseDecoder }>;
  close(): Promise<void>;
}

const clients: FakeClient[] = [];

function fakeClient(): FakeClient {
  return {
    decoder: clientResponseDecoder(),
    offsetAsked: undefined,
    deliver: undefined,
    lose: undefined,
    streamStatsRequest() {
      return Promise.resolve({ firstChunkId: 0n, lastChunkId: 0n, committedChunkId: 0n });
    },
    async declareConsumer(params, handle) {
      await this.getConnection();
      this.offsetAsked = params.offset.type === 'numeric' ? params.offset.value : params.offset.type;
      this.deliver = handle;
      this.lose = params.connectionClosedListener;
      return { extendedId: 'consumer-1', getConnectionInfo: () => ({ host: 'fake', port: 5552 }) };
    },
    getConnection() {
      return Promise.resolve({ decoder: this.decoder });
    },
    close() {
      return Promise.resolve();
    },
  };
}

vi.mock(import('../../src/transport/stream-probe.js'), async (importOriginal) => ({
  ...(await importOriginal()),
  connectStreamClient: (params: ClientParams) => {
    void params;
    const client = fakeClient();
    clients.push(client);
    return Promise.resolve(client as unknown as Client);
  },
}));

afterEach(() => {
  clients.length = 0;
});

/** Messages `from..to` of producer `p` (ID = offset + 1), in `chunk`. */
function messages(from: number, to: number, chunk: ChunkIdentity): FakeMessage[] {
  return Array.from({ length: to - from + 1 }, (_, i) => ({
    offset: BigInt(from + i),
    content: Buffer.from('1'),
    applicationProperties: identityHeaders('p', BigInt(from + i + 1)),
    messageAnnotations: {},
    chunk,
  }));
}

describe("startFrom 'next': a resubscription before the first commit", () => {
  it('starts at the first offset delivered: the dropped batch and what was written meanwhile come', async () => {
    const store = await memoryStore();
    const applied: bigint[] = [];
    const consumer = await StreamVerifyingConsumer.open({
      stream: 'ledger',
      consumerName: 'balance-projection',
      store,
      startFrom: 'next',
      // The first batch is still lingering when the connection drops.
      commitLingerMs: 60_000,
      handler: (message) => void applied.push(message.offset),
      reconnect: { initialDelayMs: 1, maxDelayMs: 5 },
    });
    const first = clients.at(-1)!;
    expect(first.offsetAsked).toBe('next');
    for (const m of messages(10, 12, { firstOffset: 10n, timestamp: 1_000n })) first.deliver!(m);
    await vi.waitFor(() => expect(applied).toEqual([10n, 11n, 12n]), { timeout: 5_000 });
    expect(consumer.committedOffset).toBeUndefined();
    // The connection is lost: the core drops its uncommitted batch (10..12) and subscribes again.
    first.lose!();
    await vi.waitFor(() => expect(clients[1]?.offsetAsked).toBeDefined(), { timeout: 5_000 });
    const second = clients[1]!;
    // The broker delivers from the chunk holding offset 10 (it began at 8 after a retention
    // change of chunk layout, say): 8 and 9 come before the consumer's first offset and are not
    // its input; 10..12 again (their effects were dropped), and 13..14 written while away.
    for (const m of messages(8, 14, { firstOffset: 8n, timestamp: 900n })) second.deliver!(m);
    await vi.waitFor(() => expect(applied.length).toBe(8), { timeout: 5_000 });
    await consumer.close();
    const committed = await store.db.get(offsetKey('balance-projection'));
    expect({
      asked: second.offsetAsked,
      applied,
      committed: committed === undefined ? undefined : decodeOffset(committed),
    }).toEqual({ asked: 10n, applied: [10n, 11n, 12n, 10n, 11n, 12n, 13n, 14n], committed: 14n });
    await store.close();
  });
});

describe('VerifyingConsumerCore.startOffset before the first commit', () => {
  it('is the first offset delivered, kept across a dropped batch; offsets below it are skipped', async () => {
    const store = await memoryStore();
    const applied: bigint[] = [];
    const core = await VerifyingConsumerCore.open({
      consumerName: 'c',
      store,
      commitLingerMs: 60_000,
      handler: (message) => void applied.push(message.offset),
    });
    const chunk: ChunkIdentity = { firstOffset: 8n, timestamp: 1n };
    const before = core.startOffset;
    for (const m of messages(10, 11, chunk)) await core.process(m);
    core.discardPending(); // a lost connection
    const afterLoss = core.startOffset;
    for (const m of messages(8, 12, chunk)) await core.process(m);
    await core.flush();
    const committed = core.committedOffset;
    await core.close();
    await store.close();
    expect({ before, afterLoss, applied, committed }).toEqual({
      before: undefined,
      afterLoss: 10n,
      applied: [10n, 11n, 10n, 11n, 12n],
      committed: 12n,
    });
  });
});
