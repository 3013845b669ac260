/**
 * The at-least-once outbox relay "written the usual way" (issue 35's comparison): in one
 * transaction, `SELECT … ORDER BY id LIMIT n FOR UPDATE SKIP LOCKED`, publish every row with the raw
 * client (an unnamed publisher: no deduplication), wait for the confirms, `DELETE` the rows, COMMIT.
 * A crash after the broker stored a batch and before the COMMIT publishes that batch again: the
 * duplicates the bench counts. Its table is its own (`naive_outbox`), filled with the same bodies.
 */
import type pg from 'pg';
import type { Client } from 'rabbitmq-stream-js-client';

/** Creates `schema.naive_outbox` (id, body) if it is missing. */
export async function createNaiveOutbox(pool: pg.Pool, schema: string): Promise<void> {
  await pool.query(
    `CREATE TABLE IF NOT EXISTS "${schema}".naive_outbox (id bigserial PRIMARY KEY, body bytea NOT NULL)`,
  );
}

/** Inserts `count` copies of `body` (or `bodyOf(i)`), in batches of 10 000 rows. */
export async function fillNaiveOutbox(
  pool: pg.Pool,
  schema: string,
  count: number,
  bodyOf: (i: number) => Buffer,
): Promise<void> {
  for (let from = 0; from < count; from += 10_000) {
    const bodies = Array.from({ length: Math.min(10_000, count - from) }, (_, i) => bodyOf(from + i));
    await pool.query(`INSERT INTO "${schema}".naive_outbox (body) SELECT unnest($1::bytea[])`, [bodies]);
  }
}

export interface NaiveRelayOptions {
  readonly pool: pg.Pool;
  readonly schema: string;
  readonly client: Client;
  readonly stream: string;
  /** Rows a transaction takes. Default 1 000. */
  readonly batch?: number;
  /** Returns once the table is empty (the bench's throughput case); otherwise polls every `pollMs`. */
  readonly untilEmpty?: boolean;
  readonly pollMs?: number;
  readonly signal?: AbortSignal;
  /** Called after each committed batch with the rows it published. */
  readonly onBatch?: (rows: number) => void;
}

/** Relays until the table is empty (`untilEmpty`) or `signal` aborts; resolves with the rows published. */
export async function runNaiveRelay(options: NaiveRelayOptions): Promise<number> {
  const batch = options.batch ?? 1_000;
  const publisher = await options.client.declarePublisher({ stream: options.stream });
  const waiting = new Set<bigint>();
  let allConfirmed: (() => void) | undefined;
  let failed: Error | undefined;
  publisher.on('publish_confirm', (err, ids) => {
    if (err !== null) failed = new Error(`publish error ${err}`);
    for (const id of ids) waiting.delete(id);
    if (waiting.size === 0 || failed !== undefined) allConfirmed?.();
  });
  let published = 0;
  try {
    while (options.signal?.aborted !== true) {
      const sql = await options.pool.connect();
      let rows: Array<{ id: string; body: Buffer }>;
      try {
        await sql.query('BEGIN');
        ({ rows } = await sql.query<{ id: string; body: Buffer }>(
          `SELECT id, body FROM "${options.schema}".naive_outbox ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED`,
          [batch],
        ));
        const confirmed = new Promise<void>((resolve) => (allConfirmed = resolve));
        for (const row of rows) {
          const { publishingId } = await publisher.send(row.body);
          waiting.add(publishingId);
        }
        if (rows.length > 0) {
          await publisher.flush();
          if (waiting.size > 0) await confirmed;
          if (failed !== undefined) throw failed;
          await sql.query(`DELETE FROM "${options.schema}".naive_outbox WHERE id = ANY($1::bigint[])`, [
            rows.map((r) => r.id),
          ]);
        }
        await sql.query('COMMIT');
        published += rows.length;
        if (rows.length > 0) options.onBatch?.(rows.length);
      } catch (err) {
        await sql.query('ROLLBACK').catch(() => undefined);
        throw err;
      } finally {
        sql.release();
      }
      if (rows.length === 0) {
        if (options.untilEmpty === true) break;
        await new Promise((resolve) => setTimeout(resolve, options.pollMs ?? 20));
      }
    }
  } finally {
    await publisher.close().catch(() => undefined);
  }
  return published;
}
