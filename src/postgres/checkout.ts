/**
 * `checkout`: a connection from a `pg` pool with an 'error' listener on it from the moment the pool
 * hands it over until it goes back. Every connection the library takes goes through here.
 *
 * Why not `await pool.connect()`: a checked-out client has no 'error' listener (pg-pool takes its
 * own off before the hand-over), and a new client's ReadyForQuery and a dying server's FATAL can
 * come in one socket read. pg parses both in one loop: the first resolves the checkout, the second
 * is emitted at once, before an awaited promise's continuation could add a listener, and an 'error'
 * emitted with none throws from the socket handler — an uncaught exception in the host process
 * (seen in CI at a PostgreSQL SIGKILL). pg-pool calls a callback synchronously as it hands the
 * client over, so a listener added there is on before the next message is parsed.
 */
import type { Pool, PoolClient } from 'pg';

/** A connection of the pool and how to give it back. */
export interface CheckedOut {
  readonly client: PoolClient;
  /**
   * Takes the checkout's 'error' listener off and gives the connection back to the pool, or with
   * `destroy` (true, or the error that broke it) has the pool close it. A second call does nothing.
   */
  readonly release: (destroy?: boolean | Error) => void;
}

/** How a checkout waits, and who hears the connection's errors. */
export interface CheckoutOptions {
  /**
   * The longest wait for a connection, in ms: a pool without `connectionTimeoutMillis` whose
   * connections are all held waits for ever. A connection that comes later goes back to the pool.
   */
  readonly timeoutMs?: number;
  /** The option `timeoutMs` comes from, named in the time-out's error (which one to raise). */
  readonly timeoutName?: string;
  /** Ends the wait at once, rejecting with the signal's reason; a connection that comes later goes back. */
  readonly signal?: AbortSignal;
  /**
   * The connection's 'error' listener until release. By default errors are ignored here: the next
   * query on a broken connection fails, and that is where the caller hears of it.
   */
  readonly onError?: (err: Error) => void;
}

const ignore = (): void => undefined;

/**
 * Takes a connection of `pool` (see the file's comment for why not `await pool.connect()`).
 *
 * @throws the pool's error; `Error` "no connection from the pool within <timeoutName> (N ms)" after
 *   `timeoutMs`;
 *   the signal's reason once it aborts.
 */
export function checkout(pool: Pool, options: CheckoutOptions = {}): Promise<CheckedOut> {
  const { timeoutMs, timeoutName, signal, onError = ignore } = options;
  return new Promise<CheckedOut>((resolve, reject) => {
    /** Resolved, rejected or timed out: a client that arrives after goes back to the pool. */
    let settled = false;
    let timer: NodeJS.Timeout | undefined;
    const onAbort = (): void => fail(signal?.reason ?? new Error('the checkout was aborted'));
    const done = (): void => {
      settled = true;
      if (timer !== undefined) clearTimeout(timer);
      signal?.removeEventListener('abort', onAbort);
    };
    const fail = (err: unknown): void => {
      if (settled) return;
      done();
      reject(err instanceof Error ? err : new Error(String(err)));
    };
    const take = (client: PoolClient): void => {
      if (settled) {
        // Nobody waits for it any more: back to the pool, on a later microtask. pg-pool hands a
        // released connection to the next request in its queue within release(), and a pool
        // without connectionTimeoutMillis keeps every abandoned request queued: given back here,
        // in the same stack, a few thousand of them overflowed it (a review's measurement) and
        // left the connection checked out with no listener at all.
        client.on('error', ignore);
        queueMicrotask(() => {
          client.removeListener('error', ignore);
          client.release();
        });
        return;
      }
      client.on('error', onError);
      let released = false;
      const release = (destroy?: boolean | Error): void => {
        if (released) return;
        released = true;
        // pg-pool puts its own listener back as it takes the connection, destroyed or not; ours
        // would pile up on a connection handed out again.
        client.removeListener('error', onError);
        client.release(destroy);
      };
      done();
      resolve({ client, release });
    };
    if (signal?.aborted === true) return onAbort();
    signal?.addEventListener('abort', onAbort, { once: true });
    if (timeoutMs !== undefined) {
      timer = setTimeout(
        () =>
          fail(
            new Error(
              `no connection from the pool within ${timeoutName === undefined ? '' : `${timeoutName} `}(${timeoutMs} ms)`,
            ),
          ),
        timeoutMs,
      );
    }
    /** The callback, and a stand-in pool's promise, may both answer: the first counts. */
    let answered = false;
    const answer = (err: unknown, client: PoolClient | undefined): void => {
      if (answered) return;
      answered = true;
      if (client !== undefined && (err === undefined || err === null)) take(client);
      else fail(err ?? new Error('the pool gave no connection'));
    };
    let returned: unknown;
    try {
      returned = pool.connect((err: Error | undefined, client: PoolClient | undefined) =>
        answer(err, client),
      );
    } catch (err) {
      return answer(err, undefined);
    }
    // A pool with only the promise form (a stand-in that ignores the callback).
    if (typeof (returned as { then?: unknown } | undefined)?.then === 'function') {
      (returned as Promise<PoolClient>).then(
        (client) => answer(undefined, client),
        (err: unknown) => answer(err ?? new Error('the pool refused'), undefined),
      );
    }
  });
}
