/**
 * `stream-dedup migrate`: {@link migrate} from the command line, on a pool of its own. The CLI
 * loads this file only for that command, so that nothing else of it needs `pg`.
 */
import pg from 'pg';
import { migrate, type MigrateResult } from './schema.js';

/**
 * Connects to `url`, migrates `schema` and closes the pool; `connectTimeoutMs` also bounds the wait
 * for the migration lock and each statement.
 *
 * @throws TypeError, RangeError for a bad schema name, before any I/O.
 * @throws DedupError `DEDUP_STORE_REFUSED` (see {@link migrate}).
 */
export async function migrateFromUrl(
  url: string,
  schema: string,
  connectTimeoutMs = 10_000,
): Promise<MigrateResult> {
  const pool = new pg.Pool({ connectionString: url, connectionTimeoutMillis: connectTimeoutMs, max: 1 });
  pool.on('error', () => undefined);
  try {
    // One bound for the whole command: connecting, the migration lock, each statement.
    return await migrate(pool, { schema, timeoutMs: connectTimeoutMs });
  } finally {
    await pool.end().catch(() => undefined);
  }
}
