/**
 * The transactional outbox relay (docs/design.md §14) against the real broker and PostgreSQL: a
 * rolled-back enqueue publishes nothing; transactions committing in the opposite order of their
 * INSERTs are published in commit order, once; a relay that stops at any crash point and reopens
 * neither loses nor doubles; a standby takes over; refusals are typed.
 */
import pg, { type PoolClient } from 'pg';
import { afterEach, describe, expect, it } from 'vitest';
import { DedupError } from '../../src/errors.js';
import { OutboxPoisonRowError, PgOutbox, PgOutboxRelay } from '../../src/postgres.js';
import type { OutboxRelayEvent, PgOutboxRelayOptions } from '../../src/postgres/outbox/relay-options.js';
import { partitionForKey } from '../../src/superstream/routing.js';
import { STREAM_CONNECTION, uniqueName } from '../support/broker.js';
import { PG_URL, useSchema } from '../support/postgres.js';
import { readAll, useClient, type Message } from '../support/stream.js';
import { useSuperStreams } from '../support/superstream.js';

const client = useClient();
const superStreams = useSuperStreams(client);
const cleanups: Array<() => Promise<void>> = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup().catch(() => undefined);
});

async function setup(): Promise<{
  db: Awaited<ReturnType<typeof useSchema>>;
  stream: string;
  outbox: PgOutbox;
  producerName: string;
}> {
  const db = await useSchema();
  cleanups.push(db.drop);
  const stream = uniqueName('outbox');
  await client().createStream({ stream, arguments: {} });
  cleanups.push(async () => {
    await client().deleteStream({ stream });
  });
  const producerName = uniqueName('relay');
  return { db, stream, producerName, outbox: PgOutbox.create({ schema: db.schema, producerName }) };
}

async function openRelay(options: PgOutboxRelayOptions): Promise<PgOutboxRelay> {
  const relay = await PgOutboxRelay.open({
    connection: STREAM_CONNECTION,
    pollIntervalMs: 200,
    takeoverIntervalMs: 100,
    ...options,
  });
  cleanups.push(() => relay.close());
  return relay;
}

/** Resolves when `count` rows in all have been deleted as stored (confirmed, or found stored at recovery). */
function confirmedCounter(): { onEvent: (e: OutboxRelayEvent) => void; reach: (n: number) => Promise<void> } {
  let confirmed = 0;
  const waiters: Array<{ n: number; resolve: () => void }> = [];
  return {
    onEvent: (e) => {
      // Rows found stored at recovery are deleted without a confirm.
      if (e.type === 'recovered') confirmed += e.alreadyStored;
      if (e.type !== 'confirmed' && e.type !== 'recovered') return;
      if (e.type === 'confirmed') confirmed += e.count;
      for (const w of waiters.splice(0)) {
        if (confirmed >= w.n) w.resolve();
        else waiters.push(w);
      }
    },
    reach: (n) =>
      confirmed >= n ? Promise.resolve() : new Promise<void>((resolve) => waiters.push({ n, resolve })),
  };
}

async function inTransaction<T>(c: PoolClient, work: () => Promise<T>): Promise<T> {
  await c.query('BEGIN');
  const result = await work();
  await c.query('COMMIT');
  return result;
}

const bodies = (messages: Message[]): string[] => messages.map((m) => m.content.toString());
const ids = (messages: Message[]): string[] =>
  messages.map((m) => String(m.applicationProperties?.['x-dedup-id']));

async function waitingRows(
  pool: { query: (t: string) => Promise<{ rows: Array<{ n: string }> }> },
  schema: string,
) {
  // Not numbered yet (in the outbox) or numbered and unconfirmed (in batch records).
  const found = await pool.query(
    `SELECT (SELECT count(*) FROM "${schema}".outbox) +
            (SELECT coalesce(sum(cardinality(row_ids)), 0) FROM "${schema}".outbox_batches) AS n`,
  );
  return Number(found.rows[0]!.n);
}

