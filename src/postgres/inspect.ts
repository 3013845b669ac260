/**
 * `stream-dedup inspect postgres://… --schema S`: reads what a PostgreSQL store holds, in one
 * read-only transaction (a snapshot: offsets and scopes of one moment), on a connection of its own.
 * The CLI loads this file only for that command, so that nothing else of it needs `pg`; it decodes
 * and prints what is returned here.
 */
import pg from 'pg';
import { DedupError } from '../errors.js';
import { checkout } from './checkout.js';
import { refusal } from './refusal.js';
import { checkSchema, checkSchemaName, SCHEMA_VERSION, tablesOf } from './schema.js';

/** What a PostgreSQL store holds, undecoded (the CLI decodes scopes as it does LevelDB's). */
export interface PostgresStoreContents {
  readonly schema: string;
  /** The schema's version (this library's: another version is refused). */
  readonly version: number;
  /** Every consumer's offset row, by name; `undefined` until its first batch committed. */
  readonly offsets: ReadonlyArray<{
    readonly consumer: string;
    readonly committedOffset: bigint | undefined;
  }>;
  /** Every verifier scope: its key (as the LevelDB store spells it) and its encoded state. */
  readonly scopes: ReadonlyArray<{ readonly scopeKey: string; readonly state: Uint8Array }>;
}

/**
 * Connects to `url` and reads the store in `schema` in a `READ ONLY` transaction: writes nothing,
 * takes no lock a consumer waits for. `timeoutMs` bounds the connection and each statement.
 *
 * @throws TypeError, RangeError for a bad schema name, before any I/O.
 * @throws DedupError `DEDUP_STORE_REFUSED` for a wrong password, an unknown database, an unreachable
 *   server, a missing schema or one of another version; the server's error is the `cause`.
 */
export async function readPostgresStore(
  url: string,
  schema: string,
  timeoutMs = 10_000,
): Promise<PostgresStoreContents> {
  checkSchemaName(schema);
  const t = tablesOf(schema);
  const pool = new pg.Pool({
    connectionString: url,
    connectionTimeoutMillis: timeoutMs,
    query_timeout: timeoutMs,
    max: 1,
  });
  pool.on('error', () => undefined);
  try {
    let held;
    try {
      held = await checkout(pool);
    } catch (err) {
      throw refusal(err, 'cannot connect to PostgreSQL');
    }
    const { client } = held;
    let failed: unknown;
    try {
      await client.query(
        `BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY; SET LOCAL statement_timeout = ${timeoutMs}`,
      );
      await checkSchema(client, schema);
      const offsets = await client.query<{ consumer: string; committed_offset: string | null }>(
        `SELECT consumer, committed_offset FROM ${t.offsets} ORDER BY consumer`,
      );
      const scopes = await client.query<{ scope: Buffer; state: Buffer }>(
        `SELECT scope, state FROM ${t.scopes} ORDER BY consumer, scope`,
      );
      await client.query('ROLLBACK');
      return {
        schema,
        version: SCHEMA_VERSION,
        offsets: offsets.rows.map((r) => ({
          consumer: r.consumer,
          committedOffset: r.committed_offset === null ? undefined : BigInt(r.committed_offset),
        })),
        scopes: scopes.rows.map((r) => ({ scopeKey: r.scope.toString('utf8'), state: r.state })),
      };
    } catch (err) {
      failed = err;
      throw err instanceof DedupError ? err : refusal(err, `cannot read schema "${schema}"`);
    } finally {
      held.release(failed === undefined ? undefined : true);
    }
  } finally {
    await pool.end().catch(() => undefined);
  }
}
