/**
 * `stream-dedup inspect postgres://… --schema S` against the real server (`scripts/postgres.sh`):
 * what a consumer committed, read in one read-only transaction while a batch holds the offset row;
 * refusals typed and within a second; nothing written.
 */
import { afterEach, describe, expect, it } from 'vitest';
import type pg from 'pg';
import { inspectPostgresRows } from '../../src/cli/inspect.js';
import { VerifyingConsumerCore } from '../../src/consumer/core.js';
import { DedupError } from '../../src/errors.js';
import { identityHeaders } from '../../src/identity/headers.js';
import { postgresHandler } from '../../src/postgres/handler.js';
import { readPostgresStore } from '../../src/postgres/inspect.js';
import { PostgresStore } from '../../src/postgres/store.js';
import { runCli } from '../support/cli.js';
import { PG_URL, uniqueSchema, useSchema } from '../support/postgres.js';

const cleanups: Array<() => Promise<void>> = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

/** Everything the store's tables hold, to compare before and after. */
async function snapshot(pool: pg.Pool, schema: string): Promise<string> {
  const parts = await Promise.all(
    ['stream_dedup_meta', 'consumer_offsets', 'scope_states'].map(async (table) => {
      const { rows } = await pool.query(`SELECT * FROM "${schema}".${table} ORDER BY 1, 2`);
      return JSON.stringify(rows);
    }),
  );
  return parts.join('\n');
}

describe('stream-dedup inspect of a PostgreSQL store', () => {
  it('postgres - shows the version, the committed offset and every scope while a batch holds the offset row; writes nothing', async () => {
    const db = await useSchema();
    cleanups.push(db.drop);
    const { pool, schema } = db;
    const store = await PostgresStore.open({ pool, schema });
    cleanups.push(() => store.close());
    const core = await VerifyingConsumerCore.open({
      consumerName: 'ledger',
      store,
      commitEvery: 2,
      handler: postgresHandler(() => undefined),
    });
    const plan: Array<[string, number]> = [
      ['p', 1],
      ['q', 4],
      ['p', 2],
      ['p', 2], // a copy
    ];
    for (const [i, [producer, id]] of plan.entries()) {
      await core.process({
        offset: BigInt(i),
        content: Buffer.alloc(0),
        applicationProperties: identityHeaders(producer, BigInt(id)),
      });
    }
    await core.flush();
    await core.close();
    const before = await snapshot(pool, schema);
    // A batch of another process holds the offset row: a read-only snapshot does not wait for it.
    const holder = await pool.connect();
    cleanups.push(async () => {
      await holder.query('ROLLBACK').catch(() => undefined);
      holder.release();
    });
    await holder.query('BEGIN');
    await holder.query(`SELECT * FROM "${schema}".consumer_offsets FOR UPDATE`);

    const started = Date.now();
    const contents = await readPostgresStore(PG_URL, schema);
    const took = Date.now() - started;
    expect(contents.version).toBe(1);
    const inspection = inspectPostgresRows(contents);
    expect(inspection.consumers).toEqual([{ consumerName: 'ledger', committedOffset: 3n }]);
    expect(inspection.scopes.map((s) => [s.consumer, s.producer, s.highest])).toEqual([
      ['ledger', 'p', 2n],
      ['ledger', 'q', 4n],
    ]);

    const cli = await runCli(['inspect', PG_URL, '--schema', schema, '--json']);
    expect(cli.stderr).toBe('');
    expect(cli.code).toBe(0);
    const printed = JSON.parse(cli.stdout) as {
      store: string;
      consumers: Array<{ consumerName: string; committedOffset: string }>;
      scopes: Array<{ producer: string; highest: string }>;
    };
    expect(printed.store).toMatch(new RegExp(`:\\*\\*\\*@.* schema ${schema} \\(version 1\\)$`));
    expect(printed.store).not.toContain(new URL(PG_URL).password);
    expect(printed.consumers).toEqual([{ consumerName: 'ledger', committedOffset: '3' }]);
    expect(printed.scopes.map((s) => [s.producer, s.highest])).toEqual([
      ['p', '2'],
      ['q', '4'],
    ]);
    await holder.query('ROLLBACK');
    expect(await snapshot(pool, schema)).toBe(before);
    console.log(`[postgres inspect] read in ${took} ms beside a held offset row`);
  });

  it('postgres - a wrong password, an unknown database, a missing schema and another version are DEDUP_STORE_REFUSED within a second, nothing created or written', async () => {
    const db = await useSchema();
    cleanups.push(db.drop);
    const { pool, schema } = db;
    const other = await useSchema();
    cleanups.push(other.drop);
    await other.pool.query(`UPDATE "${other.schema}".stream_dedup_meta SET version = 2`);
    const missing = uniqueSchema();
    const url = (change: (u: URL) => void) => {
      const u = new URL(PG_URL);
      change(u);
      return u.toString();
    };
    const before = [await snapshot(pool, schema), await snapshot(other.pool, other.schema)];
    const cases: Array<[string, string, string, RegExp]> = [
      ['wrong password', url((u) => (u.password = 'nope')), schema, /password was refused/],
      ['unknown database', url((u) => (u.pathname = '/no_such_db_sd')), schema, /database does not exist/],
      ['missing schema', PG_URL, missing, /cannot read schema|does not exist/],
      ['another version', PG_URL, other.schema, /version 2/],
    ];
    for (const [what, target, s, message] of cases) {
      const started = Date.now();
      const err = await readPostgresStore(target, s).then(
        () => undefined,
        (e: unknown) => e,
      );
      const took = Date.now() - started;
      expect(err, what).toBeInstanceOf(DedupError);
      expect((err as DedupError).code, what).toBe('DEDUP_STORE_REFUSED');
      expect((err as DedupError).message, what).toMatch(message);
      expect(took, what).toBeLessThan(1_000);
      console.log(`[postgres inspect refused] ${what}: ${took} ms`);
    }
    const { rows } = await pool.query('SELECT 1 FROM pg_namespace WHERE nspname = $1', [missing]);
    expect(rows).toEqual([]);
    expect([await snapshot(pool, schema), await snapshot(other.pool, other.schema)]).toEqual(before);
    // The command line: exit code 4 and one line naming the code; a bad schema name before any I/O.
    const cli = await runCli(['inspect', PG_URL, '--schema', missing]);
    expect(cli.code).toBe(4);
    expect(cli.stderr).toMatch(/^error: DEDUP_STORE_REFUSED: /);
    await expect(readPostgresStore(PG_URL, 'Bad-Name')).rejects.toThrow(RangeError);
    const noSchema = await runCli(['inspect', PG_URL]);
    expect(noSchema.code).toBe(2);
    expect(noSchema.stderr).toMatch(/needs --schema/);
  });
});
