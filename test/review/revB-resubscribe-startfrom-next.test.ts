/**
 * A stream deleted and recreated under its name that already holds messages (issue 32): the
 * consumer stores the identity of the chunk holding its committed offset, subscribes again at that
 * chunk's first offset and compares the first chunk delivered. Against a stand-in for the stream
 * client (no broker): stats, the subscription's offset and the deliveries are the test's.
 */
import type { ClientParams } from 'rabbitmq-stream-js-client';
import { afterEach, describe, expect, it, vi } from 'vitest';
import type { ChunkIdentity } from '../../src/store/chunk-identity.js';
import { identityHeaders } from '../../src/identity/headers.js';
import { encodeOffset, offsetKey } from '../../src/store/consumer-keys.js';
import type { DedupStore } from '../../src/store/store.js';
import { StreamVerifyingConsumer } from '../../src/transport/stream-consumer.js';
import { clientResponseDecoder, type ClientResponseDecoder } from '../support/chunks.js';
import { memoryStore } from '../support/memory-store.js';

interface Stats {
  firstChunkId: bigint;
  lastChunkId: bigint;
}

/** A stand-in for the stream client: answers stats, records the subscription's offset and its callback. */
interface FakeClient {
  readonly decoder: ClientResponseDecoder;
  offsetAsked: bigint | string | undefined;
  deliver: ((message: object) => void) | undefined;
  lose: (() => void) | undefined;
  closed: boolean;
  streamStatsRequest(stream: string): Promise<Stats & { committedChunkId: bigint }>;
  declareConsumer(
    params: { offset: { type: string; value?: bigint }; connectionClosedListener?: () => void },
    handle: (message: object) => void,
  ): Promise<object>;
  getConnection(): Promise<{ decoder: ClientResponseDecoder }>;
  close(): Promise<void>;
}

let stats: Stats | Error = { firstChunkId: 0n, lastChunkId: 0n };
const clients: FakeClient[] = [];

function fakeClient(): FakeClient {
  return {
    decoder: clientResponseDecoder(),
    offsetAsked: undefined,
    deliver: undefined,
    lose: undefined,
    closed: false,
    streamStatsRequest() {
      return stats instanceof Error
        ? Promise.reject(stats)
        : Promise.resolve({ ...stats, committedChunkId: stats.lastChunkId });
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
      this.closed = true;
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
    return Promise.resolve(client) as never;
  },
}));

afterEach(() => {
  clients.length = 0;
  stats = { firstChunkId: 0n, lastChunkId: 0n };
});

/** Messages `from..to` of producer `p` (ID = offset + 1, as if `p` wrote the stream alone), in `chunk`. */
function messages(from: number, to: number, chunk: ChunkIdentity, producer = 'p') {
  return Array.from({ length: to - from + 1 }, (_, i) => ({
    offset: BigInt(from + i),
    content: Buffer.from('1'),
    applicationProperties: identityHeaders(producer, BigInt(from + i + 1)),
    messageAnnotations: {},
    chunk,
  }));
}

const OLD: ChunkIdentity = { firstOffset: 0n, timestamp: 1_000n };
const OLD_NEXT: ChunkIdentity = { firstOffset: 5n, timestamp: 2_000n };
/** The recreated stream's first chunk: same first offset, written later. */
const NEW: ChunkIdentity = { firstOffset: 0n, timestamp: 9_000n };

/** Writes the consumer's offset record as a store of some version left it. */
function putOffset(store: DedupStore, value: Uint8Array): Promise<void> {
  return store.db.batch([{ type: 'put', key: offsetKey('balance-projection'), value }]);
}

async function open(store: DedupStore, applied: bigint[]) {
  const consumer = await StreamVerifyingConsumer.open({
    stream: 'ledger',
    consumerName: 'balance-projection',
    store,
    handler: (message) => void applied.push(message.offset),
  });
  return { consumer, client: clients.at(-1)! };
}

/** A store whose consumer committed offsets 0..4 of chunk OLD (a first life on the fake). */
async function committedStore(applied: bigint[] = []): Promise<DedupStore> {
  const store = await memoryStore();
  const { consumer, client } = await open(store, applied);
  expect(client.offsetAsked).toBe('first');
  for (const m of messages(0, 4, OLD)) client.deliver!(m);
  await consumer.waitForOffset(4n);
  await consumer.close();
  return store;
}

describe('revB: a resubscription after a lost connection, before the first commit', () => {
  it("startFrom 'next': the handled but uncommitted messages (dropped with the batch) and those written during the fault are never delivered again", async () => {
    const store = await memoryStore();
    const applied: bigint[] = [];
    const consumer = await StreamVerifyingConsumer.open({
      stream: 'ledger',
      consumerName: 'balance-projection',
      store,
      startFrom: 'next',
      // The first batch is still lingering when the connection drops (any linger, or a commit in flight).
      commitLingerMs: 60_000,
      handler: (message) => void applied.push(message.offset),
      subscription: { reconnect: { initialDelayMs: 1, maxDelayMs: 5 } },
    } as never);
    const first = clients.at(-1)!;
    expect(first.offsetAsked).toBe('next');
    for (const m of messages(10, 12, { firstOffset: 10n, timestamp: 1_000n })) first.deliver!(m);
    await vi.waitFor(() => expect(applied).toEqual([10n, 11n, 12n]), { timeout: 5_000 });
    expect(consumer.committedOffset).toBeUndefined();
    // The connection is lost: the core drops its uncommitted batch (10..12) and subscribes again.
    first.lose!();
    await vi.waitFor(() => expect(clients.length).toBe(2), { timeout: 5_000 });
    await vi.waitFor(() => expect(clients[1]!.offsetAsked).toBeDefined(), { timeout: 5_000 });
    // Expected: the new subscription starts where the dropped batch began (offset 10), so 10..12
    // are applied again (their effects were dropped with the batch) and 13.. written meanwhile are
    // delivered. Observed: 'next' again: 10..12 never take effect and nothing written during the
    // fault is ever delivered; the next commit records an offset past them. Silent loss.
    const asked = clients[1]!.offsetAsked;
    await consumer.close();
    // What was committed of 10..12 by close (nothing: the batch was dropped at the loss).
    const committed = await store.db.get(offsetKey('balance-projection'));
    expect({ asked, committed }).toEqual({ asked: 10n, committed: undefined });
    await store.close();
  });
});
