/**
 * The other-writer check of a confirmed batch record starts at its confirm (docs/design.md §14),
 * not when the pump next comes round: a record confirmed while a numbering is under way is asked
 * about during it, so its delete can ride that numbering or the next, instead of waiting for the
 * numbering to end before its check even begins (commit-to-confirm p99 at 1 000 rows/s, issue 35).
 */
import { afterEach, describe, expect, it, vi } from 'vitest';
import { broker, FakeDb, fakePool, FakeTransport, resetBroker } from '../support/relay-fakes.js';

vi.mock('../../src/transport/stream-transport.js', () => ({ StreamTransport: FakeTransport }));

const { PgOutboxRelay } = await import('../../src/postgres/outbox/relay.js');

afterEach(resetBroker);

describe('the other-writer check starts at the confirm', () => {
  it('a record confirmed during a numbering is asked about before that numbering ends', async () => {
    const db = new FakeDb();
    db.outbox.push({ id: 1n, body: Buffer.from('a') }, { id: 2n, body: Buffer.from('b') });
    broker.autoConfirm = false;
    // Every numbering's read after the first record was sent waits until `release()`.
    let release = (): void => undefined;
    const held = new Promise<void>((resolve) => (release = resolve));
    let readHeld = (): void => undefined;
    const readStarted = new Promise<void>((resolve) => (readHeld = resolve));
    db.before = (text) => {
      if (!/^\s*BEGIN; SET LOCAL/.test(text) || broker.published.length < 2) return;
      readHeld();
      return held;
    };
    let askedDuringRead = (): void => undefined;
    const asked = new Promise<string>((resolve) => (askedDuringRead = () => resolve('asked')));
    broker.queryLastId = () => {
      askedDuringRead();
      return Promise.resolve(broker.lastId);
    };
    let deleted = (): void => undefined;
    const confirmedEvent = new Promise<void>((resolve) => (deleted = resolve));
    const relay = await PgOutboxRelay.open({
      pool: fakePool(db) as never,
      schema: 'early',
      producerName: 'early',
      stream: 's',
      leaseTimeoutMs: 0,
      pollIntervalMs: 5,
      closeTimeoutMs: 0,
      queryTimeoutMs: 5_000,
      connectTimeoutMs: 5_000,
      onEvent: (e) => {
        if (e.type === 'confirmed') deleted();
      },
    });
    try {
      await readStarted;
      // The broker confirms the first record while the next numbering's read is held.
      broker.transports[0]!.handlers!.confirmed([1n, 2n]);
      const outcome = await Promise.race([
        asked,
        new Promise<string>((resolve) => setTimeout(() => resolve('not asked within 1 s'), 1_000)),
      ]);
      expect(outcome).toBe('asked');
      // The numbering goes on and carries the checked record's delete.
      release();
      await confirmedEvent;
      expect(db.deleted.map((r) => r.firstId)).toEqual([1n]);
    } finally {
      release();
      await relay.close();
    }
  });
});
