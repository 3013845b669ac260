/**
 * relay35: the confirmed records waiting for their other-writer check (`#pending`) were not
 * bounded. The check runs beside the pump (perf35) and the numbering is bounded only by the rows
 * in flight (sent, unconfirmed), so a slow broker answer (up to connectTimeoutMs, 10 s) let the
 * relay go on numbering, sending and confirming: every confirmed record joined `#pending` and
 * stayed in outbox_batches with its bodies, as many as the application committed meanwhile.
 * Now the rows of records confirmed and not yet deleted count against a second `maxInFlight`:
 * past it the relay numbers nothing until a check passes.
 */
import { afterEach, describe, expect, it, vi } from 'vitest';
import { broker, FakeDb, fakePool, FakeTransport, resetBroker } from '../support/relay-fakes.js';

vi.mock('../../src/transport/stream-transport.js', () => ({ StreamTransport: FakeTransport }));

const { PgOutboxRelay } = await import('../../src/postgres/outbox/relay.js');

afterEach(resetBroker);

describe('the records waiting for their other-writer check are bounded', () => {
  it('while no check answers, the relay sends at most 2 × maxInFlight rows; once they answer, every row', async () => {
    const db = new FakeDb();
    let rows = 0;
    const commit = (): void => {
      rows++;
      db.outbox.push({ id: BigInt(rows), body: Buffer.from(`r${rows}`) });
    };
    for (let i = 0; i < 5; i++) commit();
    /** Questions held unanswered until released. */
    const held: (() => void)[] = [];
    let hold = true;
    broker.queryLastId = () => {
      const atQuestion = broker.lastId;
      if (!hold) return Promise.resolve(atQuestion);
      return new Promise<bigint>((resolve) => held.push(() => resolve(atQuestion)));
    };
    const feeder = setInterval(() => {
      for (let i = 0; i < 3; i++) commit();
    }, 2);
    const relay = await PgOutboxRelay.open({
      pool: fakePool(db) as never,
      schema: 'pend',
      producerName: 'pend',
      stream: 's',
      leaseTimeoutMs: 0,
      pollIntervalMs: 2,
      closeTimeoutMs: 0,
      queryTimeoutMs: 200,
      connectTimeoutMs: 5_000,
      maxInFlight: 10,
      batchSize: 5,
    });
    try {
      await vi.waitFor(() => expect(held.length).toBeGreaterThan(0), { timeout: 2_000 });
      // 300 ms of slow checks, ~450 rows committed meanwhile.
      await new Promise((r) => setTimeout(r, 300));
      expect(rows).toBeGreaterThan(100);
      expect(broker.published.length).toBeLessThanOrEqual(20);
      // The checks answer: the relay catches up.
      clearInterval(feeder);
      hold = false;
      for (const release of held.splice(0)) release();
      await vi.waitFor(() => expect(broker.published.length).toBe(rows), { timeout: 5_000, interval: 10 });
      expect(broker.dropped).toEqual([]);
    } finally {
      clearInterval(feeder);
      await relay.close();
    }
  });
});
