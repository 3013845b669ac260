/**
 * Liveness of the outbox relay's other-writer check (docs/design.md §14, "another writer"; revR
 * finding 1): the two outbox models are step-safety models, and a broker request that never
 * answers is not a step they can take. This property drives the real `PgOutboxRelay` over the
 * fakes of test/support/relay-fakes.ts (a pg pool answering from memory, a StreamTransport
 * stand-in): every check the relay makes is answered, answered late, never answered, or never
 * answered while the transport reports the connection lost (the stream client's behaviour: it
 * neither answers nor rejects a request whose connection closed). Property: every check that is
 * not answered ends its life ('retrying') within connectTimeoutMs plus a slack, and once the broker
 * answers again the relay publishes every committed row.
 */
import fc from 'fast-check';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { broker, FakeDb, fakePool, FakeTransport, resetBroker } from '../test/support/relay-fakes.js';

vi.mock('../src/transport/stream-transport.js', () => ({ StreamTransport: FakeTransport }));

const { PgOutboxRelay } = await import('../src/postgres/outbox/relay.js');

type Answer = 'answer' | 'late' | 'hang' | 'hangLost';

const CONNECT_TIMEOUT_MS = 100;
/** The bound on a life whose check is never answered: connectTimeoutMs + a loaded machine's slack. */
const BOUND_MS = CONNECT_TIMEOUT_MS + 1_500;

afterEach(resetBroker);

async function live(script: readonly Answer[]): Promise<void> {
  broker.lastId = 0n;
  broker.transports = [];
  broker.published = [];
  const db = new FakeDb();
  db.outbox.push({ id: 1n, body: Buffer.from('r1') });
  let rows = 1;
  let calls = 0;
  /** Start times of the checks left unanswered, in order. */
  const unanswered: number[] = [];
  const retries: number[] = [];
  broker.queryLastId = (t) => {
    const answer = script[calls++] ?? 'answer';
    // Each check finds a new committed row, so the relay keeps numbering.
    rows++;
    db.outbox.push({ id: BigInt(rows), body: Buffer.from(`r${rows}`) });
    if (answer === 'answer') return Promise.resolve(broker.lastId);
    // The broker's state at the question (it answers in frame order on the producer's connection:
    // frames written after the question are not in the answer; relay35).
    const atQuestion = broker.lastId;
    if (answer === 'late') return new Promise((r) => setTimeout(() => r(atQuestion), 30));
    unanswered.push(performance.now());
    if (answer === 'hangLost') setImmediate(() => t.handlers?.disconnected(new Error('connection closed')));
    return new Promise<bigint>(() => undefined);
  };
  const relay = await PgOutboxRelay.open({
    pool: fakePool(db) as never,
    schema: 'live',
    producerName: 'live',
    stream: 's',
    leaseTimeoutMs: 0,
    pollIntervalMs: 5,
    closeTimeoutMs: 0,
    queryTimeoutMs: 200,
    connectTimeoutMs: CONNECT_TIMEOUT_MS,
    reconnect: { initialDelayMs: 1, maxDelayMs: 5, giveUpAfterMs: 60_000 },
    onEvent: (e) => {
      if (e.type === 'retrying') retries.push(performance.now());
    },
  });
  // A row committed every 10 ms besides: the relay numbers without waiting for its checks
  // (perf35), so a row committed only at each check could all be published by a life that then
  // ends on a hanging check, and the next life would have nothing to confirm, hence no check.
  const feeder = setInterval(() => {
    rows++;
    db.outbox.push({ id: BigInt(rows), body: Buffer.from(`r${rows}`) });
  }, 10);
  try {
    // Past the script: every row committed so far is published.
    await vi.waitFor(
      () => {
        expect(calls).toBeGreaterThan(script.length + 1);
        expect(broker.published.length).toBeGreaterThanOrEqual(rows - 1);
        // The relay no longer waits for a check before numbering (perf35): it may publish past a
        // hanging one before that check's bound ends the life; wait for the ends too.
        expect(unanswered.every((started) => retries.some((r) => r >= started))).toBe(true);
      },
      { timeout: BOUND_MS * (script.length + 2), interval: 10 },
    );
    // Each unanswered check ended a life within the bound.
    // (Checks run beside the pump: several can hang in one life, which one life's end covers.)
    for (const started of unanswered) {
      expect(retries.find((r) => r >= started)! - started).toBeLessThan(BOUND_MS);
    }
  } finally {
    clearInterval(feeder);
    await relay.close();
  }
}

describe('outbox relay: the other-writer check ends its life within a bound (liveness)', () => {
  it('a check the broker never answers ends the life within connectTimeoutMs; the relay goes on', async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.array(fc.constantFrom<Answer>('answer', 'late', 'hang', 'hangLost'), {
          minLength: 1,
          maxLength: 4,
        }),
        live,
      ),
      { numRuns: 12, interruptAfterTimeLimit: 60_000 },
    );
  });
});
