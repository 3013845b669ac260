/**
 * migrate() and `stream-dedup migrate` are bounded (found unbounded by hostile review B, M3): a paused
 * migrate of the same schema, holding the migration lock, makes the others give up with
 * DEDUP_STORE_REFUSED within their bound instead of waiting for ever.
 */
import pg from 'pg';
import { afterEach, describe, expect, it } from 'vitest';
import { DedupError } from '../../src/errors.js';
import { migrateFromUrl } from '../../src/postgres/migrate-command.js';
import { migrate } from '../../src/postgres/schema.js';
import { PG_URL, useSchema } from '../support/postgres.js';

const cleanups: Array<() => Promise<void>> = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

/** A schema whose migration lock another session holds, inside its transaction (a paused migrate). */
async function lockedSchema() {
  const db = await useSchema({ migrated: false });
  cleanups.push(db.drop);
  const other = await db.pool.connect();
  await other.query('BEGIN');
  await other.query('SELECT pg_advisory_xact_lock(hashtext($1))', [`stream-dedup:${db.schema}`]);
  cleanups.push(async () => {
    await other.query('ROLLBACK');
    other.release();
  });
  return db;
}

describe('migrate - bounded waits', () => {
  it.each([
    [
      'stream-dedup migrate (its connect time-out, 1 s)',
      (schema: string) => migrateFromUrl(PG_URL, schema, 1_000),
    ],
    [
      'migrate() with timeoutMs 1 s',
      (schema: string, pool?: unknown) => migrate(pool as never, { schema, timeoutMs: 1_000 }),
    ],
  ])('%s gives up on the migration lock with DEDUP_STORE_REFUSED', async (_what, run) => {
    const db = await lockedSchema();
    const started = Date.now();
    // Before the fix: still waiting after 8 s (no lock_timeout, statement_timeout or query_timeout).
    const err = await Promise.race([
      run(db.schema, db.pool).then(
        () => 'migrated',
        (e: unknown) => e,
      ),
      new Promise((resolve) => setTimeout(() => resolve('still waiting after 8 s'), 8_000)),
    ]);
    const elapsed = Date.now() - started;
    expect(err).toBeInstanceOf(DedupError);
    expect((err as DedupError).code).toBe('DEDUP_STORE_REFUSED');
    expect(String((err as DedupError).cause)).toMatch(/lock timeout|statement timeout/);
    expect(elapsed).toBeGreaterThanOrEqual(900);
    expect(elapsed).toBeLessThan(4_000);
  });

  it('migrate() on a pool the application has exhausted (no connectionTimeoutMillis) gives up within timeoutMs', async () => {
    const db = await useSchema({ migrated: false });
    cleanups.push(db.drop);
    const pool = new pg.Pool({ connectionString: PG_URL, max: 1 });
    pool.on('error', () => undefined);
    cleanups.push(() => pool.end());
    // The application holds the pool's one connection (a long report, a leaked client).
    const held = await pool.connect();
    cleanups.push(() => Promise.resolve(held.release()));
    const started = Date.now();
    const outcome = await Promise.race([
      migrate(pool, { schema: db.schema, timeoutMs: 500 }).then(
        () => 'migrated',
        (e: unknown) => e,
      ),
      new Promise((resolve) => setTimeout(() => resolve('still waiting after 5 s'), 5_000)),
    ]);
    const elapsed = Date.now() - started;
    // Before the bound: still waiting after 5 s.
    expect(outcome).toBeInstanceOf(DedupError);
    expect((outcome as DedupError).code).toBe('DEDUP_STORE_REFUSED');
    expect(String((outcome as DedupError).cause)).toContain(
      'no connection from the pool within timeoutMs (500 ms)',
    );
    expect(elapsed).toBeGreaterThanOrEqual(450);
    expect(elapsed).toBeLessThan(2_000);
  });
});
