/**
 * `PostgresStore`: the verifying consumers' store in the application's own PostgreSQL database
 * (docs/design.md §13). Opening it checks the schema's version; each consumer opened on it writes
 * its batches as transactions (consumer-store.ts).
 */
import pg from 'pg';
import type { Pool } from 'pg';
import type { ConsumerStore, ConsumerStoreProvider } from '../consumer/consumer-store.js';
import { DedupError } from '../errors.js';
import { expectObject, integerOption, outOfRange, timerOption, typeMismatch } from '../util/options.js';
import { PgConsumerStore, type TransactionLimits } from './consumer-store.js';
import { checkout } from './checkout.js';
import { refusal } from './refusal.js';
import { checkSchema, checkSchemaName, tablesOf, type Tables } from './schema.js';

/**
 * The options of {@link PostgresStore.open} whatever the connection: see
 * {@link PostgresStoreOptions}, which adds `pool` or `connectionString`.
 *
 * @remarks Since 0.6.0
 */
export interface PostgresStoreCommonOptions {
  /** The schema that {@link migrate} created for the store's tables. */
  readonly schema: string;
  /**
   * How long connecting may take, in ms, with `connectionString` (a pool passed in keeps its own
   * `connectionTimeoutMillis`). @defaultValue 10000
   */
  readonly connectTimeoutMs?: number;
  /**
   * How long a batch waits for its consumer's offset row while another process holds it, in ms
   * (PostgreSQL's `lock_timeout`); past it the consumer stops with `DEDUP_STORE_REFUSED`. Longer
   * than `idleInTransactionTimeoutMs`, so that a paused process's batch ends first (RangeError
   * otherwise).
   * @defaultValue 30000
   */
  readonly lockTimeoutMs?: number;
  /**
   * How long a batch's transaction may stay idle, in ms (PostgreSQL's
   * `idle_in_transaction_session_timeout`): a process paused in the middle of a batch loses its
   * transaction (rolled back by the server) and frees the offset row. A handler's own non-SQL work
   * counts as idle. A consumer's `commitLingerMs` must be less (RangeError when it opens).
   * @defaultValue 15000
   */
  readonly idleInTransactionTimeoutMs?: number;
  /**
   * How long each of the store's own statements (BEGIN, the offset row's lock, the verifier state,
   * the offset, COMMIT, a scope's read) may wait for the server's answer, in ms; more than
   * `lockTimeoutMs`, whose wait it includes (RangeError otherwise). A server that accepts and never answers then stops the
   * consumer with `DEDUP_STORE_REFUSED`, and `close()` returns, within it. The handler's own
   * queries are bounded by the pool's `query_timeout` (set to this with `connectionString`).
   * @defaultValue 60000
   */
  readonly queryTimeoutMs?: number;
  /**
   * How many times in a row a batch that failed with a serialization failure or a deadlock
   * (SQLSTATE 40001, 40P01, raised by the handler's own SQL) is rolled back and run again — the
   * handlers run again on the same messages — with a backoff of 50 ms doubling to 2 s (jittered),
   * before the consumer stops with `DEDUP_STORE_REFUSED` (the last failure as its `cause`). An
   * integer from 0 to 1000. @defaultValue 5 @remarks Since 0.6.0
   */
  readonly retries?: number;
  /**
   * How long a consumer keeps reconnecting, in ms, after its connection was lost or refused (a
   * server restart, a network cut) while it opened a batch or ran a handler: the batch is rolled
   * back (the server did that already) and run again once a connection opens, with a backoff of
   * 100 ms doubling to 2 s (jittered). Past this bound, counted from the first failure since the
   * last commit, it stops with `DEDUP_STORE_REFUSED`. A connection lost during the library's own
   * COMMIT (its outcome unknown) is the same: the next batch locks and reads the offset row, and
   * goes on after the batch if it committed (counted as a fence), from before it if not.
   * 0 stops at the first loss. @defaultValue 60000 @remarks Since 0.6.0
   */
  readonly reconnectTimeoutMs?: number;
}

/**
 * A store on the application's `pg.Pool`.
 *
 * @remarks Since 0.6.0
 */
export interface PostgresStorePoolOptions extends PostgresStoreCommonOptions {
  /** The application's `pg.Pool`: used, never closed, by the store. */
  readonly pool: Pool;
  /** Left out: the pool connects. @defaultValue none */
  readonly connectionString?: undefined;
}

/**
 * A store on a pool of its own.
 *
 * @remarks Since 0.6.0
 */
export interface PostgresStoreUrlOptions extends PostgresStoreCommonOptions {
  /** A connection URL: the store makes a pool of its own and closes it in `close()`. */
  readonly connectionString: string;
  /** Left out: the store makes its own pool. @defaultValue none */
  readonly pool?: undefined;
}

/**
 * Options of {@link PostgresStore.open}: `pool` or `connectionString`, not both. The types say
 * what `open()` checks at run time (a TypeError for a caller the types do not reach).
 *
 * @remarks Since 0.6.0
 */
export type PostgresStoreOptions = PostgresStorePoolOptions | PostgresStoreUrlOptions;

/**
 * The verifying consumers' store in PostgreSQL: pass it as the `store` of a verifying consumer and
 * its handler gets the batch's transaction (see `postgresHandler`). Open it once per process.
 *
 * @example
 * ```ts
 * const store = await PostgresStore.open({ connectionString: process.env.DATABASE_URL, schema: 'stream_dedup' });
 * ```
 * @remarks Since 0.6.0
 */
