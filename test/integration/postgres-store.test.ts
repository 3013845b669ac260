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

/**
 * Reads `messages` as a transport does: after a rewind (a fence, a retried batch) it waits the delay
 * asked and reads again from the core's resume offset. Returns what stopped it, if anything.
 */
async function readAll(core: VerifyingConsumerCore, messages: IncomingMessage[]): Promise<unknown> {
  let rewound: number | undefined;
  core.onRewind((delayMs) => {
    core.discardPending();
    rewound = delayMs;
  });
  try {
    let next = Number(core.resumeOffset ?? 0n);
    while (next < messages.length) {
      await core.process(messages[next]!);
      if (rewound === undefined) next++;
      else {
        await new Promise((resolve) => setTimeout(resolve, rewound));
        rewound = undefined;
        next = Number(core.resumeOffset ?? 0n);
      }
    }
    await core.flush();
  } catch (err) {
    return err;
  }
  return undefined;
}

/** A store that reaches the server through a {@link FaultProxy}, on a fresh schema with a balances table. */
async function throughProxy(options: { reconnectTimeoutMs?: number }) {
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
    ...options,
  });
  cleanups.push(() => store.close());
  return { ...db, proxy, store };
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

  it('postgres - two consumers under one name alternate: the fenced one re-reads the offset and goes on, every (producer, ID) applied once', async () => {
    const { pool, schema, store } = await setUp();
    await pool.query(`CREATE TABLE "${schema}".applied (id text NOT NULL)`);
    const other = await PostgresStore.open({ connectionString: PG_URL, schema });
    cleanups.push(() => other.close());
    const recording: PostgresMessageHandler = async (message, context) => {
      await crediting(schema)(message, context);
      const { producerName, publishingId } = message.identity!;
      await context.client.query(`INSERT INTO "${schema}".applied (id) VALUES ($1)`, [
        `${producerName}/${publishingId}`,
      ]);
    };
    // 40 messages: producers a and b, 30 IDs, 10 copies planted 3 to 7 offsets later.
    const plan: Array<[string, number]> = [];
    for (let i = 1; i <= 15; i++) plan.push(['a', i], ['b', i]);
    for (let k = 0; k < 10; k++) plan.splice(3 * k + 8, 0, plan[3 * k + 2]!);
    const stream = plan.map(([producer, id], i) => credit(i, producer, id, id));
    const fold = 2 * ((15 * 16) / 2);
    // Each process reads the stream as a transport does: after a fence it subscribes again from
    // the offset it re-read (the core's rewind), and what it read before is not processed.
    const processes = await Promise.all(
      [store, other].map(async (on) => {
        const core = await openCore(on, schema, { commitEvery: 2 }, recording);
        const reader = { core, next: 0, rewinds: 0 };
        core.onRewind(() => {
          reader.rewinds++;
          core.discardPending();
          reader.next = Number(core.resumeOffset ?? 0n);
        });
        return reader;
      }),
    );
    // They alternate 1 to 3 messages at a time, so each finds the offset moved by the other.
    let turn = 0;
    while (processes.some((p) => p.next < stream.length)) {
      const reader = processes[turn++ % 2]!;
      for (let n = 1 + (turn % 3); n > 0 && reader.next < stream.length; n--) {
        const at = reader.next;
        await reader.core.process(stream[at]!);
        if (reader.next === at) reader.next++;
      }
      await reader.core.flush();
    }
    for (const { core } of processes) await core.close();
    const fences = processes.map((p) => p.core.stats.fences);
    expect(fences.map((n, i) => n === processes[i]!.rewinds)).toEqual([true, true]);
    expect(fences[0]! + fences[1]!).toBeGreaterThan(4);
    for (const { core } of processes) expect(core.failure).toBeUndefined();
    expect(await balances(pool, schema)).toEqual({ x: fold });
    const { rows } = await pool.query<{ id: string; n: string }>(
      `SELECT id, count(*) AS n FROM "${schema}".applied GROUP BY id`,
    );
    expect(rows.length).toBe(30);
    expect(rows.filter((r) => r.n !== '1')).toEqual([]);
    expect(await storedOffset(pool, schema)).toBe(String(stream.length - 1));
    console.log(`[postgres fenced] fences per process: ${fences.join(', ')}`);
  });

  it('postgres - a deadlock between two consumers of different streams is rolled back and retried: both finish, exact folds', async () => {
    const { pool, schema, store } = await setUp();
    await pool.query(`INSERT INTO "${schema}".balances (account, amount) VALUES ('r1', 0), ('r2', 0)`);
    // Each message's handler adds its amount to both rows, in opposite orders for the two
    // consumers; at offset 1 each waits (at most 300 ms) for the other to hold its first row: a
    // deadlock, which the server breaks after its deadlock_timeout (1 s).
    const holding = new Map<string, () => void>();
    let met = false;
    const rendezvous = (key: string): Promise<void> =>
      new Promise((resolve) => {
        const other = holding.get(key);
        if (other !== undefined) {
          holding.delete(key);
          other();
          resolve();
          return;
        }
        const timer = setTimeout(() => {
          holding.delete(key);
          resolve();
        }, 300);
        holding.set(key, () => {
          clearTimeout(timer);
          resolve();
        });
      });
    const add =
      (rows: [string, string]): PostgresMessageHandler =>
      async (message, { client }) => {
        const { amount } = JSON.parse(message.body.toString()) as { amount: number };
        const update = `UPDATE "${schema}".balances SET amount = amount + $2 WHERE account = $1`;
        await client.query(update, [rows[0], amount]);
        // Once, at offset 1: both hold their first row, then each asks for the other's.
        if (message.offset === 1n && !met) await rendezvous('1').then(() => (met = true));
        await client.query(update, [rows[1], amount]);
      };
    const streams = [
      [credit(0, 'a', 1, 1), credit(1, 'a', 2, 2), credit(2, 'a', 3, 4)],
      [credit(0, 'b', 1, 10), credit(1, 'b', 2, 20), credit(2, 'b', 3, 40)],
    ];
    const cores = await Promise.all([
      openCore(store, schema, { consumerName: 'one', commit: 'message' }, add(['r1', 'r2'])),
      openCore(store, schema, { consumerName: 'two', commit: 'message' }, add(['r2', 'r1'])),
    ]);
    const started = Date.now();
    await Promise.all(cores.map((core, i) => readAll(core, streams[i]!)));
    const took = Date.now() - started;
    for (const core of cores) await core.close();
    for (const core of cores) expect(core.failure).toBeUndefined();
    const retries = cores.map((c) => c.stats.retries);
    expect(retries[0]! + retries[1]!).toBeGreaterThan(0);
    expect(cores.map((c) => c.stats.new)).toEqual([3, 3]);
    expect(await balances(pool, schema)).toEqual({ r1: 77, r2: 77 });
    expect(await storedOffset(pool, schema, 'one')).toBe('2');
    expect(await storedOffset(pool, schema, 'two')).toBe('2');
    console.log(`[postgres deadlock] retries per consumer: ${retries.join(', ')}; ${took} ms`);
  });

  it('postgres - a batch that fails with a serialization failure every time stops the consumer after `retries` runs, with DEDUP_STORE_REFUSED and nothing applied', async () => {
    const { pool, schema } = await setUp();
    const store = await PostgresStore.open({ pool, schema, retries: 2 });
    cleanups.push(() => store.close());
    let runs = 0;
    const core = await openCore(store, schema, { commit: 'message' }, async (message, context) => {
      runs++;
      await crediting(schema)(message, context);
      await context.client.query(
        "DO $$ BEGIN RAISE EXCEPTION 'planted' USING ERRCODE = 'serialization_failure'; END $$",
      );
    });
    const err = await readAll(core, [credit(0, 'a', 1, 5)]);
    await core.close();
    expect(err).toBeInstanceOf(DedupError);
    expect((err as DedupError).code).toBe('DEDUP_STORE_REFUSED');
    expect((err as DedupError).message).toMatch(/after 2 retries: serialization failure/);
    expect(((err as DedupError).cause as { code?: string }).code).toBe('40001');
    expect(runs).toBe(3);
    expect(core.stats.retries).toBe(2);
    expect(await balances(pool, schema)).toEqual({});
    expect(await storedOffset(pool, schema)).toBeNull();
  });

  it('postgres - a connection cut mid-batch, with new connections refused for 700 ms: the consumer reconnects and goes on, exact fold', async () => {
    const { pool, schema, proxy, store } = await throughProxy({});
    let cutAt: number | undefined;
    const core = await openCore(store, schema, { commitEvery: 3 }, async (message, context) => {
      if (message.offset === 4n && cutAt === undefined) {
        // Messages 3 and 4 are in the open batch: the server rolls it back when the socket goes.
        cutAt = Date.now();
        proxy.refuse(true);
        proxy.cut();
        setTimeout(() => proxy.refuse(false), 700);
      }
      await crediting(schema)(message, context);
    });
    const stream = Array.from({ length: 9 }, (_, i) => credit(i, 'a', i + 1, i + 1));
    expect(await readAll(core, stream)).toBeUndefined();
    const back = Date.now() - cutAt!;
    await core.close();
    expect(core.failure).toBeUndefined();
    expect(core.stats.reconnects).toBeGreaterThan(0);
    // `new` counts the rolled-back run of message 3 too; the SQL holds each once.
    expect(core.stats.new).toBeGreaterThanOrEqual(9);
    expect(await balances(pool, schema)).toEqual({ x: 45 });
    expect(await storedOffset(pool, schema)).toBe('8');
    expect(back).toBeLessThan(5_000);
    console.log(`[postgres reconnect] ${core.stats.reconnects} attempts, done ${back} ms after the cut`);
  });

  it('postgres - a connection cut as a batch commits: the consumer reconnects and runs the batch again, exact fold', async () => {
    const { pool, schema, proxy, store } = await throughProxy({});
    let cut = false;
    const core = await openCore(store, schema, {
      commitEvery: 3,
      hooks: {
        beforeCommit: ({ lastOffset }) => {
          if (lastOffset !== 5n || cut) return;
          cut = true;
          proxy.refuse(true);
          proxy.cut();
          setTimeout(() => proxy.refuse(false), 500);
        },
      },
    });
    const stream = Array.from({ length: 9 }, (_, i) => credit(i, 'a', i + 1, i + 1));
    expect(await readAll(core, stream)).toBeUndefined();
    await core.close();
    expect(cut).toBe(true);
    expect(core.failure).toBeUndefined();
    expect(core.stats.reconnects).toBeGreaterThan(0);
    expect(await balances(pool, schema)).toEqual({ x: 45 });
    expect(await storedOffset(pool, schema)).toBe('8');
    console.log(
      `[postgres reconnect at commit] ${core.stats.reconnects} attempts, ${core.stats.fences} fences`,
    );
  });

  it('postgres - a server that stays unreachable stops the consumer after reconnectTimeoutMs with DEDUP_STORE_REFUSED', async () => {
    const { pool, schema, proxy, store } = await throughProxy({ reconnectTimeoutMs: 500 });
    const core = await openCore(store, schema, { commitEvery: 3 });
    const stream = Array.from({ length: 6 }, (_, i) => credit(i, 'a', i + 1, i + 1));
    expect(await readAll(core, stream.slice(0, 3))).toBeUndefined();
    proxy.refuse(true);
    proxy.cut();
    const started = Date.now();
    const err = await readAll(core, stream);
    const took = Date.now() - started;
    await core.close();
    expect(err).toBeInstanceOf(DedupError);
    expect((err as DedupError).code).toBe('DEDUP_STORE_REFUSED');
    expect((err as DedupError).message).toMatch(/could not reach the database for \d+ ms/);
    expect(took).toBeGreaterThanOrEqual(500);
    expect(took).toBeLessThan(3_000);
    expect(await balances(pool, schema)).toEqual({ x: 6 });
    expect(await storedOffset(pool, schema)).toBe('2');
    console.log(`[postgres unreachable] stopped after ${took} ms, ${core.stats.reconnects} attempts`);
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
    // @ts-expect-error neither pool nor connectionString (refused by the types too: test/types/)
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
