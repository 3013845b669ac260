/**
 * The PostgreSQL store's schema (docs/design.md §13): versioned, in a schema the application names,
 * created or upgraded only by {@link migrate} (or `stream-dedup migrate`), and checked by every open.
 */
import type { Pool, PoolClient } from 'pg';
import { DedupError } from '../errors.js';
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
 *   its rights, or holds a newer version of the schema; the server's error is the `cause`.
 * @remarks Since 0.6.0
 */
export async function migrate(pool: Pool, options: { readonly schema: string }): Promise<MigrateResult> {
  const schema = checkSchemaName(options?.schema);
  const t = tablesOf(schema);
  let client: PoolClient | undefined;
  try {
    client = await pool.connect();
    await client.query('BEGIN');
    // One migration at a time: the key is the schema's name.
    await client.query('SELECT pg_advisory_xact_lock(hashtext($1))', [`stream-dedup:${schema}`]);
    await client.query(`CREATE SCHEMA IF NOT EXISTS "${schema}"`);
    await client.query(
      `CREATE TABLE IF NOT EXISTS ${t.meta} (
         singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
         version integer NOT NULL)`,
    );
    const found = await client.query<{ version: number }>(`SELECT version FROM ${t.meta}`);
    const previous = found.rows[0]?.version;
    if (previous !== undefined && previous > SCHEMA_VERSION) {
      throw new DedupError(
        'DEDUP_STORE_REFUSED',
        `schema "${schema}" is of version ${previous}, newer than this library's ${SCHEMA_VERSION}: upgrade stream-dedup`,
      );
    }
    if (previous === undefined) {
      await client.query(
        `CREATE TABLE ${t.offsets} (
           consumer text PRIMARY KEY,
           committed_offset bigint)`,
      );
      await client.query(
        `CREATE TABLE ${t.scopes} (
           consumer text NOT NULL,
           scope bytea NOT NULL,
           state bytea NOT NULL,
           PRIMARY KEY (consumer, scope))`,
      );
      await client.query(`INSERT INTO ${t.meta} (version) VALUES ($1)`, [SCHEMA_VERSION]);
    }
    await client.query('COMMIT');
    return { version: SCHEMA_VERSION, previousVersion: previous };
  } catch (err) {
    await client?.query('ROLLBACK').catch(() => undefined);
    throw err instanceof DedupError ? err : refusal(err, `cannot migrate schema "${schema}"`);
  } finally {
    client?.release();
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
