/**
 * PostgresStore's orderings of its bounds (found unchecked by hostile review B, L1/L2). Each
 * combination below makes the live process lose to a paused one (or to its own client time-out),
 * or the server end a quiet tail's batch: refused before any I/O. Port 1: nothing listens, so only a
 * check made before I/O can produce a RangeError.
 */
import { describe, expect, it, vi } from 'vitest';
import { VerifyingConsumerCore } from '../../src/consumer/core.js';
import { PostgresStore } from '../../src/postgres/store.js';

const nowhere = 'postgres://u:p@127.0.0.1:1/db';

describe('PostgresStore - option orderings', () => {
  it.each([
    // "Longer than idleInTransactionTimeoutMs, so that a paused process's batch ends first."
    [
      'lockTimeoutMs below idleInTransactionTimeoutMs',
      { lockTimeoutMs: 5_000, idleInTransactionTimeoutMs: 15_000 },
    ],
    // "more than lockTimeoutMs, whose wait it includes"
    ['queryTimeoutMs below lockTimeoutMs', { queryTimeoutMs: 10_000, lockTimeoutMs: 30_000 }],
  ])('refuses %s before any I/O', async (_what, bounds) => {
    const err = await PostgresStore.open({
      connectionString: nowhere,
      schema: 's',
      connectTimeoutMs: 500,
      ...bounds,
    }).then(
      () => undefined,
      (e: unknown) => e,
    );
    // Before the fix: DEDUP_STORE_REFUSED from the connection attempt (the combination accepted).
    expect(err).toBeInstanceOf(RangeError);
  });

  it.each([300, 1_000])(
    "refuses a consumer whose commitLingerMs (%i) is not below the store's idleInTransactionTimeoutMs (300), before it opens anything",
    async (commitLingerMs) => {
      const openConsumerStore = vi.fn();
      const store = { openConsumerStore, commitLingerLimitMs: 300 };
      const err = await VerifyingConsumerCore.open({
        consumerName: 'c',
        store: store,
        handler: () => undefined,
        commitLingerMs,
      }).then(
        () => undefined,
        (e: unknown) => e,
      );
      expect(err).toBeInstanceOf(RangeError);
      expect(String((err as Error).message)).toMatch(/commitLingerMs/);
      expect(openConsumerStore).not.toHaveBeenCalled();
    },
  );
});
