/* eslint-disable @typescript-eslint/require-await -- the mocks stand in for async APIs */
/**
 * GroupPartition's "changelog deleted" clock (#missingSince) was reset only by a successful
 * restore of THIS member (hostile review of issue 32's change). A single transient "does not exist" heard once, then the partition going
 * to another member (which restores it fine: the changelog exists), then one more transient hearing
 * much later stops a healthy member with DEDUP_CHANGELOG_INVALID at once: the "30 s of take-overs"
 * was measured between two isolated hearings an hour apart. Now any other outcome of a
 * take-over, and the partition going elsewhere, end the run of hearings.
 */
import { afterEach, describe, expect, it, vi } from 'vitest';

const h = vi.hoisted(() => ({
  listeners: [] as Array<() => Promise<unknown>>,
  updates: [] as Array<(active: boolean) => void>,
  restore: undefined as unknown as (o: unknown) => Promise<unknown>,
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
vi.mock('../../src/transport/stream-probe.js', async (orig) => ({
  ...(await orig<object>()),
  connectStreamClient: async () => ({ close: async () => undefined }),
}));
vi.mock('../../src/group/restore.js', async (orig) => {
  const actual = await orig<Record<string, unknown>>();
  return { ...actual, restorePartition: (o: unknown) => h.restore(o) };
});

import { GroupPartition } from '../../src/group/partition.js';
import { ChangelogMissing } from '../../src/group/restore.js';
import { resolveSubscriptionOptions, resolveVerifyingConsumerOptions } from '../../src/consumer/options.js';

afterEach(() => vi.restoreAllMocks());

async function activate(active: boolean): Promise<void> {
  h.updates.at(-1)!(active);
  await h.listeners.at(-1)!();
}

describe('group partition - the deleted-changelog clock', () => {
  it('two isolated transient "does not exist" hearings an hour apart do not stop a member', async () => {
    let now = 1_000;
    vi.spyOn(performance, 'now').mockImplementation(() => now);
    const failures: Error[] = [];
    const consumer = resolveVerifyingConsumerOptions({
      consumerName: 'billing',
      store: '/nonexistent',
      handler: async () => undefined,
    });
    const partition = new GroupPartition({
      superStream: 'orders',
      consumerName: 'billing',
      partition: 'orders-0',
      namespace: 'orders-0',
      changelog: 'orders-0.billing.changelog',
      changelogProducer: 'stream-dedup.changelog.billing',
      store: { db: {}, sync: false } as never,
      consumer,
      handler: async () => undefined,
      hooks: undefined,
      subscription: resolveSubscriptionOptions({ reconnect: { initialDelayMs: 1, maxDelayMs: 1 } }),
      connection: { hostname: '127.0.0.1', port: 1, username: 'g', password: 'g' },
      appendTimeoutMs: 1_000,
      restoreTimeoutMs: 1_000,
      stalledMs: 0,
      onAssignment: undefined,
      stats: { partitions: new Map() } as never,
      fail: (e) => failures.push(e),
    });
    await partition.subscribe();
    // Take-over 1: a node back from a network partition says the changelog does not exist (once).
    h.restore = async () => {
      throw new ChangelogMissing('orders-0.billing.changelog', new Error('Stream does not exist (code 2)'));
    };
    await activate(true);
    expect(failures).toEqual([]);
    await vi.waitFor(() => expect(h.listeners.length).toBeGreaterThanOrEqual(2));
    // The partition goes to another member (which restores it: the changelog exists), for an hour.
    await activate(false);
    now += 3_600_000;
    // Take-over 2, an hour later: one more transient hearing.
    await activate(true);
    expect(failures.map((e) => (e as { code?: string }).code)).toEqual([]);
    await partition.close();
  });
});
