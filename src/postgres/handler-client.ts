/**
 * The client a handler gets (docs/design.md §13): the batch transaction's connection, through
 * `query` only, refusing transaction control (the transaction is the library's) and any use after
 * the handler returned (that SQL would run in a later batch's transaction, or in none).
 */
import pg from 'pg';
import type { PoolClient, QueryConfig } from 'pg';
import { DedupError } from '../errors.js';
import { transactionControlIn } from './transaction-control.js';

/**
 * What a handler may run SQL through: `query`, with node-postgres's signatures.
 *
 * @remarks Since 0.6.0
 */
export type PostgresClient = Pick<PoolClient, 'query'>;

/**
 * The second argument of a handler on a `PostgresStore`: the batch's transaction.
 *
 * @remarks Since 0.6.0
 */
export interface PostgresTransaction {
  /**
   * Runs SQL inside the batch's transaction, which also commits the message's verifier state and
   * the consumer's offset. Usable only until the handler returns.
   *
   * @throws TypeError for a statement that controls the transaction (BEGIN, COMMIT, ROLLBACK, END,
   *   ABORT, SAVEPOINT, RELEASE, PREPARE TRANSACTION), and for any call after the handler returned;
   *   either stops the consumer and rolls the batch back.
   */
  readonly client: PostgresClient;
}

/**
 * A `query` call's first argument as it will be sent: a string, or a fresh copy of a config object
 * (own properties, read once), so that the text checked is the text pg sends, whatever getters or
 * later assignments the caller's object has. `undefined` for what cannot be checked: no text, or a
 * Submittable (pg.Query, a cursor: pg hands it the raw connection and reads its text when it sends it).
 */
function checkable(first: unknown): { query: string | QueryConfig; text: string } | undefined {
  if (typeof first === 'string') return { query: first, text: first };
  if (typeof first !== 'object' || first === null) return undefined;
  if (typeof (first as { submit?: unknown }).submit === 'function') return undefined;
  const copy = { ...(first as QueryConfig) };
  // A copy that still submits (an own `submit`, read once above as not a function) is refused too.
  if (typeof (copy as { submit?: unknown }).submit === 'function') return undefined;
  return typeof copy.text === 'string' ? { query: copy, text: copy.text } : undefined;
}

/** What {@link transactionControlIn} or {@link checkable} found, in words. */
function describe(control: string): string {
  if (control === 'unchecked')
    return 'a query without a text it can check, or a Submittable such as pg.Query or a cursor';
  if (control === '?')
    return 'SQL it cannot read to its end, or that reads differently with standard_conforming_strings off';
  return control.toUpperCase();
}

/**
 * True for an error the server did not send (no SQLSTATE): the driver's `query_timeout`, a lost or
 * closed connection. The statement's outcome is then unknown (it may still run and succeed) while
 * the handler is told it failed: a handler that goes on or retries would commit it twice.
 */
function unknownOutcome(err: unknown): boolean {
  return !(err instanceof pg.DatabaseError);
}

/**
 * One handler call's transaction. `misuse` is told of a refused call (the consumer stops and the
 * batch rolls back, even if the handler swallows the error).
 *
 * @internal
 */
export class HandlerTransaction implements PostgresTransaction {
  readonly client: PostgresClient;
  #usable = true;
  /** Revoked because the batch was rolled back under the running handler (a revoked partition). */
  #discarded = false;

  /**
   * @param poison - told of a query that failed without a SQLSTATE (see {@link unknownOutcome}):
   *   the batch must not commit, its connection is destroyed (the server rolls it back).
   */
  constructor(
    connection: PoolClient,
    misuse: (error: TypeError) => void,
    poison: (error: Error) => void = () => undefined,
  ) {
    const query = (...args: unknown[]): unknown => {
      let error: TypeError | undefined;
      if (this.#discarded) {
        // Not a misuse: the handler is still running, its batch is gone. Refused without stopping
        // the consumer; the message is processed again by whoever holds its stream next.
        const dropped = new DedupError(
          'DEDUP_ABORTED',
          'the batch was rolled back while the handler ran (its partition was revoked, or its ' +
            'subscription lost): nothing of it is committed; the message is processed again',
        );
        const callback = args.at(-1);
        if (typeof callback === 'function') {
          (callback as (err: Error) => void)(dropped);
          return undefined;
        }
        return Promise.reject(dropped);
      }
      if (!this.#usable) {
        error = new TypeError(
          'the PostgreSQL client was used after the handler returned: its SQL would run outside the message’s transaction',
        );
      } else {
        const checked = checkable(args[0]);
        const control = checked === undefined ? 'unchecked' : transactionControlIn(checked.text);
        if (checked !== undefined) args[0] = checked.query;
        if (control !== undefined) {
          error = new TypeError(
            `the handler may not control the batch's transaction (${describe(control)}): ` +
              'the library begins and commits it, with the verifier state and the offset',
          );
        }
      }
      if (error !== undefined) {
        misuse(error);
        const callback = args.at(-1);
        if (typeof callback === 'function') {
          (callback as (err: Error) => void)(error);
          return undefined;
        }
        return Promise.reject(error);
      }
      // The callback forms: the last argument, or a config object's `callback` (copied above).
      const told =
        (callback: unknown) =>
        (err: unknown, ...rest: unknown[]): unknown => {
          if (err !== null && err !== undefined && unknownOutcome(err)) poison(err as Error);
          return (callback as (...a: unknown[]) => unknown)(err, ...rest);
        };
      const last = args.length - 1;
      if (typeof args[last] === 'function') args[last] = told(args[last]);
      const config = args[0] as { callback?: unknown };
      if (typeof config === 'object' && typeof config.callback === 'function') {
        config.callback = told(config.callback);
      }
      const sent = (connection.query as (...a: unknown[]) => unknown)(...args);
      // A promise (pg's own, or the one of the pool's `Promise` option).
      if (typeof (sent as PromiseLike<unknown> | undefined)?.then !== 'function') return sent;
      return Promise.resolve(sent).catch((err: unknown) => {
        if (unknownOutcome(err)) poison(err as Error);
        throw err;
      });
    };
    this.client = Object.freeze({ query: query as PostgresClient['query'] });
  }

  /** The handler returned or threw: every later call is refused. */
  revoke(): void {
    this.#usable = false;
  }

  /**
   * The batch was rolled back while the handler may still run (review B, L4): every later call is
   * refused with `DEDUP_ABORTED`, which is not a misuse and does not stop the consumer.
   */
  discard(): void {
    this.#usable = false;
    this.#discarded = true;
  }
}
