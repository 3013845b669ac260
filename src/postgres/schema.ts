/**
 * The PostgreSQL store's schema (docs/design.md §13): versioned, in a schema the application names,
 * created or upgraded only by {@link migrate} (or `stream-dedup migrate`), and checked by every open.
 */
import type pg from 'pg';
import type { Pool, PoolClient } from 'pg';
import { DedupError } from '../errors.js';
import { integerOption } from '../util/options.js';
import { checkout, type CheckedOut } from './checkout.js';
import { outboxDdl } from './outbox-tables.js';
import { refusal } from './refusal.js';

/** The schema version this library writes and reads. */
export const SCHEMA_VERSION = 1;

/** PostgreSQL's limit on an identifier, in bytes. */
const MAX_IDENTIFIER_BYTES = 63;

/**
 * Checks a schema name: lower-case letters, digits and `_`, starting with a letter or `_`, at most
 * 63 bytes (PostgreSQL truncates longer identifiers silently: two names would share one schema).
 *
 * @throws TypeError, RangeError "Expected schema to be …, got …".
 */
export function checkSchemaName(schema: unknown): string {
  const what = `a PostgreSQL schema name (a-z, 0-9, _; at most ${MAX_IDENTIFIER_BYTES} bytes)`;
  if (typeof schema !== 'string') throw new TypeError(`Expected schema to be ${what}, got ${typeof schema}`);
  if (!/^[a-z_][a-z0-9_]*$/.test(schema) || schema.length > MAX_IDENTIFIER_BYTES) {
    throw new RangeError(`Expected schema to be ${what}, got ${JSON.stringify(schema)}`);
  }
  return schema;
}

/** The SQL names of the store's tables in `schema`. */
export interface Tables {
  readonly meta: string;
  readonly offsets: string;
  readonly scopes: string;
}

/** The tables of `schema` (already checked by {@link checkSchemaName}), quoted. */
export function tablesOf(schema: string): Tables {
  return {
    meta: `"${schema}".stream_dedup_meta`,
    offsets: `"${schema}".consumer_offsets`,
    scopes: `"${schema}".scope_states`,
  };
}

/** What {@link migrate} did. */
export interface MigrateResult {
  /** The schema's version now. */
  readonly version: number;
  /** The version before, or `undefined` when the tables were created by this call. */
  readonly previousVersion: number | undefined;
}

/**
 * Options of {@link migrate}.
 *
 * @remarks Since 0.6.0
 */
export interface MigrateOptions {
  /** The schema to create or check (`^[a-z_][a-z0-9_]*$`, at most 63 bytes). */
  readonly schema: string;
  /**
   * How long the migration may wait, in ms: for a connection of the pool, for the
   * migration lock (another process migrating the same schema), for any other lock, and for each
   * statement (`lock_timeout`, `statement_timeout`, and the driver's `query_timeout` one second
   * later). @defaultValue 30000 @remarks Since 0.6.0
   */
  readonly timeoutMs?: number;
}

/**
 * Creates the store's tables in `schema` (and the schema, if it is missing), or checks that they are
 * of this library's version. Idempotent, and safe to run from several processes at once (a
 * transaction-scoped advisory lock serialises them).
 *
 * @example
 * ```ts
 * import pg from 'pg';
 * import { migrate } from 'stream-dedup/postgres';
 * const pool = new pg.Pool({ connectionString: process.env.DATABASE_URL });
 * await migrate(pool, { schema: 'stream_dedup' });
 * ```
 * @throws TypeError, RangeError for a bad schema name, before any I/O.
 * @throws DedupError `DEDUP_STORE_REFUSED` when the server cannot be reached, refuses the role or
 *   its rights, or holds a newer version of the schema, or when a connection of the pool, the
 *   migration lock or a statement waits past `timeoutMs` (a pool the application has exhausted,
 *   another migrate of the schema paused, a silent server); the server's error is the `cause`.
 * @remarks Since 0.6.0
 */
