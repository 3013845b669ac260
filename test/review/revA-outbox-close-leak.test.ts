/**
 * revA (hostile review), outbox relay close(): close() waits for the run loop only
 * closeTimeoutMs + 1 s, tears down, and returns. A standby whose loop is then still inside
 * #tryLock (waiting for a pool connection) goes on after close() returned: it takes the advisory
 * lock, takes the name over (bumps the epoch), connects to the broker, and nothing ever releases
 * the lock connection. A closed relay holds the producer name for good: no other relay can
 * become active (stuck until the process exits).
 *
 * Needs the broker (127.0.0.1:5552) and the project's PostgreSQL.
 */
import pg from 'pg';
import { afterEach, describe, expect, it } from 'vitest';
import { PgOutboxRelay } from '../../src/postgres.js';
import type { OutboxRelayEvent } from '../../src/postgres/outbox/relay-options.js';
import { STREAM_CONNECTION, uniqueName } from '../support/broker.js';
import { PG_URL, useSchema } from '../support/postgres.js';
import { useClient } from '../support/stream.js';

const client = useClient();
const cleanups: Array<() => Promise<void>> = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup().catch(() => undefined);
});
const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

describe('revA: outbox relay close() of a standby', () => {
  it('a closed standby never holds the producer name afterwards', async () => {
    const db = await useSchema();
    cleanups.push(db.drop);
    const stream = uniqueName('reva-outbox');
    await client().createStream({ stream, arguments: {} });
    cleanups.push(async () => void (await client().deleteStream({ stream })));
    const producerName = uniqueName('reva-relay');
    const base = { schema: db.schema, producerName, stream, connection: STREAM_CONNECTION, takeoverIntervalMs: 100 };

    const a = await PgOutboxRelay.open({ ...base, pool: db.pool });
    expect(a.stats.isActive).toBe(true);

    const poolB = new pg.Pool({ connectionString: PG_URL, max: 2 });
    poolB.on('error', () => undefined);
    const eventsB: Array<{ at: number; e: OutboxRelayEvent }> = [];
    const b = await PgOutboxRelay.open({
      ...base,
      pool: poolB,
      closeTimeoutMs: 100,
      connectTimeoutMs: 8_000,
      onEvent: (e) => eventsB.push({ at: Date.now(), e }),
    });
    expect(b.stats.isActive).toBe(false);

    // The application holds poolB's connections for a moment (a busy pool): B's next lock try waits.
    const held = [await poolB.connect(), await poolB.connect()];
    await sleep(300);
    await a.close(); // the name is free now

    const closing = b.close();
    await sleep(1_600); // past closeTimeoutMs + 1 s: close() tears down and stops waiting
    for (const h of held) h.release();
    await closing;
    const closedAt = Date.now();
    await sleep(3_000);

    // Who holds the relay's advisory lock now?
    const key = `stream-dedup-outbox:${db.schema}:${producerName}`;
    const { rows } = await db.pool.query(
      `SELECT l.pid FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted
         AND l.objid = (hashtextextended($1, 0) & 4294967295)::oid
         AND l.classid = ((hashtextextended($1, 0) >> 32) & 4294967295)::oid`,
      [key],
    );
    const after = eventsB.filter((x) => x.at >= closedAt).map((x) => x.e.type);
    // cleanup of what B leaked: end its sessions so the schema can be dropped
    cleanups.push(async () => {
      await db.pool.query(
        `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = current_user AND pid <> pg_backend_pid()
           AND application_name = '' AND pid = ANY($1::int[])`,
        [rows.map((r: { pid: number }) => r.pid)],
      );
      void poolB.end();
    });
    // A third relay can take the name over.
    const c = await PgOutboxRelay.open({ ...base, pool: db.pool });
    cleanups.push(() => c.close());
    await sleep(1_500);
    expect({ lockHolders: rows.length, eventsOfBAfterClose: after, cActive: c.stats.isActive }).toEqual({
      lockHolders: 0,
      eventsOfBAfterClose: [],
      cActive: true,
    });
  }, 60_000);
});