export class PostgresStore implements ConsumerStoreProvider {
  readonly #pool: Pool;
  readonly #ownsPool: boolean;
  readonly #tables: Tables;
  readonly #limits: TransactionLimits;
  readonly #claims = new Set<string>();
  #closing: Promise<void> | undefined;

  private constructor(pool: Pool, ownsPool: boolean, tables: Tables, limits: TransactionLimits) {
    this.#pool = pool;
    this.#ownsPool = ownsPool;
    this.#tables = tables;
    this.#limits = limits;
  }

  /**
   * Checks the options (before any I/O), connects and checks that the schema is of this library's
   * version.
   *
   * @throws TypeError, RangeError for a bad option, before any I/O.
   * @throws DedupError `DEDUP_STORE_REFUSED` for a wrong password, an unknown database, an
   *   unreachable server, a missing schema or one of another version; the server's error is the
   *   `cause`.
   */
  static async open(options: PostgresStoreOptions): Promise<PostgresStore> {
    expectObject(options, 'options');
    const schema = checkSchemaName(options.schema);
    const { pool: given, connectionString } = options;
    if ((given === undefined) === (connectionString === undefined)) {
      typeMismatch('pool or connectionString', 'exactly one of them', given ?? connectionString);
    }
    if (given !== undefined && !(given instanceof pg.Pool)) typeMismatch('pool', 'a pg.Pool', given);
    if (connectionString !== undefined && (typeof connectionString !== 'string' || connectionString === '')) {
      typeMismatch('connectionString', 'a non-empty string', connectionString);
    }
    const connectTimeoutMs = timerOption(options.connectTimeoutMs, 'connectTimeoutMs', 10_000, 1);
    const limits: TransactionLimits = Object.freeze({
      queryTimeoutMs: integerOption(options.queryTimeoutMs, 'queryTimeoutMs', 60_000, 1, 2_147_483_647),
      lockTimeoutMs: integerOption(options.lockTimeoutMs, 'lockTimeoutMs', 30_000, 1, 2_147_483_647),
      idleInTransactionTimeoutMs: integerOption(
        options.idleInTransactionTimeoutMs,
        'idleInTransactionTimeoutMs',
        15_000,
        1,
        2_147_483_647,
      ),
      retries: integerOption(options.retries, 'retries', 5, 0, 1_000),
      reconnectTimeoutMs: integerOption(
        options.reconnectTimeoutMs,
        'reconnectTimeoutMs',
        60_000,
        0,
        2_147_483_647,
      ),
    });
    // The orderings the design relies on (docs/design.md §13), refused before any I/O.
    if (limits.lockTimeoutMs <= limits.idleInTransactionTimeoutMs) {
      // A live process waiting for the row a paused one holds would give up before the server ends
      // the paused one's batch.
      outOfRange(
        'lockTimeoutMs',
        `more than idleInTransactionTimeoutMs (${limits.idleInTransactionTimeoutMs})`,
        limits.lockTimeoutMs,
      );
    }
    if (limits.queryTimeoutMs <= limits.lockTimeoutMs) {
      // The offset row's lock waits up to lockTimeoutMs inside one statement of the store's.
      outOfRange(
        'queryTimeoutMs',
        `more than lockTimeoutMs (${limits.lockTimeoutMs})`,
        limits.queryTimeoutMs,
      );
    }
    const pool =
      given ??
      new pg.Pool({
        connectionString,
        connectionTimeoutMillis: connectTimeoutMs,
        query_timeout: limits.queryTimeoutMs,
        max: 10,
      });
    // An idle connection's error (the server restarted) is the pool's event: unheard it would
    // crash the process. The next checkout reconnects.
    if (given === undefined) pool.on('error', () => undefined);
    try {
      let held;
      try {
        held = await checkout(pool);
      } catch (err) {
        throw refusal(err, 'cannot connect to PostgreSQL');
      }
      try {
        await checkSchema(held.client, schema);
      } finally {
        held.release();
      }
    } catch (err) {
      if (given === undefined) await pool.end().catch(() => undefined);
      throw err;
    }
    return new PostgresStore(pool, given === undefined, tablesOf(schema), limits);
  }

  /** @internal */
  get commitLingerLimitMs(): number {
    return this.#limits.idleInTransactionTimeoutMs;
  }

  /** @internal */
  async openConsumerStore(consumerName: string, onFailure: (error: Error) => void): Promise<ConsumerStore> {
    if (this.#closing !== undefined) {
      throw new DedupError(
        'DEDUP_STORE_CLOSED',
        `cannot open consumer "${consumerName}": the store is closed`,
      );
    }
    // PostgreSQL's text holds no NUL: such a name could not be stored as it is.
    if (consumerName.includes('\0')) {
      throw new RangeError(
        `Expected consumerName to be a string without NUL characters, got ${JSON.stringify(consumerName)}`,
      );
    }
    if (this.#claims.has(consumerName)) {
      throw new DedupError('DEDUP_STORE_LOCKED', `consumer "${consumerName}" is already open on this store`);
    }
    this.#claims.add(consumerName);
    return PgConsumerStore.open(this.#pool, this.#tables, consumerName, this.#limits, onFailure, () =>
      this.#claims.delete(consumerName),
    );
  }

  /**
   * Closes the store's own pool (one made from `connectionString`); a pool passed in is left open.
   * Close the consumers first. Idempotent.
   */
  close(): Promise<void> {
    this.#closing ??= this.#ownsPool ? this.#pool.end().catch(() => undefined) : Promise.resolve();
    return this.#closing;
  }

  /** Calls {@link PostgresStore.close}. */
  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }
}
