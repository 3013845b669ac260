/**
 * A group member with a PostgreSQL store (a `ConsumerStoreProvider`) refuses a `commitLingerMs` not
 * less than the store's `idleInTransactionTimeoutMs` with the plain consumer's RangeError, before
 * any I/O: the refusal lived only in the core, which a member opens when a partition is activated,
 * after it reached the broker (here port 1: DEDUP_BROKER_UNREACHABLE, not the RangeError). Found
 * by the hostile review (revA finding 6). Unit test, no servers; about 50 ms.
 */
import { describe, expect, it } from 'vitest';
import type { ConsumerStoreProvider } from '../../src/consumer/consumer-store.js';
import { SuperStreamVerifyingConsumer } from '../../src/group/consumer.js';

function sharedStore(): { opened: string[]; store: ConsumerStoreProvider } {
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

describe('group member with a PostgreSQL store: option refusals before I/O', () => {
  it('refuses commitLingerMs >= idleInTransactionTimeoutMs with a RangeError before any I/O', async () => {
    const { opened, store } = sharedStore();
    const started = Date.now();
    const err: unknown = await SuperStreamVerifyingConsumer.open({
      superStream: 'orders',
      consumerName: 'billing',
      handler: () => undefined,
      connection: { hostname: '127.0.0.1', port: 1 },
      connectTimeoutMs: 2_000,
      store,
      commitLingerMs: 20_000,
    }).catch((e: unknown) => e);
    expect({ fast: Date.now() - started < 500, opened }).toEqual({ fast: true, opened: [] });
    expect(err).toBeInstanceOf(RangeError);
    expect(String(err)).toContain('commitLingerMs');
  });

  it('accepts commitLingerMs below the limit (it goes on to the broker)', async () => {
    const { store } = sharedStore();
    const err: unknown = await SuperStreamVerifyingConsumer.open({
      superStream: 'orders',
      consumerName: 'billing',
      handler: () => undefined,
      connection: { hostname: '127.0.0.1', port: 1 },
      connectTimeoutMs: 2_000,
      store,
      commitLingerMs: 14_999,
    }).catch((e: unknown) => e);
    expect(err).not.toBeInstanceOf(RangeError);
  }, 10_000);
});
