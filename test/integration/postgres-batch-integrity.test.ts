/**
 * The handler's client on the real PostgreSQL server of `scripts/postgres.sh` (no broker: the core is
 * fed messages directly, as postgres-store.test.ts does): SQL that ends the batch's transaction
 * without the statement guard seeing it must not leave the batch marked as seen while its effects
 * are rolled back (found by hostile review B, H1); what a handler leaves on the connection (L5) and
 * a linger the server would cut short (L1) do not stop the consumer later; no handler runs once a
 * commit failed (L3); a statement whose outcome the driver cannot know poisons its batch (M1); waiting for
 * a pool's connection is bounded (M2).
 */
import { afterEach, describe, expect, it, vi } from 'vitest';
import pg from 'pg';
import { VerifyingConsumerCore, type VerifyingConsumerOptions } from '../../src/consumer/core.js';
import type { IncomingMessage } from '../../src/consumer/types.js';
import { identityHeaders } from '../../src/identity/headers.js';
import { DedupError } from '../../src/errors.js';
import { postgresHandler, type PostgresMessageHandler } from '../../src/postgres/handler.js';
import { PostgresStore } from '../../src/postgres/store.js';
import type * as TransactionControl from '../../src/postgres/transaction-control.js';
import { useSchema } from '../support/postgres.js';

/** Whether the statement guard is blinded: it then lets everything through, as it would SQL it misreads. */
const guard = vi.hoisted(() => ({ blind: false }));
vi.mock('../../src/postgres/transaction-control.js', async (original) => {
  const actual = await original<typeof TransactionControl>();
  return {
    transactionControlIn: (sql: string) => (guard.blind ? undefined : actual.transactionControlIn(sql)),
  };
});

