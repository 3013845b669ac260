/**
 * A model of the PostgreSQL store's fence (docs/design.md §13; issue 34): two processes consume one
 * stream under one consumer name through the REAL core and PgConsumerStore, on an in-memory database
 * that models what the store relies on — row locks (`FOR UPDATE` waits for the holder, then reads
 * the newest committed row, as READ COMMITTED does), atomic COMMIT, ROLLBACK when a connection dies —
 * with fast-check choosing the order in which every statement reaches the server and its answer
 * comes back, and SIGKILLs at chosen moments (a killed process restarts from the stored state; a
 * fenced one rolls back and goes on in the same life from the offset it re-read), and connections
 * cut under a live process (it reconnects and goes on): at any moment, or at a COMMIT — before the
 * server runs it, or after, its answer lost (the outcome unknown to the client). Property: every
 * (producer, ID) of the stream is applied exactly once, and no life but a killed one fails. A
 * second, targeted property puts a handler's unseen end of the transaction in the middle of a batch
 * (review B, H1), where the old ordering of the commit's writes loses the batch's earlier IDs.
 */
import fc from 'fast-check';
import type { Pool } from 'pg';
import { describe, expect, it } from 'vitest';
import type { ConsumerStoreProvider } from '../src/consumer/consumer-store.js';
import { VerifyingConsumerCore } from '../src/consumer/core.js';
import type { IncomingMessage } from '../src/consumer/types.js';
import { identityHeaders } from '../src/identity/headers.js';
import { PgConsumerStore } from '../src/postgres/consumer-store.js';
import { postgresHandler } from '../src/postgres/handler.js';
import { tablesOf } from '../src/postgres/schema.js';

type Scheduler = fc.Scheduler;

/** What the database holds, committed. */
interface Committed {
  offset: string | null;
  scopes: Map<string, Buffer>;
  applied: Map<string, number>;
}

/** A transaction's writes, visible to nobody else until COMMIT. */
interface Tx {
  readonly xid: string;
  offset: string | undefined;
  readonly scopes: Map<string, Buffer>;
  readonly applied: string[];
}

class FakeDatabase {
  readonly committed: Committed = { offset: null, scopes: new Map(), applied: new Map() };
  #xids = 0;
  #lockHolder: FakeConnection | undefined;
  #lockWaiters: Array<() => void> = [];
  fenced = 0;
  /** COMMITs the server ran whose answer the client never got, and COMMITs cut before they ran. */
  lostAnswers = 0;
  cutBeforeCommit = 0;
  /** What ended a life that was not killed (a fence must not). */
  readonly unexpected: unknown[] = [];

  constructor(readonly s: Scheduler) {}