describe('PgOutboxRelay', () => {
  it('publishes committed rows once and nothing of a rolled-back transaction', async () => {
    const { db, stream, outbox, producerName } = await setup();
    const c = await db.pool.connect();
    try {
      await c.query('BEGIN');
      await outbox.enqueue(c, Buffer.from('rolled-back'));
      await c.query('ROLLBACK');
      await inTransaction(c, async () => {
        await outbox.enqueue(c, Buffer.from('a'), { key: 'k', headers: { type: 'created' } });
        await outbox.enqueue(c, Buffer.from('b'), { key: 'k' });
      });
    } finally {
      c.release();
    }
    const counter = confirmedCounter();
    await openRelay({ pool: db.pool, schema: db.schema, producerName, stream, onEvent: counter.onEvent });
    await counter.reach(2);
    const messages = await readAll(client(), stream);
    expect(bodies(messages)).toEqual(['a', 'b']);
    expect(ids(messages)).toEqual(['1', '2']);
    expect(messages[0]!.applicationProperties?.['type']).toBe('created');
    expect(await waitingRows(db.pool, db.schema)).toBe(0);
  });

  it('publishes transactions committing in the opposite order of their INSERTs in commit order', async () => {
    const { db, stream, outbox, producerName } = await setup();
    const counter = confirmedCounter();
    const relay = await openRelay({
      pool: db.pool,
      schema: db.schema,
      producerName,
      stream,
      onEvent: counter.onEvent,
    });
    const [a, b, r] = [await db.pool.connect(), await db.pool.connect(), await db.pool.connect()];
    try {
      for (const c of [a, b, r]) await c.query('BEGIN');
      // A takes the lower outbox id, B the higher, R rolls back; B commits first and is published
      // before A commits. A bigserial numbering would give A the lower publishing ID after B's:
      // the broker would drop it as a duplicate.
      await outbox.enqueue(a, Buffer.from('A'), { key: 'order-1' });
      await outbox.enqueue(r, Buffer.from('R'), { key: 'order-3' });
      await outbox.enqueue(b, Buffer.from('B'), { key: 'order-2' });
      await b.query('COMMIT');
      await counter.reach(1);
      await r.query('ROLLBACK');
      await a.query('COMMIT');
      await counter.reach(2);
    } finally {
      for (const c of [a, b, r]) c.release();
    }
    const messages = await readAll(client(), stream);
    expect(bodies(messages)).toEqual(['B', 'A']);
    expect(ids(messages)).toEqual(['1', '2']);
    expect(relay.stats).toMatchObject({ published: 2, confirmed: 2, resent: 0 });
  });

  it('re-sends rows numbered by a relay that died before sending, under the same IDs, once', async () => {
    const { db, stream, outbox, producerName } = await setup();
    const c = await db.pool.connect();
    try {
      await inTransaction(c, async () => {
        for (let i = 0; i < 5; i++) await outbox.enqueue(c, Buffer.from(`m${i}`));
      });
      // A relay died after committing its numbering, before sending: rows 1–3 numbered.
      await c.query(
        `WITH moved AS (DELETE FROM "${db.schema}".outbox WHERE id IN (SELECT id FROM "${db.schema}".outbox ORDER BY id LIMIT 3)
                          RETURNING id, body, headers, created_at)
         INSERT INTO "${db.schema}".outbox_batches
         SELECT $2, $1, 1, array_agg(id ORDER BY id), array_agg(body ORDER BY id), jsonb_agg(headers ORDER BY id), min(created_at)
           FROM moved`,
        [stream, producerName],
      );
      await c.query(`INSERT INTO "${db.schema}".outbox_ids VALUES ($1, $2, 3)`, [producerName, stream]);
    } finally {
      c.release();
    }
    const counter = confirmedCounter();
    const relay = await openRelay({
      pool: db.pool,
      schema: db.schema,
      producerName,
      stream,
      onEvent: counter.onEvent,
    });
    await counter.reach(5);
    expect(relay.stats).toMatchObject({ resent: 3, published: 2, alreadyStored: 0 });
    const messages = await readAll(client(), stream);
    expect(bodies(messages)).toEqual(['m0', 'm1', 'm2', 'm3', 'm4']);
    expect(ids(messages)).toEqual(['1', '2', '3', '4', '5']);
  });

  it('deletes unsent the rows the broker stored before the relay died (their delete was lost)', async () => {
    const { db, stream, outbox, producerName } = await setup();
    const c = await db.pool.connect();
    try {
      await inTransaction(c, async () => {
        for (let i = 0; i < 4; i++) await outbox.enqueue(c, Buffer.from(`m${i}`));
      });
      const first = confirmedCounter();
      const relay = await openRelay({
        pool: db.pool,
        schema: db.schema,
        producerName,
        stream,
        onEvent: first.onEvent,
      });
      await first.reach(4);
      await relay.close();
      // The crash point between the broker's confirm and the batch record's DELETE: the record is back.
      await c.query(
        `INSERT INTO "${db.schema}".outbox_batches
         SELECT $1, $2, 1, array_agg(g::bigint ORDER BY g), array_agg(convert_to('m' || (g - 1), 'UTF8') ORDER BY g),
                jsonb_agg(NULL::jsonb), now()
           FROM generate_series(1, 4) g`,
        [producerName, stream],
      );
      await inTransaction(c, () => outbox.enqueue(c, Buffer.from('m4')));
    } finally {
      c.release();
    }
    const counter = confirmedCounter();
    const relay = await openRelay({
      pool: db.pool,
      schema: db.schema,
      producerName,
      stream,
      onEvent: counter.onEvent,
    });
    await counter.reach(5);
    expect(relay.stats).toMatchObject({ alreadyStored: 4, resent: 0, published: 1, confirmed: 1 });
    const messages = await readAll(client(), stream);
    expect(bodies(messages)).toEqual(['m0', 'm1', 'm2', 'm3', 'm4']);
    expect(await waitingRows(db.pool, db.schema)).toBe(0);
  });

  it('closed mid-way and reopened: every row once, in order, under IDs 1 … n', async () => {
    const { db, stream, outbox, producerName } = await setup();
    const n = 400;
    const c = await db.pool.connect();
    try {
      await inTransaction(c, async () => {
        for (let i = 0; i < n; i++) await outbox.enqueue(c, Buffer.from(`m${i}`));
      });
    } finally {
      c.release();
    }
    const common = { pool: db.pool, schema: db.schema, producerName, stream, batchSize: 20, maxInFlight: 40 };
    let closing: Promise<void> | undefined;
    const first: PgOutboxRelay = await openRelay({
      ...common,
      onEvent: (e) => {
        if (e.type === 'confirmed') closing ??= first.close();
      },
    });
    await first.closed();
    await closing;
    const left = await waitingRows(db.pool, db.schema);
    expect(left).toBeGreaterThan(0);
    expect(left).toBeLessThan(n);
    const counter = confirmedCounter();
    const second = await openRelay({ ...common, onEvent: counter.onEvent });
    await counter.reach(left);
    const { published, resent, alreadyStored } = second.stats;
    expect(published + resent + alreadyStored).toBe(left);
    const messages = await readAll(client(), stream);
    expect(bodies(messages)).toEqual(Array.from({ length: n }, (_, i) => `m${i}`));
    expect(ids(messages)).toEqual(Array.from({ length: n }, (_, i) => String(i + 1)));
  });

  it('keeps a second relay waiting; when the first one’s lock session ends, exactly one of them holds the name again within 5 s', async () => {
    const { db, stream, outbox, producerName } = await setup();
    const counter = confirmedCounter();
    const common = { pool: db.pool, schema: db.schema, producerName, stream, onEvent: counter.onEvent };
    const first = await openRelay(common);
    const second = await openRelay(common);
    expect(first.stats.isActive).toBe(true);
    expect(second.stats.isActive).toBe(false);
    const c = await db.pool.connect();
    try {
      await inTransaction(c, () => outbox.enqueue(c, Buffer.from('one')));
      await counter.reach(1);
      // The server ends the first relay's lock session (its lock goes with it). Its process lives on
      // and may take the lock back before the standby's next try (every takeoverIntervalMs): which
      // one wins is a race; that exactly one is active, and every row goes out once, is not. A
      // relay that dies is the SIGKILL test's (outbox-kill.test.ts).
      const killed = Date.now();
      await c.query(
        `SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND pid <> pg_backend_pid()
           AND objid = (hashtextextended($1, 0) & 4294967295)::oid`,
        [`stream-dedup-outbox:${db.schema}:${producerName}`],
      );
      await inTransaction(c, () => outbox.enqueue(c, Buffer.from('two')));
      await counter.reach(2);
      expect(Date.now() - killed).toBeLessThan(5_000);
    } finally {
      c.release();
    }
    expect([first.stats.isActive, second.stats.isActive].filter(Boolean)).toHaveLength(1);
    const messages = await readAll(client(), stream);
    expect(bodies(messages)).toEqual(['one', 'two']);
    expect(ids(messages)).toEqual(['1', '2']);
  });

  it('a relay whose sessions ended, work first, does not take the name again while another session holds the lock', async () => {
    const { db, stream, outbox, producerName } = await setup();
    const counter = confirmedCounter();
    // The relay's own pool, so that the test can end its sessions and only those.
    const appName = uniqueName('relay-a');
    const pool = new pg.Pool({ connectionString: PG_URL, application_name: appName, max: 4 });
    pool.on('error', () => undefined);
    cleanups.push(() => pool.end());
    const events: OutboxRelayEvent[] = [];
    /** Whether an event of `type` arrives within `ms` (counting from `events.length = 0`). */
    const seen = (type: OutboxRelayEvent['type'], ms: number): Promise<boolean> =>
      new Promise((resolve) => {
        const done = (found: boolean): void => {
          clearInterval(check);
          clearTimeout(timer);
          resolve(found);
        };
        const check = setInterval(() => events.some((e) => e.type === type) && done(true), 10);
        const timer = setTimeout(() => done(false), ms);
      });
    const relay = await openRelay({
      pool,
      schema: db.schema,
      producerName,
      stream,
      reconnect: { initialDelayMs: 1_000, maxDelayMs: 1_000, giveUpAfterMs: 60_000 },
      onEvent: (e) => {
        counter.onEvent(e);
        events.push(e);
      },
    });
    await outbox.enqueue(db.pool, Buffer.from('one'));
    await counter.reach(1);
    const lockKey = `stream-dedup-outbox:${db.schema}:${producerName}`;
    const lockHolders = (param: string): string =>
      `SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted
         AND objid = (hashtextextended(${param}, 0) & 4294967295)::oid`;
    const other = await db.pool.connect();
    try {
      // The bad order: the work session ends first (the life fails on it; the lock connection is
      // kept for the next life), then the lock session, and another session takes the lock.
      events.length = 0;
      await other.query(
        `SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity WHERE application_name = $1
           AND pid NOT IN (${lockHolders('$2')})`,
        [appName, lockKey],
      );
      expect(await seen('retrying', 5_000)).toBe(true);
      // The other session queues for the lock before the relay's lock session ends, so it gets
      // the lock as that session exits, whatever the relay retries then.
      const otherPid = (await other.query<{ pid: number }>('SELECT pg_backend_pid() AS pid')).rows[0]!.pid;
      const taken = other.query('SELECT pg_advisory_lock(hashtextextended($1, 0))', [lockKey]);
      for (;;) {
        const waiting = await db.pool.query(
          `SELECT 1 FROM pg_locks WHERE pid = $1 AND locktype = 'advisory' AND NOT granted`,
          [otherPid],
        );
        if (waiting.rowCount === 1) break;
        await new Promise((resolve) => setTimeout(resolve, 10));
      }
      await db.pool.query(`SELECT pg_terminate_backend(pid, 5000) FROM (${lockHolders('$1')}) AS l`, [
        lockKey,
      ]);
      await taken;
      // The lock is the other session's: the relay must stay a standby (its retry comes within 1 s).
      expect(await seen('active', 2_500)).toBe(false);
      expect(relay.stats.isActive).toBe(false);
      await other.query('SELECT pg_advisory_unlock(hashtextextended($1, 0))', [lockKey]);
    } finally {
      other.release();
    }
    // Once the lock is free, it takes the name over under the next epoch and publishes.
    expect(await seen('active', 5_000)).toBe(true);
    expect(
      events.filter((e) => e.type === 'active').map((e) => (e.type === 'active' ? e.epoch : 0n)),
    ).toEqual([2n]);
    await outbox.enqueue(db.pool, Buffer.from('two'));
    await counter.reach(2);
    const messages = await readAll(client(), stream);
    expect(bodies(messages)).toEqual(['one', 'two']);
    expect(ids(messages)).toEqual(['1', '2']);
  });

  it('a relay whose lease was taken over numbers nothing more under its old lease', async () => {
    const { db, stream, outbox, producerName } = await setup();
    const counter = confirmedCounter();
    const events: string[] = [];
    const relay = await openRelay({
      pool: db.pool,
      schema: db.schema,
      producerName,
      stream,
      onEvent: (e) => {
        counter.onEvent(e);
        events.push(e.type === 'active' ? `active ${e.epoch}` : e.type);
      },
    });
    // Another relay took the name over (its takeover bumped the epoch) while this one held on.
    await db.pool.query(`UPDATE "${db.schema}".outbox_relays SET epoch = epoch + 1, holder = 'other'`);
    const c = await db.pool.connect();
    try {
      await inTransaction(c, () => outbox.enqueue(c, Buffer.from('x')));
    } finally {
      c.release();
    }
    await counter.reach(1);
    // Fenced at its numbering, it let the lock go, took the name again under a new epoch, then numbered.
    expect(events.filter((e) => e.startsWith('active'))).toEqual(['active 1', 'active 3']);
    expect(relay.stats.takeovers).toBe(2);
    expect(bodies(await readAll(client(), stream))).toEqual(['x']);
  });

  /** A relay idle after relaying one row, and the time from a second row's COMMIT to its confirm. */
  async function secondRowAfter(options: { pollIntervalMs: number; notify: boolean }): Promise<number> {
    const { db, stream, outbox, producerName } = await setup();
    if (!options.notify) {
      // A notification lost (sent while the relay's listening session was down): none is sent.
      await db.pool.query(`ALTER TABLE "${db.schema}".outbox DISABLE TRIGGER outbox_notify`);
    }
    await outbox.enqueue(db.pool, Buffer.from('first'));
    const counter = confirmedCounter();
    await openRelay({
      pool: db.pool,
      schema: db.schema,
      producerName,
      stream,
      pollIntervalMs: options.pollIntervalMs,
      onEvent: counter.onEvent,
    });
    // The first row's numbering found nothing more: from here the relay reads again only when a
    // notification wakes it or its poll comes round.
    await counter.reach(1);
    await outbox.enqueue(db.pool, Buffer.from('second'));
    const committed = performance.now();
    await counter.reach(2);
    const took = performance.now() - committed;
    expect(bodies(await readAll(client(), stream))).toEqual(['first', 'second']);
    return took;
  }

  it('a commit wakes the idle relay through LISTEN/NOTIFY, long before its poll', async () => {
    // The poll (min of pollIntervalMs and confirmTimeoutMs, 30 s) cannot be what found the row.
    const took = await secondRowAfter({ pollIntervalMs: 60_000, notify: true });
    expect(took).toBeLessThan(5_000);
  });

  it('a row whose notification never came is found by the polling fallback within pollIntervalMs', async () => {
    const took = await secondRowAfter({ pollIntervalMs: 300, notify: false });
    expect(took).toBeLessThan(300 + 4_000);
  });

  it('stops at a poison row with an error naming it, after publishing the rows before it', async () => {
    const { db, stream, outbox, producerName } = await setup();
    const c = await db.pool.connect();
    let poisonId: string;
    try {
      await inTransaction(c, () => outbox.enqueue(c, Buffer.from('fine')));
      // Written around enqueue (which refuses it): a header the stream cannot carry.
      const found = await c.query<{ id: string }>(
        `INSERT INTO "${db.schema}".outbox (producer_name, body, headers) VALUES ($1, 'x', '{"h": [1]}') RETURNING id`,
        [producerName],
      );
      poisonId = found.rows[0]!.id;
      await inTransaction(c, () => outbox.enqueue(c, Buffer.from('after')));
    } finally {
      c.release();
    }
    const relay = await openRelay({ pool: db.pool, schema: db.schema, producerName, stream });
    const stopped = await relay.closed();
    expect(stopped).toBeInstanceOf(OutboxPoisonRowError);
    expect((stopped as OutboxPoisonRowError).rowId).toBe(BigInt(poisonId));
    expect((stopped as DedupError).message).toContain(`outbox row ${poisonId}`);
    expect(bodies(await readAll(client(), stream))).toEqual(['fine']);
    expect(await waitingRows(db.pool, db.schema)).toBe(2);
  });

  it('refuses wrong credentials and a missing schema with DEDUP_STORE_REFUSED', async () => {
    const { db, stream, producerName } = await setup();
    const pg = await import('pg');
    const wrong = new pg.default.Pool({ connectionString: PG_URL.replace(/:[^:@/]*@/, ':wrong@') });
    wrong.on('error', () => undefined);
    cleanups.push(() => wrong.end());
    for (const [pool, schema] of [
      [wrong, db.schema],
      [db.pool, 'sd_missing_schema'],
    ] as const) {
      const err = await PgOutboxRelay.open({
        pool,
        schema,
        producerName,
        stream,
        connection: STREAM_CONNECTION,
      }).then(
        () => undefined,
        (e: unknown) => e,
      );
      expect(err).toBeInstanceOf(DedupError);
      expect((err as DedupError).code).toBe('DEDUP_STORE_REFUSED');
    }
  });

  it('routes rows of a super stream by key as SuperStreamDedupPublisher does, with IDs per partition', async () => {
    const db = await useSchema();
    cleanups.push(db.drop);
    const superStream = await superStreams('outbox-super', 3);
    const producerName = uniqueName('relay');
    const outbox = PgOutbox.create({ schema: db.schema, producerName });
    // Twelve rows routed by their key, then six whose routing key overrides a key that would send
    // them elsewhere (the same precedence as SuperStreamDedupPublisher's).
    const rows = [
      ...Array.from({ length: 12 }, (_, i) => ({ body: `key-${i}`, key: `key-${i}`, routingKey: undefined })),
      ...Array.from({ length: 6 }, (_, i) => ({
        body: `routed-${i}`,
        key: `other-${i}`,
        routingKey: `key-${i}`,
      })),
    ];
    const c = await db.pool.connect();
    try {
      await inTransaction(c, async () => {
        for (const r of rows) {
          await outbox.enqueue(c, Buffer.from(r.body), {
            key: r.key,
            ...(r.routingKey === undefined ? {} : { routingKey: r.routingKey }),
          });
        }
      });
    } finally {
      c.release();
    }
    const counter = confirmedCounter();
    await openRelay({
      pool: db.pool,
      schema: db.schema,
      producerName,
      superStream,
      onEvent: counter.onEvent,
    });
    await counter.reach(rows.length);
    const partitions = Array.from({ length: 3 }, (_, i) => `${superStream}-${i}`);
    // The overriding routing keys do move rows: some `other-i` key routes elsewhere than `key-i`.
    expect(
      rows.some(
        (r) =>
          r.routingKey !== undefined &&
          partitionForKey(r.key, partitions) !== partitionForKey(r.routingKey, partitions),
      ),
    ).toBe(true);
    for (const partition of partitions) {
      const messages = await readAll(client(), partition);
      const expected = rows
        .filter((r) => partitionForKey(r.routingKey ?? r.key, partitions) === partition)
        .map((r) => r.body);
      expect(bodies(messages)).toEqual(expected);
      expect(ids(messages)).toEqual(expected.map((_, i) => String(i + 1)));
    }
  });
});