const cleanups: Array<() => Promise<void>> = [];
afterEach(async () => {
  guard.blind = false;
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

async function setUp(poolOptions?: pg.PoolConfig) {
  const db = await useSchema();
  cleanups.push(db.drop);
  await db.pool.query(
    `CREATE TABLE "${db.schema}".balances (account text PRIMARY KEY, amount bigint NOT NULL)`,
  );
  const pool = poolOptions === undefined ? db.pool : new pg.Pool(poolOptions);
  if (pool !== db.pool) {
    pool.on('error', () => undefined);
    cleanups.push(() => pool.end().catch(() => undefined));
  }
  const store = await PostgresStore.open({ pool, schema: db.schema });
  cleanups.push(() => store.close());
  return { ...db, userPool: pool, store };
}

const credit = (offset: number, producer: string, id: number, amount: number): IncomingMessage => ({
  offset: BigInt(offset),
  content: Buffer.from(JSON.stringify({ account: 'x', amount })),
  applicationProperties: identityHeaders(producer, BigInt(id)),
});

const add = (schema: string, amount: number): [string, unknown[]] => [
  `INSERT INTO "${schema}".balances (account, amount) VALUES ('x', $1)
   ON CONFLICT (account) DO UPDATE SET amount = balances.amount + excluded.amount`,
  [amount],
];

function openCore(
  store: PostgresStore,
  handler: PostgresMessageHandler,
  options: Partial<VerifyingConsumerOptions> = {},
): Promise<VerifyingConsumerCore> {
  return VerifyingConsumerCore.open({
    consumerName: 'ledger',
    store,
    handler: postgresHandler(handler),
    commitEvery: 3,
    ...options,
  });
}

async function feed(core: VerifyingConsumerCore, messages: IncomingMessage[]): Promise<unknown> {
  try {
    for (const message of messages) await core.process(message);
    await core.flush();
  } catch (err) {
    return err;
  }
  return undefined;
}

async function balance(pool: pg.Pool, schema: string): Promise<number | undefined> {
  const { rows } = await pool.query<{ amount: string }>(`SELECT amount FROM "${schema}".balances`);
  return rows[0] === undefined ? undefined : Number(rows[0].amount);
}

describe('PostgreSQL store - SQL the statement guard misses', () => {
  it.each([
    [
      'standard_conforming_strings off',
      ['SET LOCAL standard_conforming_strings = off', "SELECT '\\''; ROLLBACK; SELECT 1 --'"],
    ],
    ['a non-ASCII identifier holding $', ['SELECT 1 AS ÿ$a$; ROLLBACK; SELECT 1 AS ÿ$a$']],
  ])(
    'a ROLLBACK the statement guard missed (%s) leaves nothing of the batch recorded: a restart applies it exactly once',
    async (_what, sqls) => {
      const { pool, schema, store } = await setUp();
      const stream = [credit(0, 'a', 1, 1), credit(1, 'a', 2, 10), credit(2, 'a', 3, 100)];
      // Message 2's handler: legal SQL the scanner reads wrongly. With standard_conforming_strings off,
      // '\'' is a one-quote literal for the server; the scanner reads it as an unterminated ''-escaped
      // literal that swallows "; ROLLBACK; SELECT 1 --" and ends at the last quote.
      const core = await openCore(store, async (message, { client }) => {
        const { amount } = JSON.parse(message.body.toString()) as { amount: number };
        if (amount === 100) {
          for (const sql of sqls) await client.query(sql);
        }
        await client.query(...add(schema, amount));
      });
      const err = await feed(core, stream);
      await core.close();
      // The guard refuses the SQL ('?': it reads differently by the setting) or, where it cannot
      // see it, the commit's xid check finds the transaction ended and stops; either way its first
      // statement, so no scope state is written in autocommit (IDs recorded as seen with their
      // effects rolled back: a restart would skip them as duplicates).
      expect(err).toBeInstanceOf(TypeError);
      const { rows } = await pool.query(`SELECT scope FROM "${schema}".scope_states`);
      expect(rows).toEqual([]);
      // And the consequence: a restart from the stored offset re-delivers 0..2 as duplicates.
      const again = await openCore(store, async (message, { client }) => {
        const { amount } = JSON.parse(message.body.toString()) as { amount: number };
        await client.query(...add(schema, amount));
      });
      expect(await feed(again, stream)).toBeUndefined();
      await again.close();
      expect(await balance(pool, schema)).toBe(111); // the exactly-once fold (100 before the fix)
    },
  );

  it.each([
    // What follows a missed transaction end runs in autocommit (message 2's +100 is kept), and a
    // missed COMMIT has committed messages 0 and 1's +11: the library cannot undo either (the error
    // says so). What it must not do is record the IDs as seen: the restart applies all three again
    // (+111). Before the fix the restart skipped them: 100 and 111.
    ['ROLLBACK', 211],
    ['COMMIT', 222],
  ])(
    'a %s that reaches the server unseen (any gap of the guard) writes nothing of the library: the offset check runs first',
    async (control, expected) => {
      const { pool, schema, store } = await setUp();
      const stream = [credit(0, 'a', 1, 1), credit(1, 'a', 2, 10), credit(2, 'a', 3, 100)];
      const core = await openCore(store, async (message, { client }) => {
        const { amount } = JSON.parse(message.body.toString()) as { amount: number };
        if (amount === 100) {
          guard.blind = true;
          await client.query(control);
          guard.blind = false;
        }
        await client.query(...add(schema, amount));
      });
      const err = await feed(core, stream);
      await core.close();
      expect(err).toBeInstanceOf(TypeError);
      expect(String((err as Error).message)).toMatch(/ended inside a handler/);
      const scopes = await pool.query(`SELECT scope FROM "${schema}".scope_states`);
      expect(scopes.rows).toEqual([]); // before the fix: the batch's scope, written in autocommit
      const offsets = await pool.query(`SELECT committed_offset FROM "${schema}".consumer_offsets`);
      expect(offsets.rows).toEqual([{ committed_offset: null }]);
      const again = await openCore(store, async (message, { client }) => {
        const { amount } = JSON.parse(message.body.toString()) as { amount: number };
        await client.query(...add(schema, amount));
      });
      expect(await feed(again, stream)).toBeUndefined();
      await again.close();
      expect(await balance(pool, schema)).toBe(expected);
    },
  );

  it('refuses a pg.Query (a Submittable: pg reads its text when it sends it and hands it the raw connection)', async () => {
    const { pool, schema, store } = await setUp();
    const stream = [credit(0, 'a', 1, 1), credit(1, 'a', 2, 10), credit(2, 'a', 3, 100)];
    let refused: unknown;
    const core = await openCore(store, async (message, { client }) => {
      const { amount } = JSON.parse(message.body.toString()) as { amount: number };
      if (amount === 100) {
        const busy = client.query('SELECT pg_sleep(0.05)'); // the next one would wait in pg's queue
        const q = new pg.Query('SELECT 1');
        const done = (client.query(q as never) as unknown as Promise<unknown>).catch(
          (e: unknown) => (refused = e),
        );
        (q as unknown as { text: string }).text = 'ROLLBACK'; // pg would read this when it sends it
        await busy;
        await done;
      }
      await client.query(...add(schema, amount));
    });
    const err = await feed(core, stream);
    await core.close();
    expect(refused).toBeInstanceOf(TypeError);
    expect(String((refused as Error).message)).toMatch(/may not control .*Submittable/);
    expect(err).toBe(refused); // the consumer stops with it, even though the handler went on
    const { rows } = await pool.query(`SELECT scope FROM "${schema}".scope_states`);
    expect(rows).toEqual([]);
    expect(await balance(pool, schema)).toBeUndefined();
  });

  it('refuses a consumer whose commitLingerMs is not below idleInTransactionTimeoutMs (the server would end its quiet tail)', async () => {
    const db = await useSchema();
    cleanups.push(db.drop);
    const store = await PostgresStore.open({
      pool: db.pool,
      schema: db.schema,
      idleInTransactionTimeoutMs: 300,
    });
    cleanups.push(() => store.close());
    const err = await openCore(store, () => Promise.resolve(), { commitLingerMs: 1_000 }).then(
      () => undefined,
      (e: unknown) => e,
    );
    // Before the fix it opened, and the first quiet tail stopped it with DEDUP_STORE_REFUSED
    // ("terminating connection due to idle-in-transaction timeout").
    expect(err).toBeInstanceOf(RangeError);
    const { rows } = await db.pool.query(`SELECT consumer FROM "${db.schema}".consumer_offsets`);
    expect(rows).toEqual([]); // nothing written: refused before the store's own I/O
  });

  it("a handler's SET SESSION CHARACTERISTICS … READ ONLY on the pooled connection does not stop later batches (BEGIN says READ WRITE)", async () => {
    const { PG_URL } = await import('../support/postgres.js');
    const { pool, schema, store } = await setUp({ connectionString: PG_URL, max: 1 });
    const core = await openCore(
      store,
      async (message, { client }) => {
        const { amount } = JSON.parse(message.body.toString()) as { amount: number };
        await client.query(...add(schema, amount));
        // Not transaction control, so the guard lets it through; it outlives the COMMIT.
        if (amount === 1) await client.query('SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY');
      },
      { commitEvery: 1 },
    );
    const err = await feed(core, [credit(0, 'a', 1, 1), credit(1, 'a', 2, 10)]);
    await core.close();
    await pool.query('SET SESSION CHARACTERISTICS AS TRANSACTION READ WRITE').catch(() => undefined);
    // Before the fix: DEDUP_STORE_REFUSED "the role or the server is read-only" (25006) on the next
    // batch's FOR UPDATE. (The setting still leaks into a user pool's other queries: handlers use SET LOCAL.)
    expect(err).toBeUndefined();
  });

  it('no handler runs after the commit its batch waited for failed (the consumer has stopped)', async () => {
    const { schema, store } = await setUp();
    const calls: number[] = [];
    const core = await openCore(
      store,
      async (message, { client }) => {
        const { amount } = JSON.parse(message.body.toString()) as { amount: number };
        calls.push(amount);
        if (amount === 1) {
          // An error the handler swallows: the transaction is aborted, so its COMMIT fails (25P02).
          await client.query('SELECT 1/0').catch(() => undefined);
          return;
        }
        await client.query(...add(schema, amount));
      },
      { commitEvery: 1 },
    );
    await core.process(credit(0, 'a', 1, 1)); // its batch is being written (pipelined)
    // The next delivery waits for that write before its transaction opens.
    const second = await Promise.resolve(core.process(credit(1, 'a', 2, 10))).then(
      () => undefined,
      (e: unknown) => e,
    );
    const failure = core.failure;
    await core.close();
    expect(failure).toBeDefined();
    expect(second).toBeDefined();
    // Before the fix: [1, 10]: message 1's handler ran (its side effects outside the database too) after
    // the consumer had stopped, on a fresh transaction that then stays open until close().
    expect(calls).toEqual([1]);
  });

  it('a handler statement that timed out client-side (outcome unknown) poisons the batch: never committed, the connection destroyed', async () => {
    const db = await useSchema();
    cleanups.push(db.drop);
    await db.pool.query(
      `CREATE TABLE "${db.schema}".balances (account text PRIMARY KEY, amount bigint NOT NULL)`,
    );
    const { PG_URL } = await import('../support/postgres.js');
    // The store's own pool: its query_timeout (= queryTimeoutMs) bounds the handler's queries too.
    const store = await PostgresStore.open({
      connectionString: PG_URL,
      schema: db.schema,
      // Wide enough that the store's own statements and the gaps between them never reach them on a
      // loaded machine (at 400 / 300 / 200 ms a stall could end the batch before message 100 ran):
      // only the handler's pg_sleep, past queryTimeoutMs, times out.
      queryTimeoutMs: 1_000,
      lockTimeoutMs: 800,
      idleInTransactionTimeoutMs: 600,
    });
    cleanups.push(() => store.close());
    let timeouts = 0;
    const core = await openCore(store, async (message, { client }) => {
      const { amount } = JSON.parse(message.body.toString()) as { amount: number };
      const insert = `INSERT INTO "${db.schema}".balances (account, amount) SELECT 'x', $1 FROM pg_sleep($2)
        ON CONFLICT (account) DO UPDATE SET amount = balances.amount + excluded.amount`;
      try {
        await client.query(insert, [amount, amount === 100 ? 1.5 : 0]);
      } catch {
        // The driver said it failed ("Query read timeout"): the handler tries once more.
        timeouts++;
        await client.query(insert, [amount, 0]);
      }
    });
    const err = await feed(core, [credit(0, 'a', 1, 1), credit(1, 'a', 2, 10), credit(2, 'a', 3, 100)]);
    await core.close();
    expect(timeouts).toBe(1);
    // Before the fix the batch committed with 100 applied twice (211): the timed-out INSERT went on
    // running in the transaction and the retry added it again.
    expect(err).toBeInstanceOf(DedupError);
    expect((err as DedupError).code).toBe('DEDUP_STORE_REFUSED');
    expect(String((err as DedupError).cause)).toMatch(/timeout/i);
    expect(await balance(db.pool, db.schema)).toBeUndefined();
  });

  it('a batch waiting for a connection of an exhausted user pool (no connectionTimeoutMillis) gives up within queryTimeoutMs, and close() returns', async () => {
    const base = await useSchema();
    cleanups.push(base.drop);
    const { PG_URL } = await import('../support/postgres.js');
    const pool = new pg.Pool({ connectionString: PG_URL, max: 1 });
    pool.on('error', () => undefined);
    cleanups.push(() => pool.end().catch(() => undefined));
    await pool.query(
      `CREATE TABLE "${base.schema}".balances (account text PRIMARY KEY, amount bigint NOT NULL)`,
    );
    const store = await PostgresStore.open({
      pool,
      schema: base.schema,
      queryTimeoutMs: 500,
      lockTimeoutMs: 400,
      idleInTransactionTimeoutMs: 300,
    });
    cleanups.push(() => store.close());
    const core = await openCore(store, async (message, { client }) => {
      const { amount } = JSON.parse(message.body.toString()) as { amount: number };
      await client.query(...add(base.schema, amount));
    });
    // The application holds the pool's one connection (a long report, a leaked client).
    const held = await pool.connect();
    cleanups.unshift(() => Promise.resolve(held.release()));
    const started = Date.now();
    const processing = Promise.resolve(core.process(credit(0, 'a', 1, 1))).catch((e: unknown) => e);
    const closed = core.close().then(() => 'closed');
    const outcome = await Promise.race([
      closed,
      new Promise((resolve) => setTimeout(() => resolve('still waiting after 5 s'), 5_000)),
    ]);
    const elapsed = Date.now() - started;
    held.release();
    cleanups.shift();
    const err = await processing;
    // Before the fix: still waiting after 5 s.
    expect(outcome).toBe('closed');
    expect(elapsed).toBeLessThan(2_000);
    expect(err).toBeInstanceOf(DedupError);
    expect((err as DedupError).code).toBe('DEDUP_STORE_REFUSED');
    // The connection that came late went back to the pool: the application can use it.
    expect((await pool.query('SELECT 1 AS one')).rows).toEqual([{ one: 1 }]);
  });
});