  /** Takes the offset row's lock for `conn`, waiting for the holder's transaction to end. */
  async lock(conn: FakeConnection): Promise<void> {
    while (this.#lockHolder !== undefined && this.#lockHolder !== conn) {
      await new Promise<void>((resolve) => this.#lockWaiters.push(resolve));
      conn.checkAlive();
    }
    this.#lockHolder = conn;
  }

  unlock(conn: FakeConnection): void {
    if (this.#lockHolder !== conn) return;
    this.#lockHolder = undefined;
    for (const wake of this.#lockWaiters.splice(0)) wake();
  }

  newXid(): string {
    return String(++this.#xids);
  }
}

/** One connection of one process's life: dies with it (its transaction rolled back by the server). */
class FakeConnection {
  tx: Tx | undefined;
  /** Cut under a live process (a network cut): its statements fail, the life goes on. */
  lost = false;
  constructor(
    readonly db: FakeDatabase,
    readonly life: Life,
  ) {}

  checkAlive(): void {
    if (this.life.dead || this.lost)
      throw Object.assign(new Error('Connection terminated'), { code: 'ECONNRESET' });
  }

  /** The network cuts this connection: the server ends its session (rolls back, unlocks). */
  cut(): void {
    this.lost = true;
    this.terminate();
  }

  /** The server ends the session: its transaction rolls back, its lock goes. */
  terminate(): void {
    this.tx = undefined;
    this.db.unlock(this);
  }

  async query(
    statement: string | { text: string; values?: unknown[] },
    values: unknown[] = [],
  ): Promise<{ rows: unknown[]; rowCount: number }> {
    // The store's own statements come as query configs (with their time-out).
    const text = typeof statement === 'string' ? statement : statement.text;
    const params = typeof statement === 'string' ? values : (statement.values ?? []);
    const { db } = this;
    // The statement reaches the server at a moment fast-check chooses.
    await db.s.schedule(Promise.resolve(), `${this.life.name}: ${text.slice(0, 24)}`);
    this.checkAlive();
    // A cut armed for this process's next COMMIT: before the server runs it, or after (the answer lost).
    const armed = text === 'COMMIT' ? this.life.cutAtCommit : undefined;
    if (armed !== undefined) this.life.cutAtCommit = undefined;
    if (armed === 'before') {
      db.cutBeforeCommit++;
      this.cut();
      this.checkAlive();
    }
    const result = await this.#execute(text, params);
    if (armed === 'after') {
      db.lostAnswers++;
      this.cut();
    }
    // And its answer comes back at another.
    await db.s.schedule(Promise.resolve(), `${this.life.name}: answer`);
    this.checkAlive();
    return result;
  }

  async #execute(text: string, params: unknown[]): Promise<{ rows: unknown[]; rowCount: number }> {
    const { db } = this;
    const c = db.committed;
    const none = { rows: [], rowCount: 0 };
    if (text.startsWith('BEGIN')) {
      this.tx = { xid: db.newXid(), offset: undefined, scopes: new Map(), applied: [] };
      return none;
    }
    if (text.includes('FOR UPDATE')) {
      await db.lock(this);
      // READ COMMITTED: the newest committed version of the row, once locked.
      return { rows: [{ committed_offset: c.offset, xid: this.tx!.xid }], rowCount: 1 };
    }
    if (text.startsWith('INSERT INTO') && text.includes('consumer_offsets')) return none;
    if (text.startsWith('SELECT committed_offset'))
      return { rows: [{ committed_offset: c.offset }], rowCount: 1 };
    if (text.startsWith('SELECT state')) {
      const state = c.scopes.get((params[1] as Buffer).toString('hex'));
      return { rows: state === undefined ? [] : [{ state }], rowCount: state === undefined ? 0 : 1 };
    }
    if (text.startsWith('INSERT INTO') && text.includes('scope_states')) {
      const [, scopes, states] = params as [string, Buffer[], Buffer[]];
      // Without a transaction, autocommit: kept at once.
      scopes.forEach((scope, i) => (this.tx?.scopes ?? c.scopes).set(scope.toString('hex'), states[i]!));
      return none;
    }
    if (text.startsWith('UPDATE')) {
      const tx = this.tx;
      if (tx === undefined || tx.xid !== params[2]) return none;
      tx.offset = params[1] as string;
      return { rows: [], rowCount: 1 };
    }
    if (text === 'APPLY') {
      // Without a transaction (ended unseen), autocommit: applied at once.
      if (this.tx === undefined)
        c.applied.set(params[0] as string, (c.applied.get(params[0] as string) ?? 0) + 1);
      else this.tx.applied.push(params[0] as string);
      return { rows: [], rowCount: 1 };
    }
    if (text === 'CLOCK') return none;
    if (text === 'UNSEEN ROLLBACK') {
      // SQL that ends the transaction where the guard does not see it (a gap of its reading).
      this.tx = undefined;
      db.unlock(this);
      return none;
    }
    if (text === 'COMMIT') {
      const tx = this.tx!;
      if (tx.offset !== undefined) c.offset = tx.offset;
      for (const [k, v] of tx.scopes) c.scopes.set(k, v);
      for (const key of tx.applied) c.applied.set(key, (c.applied.get(key) ?? 0) + 1);
      this.tx = undefined;
      db.unlock(this);
      return none;
    }
    if (text === 'ROLLBACK') {
      this.tx = undefined;
      db.unlock(this);
      return none;
    }
    throw new Error(`the model does not know ${text}`);
  }
}

/** One life of one process. */
interface Life {
  readonly name: string;
  dead: boolean;
  readonly connections: FakeConnection[];
  /** A cut armed for the life's next COMMIT (see FakeConnection.query). */
  cutAtCommit?: 'before' | 'after';
}

/** A cut of one process's connections (it lives on): at a moment, or at its next COMMIT. */
interface Cut {
  readonly victim: 'A' | 'B';
  readonly at: 'now' | 'before' | 'after';
}

/** The pg.Pool a life's store uses: a connection per checkout, all of them dying with the life. */
function fakePool(db: FakeDatabase, life: Life): Pool {
  const connect = (): FakeConnection => {
    const conn = new FakeConnection(db, life);
    life.connections.push(conn);
    return conn;
  };
  return {
    query: (text: string | { text: string }, params?: unknown[]) => connect().query(text, params),
    connect: async () => {
      const conn = connect();
      await db.s.schedule(Promise.resolve(), `${life.name}: connect`);
      conn.checkAlive();
      return {
        query: (text: string | { text: string }, params?: unknown[]) => conn.query(text, params),
        on: () => undefined,
        removeListener: () => undefined,
        // Released with an error, pg destroys the connection: the server rolls its transaction back.
        release: (err?: unknown) => {
          if (err !== undefined && err !== false) conn.terminate();
        },
      };
    },
  } as unknown as Pool;
}

const TABLES = tablesOf('model');
const LIMITS = {
  lockTimeoutMs: 1_000,
  idleInTransactionTimeoutMs: 1_000,
  queryTimeoutMs: 2_000,
  retries: 5,
  // A cut process reconnects; a killed one stops at its first failure (run() ends the life).
  reconnectTimeoutMs: 2_147_483_647,
};

/** Runs lives of process `name` until one consumes the whole stream (or `maxLives` ran). */
async function run(
  name: string,
  db: FakeDatabase,
  stream: IncomingMessage[],
  commitEvery: number,
  lives: Map<string, Life>,
  maxLives: number,
  unseenEndAt?: number,
  reconnects: { count: number } = { count: 0 },
): Promise<boolean> {
  for (let n = 0; n < maxLives; n++) {
    const life: Life = { name: `${name}#${n}`, dead: false, connections: [] };
    lives.set(name, life);
    const provider: ConsumerStoreProvider = {
      openConsumerStore: (consumer, onFailure) =>
        PgConsumerStore.open(fakePool(db, life), TABLES, consumer, LIMITS, onFailure, () => undefined),
    };
    let core: VerifyingConsumerCore | undefined;
    try {
      core = await VerifyingConsumerCore.open({
        consumerName: 'ledger',
        store: provider,
        commitEvery,
        commitLingerMs: 2_147_483_647,
        handler: postgresHandler(async (message, { client }) => {
          const { producerName, publishingId } = message.identity!;
          // The first life ends its transaction unseen at this message (then goes on, as a handler would).
          if (n === 0 && message.offset === BigInt(unseenEndAt ?? -1)) await client.query('UNSEEN ROLLBACK');
          await client.query('APPLY', [`${producerName}/${publishingId}`]);
        }),
      });
      // A fenced process goes on in the same life: it re-subscribes from the offset it re-read, as
      // the transports do (Resubscriber.rewind), and what was delivered before is not processed.
      let rewound = false;
      const opened = core;
      opened.onRewind(() => {
        rewound = true;
        db.fenced++;
        opened.discardPending();
      });
      let o = Number(core.resumeOffset ?? 0n);
      for (;;) {
        while (o < stream.length) {
          // A killed process does not reconnect: its life ends here (its store would retry for ever).
          if (life.dead) throw new Error('killed');
          await core.process(stream[o]!);
          if (rewound) {
            rewound = false;
            o = Number(core.resumeOffset ?? 0n);
          } else o++;
        }
        // The last batch's commit may fail and rewind too (a cut at its COMMIT): read on from there.
        await core.flush();
        if (life.dead) throw new Error('killed');
        if (!rewound) break;
        rewound = false;
        o = Number(core.resumeOffset ?? 0n);
      }
      reconnects.count += core.stats.reconnects;
      await core.close();
      return true;
    } catch (err) {
      // open() does not reconnect (it refuses, and the application opens again): a cut then ends
      // the life as a kill does. Any other failure of a live process is unexpected.
      const cutInOpen = core === undefined && life.connections.some((c) => c.lost);
      if (!life.dead && !cutInOpen) db.unexpected.push(err);
      core?.discardPending();
      // A life that failed (killed): the process restarts from what is stored.
    }
  }
  return false;
}

const streamArb = fc
  .array(fc.record({ producer: fc.constantFrom('p', 'q'), id: fc.integer({ min: 1, max: 6 }) }), {
    minLength: 1,
    maxLength: 12,
  })
  .map((entries) =>
    entries.map((e, i): IncomingMessage => ({
      offset: BigInt(i),
      content: Buffer.from(''),
      applicationProperties: identityHeaders(e.producer, BigInt(e.id)),
    })),
  );

const cutArb: fc.Arbitrary<Cut> = fc.record({
  victim: fc.constantFrom('A' as const, 'B' as const),
  at: fc.constantFrom('now' as const, 'before' as const, 'after' as const),
});

interface Stats {
  runs: number;
  rewinds: number;
  kills: number;
  cuts: number;
  lostAnswers: number;
  cutBeforeCommit: number;
  reconnects: number;
  unseenEnds: number;
}

const newStats = (): Stats => ({
  runs: 0,
  rewinds: 0,
  kills: 0,
  cuts: 0,
  lostAnswers: 0,
  cutBeforeCommit: 0,
  reconnects: 0,
  unseenEnds: 0,
});

/**
 * One run: processes A (and B when `processes` is 2) consume `stream`, the kills and cuts happening
 * at moments the scheduler chooses; then the property's checks.
 */
async function check(
  stats: Stats,
  s: Scheduler,
  stream: IncomingMessage[],
  commitEvery: number,
  kills: ReadonlyArray<'A' | 'B'>,
  cuts: readonly Cut[],
  unseenEndAt: number | undefined,
  processes: 1 | 2,
): Promise<void> {
  const db = new FakeDatabase(s);
  const lives = new Map<string, Life>();
  const reconnects = { count: 0 };
  // Each kill happens at a moment the scheduler chooses.
  for (const victim of kills) {
    void s.schedule(Promise.resolve(), `kill ${victim}`).then(() => {
      const life = lives.get(victim);
      if (life === undefined || life.dead) return;
      life.dead = true;
      stats.kills++;
      for (const conn of life.connections) conn.terminate();
    });
  }
  // Each cut too: the victim's connections now, or the victim's next COMMIT armed.
  for (const { victim, at } of cuts) {
    void s.schedule(Promise.resolve(), `cut ${victim} ${at}`).then(() => {
      const life = lives.get(victim);
      if (life === undefined || life.dead) return;
      stats.cuts++;
      if (at === 'now') for (const conn of life.connections) conn.cut();
      else life.cutAtCommit = at;
    });
  }
  const done = Promise.all([
    run('A', db, stream, commitEvery, lives, 12, unseenEndAt, reconnects),
    processes === 2 ? run('B', db, stream, commitEvery, lives, 12, undefined, reconnects) : true,
  ]);
  await s.waitFor(done);
  const finished = await done;
  stats.runs++;
  stats.rewinds += db.fenced;
  stats.lostAnswers += db.lostAnswers;
  stats.cutBeforeCommit += db.cutBeforeCommit;
  stats.reconnects += reconnects.count;
  // A life stops only when killed — or, in a run whose handler ended its transaction where the
  // guard does not see it, with the library's refusal of that batch (its TypeError).
  const unseenRun = unseenEndAt !== undefined && unseenEndAt < stream.length;
  expect(
    db.unexpected.filter(
      (err) => !(unseenRun && err instanceof TypeError && /was ended inside a handler/.test(err.message)),
    ),
  ).toEqual([]);
  expect(finished.every(Boolean)).toBe(true);
  // The identity headers name (producer, ID): equal headers, equal identity.
  const distinct = new Set(stream.map((m) => JSON.stringify(m.applicationProperties)));
  expect(db.committed.applied.size).toBe(distinct.size);
  // After a transaction ended unseen, what ran after it was autocommitted (and a restart applies it
  // again): the library cannot undo that. What it must not do is record an ID as seen whose effect
  // was rolled back: every ID is applied at least once.
  if (unseenRun) stats.unseenEnds++;
  for (const [key, count] of db.committed.applied) {
    if (unseenRun) expect(count, key).toBeGreaterThanOrEqual(1);
    else expect(count, key).toBe(1);
  }
  expect(db.committed.offset).toBe(String(stream.length - 1));
}

describe('PostgreSQL fence model', () => {
  it('two processes under one consumer name, interleaved statement by statement, SIGKILLed and cut (a COMMIT of unknown outcome), apply every (producer, ID) exactly once', async () => {
    const stats = newStats();
    await fc.assert(
      fc.asyncProperty(
        streamArb,
        fc.integer({ min: 1, max: 3 }),
        fc.array(fc.constantFrom('A' as const, 'B' as const), { maxLength: 3 }),
        fc.array(cutArb, { maxLength: 3 }),
        fc.scheduler(),
        fc.option(fc.nat({ max: 11 }), { freq: 3 }),
        async (stream, commitEvery, kills, cuts, s, unseenEndAt) =>
          check(stats, s, stream, commitEvery, kills, cuts, unseenEndAt ?? undefined, 2),
      ),
      { numRuns: 300 },
    );
    console.log(`[postgres fence model] ${JSON.stringify(stats)}`);
  });

  it("a handler's SQL ends the transaction unseen in the middle of a batch: no ID is recorded as seen whose effect was rolled back (review B, H1)", async () => {
    // Targeted: the unseen end falls after the batch's first message (one before it in the same
    // transaction is rolled back), the stream's IDs mostly distinct, one or two processes, few faults.
    const stats = newStats();
    const arb = fc
      .record({
        commitEvery: fc.integer({ min: 2, max: 4 }),
        batch: fc.nat({ max: 2 }),
        at: fc.integer({ min: 1, max: 3 }),
        ids: fc.uniqueArray(
          fc.record({ producer: fc.constantFrom('p', 'q'), id: fc.integer({ min: 1, max: 8 }) }),
          { minLength: 2, maxLength: 12, selector: (e) => `${e.producer}/${e.id}` },
        ),
      })
      .filter(({ commitEvery, at }) => at < commitEvery)
      .map(({ commitEvery, batch, at, ids }) => ({
        commitEvery,
        unseenEndAt: Math.min(batch * commitEvery + at, ids.length - 1),
        stream: ids.map((e, i): IncomingMessage => ({
          offset: BigInt(i),
          content: Buffer.from(''),
          applicationProperties: identityHeaders(e.producer, BigInt(e.id)),
        })),
      }));
    await fc.assert(
      fc.asyncProperty(
        arb,
        fc.constantFrom(1 as const, 2 as const),
        fc.array(cutArb, { maxLength: 1 }),
        fc.scheduler(),
        async ({ stream, commitEvery, unseenEndAt }, processes, cuts, s) =>
          check(stats, s, stream, commitEvery, [], cuts, unseenEndAt, processes),
      ),
      { numRuns: 100 },
    );
    console.log(`[postgres fence model, unseen end mid-batch] ${JSON.stringify(stats)}`);
  });
});

/**
 * One holder's period of a consumer group's partition on a shared database (src/group, the
 * shared-database strategy): a core opened on the partition's name, resuming from the stored
 * offset. A revocation the holder sees drops its batch at once, possibly in the middle of a
 * handler (`discardPending()`, as GroupPartition #lose does: review B L4); one it does not see (a
 * paused member) lets it go on for `lateSteps` more messages, whose batches the fence must refuse.
 */
interface Tenure {
  revoked: boolean;
  readonly seen: boolean;
  readonly lateSteps: number;
  core?: VerifyingConsumerCore;
  /** Called inside the handler, between its two statements. */
  statement?: () => void;
}

async function hold(
  name: string,
  db: FakeDatabase,
  stream: IncomingMessage[],
  commitEvery: number,
  t: Tenure,
): Promise<void> {
  const life: Life = { name, dead: false, connections: [] };
  const provider: ConsumerStoreProvider = {
    openConsumerStore: (consumer, onFailure) =>
      PgConsumerStore.open(fakePool(db, life), TABLES, consumer, LIMITS, onFailure, () => undefined),
  };
  const core = await VerifyingConsumerCore.open({
    consumerName: 'group.orders-0',
    store: provider,
    commitEvery,
    commitLingerMs: 2_147_483_647,
    // Not deterministic (the clock), and two statements with a moment between them.
    handler: postgresHandler(async (message, { client }) => {
      const { producerName, publishingId } = message.identity!;
      await client.query('APPLY', [`${producerName}/${publishingId}`, Date.now()]);
      // The handler's later statement: a revocation before it is review B's L4.
      t.statement?.();
      await client.query('CLOCK', [Date.now()]);
    }),
  });
  t.core = core;
  // The group drops a partition whose batch rewinds (a fence): it subscribes again.
  let rewound = false;
  core.onRewind(() => {
    rewound = true;
    db.fenced++;
  });
  let late = 0;
  let finished = false;
  for (let o = Number(core.resumeOffset ?? 0n); ; o++) {
    if (t.revoked && (t.seen || late++ >= t.lateSteps)) break;
    if (o >= stream.length) {
      finished = !t.revoked;
      break;
    }
    try {
      await core.process(stream[o]!);
    } catch (err) {
      db.unexpected.push(err);
      break;
    }
    if (rewound || core.failure !== undefined) break;
  }
  if (finished) await core.flush();
  core.discardPending();
  await core.close();
  if (core.failure !== undefined) db.unexpected.push(core.failure);
}

describe('PostgreSQL fence model - consumer group on a shared database', () => {
  it('holders of one partition revoked mid-batch (seen: dropped mid-handler; unseen: late batches), with a clock-using handler, apply every (producer, ID) exactly once and never crash', async () => {
    const stats = { runs: 0, fenced: 0, revocations: 0, seen: 0 };
    await fc.assert(
      fc.asyncProperty(
        streamArb,
        fc.integer({ min: 1, max: 3 }),
        fc.array(
          fc.record({ seen: fc.boolean(), lateSteps: fc.nat({ max: 4 }), at: fc.option(fc.nat({ max: 4 })) }),
          {
            maxLength: 4,
          },
        ),
        fc.scheduler(),
        async (stream, commitEvery, revocations, s) => {
          const db = new FakeDatabase(s);
          const holding: Promise<void>[] = [];
          // The broker: a holder at a time; each planned revocation, at a moment the scheduler
          // chooses, gives the partition to the other member at once (the old one may not know yet).
          const run = (async () => {
            for (let i = 0; i < 30; i++) {
              const plan = revocations[i];
              const t: Tenure = { revoked: false, seen: plan?.seen ?? true, lateSteps: plan?.lateSteps ?? 0 };
              const held = hold(i % 2 === 0 ? 'A' : 'B', db, stream, commitEvery, t);
              holding.push(held);
              let revoke = (): void => undefined;
              const revoked = new Promise<void>((resolve) => (revoke = resolve));
              const drop = (): void => {
                if (t.revoked) return;
                t.revoked = true;
                stats.revocations++;
                // GroupPartition #lose: the batch goes at once, a handler may be running.
                if (t.seen) {
                  stats.seen++;
                  t.core?.discardPending();
                }
                revoke();
              };
              if (plan !== undefined && plan.at !== null) {
                // Inside a handler, at its `at`-th message, between its statements.
                let statements = 0;
                t.statement = () => {
                  if (statements++ === plan.at) drop();
                };
              } else if (plan !== undefined) {
                // At a moment the scheduler chooses.
                void s.schedule(Promise.resolve(), `revoke ${i}`).then(drop);
              }
              const ended = await Promise.race([held.then(() => 'ended'), revoked.then(() => 'revoked')]);
              if (ended === 'ended' && db.committed.offset === String(stream.length - 1)) return;
            }
          })();
          await s.waitFor(run);
          await s.waitFor(Promise.all(holding));
          stats.runs++;
          stats.fenced += db.fenced;
          expect(db.unexpected).toEqual([]);
          const distinct = new Set(stream.map((m) => JSON.stringify(m.applicationProperties)));
          expect(db.committed.applied.size).toBe(distinct.size);
          for (const [key, count] of db.committed.applied) expect(count, key).toBe(1);
          expect(db.committed.offset).toBe(String(stream.length - 1));
        },
      ),
      { numRuns: 300 },
    );
    console.log(`[postgres fence model, group] ${JSON.stringify(stats)}`);
  });
});
