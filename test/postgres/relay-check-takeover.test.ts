/**
 * revP (hostile review of relay35): two attacks on the new other-writer check that the relay
 * survives, kept as regression tests. (1) Another life of this outbox (a standby that took the
 * name over) numbers and sends above this relay's mark while a check is asked: the check must end
 * the life as fenced (retry), not stop it with DEDUP_NAME_CONFLICT. Mutation `epoch !== this.#epoch`
 * → false: fails (stopped with DEDUP_NAME_CONFLICT). maxInFlight 2 keeps the pump from numbering
 * between question and answer (its own lease read would otherwise see the take-over first and mask
 * the check's path). (2) close() while numbering is paused on a check that never answers returns
 * within its bound and deletes nothing unchecked. Mutation: #room ignores the pending rows: fails
 * (30 rows sent, bound 8). ~0.9 s together.
 */
import { afterEach, describe, expect, it, vi } from 'vitest';
import { broker, FakeDb, fakePool, FakeTransport, resetBroker } from '../support/relay-fakes.js';

vi.mock('../../src/transport/stream-transport.js', () => ({ StreamTransport: FakeTransport }));

const { PgOutboxRelay } = await import('../../src/postgres/outbox/relay.js');

afterEach(resetBroker);

const opts = {
  stream: 's',
  leaseTimeoutMs: 0,
  pollIntervalMs: 5,
  closeTimeoutMs: 0,
  queryTimeoutMs: 200,
  connectTimeoutMs: 1_000,
  reconnect: { initialDelayMs: 1, maxDelayMs: 5, giveUpAfterMs: 60_000 },
};

describe('relay35 other-writer check: take-over at a question, close during the pending pause', () => {
  it('another life of the same outbox that took over at a question is not a name conflict', async () => {
    const db = new FakeDb();
    db.outbox.push({ id: 1n, body: Buffer.from('a') }, { id: 2n, body: Buffer.from('b') });
    let asked = 0;
    broker.queryLastId = () => {
      asked++;
      if (asked === 1) {
        // Another life (a standby) takes the name over, numbers row 3 as ID 3 and sends it.
        db.epoch += 1n;
        db.records.push({ target: 's', firstId: 3n, rowIds: [3n], bodies: [Buffer.from('c')] });
        db.lastAssigned.set('s', 3n);
        broker.lastId = 3n;
      }
      // Answered at once: before the pump's next numbering would meet the moved epoch itself.
      return Promise.resolve(broker.lastId);
    };
    const events: string[] = [];
    const relay = await PgOutboxRelay.open({
      pool: fakePool(db) as never,
      schema: 'tk',
      producerName: 'tk',
      ...opts,
      // Rows 1, 2 confirmed and waiting for their check fill maxInFlight: no numbering (whose lease
      // read would see the take-over first) until the check answers: the check must tell it apart.
      maxInFlight: 2,
      onEvent: (e) =>
        events.push(e.type === 'stopped' ? `stopped:${(e.error as { code?: string })?.code}` : e.type),
    });
    try {
      const stopped = await Promise.race([
        relay.closed(),
        new Promise<string>((r) => setTimeout(() => r('running'), 500)),
      ]);
      expect(stopped).toBe('running');
      expect(events.filter((e) => e.startsWith('stopped'))).toEqual([]);
      expect(events).toContain('retrying');
      expect(broker.dropped).toEqual([]);
    } finally {
      await relay.close();
    }
  });

  it('close() during a pause on a check that never answers returns within its bound', async () => {
    const db = new FakeDb();
    for (let i = 1; i <= 30; i++) db.outbox.push({ id: BigInt(i), body: Buffer.from(`r${i}`) });
    broker.queryLastId = () => new Promise<bigint>(() => undefined);
    const relay = await PgOutboxRelay.open({
      pool: fakePool(db) as never,
      schema: 'cl',
      producerName: 'cl',
      ...opts,
      connectTimeoutMs: 60_000,
      closeTimeoutMs: 200,
      maxInFlight: 4,
      batchSize: 2,
    });
    await vi.waitFor(() => expect(broker.published.length).toBeGreaterThan(0), { timeout: 2_000 });
    await new Promise((r) => setTimeout(r, 100));
    const published = broker.published.length;
    expect(published).toBeLessThanOrEqual(8);
    const t0 = performance.now();
    await relay.close();
    const took = performance.now() - t0;
    expect(took).toBeLessThan(1_500);
    // Nothing deleted whose check did not pass.
    expect(db.deleted).toEqual([]);
  });
});
