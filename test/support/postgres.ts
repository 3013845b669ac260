/**
 * The PostgreSQL server of the tests (`bash scripts/postgres.sh up`): its URL from
 * `STREAM_DEDUP_PG_URL`, and a schema of a test's own, migrated, dropped at the end. A test that
 * needs the server fails loudly when it is missing: nothing is skipped.
 */
import { randomBytes } from 'node:crypto';
import pg from 'pg';
import { migrate } from '../../src/postgres/schema.js';

/** The URL the tests connect with. */
export const PG_URL: string =
  process.env.STREAM_DEDUP_PG_URL ?? 'postgres://stream_dedup:stream-dedup@127.0.0.1:5433/stream_dedup';

/** A pool on the tests' server; throws, with the command that starts one, when it does not answer. */
export async function connectPool(url = PG_URL): Promise<pg.Pool> {
  const pool = new pg.Pool({ connectionString: url, connectionTimeoutMillis: 5_000 });
  pool.on('error', () => undefined);
  try {
    await pool.query('SELECT 1');
  } catch (err) {
    await pool.end().catch(() => undefined);
    throw new Error(
      `These tests need PostgreSQL at ${url.replace(/:[^:@/]*@/, ':***@')} but it did not answer ` +
        `(${(err as Error).message}). Start it with \`bash scripts/postgres.sh up\`, or set STREAM_DEDUP_PG_URL.`,
      { cause: err },
    );
  }
  return pool;
}

/** A schema name of the test's own. */
export function uniqueSchema(prefix = 'sd_test'): string {
  return `${prefix}_${randomBytes(6).toString('hex')}`;
}

/** A pool and a fresh migrated schema; `drop()` removes the schema and closes the pool. */
export async function useSchema(options: { migrated?: boolean } = {}): Promise<{
  pool: pg.Pool;
  schema: string;
  drop: () => Promise<void>;
}> {
  const pool = await connectPool();
  const schema = uniqueSchema();
  if (options.migrated !== false) await migrate(pool, { schema });
  return {
    pool,
    schema,
    drop: async () => {
      await pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`).catch(() => undefined);
      await pool.end();
    },
  };
}
