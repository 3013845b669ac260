/**
 * revR finding 2: the database-wide name lock's key joins kind, target and producer name with ':',
 * which both a stream name and a producer name may contain (REVIEW.md §2, separators inside
 * names). Two different (stream, producer name) pairs — which the broker deduplicates separately —
 * share one lock key: the relay of the second (another schema) finds the name lock held and its
 * outbox lock free, and stops with a false DEDUP_NAME_CONFLICT, permanently, while the first runs.
 */
import { describe, expect, it } from 'vitest';
import { RelayLock } from '../../src/postgres/outbox/relay-lock.js';
import { resolveRelayOptions } from '../../src/postgres/outbox/relay-options.js';

const run = (() => {
  throw new Error('no I/O here');
}) as never;

describe('revR: the name lock key is injective', () => {
  it('distinct (stream, producer name) pairs get distinct name lock keys', () => {
    // Both pairs pass the relay's option checks.
    const pool = { connect: () => undefined } as never;
    resolveRelayOptions({ pool, schema: 'app1', producerName: 'c', stream: 'a:b' });
    resolveRelayOptions({ pool, schema: 'app2', producerName: 'b:c', stream: 'a' });
    const first = new RelayLock(run, 'app1', 'c', { kind: 'stream', name: 'a:b' }, 0);
    const second = new RelayLock(run, 'app2', 'b:c', { kind: 'stream', name: 'a' }, 0);
    expect(second.nameKey).not.toBe(first.nameKey);
  });
});
