/**
 * migrate() and `stream-dedup migrate` are bounded (found unbounded by hostile review B, M3): a paused
 * migrate of the same schema, holding the migration lock, makes the others give up with
 * DEDUP_STORE_REFUSED within their bound instead of waiting for ever.
 */
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
});
