/**
 * The verifying consumer on the PostgreSQL store (issue 34), against the real server of
 * `scripts/postgres.sh`: the core is fed messages directly (the broker's part is the stream test's).
 * Each test has a schema of its own, dropped at the end.
 */
import { afterEach, describe, expect, it } from 'vitest';
import pg from 'pg';
import { VerifyingConsumerCore, type VerifyingConsumerOptions } from '../../src/consumer/core.js';
import type { IncomingMessage } from '../../src/consumer/types.js';
import { DedupError } from '../../src/errors.js';
import { identityHeaders } from '../../src/identity/headers.js';
import { postgresHandler, type PostgresMessageHandler } from '../../src/postgres/handler.js';
import { migrate, SCHEMA_VERSION } from '../../src/postgres/schema.js';
import { PostgresStore } from '../../src/postgres/store.js';
import { runCli } from '../support/cli.js';
import { FaultProxy } from '../support/proxy.js';
import { PG_URL, uniqueSchema, useSchema } from '../support/postgres.js';

const cleanups: Array<() => Promise<void>> = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

async function setUp() {
  const db = await useSchema();
  cleanups.push(db.drop);
  await db.pool.query(
    `CREATE TABLE "${db.schema}".balances (account text PRIMARY KEY, amount bigint NOT NULL)`,
  );
  const store = await PostgresStore.open({ pool: db.pool, schema: db.schema });
  cleanups.push(() => store.close());
  return { ...db, store };
}

/** A credit of `amount` to `account` from `producer` with publishing ID `id`, at `offset`. */
const credit = (
  offset: number,
  producer: string,
  id: number,
  amount: number,
  account = 'x',
): IncomingMessage => ({
  offset: BigInt(offset),
  content: Buffer.from(JSON.stringify({ account, amount })),
  applicationProperties: identityHeaders(producer, BigInt(id)),
});

const crediting =
  (schema: string): PostgresMessageHandler =>
  async (message, { client }) => {
    const { account, amount } = JSON.parse(message.body.toString()) as { account: string; amount: number };
    await client.query(
      `INSERT INTO "${schema}".balances (account, amount) VALUES ($1, $2)
     ON CONFLICT (account) DO UPDATE SET amount = balances.amount + excluded.amount`,
      [account, amount],
    );
  };

async function openCore(
  store: PostgresStore,
  schema: string,
  options: Partial<VerifyingConsumerOptions> = {},
  handler: PostgresMessageHandler = crediting(schema),
): Promise<VerifyingConsumerCore> {
  return VerifyingConsumerCore.open({
    consumerName: 'ledger',
    store,
    handler: postgresHandler(handler),
    commitEvery: 3,
    ...options,
  });
}

async function balances(pool: pg.Pool, schema: string): Promise<Record<string, number>> {
  const { rows } = await pool.query<{ account: string; amount: string }>(
    `SELECT account, amount FROM "${schema}".balances ORDER BY account`,
  );
  return Object.fromEntries(rows.map((r) => [r.account, Number(r.amount)]));
}

async function storedOffset(pool: pg.Pool, schema: string, consumer = 'ledger'): Promise<string | null> {
  const { rows } = await pool.query<{ committed_offset: string | null }>(
    `SELECT committed_offset FROM "${schema}".consumer_offsets WHERE consumer = $1`,
    [consumer],
  );
  return rows[0]?.committed_offset ?? null;
}

/** Feeds `messages` in order; returns what the first failing process() threw, if anything. */
async function feed(core: VerifyingConsumerCore, messages: IncomingMessage[]): Promise<unknown> {
  try {
    for (const message of messages) await core.process(message);
    await core.flush();
  } catch (err) {
    return err;
  }
  return undefined;
}

