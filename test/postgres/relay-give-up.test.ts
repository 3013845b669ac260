/**
 * A failure that comes back at every life gives up after reconnect.giveUpAfterMs: a life that
 * activates and fails at once (here: every numbering's move fails, as on an `outbox_ids` without
 * the primary key its ON CONFLICT needs) does not clear the failure's clock. It did: the relay
 * retried for ever at the shortest backoff, taking the lease again at each try.
 */
import { afterEach, describe, expect, it, vi } from 'vitest';
import { DedupError } from '../../src/errors.js';
import type { PgOutboxRelay as Relay } from '../../src/postgres/outbox/relay.js';
import { broker, FakeDb, fakePool, FakeTransport, resetBroker } from '../support/relay-fakes.js';

vi.mock('../../src/transport/stream-transport.js', () => ({ StreamTransport: FakeTransport }));

const { PgOutboxRelay } = await import('../../src/postgres/outbox/relay.js');

afterEach(resetBroker);

/**
 * A relay over `db` that counts its lives; `stopped()` is what closed() resolved with within 5 s,
 * or 'still retrying after 5 s'.
 */
async function openCounting(
  db: FakeDb,
  name: string,
  options: Partial<Parameters<typeof PgOutboxRelay.open>[0]>,
): Promise<{
  relay: Relay;
  lives: () => number;
  stopped: () => Promise<unknown>;
}> {
  let lives = 0;
  const relay = await PgOutboxRelay.open({
    pool: fakePool(db) as never,
    schema: name,
    producerName: name,
    stream: 's',
    leaseTimeoutMs: 0,
    pollIntervalMs: 5,
    closeTimeoutMs: 0,
    ...options,
    onEvent: (e) => {
      if (e.type === 'active') lives++;
    },
  } as Parameters<typeof PgOutboxRelay.open>[0]);
  return {
    relay,
    lives: () => lives,
    stopped: () =>
      Promise.race([
        relay.closed(),
        new Promise<string>((resolve) => setTimeout(() => resolve('still retrying after 5 s'), 5_000)),
      ]),
  };
}

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
    const {
      relay,
      lives,
      stopped: stoppedWithin,
    } = await openCounting(db, 'giveup', {
      reconnect: { initialDelayMs: 1, maxDelayMs: 50, giveUpAfterMs: 500 },
    });
    try {
      const stopped = await stoppedWithin();
      expect(stopped).toBeInstanceOf(DedupError);
      expect((stopped as DedupError).code).toBe('DEDUP_STORE_REFUSED');
      expect((stopped as Error).message).toMatch(/ON CONFLICT/);
      // The backoff grew (1, 2, 4 … 50 ms) instead of restarting at 1 ms every life.
      expect(lives()).toBeLessThan(40);
      // Nothing was numbered: the row still waits.
      expect(db.outbox.map((r) => r.id)).toEqual([1n]);
    } finally {
      await relay.close();
    }
  });
});

describe('reconnect.giveUpAfterMs after a wait as a standby', () => {
  it('a failure before a long wait as a standby does not count against the life after it', async () => {
    const db = new FakeDb();
    let actives = 0;
    let activated = (): void => undefined;
    const relay = await PgOutboxRelay.open({
      pool: fakePool(db) as never,
      schema: 'standby',
      producerName: 'standby',
      stream: 's',
      leaseTimeoutMs: 0,
      pollIntervalMs: 5,
      takeoverIntervalMs: 10,
      closeTimeoutMs: 0,
      // No life here runs for maxDelayMs or has a row confirmed: only the wait may clear the clock.
      reconnect: { initialDelayMs: 1, maxDelayMs: 10_000, giveUpAfterMs: 300 },
      onEvent: (e) => {
        if (e.type !== 'active') return;
        actives++;
        activated();
      },
    });
    const nextActive = (): Promise<void> => new Promise<void>((resolve) => (activated = resolve));
    const transport = (): FakeTransport => broker.transports[broker.transports.length - 1] as FakeTransport;
    try {
      // A failure (the broker connection lost) while another relay took the name: a standby.
      db.lockFree = false;
      transport().handlers!.disconnected(new Error('connection lost'));
      // Longer than giveUpAfterMs as a standby (the wait is the condition under test).
      await new Promise((resolve) => setTimeout(resolve, 600));
      expect(actives).toBe(1);
      // The name comes back; the new life fails at once (no row confirmed, not maxDelayMs old).
      const back = nextActive();
      db.lockFree = true;
      await back;
      const again = nextActive();
      transport().handlers!.disconnected(new Error('connection lost again'));
      const outcome = await Promise.race([
        again.then(() => 'active again'),
        relay.closed().then((e) => `stopped: ${String(e)}`),
        new Promise<string>((resolve) => setTimeout(() => resolve('neither within 5 s'), 5_000)),
      ]);
      // One failure 0 ms old, not one 600 ms old: retried, not given up.
      expect(outcome).toBe('active again');
    } finally {
      await relay.close();
    }
  });
});

describe('reconnect.giveUpAfterMs when nothing is ever confirmed', () => {
  it('a broker that takes the sends and never confirms stops the relay, however long each life lasts', async () => {
    const db = new FakeDb();
    db.outbox.push({ id: 1n, body: Buffer.from('a') });
    broker.stores = false;
    const {
      relay,
      lives,
      stopped: stoppedWithin,
    } = await openCounting(db, 'noconfirm', {
      // Every life lasts confirmTimeoutMs (100), longer than maxDelayMs (50): not "healthy" for it.
      confirmTimeoutMs: 100,
      reconnect: { initialDelayMs: 1, maxDelayMs: 50, giveUpAfterMs: 300 },
    });
    try {
      const stopped = await stoppedWithin();
      expect(stopped).toBeInstanceOf(DedupError);
      expect((stopped as DedupError).code).toBe('DEDUP_BROKER_UNREACHABLE');
      expect(lives()).toBeGreaterThan(1);
      // The row's record is kept: numbered, sent, never confirmed.
      expect(db.records.map((r) => r.rowIds)).toEqual([[1n]]);
    } finally {
      await relay.close();
    }
  });
});
