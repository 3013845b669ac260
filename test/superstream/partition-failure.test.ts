import { afterEach, describe, expect, it, vi } from 'vitest';
import { DedupError } from '../../src/errors.js';
import type { StreamDedupPublisherOptions } from '../../src/transport/stream-options.js';
import { SuperStreamDedupPublisher } from '../../src/superstream/publisher.js';
import { memoryStore } from '../support/memory-store.js';
import { PartitionTransports } from '../support/partition-transports.js';

// A partition whose publisher core fails at any time after the core exists (here: its stream is
// deleted, every reconnect refused) stops the super stream publisher, or fails its open, even
// while another partition is still opening. No broker: each partition's StreamTransport is a
// scripted stand-in, and the partitions query answers from a list.

const hub = vi.hoisted(() => ({
  partitions: [] as string[],
  transports: undefined as PartitionTransports | undefined,
}));
vi.mock(import('../../src/transport/stream-transport.js'), async (importOriginal) => ({
  ...(await importOriginal()),
  StreamTransport: class {
    constructor(options: StreamDedupPublisherOptions) {
      return hub.transports!.of(options.stream);
    }
  } as never,
}));
vi.mock(import('../../src/superstream/partitions.js'), async (importOriginal) => ({
  ...(await importOriginal()),
  Locator: class {
    partitions(): Promise<string[]> {
      return Promise.resolve(hub.partitions);
    }
    close(): Promise<void> {
      return Promise.resolve();
    }
  } as never,
}));

const transports = new PartitionTransports();
hub.transports = transports;
afterEach(() => transports.clear());

async function openWith(partitions: string[]): Promise<{
  opening: Promise<SuperStreamDedupPublisher>;
  store: Awaited<ReturnType<typeof memoryStore>>;
}> {
  hub.partitions = partitions;
  const store = await memoryStore();
  const opening = SuperStreamDedupPublisher.open({
    superStream: 'inv',
    producerName: 'p',
    store,
    routing: { kind: 'hash', key: () => 'k' },
    reconnect: { initialDelayMs: 1, maxDelayMs: 1 },
    logger: transports.logger,
  });
  // Every partition's core connects before the test scripts anything.
  while (transports.all().filter((t) => t.connects > 0).length < partitions.length) {
    await new Promise((resolve) => setImmediate(resolve));
  }
  return { opening, store };
}

describe('super stream publisher - a partition that fails', () => {
  it('while another partition still opens fails the open with its error, naming it', async () => {
    const { opening, store } = await openWith(['inv-0', 'inv-1']);
    const [fast, slow] = [transports.of('inv-0'), transports.of('inv-1')];
    fast.open();
    // inv-0's core exists and runs; its stream is deleted before inv-1 has answered.
    await fast.started;
    fast.fail();
    await fast.closedOnce;
    slow.open();
    const err = await opening.then(
      async (pub) => {
        // Today's defect: the publisher opens, its closed() never resolves, isClosed is false.
        const state = { isClosed: pub.isClosed };
        await pub.close();
        return state;
      },
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(DedupError);
    expect(err).toMatchObject({ code: 'DEDUP_BROKER_REFUSED' });
    expect((err as Error).message).toContain('partition "inv-0" of super stream "inv"');
    // Every partition's transport was closed; the shared store stays the caller's.
    expect(slow.closes).toBeGreaterThan(0);
    expect(fast.closes).toBeGreaterThan(0);
    await store.close();
  });

  it('after the open stops the publisher: closed() resolves with the error, isClosed is true', async () => {
    const { opening, store } = await openWith(['inv-0', 'inv-1', 'inv-2']);
    for (const t of transports.all()) t.open();
    const pub = await opening;
    transports.of('inv-2').fail();
    const closedWith = await pub.closed();
    expect(pub.isClosed).toBe(true);
    expect(closedWith).toMatchObject({ code: 'DEDUP_BROKER_REFUSED' });
    expect(closedWith?.message).toContain('partition "inv-2"');
    await expect(pub.sendTo('inv-0', Buffer.from('x'))).rejects.toMatchObject({
      code: 'DEDUP_BROKER_REFUSED',
    });
    for (const t of transports.all()) expect(t.closes).toBeGreaterThan(0);
    await store.close();
  });
});
