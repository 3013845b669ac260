/**
 * revR finding 1: the other-writer check awaits the broker's last ID with no bound. The stream
 * client never rejects a request whose connection closed (rabbitmq-stream-js-client keeps it in
 * `waitingResponses` for good) and has no request time-out; `#checkNoOtherWriter` calls
 * `transport.queryLastId()` bare (the changelog writer wraps the same call in `withTimeout`). A
 * broker connection lost while that query is outstanding — before each delete of confirmed
 * records, so at almost every numbering under load — leaves the pump waiting for ever: in the
 * numbering path `assign` waited on the check inside its open transaction; the `disconnected`
 * report only sets `#failure` and wakes a sleep nobody sleeps in. The heartbeat keeps the lease,
 * so no standby takes over: the relay stays "active" and publishes nothing.
 */
import { afterEach, describe, expect, it, vi } from 'vitest';
import { broker, FakeDb, fakePool, FakeTransport, resetBroker } from '../support/relay-fakes.js';

vi.mock('../../src/transport/stream-transport.js', () => ({ StreamTransport: FakeTransport }));

const { PgOutboxRelay } = await import('../../src/postgres/outbox/relay.js');

afterEach(resetBroker);

describe('revR: the other-writer check has no bound', () => {
  it('a broker connection lost during the check ends the life (retrying), not a hang', async () => {
    const db = new FakeDb();
    db.outbox.push({ id: 1n, body: Buffer.from('a') }, { id: 2n, body: Buffer.from('b') });
    const events: string[] = [];
    // The connection closes while the query is outstanding: the client's promise never settles,
    // the transport reports the loss.
    broker.queryLastId = (t) => {
      setImmediate(() => t.handlers?.disconnected(new Error('stream connection closed')));
      return new Promise<bigint>(() => undefined);
    };
    const relay = await PgOutboxRelay.open({
      pool: fakePool(db) as never,
      schema: 'revr',
      producerName: 'revr',
      stream: 's',
      leaseTimeoutMs: 0,
      pollIntervalMs: 20,
      confirmTimeoutMs: 500,
      closeTimeoutMs: 0,
      queryTimeoutMs: 200,
      connectTimeoutMs: 500,
      onEvent: (e) => events.push(e.type),
    });
    try {
      // Rows 1, 2 are numbered, sent and confirmed; the check before deleting their record hangs.
      await vi.waitFor(() => expect(broker.published.length).toBe(2), { timeout: 2_000 });
      // Any bound (confirmTimeoutMs, queryTimeoutMs, connectTimeoutMs) would end the life well
      // within 3 s: the next life re-reads, deletes the stored record, and goes on.
      await vi.waitFor(() => expect(events).toContain('retrying'), { timeout: 3_000, interval: 50 });
    } finally {
      await relay.close();
    }
  });

  it('the numbering transaction never waits on the check: one begun while a check is outstanding commits before it answers (finding 5)', async () => {
    const db = new FakeDb();
    db.outbox.push({ id: 1n, body: Buffer.from('a') });
    /** Checks asked and not answered yet. */
    const outstanding = new Set<number>();
    let checks = 0;
    let begunDuring: Set<number> | undefined;
    const waited: number[] = [];
    let overlapped = 0;
    db.before = (text) => {
      const t = text.trim();
      if (/^BEGIN; SET LOCAL/.test(t)) {
        begunDuring = new Set(outstanding);
        if (outstanding.size > 0) overlapped++;
      } else if (/COMMIT$/.test(t) && begunDuring !== undefined) {
        // A check outstanding at the BEGIN and answered before the COMMIT: the transaction may have
        // waited for it.
        for (const c of begunDuring) if (!outstanding.has(c)) waited.push(c);
        begunDuring = undefined;
      }
    };
    // A slow broker answer (50 ms), and a new row waiting at every check: the next numbering follows.
    broker.queryLastId = () => {
      const c = ++checks;
      outstanding.add(c);
      db.outbox.push({ id: BigInt(100 + c), body: Buffer.from('x') });
      return new Promise<bigint>((resolve) =>
        setTimeout(() => {
          outstanding.delete(c);
          resolve(broker.lastId);
        }, 50),
      );
    };
    const relay = await PgOutboxRelay.open({
      pool: fakePool(db) as never,
      schema: 'revr',
      producerName: 'revr',
      stream: 's',
      leaseTimeoutMs: 0,
      pollIntervalMs: 5,
      closeTimeoutMs: 0,
      queryTimeoutMs: 200,
    });
    try {
      await vi.waitFor(() => expect(checks).toBeGreaterThanOrEqual(4), { timeout: 3_000 });
      // The numberings went on while checks were out (nothing serialises them behind the broker)…
      expect(overlapped).toBeGreaterThan(0);
      // …and none of them waited for one.
      expect(waited).toEqual([]);
    } finally {
      await relay.close();
    }
  });

  it('a check the broker never answers, with no loss reported, ends the life within connectTimeoutMs', async () => {
    const db = new FakeDb();
    db.outbox.push({ id: 1n, body: Buffer.from('a') });
    const events: string[] = [];
    let asked = 0;
    broker.queryLastId = () => {
      asked = performance.now();
      return new Promise<bigint>(() => undefined);
    };
    const relay = await PgOutboxRelay.open({
      pool: fakePool(db) as never,
      schema: 'revr',
      producerName: 'revr',
      stream: 's',
      leaseTimeoutMs: 0,
      pollIntervalMs: 20,
      closeTimeoutMs: 0,
      queryTimeoutMs: 200,
      connectTimeoutMs: 300,
      onEvent: (e) => events.push(e.type),
    });
    try {
      await vi.waitFor(() => expect(events).toContain('retrying'), { timeout: 3_000, interval: 20 });
      const after = performance.now() - asked;
      // Ended by the 300 ms bound (not by confirmTimeoutMs, 30 s): within a poll of it.
      expect(after).toBeLessThan(1_000);
    } finally {
      await relay.close();
    }
  });
});