describe('verifying consumer on PostgreSQL', () => {
  it('postgres - the SQL balances equal the exactly-once fold with planted copies and reordering', async () => {
    const { pool, schema, store } = await setUp();
    // Producers a and b, IDs reordered within the window, copies planted later in the stream.
    const plan: Array<[string, number, number, string]> = [
      ['a', 1, 10, 'x'],
      ['a', 3, 30, 'y'],
      ['b', 1, 5, 'x'],
      ['a', 2, 20, 'x'], // late, within the window: new
      ['a', 1, 10, 'x'], // copy
      ['b', 2, 7, 'y'],
      ['b', 1, 5, 'x'], // copy
      ['a', 3, 30, 'y'], // copy
      ['a', 4, 40, 'x'],
      ['b', 3, 9, 'x'],
    ];
    const messages = plan.map(([producer, id, amount, account], i) =>
      credit(i, producer, id, amount, account),
    );
    const core = await openCore(store, schema);
    expect(await feed(core, messages)).toBeUndefined();
    expect(core.stats).toMatchObject({ new: 7, duplicate: 3 });
    await core.close();
    // The fold: each (producer, ID) once.
    const fold: Record<string, number> = {};
    const seen = new Set<string>();
    for (const [producer, id, amount, account] of plan) {
      if (seen.has(`${producer}/${id}`)) continue;
      seen.add(`${producer}/${id}`);
      fold[account] = (fold[account] ?? 0) + amount;
    }
    expect(await balances(pool, schema)).toEqual(fold);
    expect(await storedOffset(pool, schema)).toBe('9');
    // A second life resumes after offset 9 and recognises every copy from the stored verifier state.
    const again = await openCore(store, schema);
    expect(again.resumeOffset).toBe(10n);
    expect(
      await feed(again, [credit(10, 'a', 4, 40), credit(11, 'b', 2, 7), credit(12, 'b', 4, 1)]),
    ).toBeUndefined();
    expect(again.stats).toMatchObject({ new: 1, duplicate: 2 });
    await again.close();
    expect(await balances(pool, schema)).toEqual({ ...fold, x: fold.x! + 1 });
  });

  it('postgres - a handler that throws stops the consumer and nothing of its batch takes effect', async () => {
    const { pool, schema, store } = await setUp();
    const good = crediting(schema);
    const core = await openCore(store, schema, { commitEvery: 100 }, async (message, tx) => {
      await good(message, tx);
      if (message.offset === 4n) throw new Error('boom');
    });
    await core.process(credit(0, 'a', 1, 1));
    await core.flush(); // offset 0 committed
    const err = await feed(core, [
      credit(1, 'a', 2, 10),
      credit(2, 'a', 3, 10),
      credit(3, 'a', 4, 10),
      credit(4, 'a', 5, 10),
    ]);
    expect((err as Error).message).toBe('boom');
    await core.close();
    expect(await balances(pool, schema)).toEqual({ x: 1 });
    expect(await storedOffset(pool, schema)).toBe('0');
    // The next life applies the batch once.
    const again = await openCore(store, schema, { commitEvery: 100 });
    expect(
      await feed(again, [
        credit(1, 'a', 2, 10),
        credit(2, 'a', 3, 10),
        credit(3, 'a', 4, 10),
        credit(4, 'a', 5, 10),
      ]),
    ).toBeUndefined();
    await again.close();
    expect(await balances(pool, schema)).toEqual({ x: 41 });
  });

  it.each([
    ['COMMIT', 'COMMIT'],
    ['ROLLBACK', 'rollback'],
    ['BEGIN', '/* hi */ begin'],
    ['SAVEPOINT', 'SAVEPOINT s1'],
    ['RELEASE', 'select 1; RELEASE SAVEPOINT s1'],
    ['END', "select 'a;b'; end"],
  ])(
    'postgres - a handler issuing %s is refused with a TypeError and its batch rolled back',
    async (word, sql) => {
      const { pool, schema, store } = await setUp();
      const good = crediting(schema);
      let refused: unknown;
      const core = await openCore(store, schema, { commitEvery: 100 }, async (message, tx) => {
        await good(message, tx);
        if (message.offset === 1n) {
          // Even swallowed, the refusal stops the consumer.
          await tx.client.query(sql).catch((err: unknown) => (refused = err));
        }
      });
      const err = await feed(core, [credit(0, 'a', 1, 1), credit(1, 'a', 2, 10), credit(2, 'a', 3, 100)]);
      expect(refused).toBeInstanceOf(TypeError);
      expect((refused as Error).message).toContain(word);
      expect(err).toBe(refused);
      await core.close();
      expect(await balances(pool, schema)).toEqual({});
      expect(await storedOffset(pool, schema)).toBeNull();
    },
  );

  it('postgres - a client used after its handler returned is refused, the consumer stops and the batch rolls back', async () => {
    const { pool, schema, store } = await setUp();
    const good = crediting(schema);
    let kept: pg.PoolClient | undefined;
    const core = await openCore(store, schema, { commitEvery: 100 }, async (message, tx) => {
      await good(message, tx);
      kept ??= tx.client as pg.PoolClient;
    });
    await core.process(credit(0, 'a', 1, 1));
    await core.process(credit(1, 'a', 2, 10));
    const late = await kept!.query(`UPDATE "${schema}".balances SET amount = 1000`).then(
      () => undefined,
      (err: unknown) => err,
    );
    expect(late).toBeInstanceOf(TypeError);
    expect(core.failure).toBe(late);
    await expect(core.flush()).rejects.toBe(late);
    await core.close();
    expect(await balances(pool, schema)).toEqual({});
    expect(await storedOffset(pool, schema)).toBeNull();
  });

  it('postgres - two consumers under one name: the one whose offset moved is fenced, no effect twice', async () => {
    const { pool, schema, store } = await setUp();
    const other = await PostgresStore.open({ connectionString: PG_URL, schema });
    cleanups.push(() => other.close());
    const first = await openCore(store, schema, { commit: 'message' });
    const second = await openCore(other, schema, { commit: 'message' });
    const stream = [credit(0, 'a', 1, 1), credit(1, 'a', 2, 10), credit(2, 'a', 3, 100)];
    expect(await feed(first, stream.slice(0, 2))).toBeUndefined();
    // The second read the offset before the first committed: its first batch finds it moved.
    const err = await feed(second, stream);
    expect(err).toBeInstanceOf(DedupError);
    expect((err as DedupError).code).toBe('DEDUP_CONSUMER_FENCED');
    expect(second.stats.commits).toBe(0);
    expect(await feed(first, stream.slice(2))).toBeUndefined();
    await first.close();
    await second.close();
    expect(await balances(pool, schema)).toEqual({ x: 111 });
    expect(await storedOffset(pool, schema)).toBe('2');
  });

  it('postgres - refuses a wrong password, an unknown database, a missing schema, another version and a read-only role within a second', async () => {
    const { pool, schema } = await setUp();
    const url = new URL(PG_URL);
    const cases: Array<[string, () => Promise<unknown>, RegExp]> = [
      [
        'wrong password',
        () => PostgresStore.open({ connectionString: withUrl(url, { password: 'nope' }), schema }),
        /password was refused/,
      ],
      [
        'unknown database',
        () => PostgresStore.open({ connectionString: withUrl(url, { pathname: '/no_such_db' }), schema }),
        /database does not exist/,
      ],
      ['missing schema', () => PostgresStore.open({ pool, schema: 'no_such_schema_x' }), /run migrate/],
    ];
    for (const [what, open, message] of cases) {
      const started = Date.now();
      const err = await open().then(
        () => undefined,
        (e: unknown) => e,
      );
      expect(err, what).toBeInstanceOf(DedupError);
      expect((err as DedupError).code, what).toBe('DEDUP_STORE_REFUSED');
      expect((err as DedupError).message, what).toMatch(message);
      expect((err as DedupError).cause, what).toBeDefined();
      expect(Date.now() - started, what).toBeLessThan(1_000);
    }
    // Another version: the meta table says 2.
    await pool.query(`UPDATE "${schema}".stream_dedup_meta SET version = $1`, [SCHEMA_VERSION + 1]);
    const newer = await PostgresStore.open({ pool, schema }).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect((newer as DedupError).code).toBe('DEDUP_STORE_REFUSED');
    expect((newer as DedupError).message).toMatch(/version 2, this library reads version 1/);
    await expect(migrate(pool, { schema })).rejects.toMatchObject({ code: 'DEDUP_STORE_REFUSED' });
    await pool.query(`UPDATE "${schema}".stream_dedup_meta SET version = $1`, [SCHEMA_VERSION]);
    // A read-only role: the store opens (it only reads the version), the consumer is refused, nothing written.
    const role = `${schema}_ro`;
    await pool.query(`CREATE ROLE ${role} LOGIN PASSWORD 'ro'`);
    cleanups.push(async () => {
      await pool.query(`DROP OWNED BY ${role}`).catch(() => undefined);
      await pool.query(`DROP ROLE IF EXISTS ${role}`).catch(() => undefined);
    });
    await pool.query(`GRANT USAGE ON SCHEMA "${schema}" TO ${role}`);
    await pool.query(`GRANT SELECT ON ALL TABLES IN SCHEMA "${schema}" TO ${role}`);
    const readOnly = await PostgresStore.open({
      connectionString: withUrl(url, { username: role, password: 'ro' }),
      schema,
    });
    cleanups.push(() => readOnly.close());
    const started = Date.now();
    const err = await openCore(readOnly, schema).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect((err as DedupError).code).toBe('DEDUP_STORE_REFUSED');
    expect((err as DedupError).message).toMatch(/lacks a right/);
    expect(Date.now() - started).toBeLessThan(1_000);
    expect(await storedOffset(pool, schema)).toBeNull();
    const { rows } = await pool.query(`SELECT count(*)::int AS n FROM "${schema}".consumer_offsets`);
    expect(rows[0]).toEqual({ n: 0 });
  });

  it('postgres - stream-dedup migrate creates the schema once, then checks it; a wrong password exits 4', async () => {
    const db = await useSchema({ migrated: false });
    cleanups.push(db.drop);
    const created = await runCli(['migrate', db.schema, '--json'], { STREAM_DEDUP_PG_URL: PG_URL });
    expect(created.code, created.stderr).toBe(0);
    expect(JSON.parse(created.stdout)).toEqual({ schema: db.schema, version: SCHEMA_VERSION });
    const again = await runCli(['migrate', db.schema, '--url', PG_URL]);
    expect(again.stdout).toBe(`schema ${db.schema}: version ${SCHEMA_VERSION}, nothing to do\n`);
    const store = await PostgresStore.open({ pool: db.pool, schema: db.schema });
    await store.close();
    const url = withUrl(new URL(PG_URL), { password: 'nope' });
    const refused = await runCli(['migrate', uniqueSchema(), '--url', url]);
    expect(refused.code).toBe(4);
    expect(refused.stderr).toMatch(/DEDUP_STORE_REFUSED: .*password was refused/);
    expect((await runCli(['migrate', 'Bad-Name', '--url', PG_URL])).code).toBe(2);
  });

  it('postgres - runs on a pool of one connection (scope states load through the batch transaction)', async () => {
    const db = await useSchema();
    cleanups.push(db.drop);
    await db.pool.query(
      `CREATE TABLE "${db.schema}".balances (account text PRIMARY KEY, amount bigint NOT NULL)`,
    );
    const single = new pg.Pool({ connectionString: PG_URL, max: 1, connectionTimeoutMillis: 2_000 });
    cleanups.push(() => single.end());
    const store = await PostgresStore.open({ pool: single, schema: db.schema });
    const core = await openCore(store, db.schema);
    expect(
      await feed(core, [credit(0, 'a', 1, 1), credit(1, 'b', 1, 10), credit(2, 'a', 1, 1)]),
    ).toBeUndefined();
    await core.close();
    expect(await balances(db.pool, db.schema)).toEqual({ x: 11 });
  });

  it('postgres - a server that stops answering mid-batch stops the consumer within queryTimeoutMs, and close() returns', async () => {
    const db = await useSchema();
    cleanups.push(db.drop);
    await db.pool.query(
      `CREATE TABLE "${db.schema}".balances (account text PRIMARY KEY, amount bigint NOT NULL)`,
    );
    const target = new URL(PG_URL);
    const proxy = await FaultProxy.start(target.hostname, Number(target.port));
    cleanups.push(() => proxy.close());
    const viaProxy = new URL(PG_URL);
    viaProxy.port = String(proxy.port);
    const store = await PostgresStore.open({
      connectionString: viaProxy.toString(),
      schema: db.schema,
      queryTimeoutMs: 500,
      lockTimeoutMs: 400, // below queryTimeoutMs, above idleInTransactionTimeoutMs (the store checks)
      idleInTransactionTimeoutMs: 300,
    });
    cleanups.push(() => store.close());
    const core = await openCore(store, db.schema, { commitEvery: 100 });
    await core.process(credit(0, 'a', 1, 1)); // the batch's transaction is open
    proxy.stall(true); // bytes dropped both ways, connections open: a silent server
    const started = Date.now();
    const err = await core.flush().then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(DedupError);
    expect((err as DedupError).code).toBe('DEDUP_STORE_REFUSED');
    await core.close();
    const took = Date.now() - started;
    expect(took).toBeLessThan(2_000);
    proxy.stall(false);
    expect(await balances(db.pool, db.schema)).toEqual({});
    expect(await storedOffset(db.pool, db.schema)).toBeNull();
  });

  it('postgres - options are checked before any I/O', async () => {
    await expect(PostgresStore.open({ connectionString: PG_URL, schema: 'Bad-Name' })).rejects.toThrow(
      RangeError,
    );
    await expect(PostgresStore.open({ schema: 'ok' })).rejects.toThrow(TypeError);
    await expect(
      PostgresStore.open({ connectionString: PG_URL, schema: 'ok', lockTimeoutMs: 0 }),
    ).rejects.toThrow(RangeError);
    const { store, schema } = await setUp();
    await expect(openCore(store, schema, { scopeTtlMs: 1_000 })).rejects.toThrow(RangeError);
  });
});

function withUrl(base: URL, changes: { password?: string; pathname?: string; username?: string }): string {
  const url = new URL(base.toString());
  if (changes.password !== undefined) url.password = changes.password;
  if (changes.username !== undefined) url.username = changes.username;
  if (changes.pathname !== undefined) url.pathname = changes.pathname;
  return url.toString();
}
