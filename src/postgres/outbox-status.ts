/**
 * `stream-dedup outbox status`: what the transactional outbox of a schema holds, read in one
 * READ ONLY transaction on a pool of its own. The CLI loads this file only for that command, so
 * that nothing else of it needs `pg`.
 */
import pg from 'pg';
import { assertProducerName } from '../identity/producer-name.js';
import { checkout, type CheckedOut } from './checkout.js';
import { checkSchema, checkSchemaName } from './schema.js';
import { refusal } from './refusal.js';
import { outboxTablesOf } from './outbox-tables.js';

/** One target stream (or partition) of a producer name. */
export interface OutboxTargetStatus {
  /** The stream or partition. */
  readonly target: string;
  /** The highest publishing ID the relay assigned to a row of it. */
  readonly lastAssigned: bigint;
  /**
   * The highest ID below which every row is confirmed (its row deleted): the lowest ID still
   * waiting for its confirm, less one; `lastAssigned` when none waits. The broker holds at least
   * these.
   */
  readonly lastConfirmed: bigint;
}

/** One producer name's outbox. */
export interface OutboxProducerStatus {
  readonly producerName: string;
  /** Rows not yet confirmed: committed and not yet numbered, or numbered and sent, unconfirmed. */
  readonly waiting: number;
  /** Of `waiting`, the rows the relay numbered (sent, or about to be re-sent) and not confirmed. */
  readonly numbered: number;
  /** The age of the oldest waiting row in ms (the server's clock), or undefined when none waits. */
  readonly oldestAgeMs: number | undefined;
  /** The relay that took the name over last, or undefined when none ever did. */
  readonly relay:
    | {
        /** The relay's random identity (a UUID per `open()`). */
        readonly holder: string;
        /** The lease epoch: how many take-overs the name has seen. */
        readonly epoch: bigint;
        /** When it took the name over. */
        readonly since: Date;
        /**
         * True when a database session holds the name's lock now (a relay is active); false when
         * the last holder is gone and no relay has taken over yet.
         */
        readonly holdsLock: boolean;
        /** The locking session's client address and process ID on the server, when it holds it. */
        readonly session: { readonly pid: number; readonly clientAddress: string | null } | undefined;
      }
    | undefined;
  readonly targets: readonly OutboxTargetStatus[];
}

/** What {@link readOutboxStatus} found. */
export interface OutboxStatus {
  readonly schema: string;
  readonly producers: readonly OutboxProducerStatus[];
}

/** The relay's advisory-lock key text (src/postgres/outbox/relay.ts takes `hashtextextended` of it). */
function lockKeyOf(schema: string, producerName: string): string {
  return `stream-dedup-outbox:${schema}:${producerName}`;
}

/**
 * Reads the outbox of `schema` (every producer name in it, or `producerName`'s only).
 *
 * @throws TypeError, RangeError for a bad schema or producer name, before any I/O.
 * @throws DedupError `DEDUP_STORE_REFUSED` when the server refuses (password, database, missing
 *   schema, a schema of another version), with the server's error as its cause.
 */
