/**
 * The outbox relay's close() releases everything within its bound (review A): a standby closed
 * while it waits for a pool connection must neither keep nor later take the producer name (its
 * loop used to go on after close() returned: it took the lock, bumped the epoch, connected to the
 * broker, and nothing released the lock connection). Real broker, real PostgreSQL.
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

describe('outbox relay close() of a standby waiting for a pool connection', () => {
  it('returns within its bound and never holds the producer name afterwards', async () => {
    const db = await useSchema();
    cleanups.push(db.drop);
    const stream = uniqueName('outbox-close');
    await client().createStream({ stream, arguments: {} });
    cleanups.push(async () => void (await client().deleteStream({ stream })));
    const producerName = uniqueName('relay-close');
    const appName = uniqueName('relay-close-b');
    const base = {
      schema: db.schema,
      producerName,
      stream,
      connection: STREAM_CONNECTION,
      takeoverIntervalMs: 100,
    };

    const a = await PgOutboxRelay.open({ ...base, pool: db.pool });
    expect(a.stats.isActive).toBe(true);

    const poolB = new pg.Pool({ connectionString: PG_URL, max: 2, application_name: appName });
    poolB.on('error', () => undefined);
    cleanups.push(async () => {
      // Whatever B leaked is ended here, so that the schema can be dropped even when the test fails.
      await db.pool.query(
        'SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1',
        [appName],
      );
      await poolB.end().catch(() => undefined);
    });
    const eventsB: Array<{ at: number; e: OutboxRelayEvent }> = [];
    const b = await PgOutboxRelay.open({
      ...base,
      pool: poolB,
      closeTimeoutMs: 100,
      connectTimeoutMs: 8_000,
      onEvent: (e) => eventsB.push({ at: performance.now(), e }),
    });
    expect(b.stats.isActive).toBe(false);

    // The application holds poolB's connections (a busy pool): B's next lock try waits for one.
    const held = [await poolB.connect(), await poolB.connect()];
    await sleep(300);
    await a.close(); // the name is free now

    const closeStarted = performance.now();
    const closing = b.close().then(() => performance.now());
    await sleep(1_600); // past closeTimeoutMs + 1 s
    for (const h of held) h.release();
    const closedAt = await closing;
    await sleep(1_500); // B's connect would have been answered by now

    const leaked = await db.pool.query<{ n: number }>(
      `SELECT count(*)::int AS n FROM pg_locks l JOIN pg_stat_activity s USING (pid)
        WHERE l.locktype = 'advisory' AND s.application_name = $1`,
      [appName],
    );
    const after = eventsB.filter((x) => x.at >= closedAt).map((x) => x.e.type);
    // A third relay takes the name over.
    const c = await PgOutboxRelay.open({ ...base, pool: db.pool });
    cleanups.push(() => c.close());
    console.log(`[outbox close] standby close() took ${(closedAt - closeStarted).toFixed(0)} ms`);
    expect({
      lockHoldersOfB: leaked.rows[0]!.n,
      eventsOfBAfterClose: after,
      cActive: c.stats.isActive,
      everActiveB: eventsB.some((x) => x.e.type === 'active'),
    }).toEqual({ lockHoldersOfB: 0, eventsOfBAfterClose: [], cActive: true, everActiveB: false });
    // Bounded by the close signal, not by the pool's connect (8 s) nor closeTimeoutMs + 1 s.
    expect(closedAt - closeStarted).toBeLessThan(1_000);
  }, 60_000);
});
