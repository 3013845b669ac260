/* eslint-disable @typescript-eslint/require-await -- the mocks stand in for async APIs */
/**
 * A partition stream deleted and recreated under the same name while the group's changelog says
 * where its members got to: a take-over subscribed at the restored offset + 1, and the client
 * drops every message below it, so the new stream's first offsets were never applied, silently.
 * The plain stream consumer refused an empty recreated stream (DEDUP_STREAM_REGRESSION); group
 * members did not check at all (issue 32).
 */
import { afterEach, describe, expect, it, vi } from 'vitest';

const h = vi.hoisted(() => ({
  listeners: [] as Array<() => Promise<unknown>>,
  updates: [] as Array<(active: boolean) => void>,
  lastChunkId: -1n,
  /** Reader clients connected (readerConnector → connectStreamClient): the check reads through one. */
  readers: 0,
}));

vi.mock('../../src/transport/stream-client-internals.js', async (orig) => ({
  ...(await orig<object>()),
  consumerCloseEvents: () => undefined,
  decodeDeliveriesOurselves: () => undefined,
  watchConsumerUpdates: (_c: unknown, cb: (active: boolean) => void) => h.updates.push(cb),
}));
vi.mock('../../src/transport/stream-delivery.js', async (orig) => ({
  ...(await orig<object>()),
  connectSubscriber: async () => ({
    close: async () => undefined,
    declareConsumer: async (p: { consumerUpdateListener: () => Promise<unknown> }) => {
      h.listeners.push(p.consumerUpdateListener);
      return { extendedId: 'x' };
    },
  }),
}));
// The one reader connector (src/transport/reader-connector.ts) connects through this export: a
// reader made any other way would reach for the broker at port 1 and the test would fail.
vi.mock('../../src/transport/stream-probe.js', async (orig) => ({
  ...(await orig<object>()),
  connectStreamClient: async () => {
    h.readers++;
    return {
      close: async () => undefined,
      streamStatsRequest: async () => ({
        firstChunkId: 0n,
        committedChunkId: h.lastChunkId,
        lastChunkId: h.lastChunkId,
      }),
    };
  },
}));
vi.mock('../../src/group/restore.js', async (orig) => {
  const actual = await orig<Record<string, unknown>>();
  // The changelog says the group committed offset 41 of the partition.
  return {
    ...actual,
    restorePartition: async () => ({
      offset: 41n,
      start: undefined,
      read: 0,
      applied: 0,
      changelogLastId: 43n,
    }),
  };
});

import { GroupPartition } from '../../src/group/partition.js';
import { resolveSubscriptionOptions, resolveVerifyingConsumerOptions } from '../../src/consumer/options.js';

afterEach(() => vi.restoreAllMocks());

describe('group partition - a partition recreated under the same name', () => {
  it('stops the member with DEDUP_STREAM_REGRESSION when the partition is empty behind the offset its changelog holds', async () => {
    const failures: Error[] = [];
    const partition = new GroupPartition({
      superStream: 'orders',
      consumerName: 'billing',
      partition: 'orders-0',
      namespace: 'orders-0',
      changelog: 'orders-0.billing.changelog',
      changelogProducer: 'stream-dedup.changelog.billing',
      store: { db: { get: async () => undefined }, sync: false } as never,
      consumer: resolveVerifyingConsumerOptions({
        consumerName: 'billing',
        store: '/nonexistent',
        handler: async () => undefined,
      }),
      handler: async () => undefined,
      hooks: undefined,
      subscription: resolveSubscriptionOptions({ reconnect: { initialDelayMs: 1, maxDelayMs: 1 } }),
      connection: { hostname: '127.0.0.1', port: 1, username: 'g', password: 'g' },
      appendTimeoutMs: 1_000,
      restoreTimeoutMs: 1_000,
      stalledMs: 0,
      onAssignment: undefined,
      stats: {
        restores: 0,
        entriesRestored: 0,
        fenced: 0,
        rejoins: 0,
        snapshotsWritten: 0,
        snapshotRestores: 0,
        standbyTakeOvers: 0,
      },
      fail: (e) => failures.push(e),
    });
    await partition.subscribe();
    h.lastChunkId = -1n; // no chunk: the stream is empty
    h.updates.at(-1)!(true);
    await h.listeners.at(-1)!();
    expect(failures.map((e) => (e as { code?: string }).code)).toEqual(['DEDUP_STREAM_REGRESSION']);
    expect(h.readers).toBeGreaterThanOrEqual(1);
    expect(failures[0]!.message).toMatch(/partition "orders-0" is empty, but .*offset 41/);
    await partition.close();
  });
});
