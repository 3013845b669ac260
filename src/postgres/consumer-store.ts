/**
 * The PostgreSQL implementation of the verifying consumer's store (docs/design.md §13). A batch is
 * one transaction on one connection: opened before the batch's first message, its offset row locked
 * (`SELECT … FOR UPDATE`) and compared with what this process last committed; the handlers run
 * their SQL in it; its commit writes the verifier state of every scope it touched and the offset,
 * then COMMIT. Batches do not overlap: the next one opens once the previous one has committed.
 */
import type pg from 'pg';
import type { Pool, PoolClient } from 'pg';
import type { ChunkIdentity } from '../store/chunk-identity.js';
import type { ConsumerStore, Rewind, StoreBatch } from '../consumer/consumer-store.js';
import { DedupError } from '../errors.js';
import { offsetKey, scopeKeyOfStateKey } from '../store/consumer-keys.js';
import { Backoff } from '../util/backoff.js';
import { HandlerTransaction } from './handler-client.js';
import { CHUNK_COLUMNS, offsetRow, type OffsetRow, type StoredOffset } from './offset-row.js';
import { checkout, type CheckedOut } from './checkout.js';
import { errorCode, refusal } from './refusal.js';
import type { Tables } from './schema.js';

/** How the store bounds its waits, in ms. */
export interface TransactionLimits {
  /** `lock_timeout` of each batch: how long it waits for the offset row another process holds. */
  readonly lockTimeoutMs: number;
  /**
   * `idle_in_transaction_session_timeout` of each batch: a batch left open this long (a paused or
   * hung process) is ended by the server, which frees the offset row for the other process.
   */
  readonly idleInTransactionTimeoutMs: number;
  /**
   * How long each of the store's own statements may wait for the server's answer (pg's
   * `query_timeout`): a server that accepts and never answers stops the consumer, and `close()`
   * returns, within it.
   */
  readonly queryTimeoutMs: number;
  /**
   * How many times in a row a batch that failed with a serialization failure or a deadlock
   * (SQLSTATE 40001, 40P01) is rolled back and run again before the consumer stops.
   */
  readonly retries: number;
  /**
   * How long the consumer keeps reconnecting after it lost its connection (before or inside a
   * handler) before it stops; from the first failure since the last commit.
   */
  readonly reconnectTimeoutMs: number;
}

/** SQLSTATEs after which the same batch, run again, may succeed: serialization failure, deadlock. */
const RETRYABLE = new Set(['40001', '40P01']);

/** The backoff between two runs of a batch that failed with a {@link RETRYABLE} error, in ms. */
const RETRY_BACKOFF = { initialDelayMs: 50, maxDelayMs: 2_000 } as const;

/** The backoff between two attempts to reach a server that went away, in ms. */
const RECONNECT_BACKOFF = { initialDelayMs: 100, maxDelayMs: 2_000 } as const;

/**
 * Codes of a lost or refused connection: the server restarting (57P01 admin shutdown, 57P02 crash
 * shutdown, 57P03 starting up), SQLSTATE class 08, and Node.js's socket errors. A time-out is not
 * one of them: a server that accepts and never answers stops the consumer (`queryTimeoutMs`).
 */
const CONNECTION_LOST = new Set(['57P01', '57P02', '57P03', 'ECONNRESET', 'ECONNREFUSED', 'EPIPE']);

/** `err`, then the errors it wraps (a handler or the store may wrap the driver's error). */
function* causes(err: unknown): Generator<unknown> {
  for (let e = err, depth = 0; e !== undefined && e !== null && depth < 4; depth++) {
    yield e;
    e = (e as { cause?: unknown }).cause;
  }
}

/** The SQLSTATE of `err` or of the error it wraps, when running the batch again may succeed. */
function retryableCode(err: unknown): string | undefined {
  for (const e of causes(err)) {
    const code = errorCode(e);
    if (code !== undefined && RETRYABLE.has(code)) return code;
  }
  return undefined;
}

/**
 * True when the server ended the session because its transaction stayed idle past
 * `idle_in_transaction_session_timeout` (SQLSTATE 25P03): the transaction was rolled back.
 */
