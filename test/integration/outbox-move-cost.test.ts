/**
 * The numbering's move must not scan the backlog (issue 35, perf35): with `producer_name = … AND
 * id = ANY(…)` the planner read the (producer_name, id) index over every waiting row of the name
 * and filtered the ids, so each move of 500 rows cost O(backlog) (44.7 ms of 100 000 rows against
 * 3.0 ms by the primary key) and draining a backlog cost its square. Counted with PostgreSQL's own
 * index counters (pg_stat_user_indexes): index entries read per row relayed.
 */
import pg from 'pg';
import { afterEach, describe, expect, it } from 'vitest';
import { PgOutboxRelay } from '../../src/postgres.js';
import { STREAM_CONNECTION, uniqueName } from '../support/broker.js';
import { PG_URL, useSchema } from '../support/postgres.js';
import { useClient } from '../support/stream.js';

const client = useClient();
const cleanups: Array<() => Promise<void>> = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup().catch(() => undefined);
});

/** Index entries read from the outbox's indexes (0 before the statistics know them). */
async function entriesRead(pool: pg.Pool, schema: string): Promise<number> {
  const { rows } = await pool.query<{ n: number }>(
    `SELECT coalesce(sum(idx_tup_read), 0)::int AS n FROM pg_stat_user_indexes WHERE schemaname = $1 AND relname = 'outbox'`,
    [schema],
  );
  return rows[0]!.n;
}

describe('outbox relay - move cost', () => {
  it('reads each waiting row’s index entries a bounded number of times, whatever the backlog', async () => {
    const db = await useSchema();
    cleanups.push(db.drop);
    const stream = uniqueName('outbox-move');
    await client().createStream({ stream, arguments: {} });
    cleanups.push(async () => void (await client().deleteStream({ stream })));
    const producerName = uniqueName('outbox-move');
    const n = 20_000;
    await db.pool.query(
      `INSERT INTO "${db.schema}".outbox (producer_name, body) SELECT $1, convert_to('m' || g, 'UTF8') FROM generate_series(1, $2) g`,
      [producerName, n],
    );
    // The relay's own pool: ending it ends its sessions, which flushes their statistics.
    const relayPool = new pg.Pool({ connectionString: PG_URL, max: 4 });
    relayPool.on('error', () => undefined);
    let confirmed = 0;
    let allConfirmed!: () => void;
    const done = new Promise<void>((resolve) => (allConfirmed = resolve));
    const relay = await PgOutboxRelay.open({
      pool: relayPool,
      schema: db.schema,
      producerName,
      stream,
      connection: STREAM_CONNECTION,
      onEvent: (e) => {
        if (e.type === 'confirmed' && (confirmed += e.count) >= n) allConfirmed();
      },
    });
    await done;
    await relay.close();
    await relayPool.end();
    // Statistics reach the shared counters when a session ends (no event to wait for): bounded poll.
    const deadline = Date.now() + 15_000;
    let read = await entriesRead(db.pool, db.schema);
    while (read < n && Date.now() < deadline) {
      await new Promise((resolve) => setTimeout(resolve, 100));
      read = await entriesRead(db.pool, db.schema);
    }
    console.log(`[outbox move cost] ${n} rows relayed: ${read} index entries read`);
    // Measured 3n (the read, the move by the primary key, dead entries stepped over once before
    // they are marked killed); the move scanning the backlog read 346 000 = 17n.
    expect(read).toBeGreaterThanOrEqual(n);
    expect(read).toBeLessThan(6 * n);
  }, 60_000);
});