export async function migrate(pool: Pool, options: MigrateOptions): Promise<MigrateResult> {
  const schema = checkSchemaName(options?.schema);
  const timeoutMs = integerOption(options.timeoutMs, 'timeoutMs', 30_000, 1, 2_147_483_647);
  const t = tablesOf(schema);
  let held: CheckedOut | undefined;
  try {
    // checkout.ts: an 'error' listener from the hand-over (a server dying mid-handshake), and the
    // wait for a connection bounded too (a pool whose connections the application holds).
    held = await checkout(pool, { timeoutMs, timeoutName: 'timeoutMs' });
    const connection = held.client;
    // Each statement: the server gives up at timeoutMs, the driver (a server that does not answer) soon after.
    const run = <R extends pg.QueryResultRow>(text: string, values?: unknown[]) =>
      connection.query<R>({ text, values, query_timeout: timeoutMs + 1_000 } as pg.QueryConfig);
    await run(`BEGIN; SET LOCAL lock_timeout = ${timeoutMs}; SET LOCAL statement_timeout = ${timeoutMs}`);
    // One migration at a time: the key is the schema's name.
    await run('SELECT pg_advisory_xact_lock(hashtext($1))', [`stream-dedup:${schema}`]);
    await run(`CREATE SCHEMA IF NOT EXISTS "${schema}"`);
    await run(
      `CREATE TABLE IF NOT EXISTS ${t.meta} (
         singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
         version integer NOT NULL)`,
    );
    const found = await run<{ version: number }>(`SELECT version FROM ${t.meta}`);
    const previous = found.rows[0]?.version;
    if (previous !== undefined && previous > SCHEMA_VERSION) {
      throw new DedupError(
        'DEDUP_STORE_REFUSED',
        `schema "${schema}" is of version ${previous}, newer than this library's ${SCHEMA_VERSION}: upgrade stream-dedup`,
      );
    }
    if (previous === undefined) {
      await run(
        `CREATE TABLE ${t.offsets} (
           consumer text PRIMARY KEY,
           committed_offset bigint,
           chunk_first_offset bigint,
           chunk_timestamp bigint)`,
      );
      await run(
        `CREATE TABLE ${t.scopes} (
           consumer text NOT NULL,
           scope bytea NOT NULL,
           state bytea NOT NULL,
           PRIMARY KEY (consumer, scope))`,
      );
      await run(`INSERT INTO ${t.meta} (version) VALUES ($1)`, [SCHEMA_VERSION]);
    }
    // The transactional outbox's tables (outbox/tables.ts), idempotent.
    for (const statement of outboxDdl(schema)) await run(statement);
    await run('COMMIT');
    return { version: SCHEMA_VERSION, previousVersion: previous };
  } catch (err) {
    // Destroyed, not asked to ROLLBACK (a silent server would not answer that either): the server
    // rolls back a transaction whose connection goes.
    held?.release(true);
    throw err instanceof DedupError ? err : refusal(err, `cannot migrate schema "${schema}"`);
  } finally {
    // Once: after a destroy above, this does nothing.
    held?.release();
  }
}

/**
 * Checks that `schema` holds this library's tables, of this version.
 *
 * @throws DedupError `DEDUP_STORE_REFUSED` when the schema or its tables are missing, or of
 *   another version.
 */
export async function checkSchema(client: PoolClient, schema: string): Promise<void> {
  const t = tablesOf(schema);
  let version: number | undefined;
  try {
    const found = await client.query<{ version: number }>(`SELECT version FROM ${t.meta}`);
    version = found.rows[0]?.version;
  } catch (err) {
    throw refusal(err, `cannot read schema "${schema}"`);
  }
  if (version !== SCHEMA_VERSION) {
    throw new DedupError(
      'DEDUP_STORE_REFUSED',
      version === undefined
        ? `schema "${schema}" has no version: run migrate() or 'stream-dedup migrate' first`
        : `schema "${schema}" is of version ${version}, this library reads version ${SCHEMA_VERSION}` +
            (version < SCHEMA_VERSION
              ? `: run migrate() or 'stream-dedup migrate' to upgrade it`
              : ': upgrade stream-dedup'),
    );
  }
}