export async function readOutboxStatus(
  url: string,
  schema: string,
  { producerName, timeoutMs = 10_000 }: { readonly producerName?: string; readonly timeoutMs?: number } = {},
): Promise<OutboxStatus> {
  checkSchemaName(schema);
  if (producerName !== undefined) assertProducerName(producerName);
  const t = outboxTablesOf(schema);
  const pool = new pg.Pool({
    connectionString: url,
    connectionTimeoutMillis: timeoutMs,
    max: 1,
    statement_timeout: timeoutMs,
    query_timeout: timeoutMs,
  });
  pool.on('error', () => undefined);
  let held: CheckedOut;
  try {
    held = await checkout(pool);
  } catch (err) {
    await pool.end().catch(() => undefined);
    throw refusal(err, 'cannot connect to PostgreSQL');
  }
  const { client } = held;
  try {
    await checkSchema(client, schema);
    try {
      await client.query('BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY');
      const only = producerName === undefined ? '' : 'WHERE producer_name = $1';
      const params = producerName === undefined ? [] : [producerName];
      const rows = await client.query<{
        producer_name: string;
        waiting: number;
        numbered: number;
        oldest_ms: number | null;
      }>(
        // Waiting rows are in the outbox (not numbered yet) or in batch records (numbered, unconfirmed).
        `SELECT producer_name, sum(n)::int AS waiting, sum(n) FILTER (WHERE numbered)::int AS numbered,
                (extract(epoch FROM clock_timestamp() - min(created_at)) * 1000)::float8 AS oldest_ms
           FROM (SELECT producer_name, 1 AS n, false AS numbered, created_at FROM ${t.outbox} ${only}
                 UNION ALL
                 SELECT producer_name, cardinality(row_ids), true, created_at FROM ${t.batches} ${only}) w
          GROUP BY producer_name`,
        params,
      );
      const relays = await client.query<{
        producer_name: string;
        holder: string;
        epoch: string;
        since: Date;
        pid: number | null;
        client_addr: string | null;
      }>(
        // The relay's session advisory lock on a bigint key: pg_locks splits it into classid (high
        // 32 bits) and objid (low 32 bits), objsubid 1.
        `SELECT r.producer_name, r.holder, r.epoch::text, r.since, l.pid, host(a.client_addr) AS client_addr
           FROM ${t.relays} r
           LEFT JOIN LATERAL (SELECT hashtextextended($${params.length + 1} || r.producer_name, 0) AS k) key ON true
           LEFT JOIN pg_locks l ON l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
                AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
                AND l.classid = ((key.k >> 32) & 4294967295)::oid AND l.objid = (key.k & 4294967295)::oid
           LEFT JOIN pg_stat_activity a ON a.pid = l.pid
           ${only.replace('producer_name', 'r.producer_name')}`,
        [...params, lockKeyOf(schema, '')],
      );
      const ids = await client.query<{
        producer_name: string;
        target: string;
        last_assigned: string;
        lowest_waiting: string | null;
      }>(
        `SELECT i.producer_name, i.target, i.last_assigned::text,
                (SELECT min(b.first_id) FROM ${t.batches} b
                  WHERE b.producer_name = i.producer_name AND b.target = i.target)::text AS lowest_waiting
           FROM ${t.ids} i ${only.replace('producer_name', 'i.producer_name')}
           ORDER BY i.producer_name, i.target`,
        params,
      );
      await client.query('COMMIT');
      const names = new Set<string>([
        ...rows.rows.map((r) => r.producer_name),
        ...relays.rows.map((r) => r.producer_name),
        ...ids.rows.map((r) => r.producer_name),
      ]);
      const producers = [...names].sort().map((name): OutboxProducerStatus => {
        const row = rows.rows.find((r) => r.producer_name === name);
        const relay = relays.rows.find((r) => r.producer_name === name);
        return {
          producerName: name,
          waiting: row?.waiting ?? 0,
          numbered: row?.numbered ?? 0,
          oldestAgeMs: row?.oldest_ms === null || row === undefined ? undefined : Math.max(0, row.oldest_ms),
          relay:
            relay === undefined
              ? undefined
              : {
                  holder: relay.holder,
                  epoch: BigInt(relay.epoch),
                  since: relay.since,
                  holdsLock: relay.pid !== null,
                  session:
                    relay.pid === null ? undefined : { pid: relay.pid, clientAddress: relay.client_addr },
                },
          targets: ids.rows
            .filter((r) => r.producer_name === name)
            .map((r) => ({
              target: r.target,
              lastAssigned: BigInt(r.last_assigned),
              lastConfirmed:
                r.lowest_waiting === null ? BigInt(r.last_assigned) : BigInt(r.lowest_waiting) - 1n,
            })),
        };
      });
      return { schema, producers };
    } catch (err) {
      await client.query('ROLLBACK').catch(() => undefined);
      throw refusal(err, `cannot read the outbox of schema "${schema}"`);
    }
  } finally {
    held.release(true);
    await pool.end().catch(() => undefined);
  }
}
