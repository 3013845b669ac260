/**
 * revR finding 4: open() starts the lease heartbeat only after its first activation returns. The
 * lock session already runs with `idle_session_timeout = leaseTimeoutMs` (set in acquire) and is
 * idle during the whole activation (the work connection, takeover, every target's broker connect
 * — a leader election waits up to connectTimeoutMs — and the recovery re-sends of up to
 * maxInFlight + batchSize rows). An activation longer than the lease gets the lock session ended
 * by the server: a standby takes the name over and this relay's first life ends on the lost
 * lock ('retrying', a second take-over, the recovery re-sent again). Later lives are covered (the
 * interval exists by then): only open()'s activation is not.
 */
import { afterEach, describe, expect, it, vi } from 'vitest';
import { broker, FakeDb, fakePool, FakeTransport } from '../support/relay-fakes.js';

vi.mock('../../src/transport/stream-transport.js', () => ({ StreamTransport: FakeTransport }));

const { PgOutboxRelay } = await import('../../src/postgres/outbox/relay.js');

afterEach(() => {
  broker.connectDelayMs = 0;
  broker.transports = [];
});

describe('revR: the lease heartbeat covers open()', () => {
  it('the lock session is kept alive while open() activates for longer than the lease', async () => {
    const db = new FakeDb();
    broker.connectDelayMs = 1_000; // the broker connect takes 5 leases
    const leaseTimeoutMs = 200;
    let locked: number | undefined;
    let lastUse: number | undefined;
    let longestIdle = 0;
    db.before = (text) => {
      const now = performance.now();
      if (/pg_try_advisory_lock/.test(text)) locked = now;
      // Statements on the lock session: the lock, its SET, LISTEN, the heartbeat's pg_locks check.
      if (
        locked !== undefined &&
        /pg_try_advisory_lock|idle_session_timeout|LISTEN|FROM pg_locks/.test(text)
      ) {
        if (lastUse !== undefined) longestIdle = Math.max(longestIdle, now - lastUse);
        lastUse = now;
      }
    };
    const relay = await PgOutboxRelay.open({
      pool: fakePool(db) as never,
      schema: 'revr',
      producerName: 'revr',
      stream: 's',
      leaseTimeoutMs,
      closeTimeoutMs: 0,
      queryTimeoutMs: 200,
    });
    try {
      const openedAt = performance.now();
      longestIdle = Math.max(longestIdle, openedAt - (lastUse ?? openedAt));
      expect(relay.stats.isActive).toBe(true);
      // The server ends a session idle for leaseTimeoutMs: the lock session must not be.
      expect(longestIdle).toBeLessThan(leaseTimeoutMs);
    } finally {
      await relay.close();
    }
  });
});
