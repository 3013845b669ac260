/**
 * Hostile review B: PostgresStore's documented orderings of its bounds are not checked. Each
 * combination below makes the live process lose to a paused one (or to its own client time-out):
 * REVIEW §5 asks for a typed refusal before any I/O. Port 1: nothing listens, so only a check made
 * before I/O can produce a RangeError.
 */
import { describe, expect, it } from 'vitest';
import { PostgresStore } from '../../src/postgres/store.js';

const nowhere = 'postgres://u:p@127.0.0.1:1/db';

describe('rev-b: PostgresStore option orderings', () => {
  it.each([
    // "Longer than idleInTransactionTimeoutMs, so that a paused process's batch ends first."
    [
      'lockTimeoutMs below idleInTransactionTimeoutMs',
      { lockTimeoutMs: 5_000, idleInTransactionTimeoutMs: 15_000 },
    ],
    // "more than lockTimeoutMs, whose wait it includes"
    ['queryTimeoutMs below lockTimeoutMs', { queryTimeoutMs: 10_000, lockTimeoutMs: 30_000 }],
  ])('rev-b - refuses %s before any I/O', async (_what, bounds) => {
    const err = await PostgresStore.open({
      connectionString: nowhere,
      schema: 's',
      connectTimeoutMs: 500,
      ...bounds,
    }).then(
      () => undefined,
      (e: unknown) => e,
    );
    // Observed: DEDUP_STORE_REFUSED from the connection attempt (the combination is accepted).
    expect(err).toBeInstanceOf(RangeError);
  });
});
