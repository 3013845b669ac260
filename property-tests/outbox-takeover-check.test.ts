/**
 * revP (review of relay35): the missing dimension of property-tests/outbox-other-writer.test.ts —
 * another LIFE of this outbox, not another writer. At random questions of the other-writer check a
 * standby takes the name over (the lease epoch moves), numbers some waiting rows from
 * `last_assigned` and sends them (the broker's last ID moves above this relay's mark); the answer
 * comes at once or late. maxInFlight is small, so the relay often cannot number between question
 * and answer and the check itself must tell the take-over from another writer. Property: the
 * relay never stops (no DEDUP_NAME_CONFLICT: every ID above its mark is this outbox's), nothing
 * the broker dropped is deleted, and every committed row ends up at the broker.
 *
 * Mutant `epoch !== this.#epoch` → false in relay.ts#checkNoOtherWriter: fails within 1–3 runs, shrunk
 * to one question answered at once, one row taken over, maxInFlight 1; the real relay passes 5 × 30
 * runs (~1 s each, load ~6).
 */
import fc from 'fast-check';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { broker, FakeDb, fakePool, FakeTransport, resetBroker } from '../test/support/relay-fakes.js';

vi.mock('../src/transport/stream-transport.js', () => ({ StreamTransport: FakeTransport }));

const { PgOutboxRelay } = await import('../src/postgres/outbox/relay.js');

/** Per question: the answer's delay (ms), and how many waiting rows another life numbers then (0: none). */
interface Question {
  readonly delayMs: 0 | 20;
  readonly takeover: number;
}

afterEach(resetBroker);

async function run(script: readonly Question[], maxInFlight: number): Promise<void> {
  broker.lastId = 0n;
  broker.transports = [];
  broker.published = [];
  broker.dropped = [];
  const db = new FakeDb();
  let rows = 0;
  const commit = (): void => {
    rows++;
    db.outbox.push({ id: BigInt(rows), body: Buffer.from(`r${rows}`) });
  };
  for (let i = 0; i < 3; i++) commit();
  /** Rows the other life numbered and sent (never this relay's to send). */
  let byOther = 0;
  let asked = 0;
  let queue: Promise<unknown> = Promise.resolve();
  broker.queryLastId = () => {
    const q = script[asked++] ?? { delayMs: 0, takeover: 0 };
    const take = Math.min(q.takeover, db.outbox.length);
    if (take > 0) {
      // Another life of this outbox: takes the lease, numbers `take` rows from last_assigned
      // (committed), sends them; the broker stores them.
      db.epoch += 1n;
      const picked = [...db.outbox].sort((a, b) => (a.id < b.id ? -1 : 1)).slice(0, take);
      const first = (db.lastAssigned.get('s') ?? 0n) + 1n;
      db.outbox = db.outbox.filter((r) => !picked.includes(r));
      db.records.push({
        target: 's',
        firstId: first,
        rowIds: picked.map((r) => r.id),
        bodies: picked.map((r) => r.body),
      });
      const last = first + BigInt(take) - 1n;
      db.lastAssigned.set('s', last);
      if (last > broker.lastId) broker.lastId = last;
      byOther += take;
    }
    // A row committed at each scripted question (the relay numbers again before a late answer);
    // none after the script, so the outbox can drain.
    if (asked <= script.length) commit();
    const atQuestion = broker.lastId;
    const answer = queue.then(() => new Promise<bigint>((r) => setTimeout(() => r(atQuestion), q.delayMs)));
    queue = answer;
    return answer;
  };
  let stopped: Error | undefined;
  const relay = await PgOutboxRelay.open({
    pool: fakePool(db) as never,
    schema: 'tko',
    producerName: 'tko',
    stream: 's',
    leaseTimeoutMs: 0,
    pollIntervalMs: 5,
    closeTimeoutMs: 0,
    queryTimeoutMs: 200,
    connectTimeoutMs: 1_000,
    maxInFlight,
    batchSize: maxInFlight,
    reconnect: { initialDelayMs: 1, maxDelayMs: 5, giveUpAfterMs: 60_000 },
    onEvent: (e) => {
      if (e.type === 'stopped') stopped = e.error;
    },
  });
  try {
    await vi.waitFor(
      () => {
        if (stopped === undefined) {
          expect(asked).toBeGreaterThan(script.length);
          expect(db.outbox.length).toBe(0);
        }
      },
      { timeout: 5_000, interval: 5 },
    );
    expect(stopped, 'stopped though only this outbox wrote under the name').toBeUndefined();
    const dropped = new Set(broker.dropped);
    const deletedDropped = db.deleted.flatMap((r) =>
      r.rowIds.map((_, i) => r.firstId + BigInt(i)).filter((id) => dropped.has(id)),
    );
    expect(deletedDropped, 'IDs the broker dropped, deleted as published').toEqual([]);
    // Every numbered ID is at the broker (sent by this relay or by the other life).
    expect(broker.lastId).toBe(db.lastAssigned.get('s'));
    expect(broker.published.length + byOther).toBeGreaterThanOrEqual(rows - db.outbox.length);
  } finally {
    await relay.close();
  }
}

describe('outbox relay: another life of this outbox taking over at a question is no name conflict', () => {
  it('never stops, deletes nothing dropped, publishes every row', async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.array(
          fc.record({
            delayMs: fc.constantFrom<0 | 20>(0, 20),
            takeover: fc.oneof(fc.constant(0), fc.integer({ min: 1, max: 3 })),
          }),
          { minLength: 1, maxLength: 5 },
        ),
        fc.integer({ min: 1, max: 4 }),
        run,
      ),
      { numRuns: 30, interruptAfterTimeLimit: 90_000 },
    );
  });
});
