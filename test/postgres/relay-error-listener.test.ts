/**
 * Every connection the relay takes from the pool has an 'error' listener the moment the pool hands
 * it over. A checked-out pg client has none (pg-pool takes its own off), and a new client's
 * ReadyForQuery and a dying server's FATAL can arrive in one socket read: pg parses both in one
 * loop and emits the FATAL before an awaited promise's continuation runs. With the listener added
 * after `await pool.connect()`, that emit threw from the socket handler: an uncaught exception in
 * the host process (CI, a PostgreSQL SIGKILL).
 */
import { afterEach, describe, expect, it, vi } from 'vitest';
import { broker, FakeDb, fakePool, FakeTransport, resetBroker } from '../support/relay-fakes.js';

vi.mock('../../src/transport/stream-transport.js', () => ({ StreamTransport: FakeTransport }));

const { PgOutboxRelay } = await import('../../src/postgres/outbox/relay.js');

afterEach(resetBroker);

describe('outbox relay - pool connections', () => {
  it("has an 'error' listener on every connection as the pool hands it over", async () => {
    const db = new FakeDb();
    db.outbox.push({ id: 1n, body: Buffer.from('r1') });
    interface Handed {
      on: (event: string, fn: unknown) => unknown;
    }
    const inner: {
      connect: (
        callback?: (err: Error | undefined, c: Handed | undefined) => void,
      ) => Promise<Handed> | undefined;
    } = fakePool(db) as never;
    /** Per hand-over: the 'error' listeners the relay had added when the pool's hand-over returned. */
    const atHandOver: number[] = [];
    const pool = {
      connect: (callback?: (err: Error | undefined, c: unknown) => void) => {
        if (callback === undefined) {
          // The promise form: nothing can be added before the caller's continuation runs.
          atHandOver.push(0);
          return inner.connect();
        }
        void inner.connect((err, c) => {
          let handed: Handed | undefined;
          let listeners = 0;
          if (c !== undefined) {
            handed = new Proxy(c, {
              get: (target, key, receiver) =>
                key === 'on'
                  ? (event: string, fn: unknown) => {
                      if (event === 'error') listeners++;
                      return target.on(event, fn);
                    }
                  : (Reflect.get(target, key, receiver) as unknown),
            });
          }
          callback(err, handed);
          // What pg would do next in the same parse loop: emit a FATAL on this client.
          atHandOver.push(listeners);
        });
        return undefined;
      },
    };
    const relay = await PgOutboxRelay.open({
      pool: pool as never,
      schema: 'listeners',
      producerName: 'listeners',
      stream: 's',
      leaseTimeoutMs: 0,
      pollIntervalMs: 5,
      closeTimeoutMs: 0,
    });
    try {
      await vi.waitFor(() => expect(broker.published.length).toBeGreaterThan(0), { timeout: 5_000 });
    } finally {
      await relay.close();
    }
    // The schema check's, the lock's and the work connection's, at least.
    expect(atHandOver.length).toBeGreaterThanOrEqual(3);
    expect(atHandOver.filter((n) => n === 0)).toEqual([]);
  });
});
