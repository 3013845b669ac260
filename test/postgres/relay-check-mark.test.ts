/**
 * relay35 (hostile review of the other-writer check): the broker's last ID must be compared with
 * what the outbox had numbered when the question was ASKED, not when the answer arrives. The
 * broker answers a query on the producer's connection in frame order: it reflects the relay's
 * frames written before the query and none written after. A check asked when the relay had
 * numbered up to L0 and answered after the next numbering raised the mark to L1 must fail on an
 * answer in (L0, L1]: that ID can only be another writer's, and the rows the relay sends after it
 * at or below it are dropped by the broker as duplicates while being confirmed.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { broker, FakeDb, fakePool, FakeTransport, resetBroker } from '../support/relay-fakes.js';
import { vi } from 'vitest';

vi.mock('../../src/transport/stream-transport.js', () => ({ StreamTransport: FakeTransport }));

const { PgOutboxRelay } = await import('../../src/postgres/outbox/relay.js');

afterEach(resetBroker);

describe('the other-writer check compares with the numbered mark as of its question', () => {
  it('an answer above the mark at the question stops the relay, though a later numbering passed it', async () => {
    const db = new FakeDb();
    db.outbox.push({ id: 1n, body: Buffer.from('a') }, { id: 2n, body: Buffer.from('b') });
    const confirmedUpTo: bigint[] = [];
    let asked = 0;
    broker.queryLastId = () => {
      asked++;
      if (asked === 1) {
        // Rows 1, 2 (IDs 1, 2) are stored and confirmed; another writer publishes ID 3 under the
        // name now, and the application commits row 3, which the relay will number as ID 3: the
        // broker drops it as a duplicate (and confirms it).
        broker.lastId = 3n;
        db.outbox.push({ id: 3n, body: Buffer.from('c') });
      }
      // The answer is the broker's state at the question, delivered 50 ms later (a slow broker):
      // after the numbering of row 3 (mark 3).
      const atQuestion = broker.lastId;
      return new Promise<bigint>((resolve) => setTimeout(() => resolve(atQuestion), 50));
    };
    const relay = await PgOutboxRelay.open({
      pool: fakePool(db) as never,
      schema: 'mark',
      producerName: 'mark',
      stream: 's',
      leaseTimeoutMs: 0,
      pollIntervalMs: 5,
      closeTimeoutMs: 0,
      queryTimeoutMs: 200,
      connectTimeoutMs: 1_000,
      onEvent: (e) => {
        if (e.type === 'confirmed') confirmedUpTo.push(e.lastId);
      },
    });
    try {
      const stopped = await Promise.race([
        relay.closed(),
        new Promise<string>((resolve) => setTimeout(() => resolve('still running after 2 s'), 2_000)),
      ]);
      // The first check was asked at mark 2 and answered 3: another writer.
      expect(stopped).toBeInstanceOf(Error);
      expect((stopped as { code?: string }).code).toBe('DEDUP_NAME_CONFLICT');
      // Row 3's record (dropped by the broker, confirmed) was kept, not deleted as published.
      expect(confirmedUpTo.filter((id) => id >= 3n)).toEqual([]);
    } finally {
      await relay.close();
    }
  });
});
