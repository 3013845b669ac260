/**
 * revA (hostile review), group options with a PostgresStore "resolved in one place, before any
 * I/O" (h/pggroup): a refusal the plain consumer makes for a PostgreSQL store live only in
 * VerifyingConsumerCore.open (consumer/core.ts), which a group member reaches only when a
 * partition is activated — after connecting to the broker: commitLingerMs ≥ the store's
 * idleInTransactionTimeoutMs (scopeTtlMs > 0 IS refused up front). resolveGroupOptions accepts it, so open()
 * goes to the network (here: port 1, DEDUP_BROKER_UNREACHABLE) instead of a RangeError at once.
 * Unit test, no servers.
 */
import { describe, expect, it } from 'vitest';
import { SuperStreamVerifyingConsumer } from '../../src/group/consumer.js';

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
  connection: { hostname: '127.0.0.1', port: 1 },
  connectTimeoutMs: 2_000,
};

describe('revA: group + PostgresStore option refusals before I/O', () => {
  it.each([
    ['commitLingerMs', 20_000],
  ] as const)('refuses %s with a RangeError before any I/O', async (name, value) => {
    const { opened, store } = sharedStore();
    const started = Date.now();
    const err: unknown = await SuperStreamVerifyingConsumer.open({
      ...base,
      store: store as never,
      [name]: value,
    } as never).catch((e: unknown) => e);
    expect({ err: String(err), ms: Date.now() - started < 500, opened }).toMatchObject({
      err: expect.stringContaining(name),
      ms: true,
      opened: [],
    });
    expect(err).toBeInstanceOf(RangeError);
  }, 60_000);
});