function endedByServer(err: unknown): boolean {
  for (const e of causes(err)) if (errorCode(e) === '25P03') return true;
  return false;
}

/** True when `err` (or what it wraps) says the connection to the server was lost or refused. */
function connectionLost(err: unknown): boolean {
  for (const e of causes(err)) {
    const code = errorCode(e);
    if (code !== undefined && (CONNECTION_LOST.has(code) || code.startsWith('08'))) return true;
    // pg's own words when the server closes the socket (no code).
    if (
      e instanceof Error &&
      /^Connection terminated|connection error and is not queryable/.test(e.message)
    ) {
      return true;
    }
  }
  return false;
}

/** A statement of the store's own, bounded by `queryTimeoutMs`. */
function bounded(text: string, values: unknown[] | undefined, limits: TransactionLimits): pg.QueryConfig {
  return { text, values, query_timeout: limits.queryTimeoutMs } as pg.QueryConfig;
}

/** The batch transaction in progress. */
interface OpenTransaction {
  readonly client: PoolClient;
  /** Gives `client` back (checkout.ts): its 'error' listener, #onClientError, goes with it. */
  readonly release: CheckedOut['release'];
  /** The transaction's ID: checked again at commit, so that a COMMIT the guard missed is caught. */
  readonly xid: string;
  readonly handlers: Set<HandlerTransaction>;
  misuse: Error | undefined;
}

/**
 * Batches ended in a row by the server for idling (25P03) before the consumer stops: one is a
 * paused process (a fence: it goes on from the stored offset), three are a handler slower than
 * idleInTransactionTimeoutMs.
 */
const IDLE_ENDS_LIMIT = 3;

/**
 * One consumer's PostgreSQL store.
 *
 * @internal
 */
