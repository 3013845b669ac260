import { describe, expect, it } from 'vitest';
import { SuperStreamVerifyingConsumer } from '../../src/group/consumer.js';
import { resolveGroupOptions } from '../../src/group/options.js';

/** A shared-database store as the group sees it; opening a consumer on it is I/O, which must not happen. */
function sharedStore(): { opened: string[]; store: object } {
  const opened: string[] = [];
  return {
    opened,
    store: {
      openConsumerStore: (name: string) => {
        opened.push(name);
        throw new Error('I/O');
      },
      commitLingerLimitMs: 15_000,
    },
  };
}

const base = {
  superStream: 'orders',
  consumerName: 'billing',
  handler: () => undefined,
  // Port 1: nothing listens. Any I/O would fail otherwise (DEDUP_BROKER_UNREACHABLE).
  connection: { hostname: '127.0.0.1', port: 1 },
};

describe('group member options - resolved in one place, the strategy chosen by the store', () => {
  it('chooses the shared-database strategy for a PostgresStore-like store, with no changelog and the watch off', () => {
    const { store } = sharedStore();
    const resolved = resolveGroupOptions({ ...base, store: store as never });
    expect(resolved.strategy.kind).toBe('shared-database');
    expect(resolved.stalledMs).toBe(0);
    expect(resolveGroupOptions({ ...base, store: '/tmp/x' }).strategy).toMatchObject({
      kind: 'changelog',
      appendTimeoutMs: 30_000,
      appendsInFlight: 4,
      restoreTimeoutMs: 300_000,
    });
    expect(resolveGroupOptions({ ...base, store: '/tmp/x' }).stalledMs).toBe(60_000);
  });

  it.each([
    ['appendTimeoutMs', 1_000],
    ['appendsInFlight', 2],
    ['restoreTimeoutMs', 1_000],
    ['stalledPartitionMs', 60_000],
    ['sync', true],
    ['tenantVersion', 'v1'],
    ['snapshotEveryEntries', 100],
    ['snapshotEveryBytes', 0],
    ['changelogRetention', { maxLengthBytes: 1 << 30 }],
    ['standbyReplicas', 1],
  ] as const)(
    'refuses %s (an option of the changelog strategy) with a shared database, before any I/O',
    async (name, value) => {
      const { opened, store } = sharedStore();
      const err: unknown = await SuperStreamVerifyingConsumer.open({
        ...base,
        store: store as never,
        tenant: () => '',
        [name]: value,
      }).catch((e: unknown) => e);
      expect(err).toMatchObject({ code: 'DEDUP_UNSAFE_OPTIONS' });
      expect((err as Error).message).toContain(name);
      expect(opened).toEqual([]);
    },
  );

  it.each([0, 33, 1.5, '4'])(
    'refuses appendsInFlight %s before any I/O (an integer from 1 to 32)',
    async (value) => {
      const err: unknown = await SuperStreamVerifyingConsumer.open({
        ...base,
        store: '/nonexistent/never-opened',
        appendsInFlight: value as never,
      }).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(typeof value === 'number' ? RangeError : TypeError);
      expect((err as Error).message).toContain('appendsInFlight');
    },
  );

  it('refuses a bad option with a shared database as with LevelDB (TypeError/RangeError before any I/O)', async () => {
    const { store } = sharedStore();
    await expect(
      SuperStreamVerifyingConsumer.open({ ...base, store: store as never, commitEvery: 0 }),
    ).rejects.toBeInstanceOf(RangeError);
    await expect(
      SuperStreamVerifyingConsumer.open({ ...base, store: store as never, consumerName: 'a.b' }),
    ).rejects.toMatchObject({ code: 'DEDUP_UNSAFE_OPTIONS' });
  });
});

describe('group member options - lagIntervalMs', () => {
  it('defaults to 30 000 ms, takes 0 (no gauge) and refuses a negative, a fraction or a non-number before any I/O', () => {
    expect(resolveGroupOptions({ ...base, store: '/tmp/x' }).lagIntervalMs).toBe(30_000);
    expect(resolveGroupOptions({ ...base, store: '/tmp/x', lagIntervalMs: 0 }).lagIntervalMs).toBe(0);
    expect(() => resolveGroupOptions({ ...base, store: '/tmp/x', lagIntervalMs: -1 })).toThrow(RangeError);
    expect(() => resolveGroupOptions({ ...base, store: '/tmp/x', lagIntervalMs: 1.5 })).toThrow(RangeError);
    expect(() => resolveGroupOptions({ ...base, store: '/tmp/x', lagIntervalMs: '5' as never })).toThrow(
      TypeError,
    );
  });
});
