/**
 * A failure that comes back at every life gives up after reconnect.giveUpAfterMs: a life that
 * activates and fails at once (here: every numbering's move fails, as on an `outbox_ids` without
 * the primary key its ON CONFLICT needs) does not clear the failure's clock. It did: the relay
 * retried for ever at the shortest backoff, taking the lease again at each try.
 */
import { afterEach, describe, expect, it, vi } from 'vitest';
import { DedupError } from '../../src/errors.js';
import { FakeDb, fakePool, FakeTransport, resetBroker } from '../support/relay-fakes.js';

vi.mock('../../src/transport/stream-transport.js', () => ({ StreamTransport: FakeTransport }));

const { PgOutboxRelay } = await import('../../src/postgres/outbox/relay.js');

afterEach(resetBroker);

describe('reconnect.giveUpAfterMs', () => {
  it('a numbering that fails at every life stops the relay after giveUpAfterMs, typed', async () => {
    const db = new FakeDb();
    db.outbox.push({ id: 1n, body: Buffer.from('a') });
    db.before = (text) => {
      if (/INSERT INTO .*outbox_batches/s.test(text)) {
        throw Object.assign(
          new Error('there is no unique or exclusion constraint matching the ON CONFLICT specification'),
          { code: '42P10' },
        );
      }
    };
    let lives = 0;
    const relay = await PgOutboxRelay.open({
      pool: fakePool(db) as never,
      schema: 'giveup',
      producerName: 'giveup',
      stream: 's',
      leaseTimeoutMs: 0,
      pollIntervalMs: 5,
      closeTimeoutMs: 0,
      reconnect: { initialDelayMs: 1, maxDelayMs: 50, giveUpAfterMs: 500 },
      onEvent: (e) => {
        if (e.type === 'active') lives++;
      },
    });
    try {
      const stopped = await Promise.race([
        relay.closed(),
        new Promise<string>((resolve) => setTimeout(() => resolve('still retrying after 5 s'), 5_000)),
      ]);
      expect(stopped).toBeInstanceOf(DedupError);
      expect((stopped as DedupError).code).toBe('DEDUP_STORE_REFUSED');
      expect((stopped as Error).message).toMatch(/ON CONFLICT/);
      // The backoff grew (1, 2, 4 … 50 ms) instead of restarting at 1 ms every life.
      expect(lives).toBeLessThan(40);
      // Nothing was numbered: the row still waits.
      expect(db.outbox.map((r) => r.id)).toEqual([1n]);
    } finally {
      await relay.close();
    }
  });
});