export class PgConsumerStore implements ConsumerStore {
  readonly #pool: Pool;
  readonly #tables: Tables;
  readonly #consumer: string;
  readonly #limits: TransactionLimits;
  readonly #onFailure: (error: Error) => void;
  readonly #release: () => void;
  #committed: bigint | undefined;
  /** The identity of the chunk holding #committed, when stored (stream transport, 0.6.0 on). */
  #committedChunk: ChunkIdentity | undefined;
  #tx: OpenTransaction | undefined;
  #opening: Promise<void> | undefined;
  /** The commit or rollback in flight: the next transaction opens after it. */
  #settling: Promise<void> = Promise.resolve();
  /** Batches run again in a row after a retryable failure (none since the last commit). */
  #retried = 0;
  readonly #retryBackoff = new Backoff(RETRY_BACKOFF);
  /** When the connection was first found lost since the last commit (ms since the epoch). */
  #lostSince: number | undefined;
  readonly #reconnectBackoff = new Backoff(RECONNECT_BACKOFF);
  /**
   * The server ended the open batch's session for idling (SQLSTATE 25P03): the FATAL comes on the
   * client's 'error' event, and the handler's next query then fails "not queryable", which alone
   * reads as a lost connection.
   */
  #endedIdle = false;
  /** Batches ended by the server for idling in a row (none since the last commit). */
  #idleEnds = 0;
  readonly #onClientError = (err: unknown): void => {
    if (endedByServer(err)) this.#endedIdle = true;
  };

  private constructor(
    pool: Pool,
    tables: Tables,
    consumer: string,
    limits: TransactionLimits,
    committed: OffsetRow,
    onFailure: (error: Error) => void,
    release: () => void,
  ) {
    this.#pool = pool;
    this.#tables = tables;
    this.#consumer = consumer;
    this.#limits = limits;
    this.#committed = committed.offset;
    this.#committedChunk = committed.chunk;
    this.#onFailure = onFailure;
    this.#release = release;
  }

  /**
   * Creates the consumer's offset row if it is missing (so that there is always a row to lock) and
   * reads its committed offset.
   *
   * @throws DedupError `DEDUP_STORE_REFUSED` (a read-only role, a missing table, an unreachable server).
   */
  static async open(
    pool: Pool,
    tables: Tables,
    consumer: string,
    limits: TransactionLimits,
    onFailure: (error: Error) => void,
    release: () => void,
  ): Promise<PgConsumerStore> {
    let committed: OffsetRow;
    try {
      await pool.query(
        bounded(
          `INSERT INTO ${tables.offsets} (consumer, committed_offset) VALUES ($1, NULL) ON CONFLICT DO NOTHING`,
          [consumer],
          limits,
        ),
      );
      const found = await pool.query<StoredOffset>(
        bounded(
          `SELECT committed_offset, ${CHUNK_COLUMNS} FROM ${tables.offsets} WHERE consumer = $1`,
          [consumer],
          limits,
        ),
      );
      committed = offsetRow(found.rows[0]);
    } catch (err) {
      release();
      throw refusal(err, `cannot open consumer "${consumer}"`);
    }
    return new PgConsumerStore(pool, tables, consumer, limits, committed, onFailure, release);
  }

  get committedOffset(): bigint | undefined {
    return this.#committed;
  }

  get committedChunk(): ChunkIdentity | undefined {
    return this.#committedChunk;
  }

  async get(key: string): Promise<Uint8Array | undefined> {
    // Through the batch's own connection when one is open (scopes load while a message is verified,
    // inside its batch): a second connection would wait for ever on a pool of one.
    const found = await (this.#tx?.client ?? this.#pool).query<{ state: Buffer }>(
      bounded(
        `SELECT state FROM ${this.#tables.scopes} WHERE consumer = $1 AND scope = $2`,
        [this.#consumer, Buffer.from(scopeKeyOfStateKey(key), 'utf8')],
        this.#limits,
      ),
    );
    return found.rows[0]?.state;
  }

  enter(): Promise<void> | undefined {
    if (this.#tx !== undefined) return undefined;
    return (this.#opening ??= this.#open().finally(() => (this.#opening = undefined)));
  }

  handlerContext(): unknown {
    const tx = this.#tx;
    if (tx === undefined) throw new Error('no batch transaction is open');
    const handler = new HandlerTransaction(
      tx.client,
      (error) => {
        tx.misuse ??= error;
        this.#onFailure(error);
      },
      // A statement of unknown outcome: the commit refuses (and destroys the connection).
      (error) => (tx.misuse ??= error),
    );
    tx.handlers.add(handler);
    return handler;
  }

  releaseContext(context: unknown): void {
    const handler = context as HandlerTransaction;
    handler.revoke();
    this.#tx?.handlers.delete(handler);
  }

  write(batch: StoreBatch): Promise<void> {
    const tx = this.#tx;
    if (tx === undefined) return Promise.reject(new Error('no batch transaction is open'));
    this.#tx = undefined;
    const committing = this.#commit(tx, batch);
    this.#settling = committing.catch(() => undefined);
    return committing;
  }

  discard(): void {
    const tx = this.#tx;
    if (tx === undefined) return;
    this.#tx = undefined;
    this.#settling = this.#rollback(tx);
  }

  recover(error: unknown): Rewind | Error | undefined {
    if (error instanceof DedupError && error.code === 'DEDUP_CONSUMER_FENCED') {
      // #open re-read the stored offset: the consumer goes on from there, with no wait.
      return { kind: 'fenced', delayMs: 0 };
    }
    const endedIdle = this.#endedIdle;
    this.#endedIdle = false;
    if (endedByServer(error) || (endedIdle && connectionLost(error))) {
      // The server ended this batch's transaction after idleInTransactionTimeoutMs (a process
      // paused mid-batch, then resumed): rolled back, so that another process could take the offset
      // row. A fence like the one #open finds: the next batch re-reads the stored offset. The same
      // batch ended so again and again is a handler that idles longer than the limit, not a pause:
      // re-running it would end the same way (review A, finding 5).
      if (++this.#idleEnds >= IDLE_ENDS_LIMIT) {
        return new DedupError(
          'DEDUP_STORE_REFUSED',
          `consumer "${this.#consumer}": the server ended the same batch's transaction ${this.#idleEnds} times ` +
            `in a row for idling (idle_in_transaction_session_timeout = idleInTransactionTimeoutMs, ` +
            `${this.#limits.idleInTransactionTimeoutMs} ms; SQLSTATE 25P03): the handler holds the transaction ` +
            'idle longer than that between its statements (its own work counts as idle). Raise ' +
            'idleInTransactionTimeoutMs (and lockTimeoutMs above it), or do the slow work outside the handler',
          { cause: error },
        );
      }
      return { kind: 'fenced', delayMs: 0 };
    }
    if (connectionLost(error)) {
      const now = Date.now();
      this.#lostSince ??= now;
      if (now - this.#lostSince >= this.#limits.reconnectTimeoutMs) {
        return new DedupError(
          'DEDUP_STORE_REFUSED',
          `consumer "${this.#consumer}" could not reach the database for ${now - this.#lostSince} ms ` +
            `(reconnectTimeoutMs ${this.#limits.reconnectTimeoutMs}): ${error instanceof Error ? error.message : String(error)}`,
          { cause: error },
        );
      }
      return { kind: 'reconnect', delayMs: Math.round(this.#reconnectBackoff.next()) };
    }
    const code = retryableCode(error);
    if (code === undefined) return undefined;
    if (this.#retried >= this.#limits.retries) {
      return new DedupError(
        'DEDUP_STORE_REFUSED',
        `consumer "${this.#consumer}" gave up a batch after ${this.#retried} retries: ` +
          `${code === '40P01' ? 'deadlock' : 'serialization failure'} every time (SQLSTATE ${code}); ` +
          'nothing of it was applied',
        { cause: error },
      );
    }
    this.#retried++;
    return { kind: 'retry', delayMs: Math.round(this.#retryBackoff.next()) };
  }

  async close(): Promise<void> {
    this.discard();
    await this.#opening?.catch(() => undefined);
    this.discard();
    await this.#settling;
    this.#release();
  }

  async #open(): Promise<void> {
    await this.#settling;
    // Before the checkout: #onClientError is on from the hand-over.
    this.#endedIdle = false;
    let held: CheckedOut;
    try {
      // Bounded: a user pool without connectionTimeoutMillis whose connections the application
      // holds would make the batch, and close(), wait for ever.
      held = await checkout(this.#pool, {
        timeoutMs: this.#limits.queryTimeoutMs,
        timeoutName: 'queryTimeoutMs',
        onError: this.#onClientError,
      });
    } catch (err) {
      throw refusal(err, `consumer "${this.#consumer}" cannot reach the database`);
    }
    const { client, release } = held;
    try {
      const { lockTimeoutMs, idleInTransactionTimeoutMs } = this.#limits;
      // READ COMMITTED (docs/design.md §13: why it suffices); one round trip for the three. READ
      // WRITE whatever the session's default (a handler's SET SESSION CHARACTERISTICS outlives its batch).
      await client.query(
        bounded(
          `BEGIN ISOLATION LEVEL READ COMMITTED, READ WRITE; SET LOCAL lock_timeout = ${lockTimeoutMs}; ` +
            `SET LOCAL idle_in_transaction_session_timeout = ${idleInTransactionTimeoutMs}`,
          undefined,
          this.#limits,
        ),
      );
      const found = await client.query<StoredOffset & { xid: string }>(
        bounded(
          `SELECT committed_offset, ${CHUNK_COLUMNS}, pg_current_xact_id()::text AS xid FROM ${this.#tables.offsets} ` +
            'WHERE consumer = $1 FOR UPDATE',
          [this.#consumer],
          this.#limits,
        ),
      );
      const row = found.rows[0];
      if (row === undefined) {
        throw new DedupError(
          'DEDUP_STORE_REFUSED',
          `the offset row of consumer "${this.#consumer}" was deleted while it ran`,
        );
      }
      const { offset: stored, chunk } = offsetRow(row);
      if (stored !== this.#committed) {
        const mine = this.#committed;
        // Where to resume: what the other process committed (see recover()).
        this.#committed = stored;
        this.#committedChunk = chunk;
        throw new DedupError(
          'DEDUP_CONSUMER_FENCED',
          `consumer "${this.#consumer}" is fenced: its committed offset moved from ${mine ?? 'none'} ` +
            `to ${stored ?? 'none'} under it, so another process consumes under this name; nothing of ` +
            'this batch was applied',
        );
      }
      this.#tx = { client, release, xid: row.xid, handlers: new Set(), misuse: undefined };
    } catch (err) {
      // The connection is destroyed, not asked to ROLLBACK: the server rolls back a transaction
      // whose connection goes, and a server that does not answer would not answer that either.
      release(destroyOn(err));
      throw err instanceof DedupError
        ? err
        : refusal(err, `consumer "${this.#consumer}" cannot begin a batch`);
    }
  }

  async #commit(tx: OpenTransaction, batch: StoreBatch): Promise<void> {
    const { client, release } = tx;
    for (const handler of tx.handlers) handler.revoke();
    try {
      if (tx.misuse !== undefined) throw tx.misuse;
      // FIRST, before any other write: the transaction must still be the one that locked the row.
      // A handler's COMMIT or ROLLBACK that the guard missed would have ended it, and every later
      // statement would run in autocommit: a scope state written then would mark the batch's IDs
      // as seen while its effects were rolled back (lost on restart). In autocommit this UPDATE
      // matches no row (a fresh xid): nothing of the library's is written (a missed COMMIT has
      // committed the handlers' effects before it: said loudly).
      const updated = await client.query(
        bounded(
          `UPDATE ${this.#tables.offsets} SET committed_offset = $2, chunk_first_offset = $4, ` +
            'chunk_timestamp = $5 WHERE consumer = $1 AND pg_current_xact_id()::text = $3',
          [
            this.#consumer,
            batch.lastOffset.toString(),
            tx.xid,
            batch.lastChunk?.firstOffset.toString() ?? null,
            batch.lastChunk?.timestamp.toString() ?? null,
          ],
          this.#limits,
        ),
      );
      if (updated.rowCount !== 1) {
        throw new TypeError(
          `consumer "${this.#consumer}": the batch's transaction was ended inside a handler (a COMMIT or ROLLBACK ` +
            'run through the client): nothing of this batch is committed by the library',
        );
      }
      const scopes: Buffer[] = [];
      const states: Buffer[] = [];
      const ownOffset = offsetKey(this.#consumer);
      for (const op of batch.ops) {
        if (op.key === ownOffset) continue;
        if (op.type !== 'put') throw new Error(`a batch may not delete (${op.key})`);
        scopes.push(Buffer.from(scopeKeyOfStateKey(op.key), 'utf8'));
        states.push(Buffer.from(op.value.buffer, op.value.byteOffset, op.value.byteLength));
      }
      if (scopes.length > 0) {
        await client.query(
          bounded(
            `INSERT INTO ${this.#tables.scopes} (consumer, scope, state) ` +
              'SELECT $1, s, v FROM unnest($2::bytea[], $3::bytea[]) AS t(s, v) ' +
              'ON CONFLICT (consumer, scope) DO UPDATE SET state = excluded.state',
            [this.#consumer, scopes, states],
            this.#limits,
          ),
        );
      }
      await client.query(bounded('COMMIT', undefined, this.#limits));
    } catch (err) {
      // Destroyed, not rolled back by a statement (see #open).
      release(destroyOn(err));
      // The library's own refusals as they are; the server's and the driver's (a time-out) in words.
      throw err instanceof DedupError || err instanceof TypeError
        ? err
        : refusal(err, `consumer "${this.#consumer}" cannot commit a batch`);
    }
    release();
    this.#committed = batch.lastOffset;
    this.#committedChunk = batch.lastChunk;
    this.#retried = 0;
    this.#retryBackoff.reset();
    this.#lostSince = undefined;
    this.#reconnectBackoff.reset();
    this.#idleEnds = 0;
  }

  async #rollback(tx: OpenTransaction): Promise<void> {
    // A handler may still be running (a group member's partition revoked mid-handler): its later
    // queries are refused as rolled back, not as a misuse that would stop the consumer (L4).
    for (const handler of tx.handlers) handler.discard();
    let failed: unknown;
    await tx.client
      .query(bounded('ROLLBACK', undefined, this.#limits))
      .catch((err: unknown) => (failed = err ?? true));
    tx.release(failed === undefined ? undefined : destroyOn(failed));
  }
}

/** What a failed connection is destroyed with (release's argument): the error, or true. */
function destroyOn(err: unknown): Error | true {
  return err instanceof Error ? err : true;
}
