/**
 * The ledger projection of test/support/group-ledger.ts in SQL, for consumer groups on a
 * PostgresStore: one row per partition (balance, count) and one per applied (partition, ID), whose
 * second application counts a double. The handler uses the clock (each applied row records
 * Date.now()): with the effect and the fence in one transaction it need not be deterministic.
 */
import type pg from 'pg';
import type { VerifiedMessage } from '../../src/consumer/types.js';
import type { PostgresClient } from '../../src/postgres.js';

/** Creates the projection's tables in `schema` (migrated already). */
export async function createLedgerTables(pool: pg.Pool, schema: string): Promise<void> {
  await pool.query(
    `CREATE TABLE "${schema}".balances (partition text PRIMARY KEY, balance bigint NOT NULL, count bigint NOT NULL);
     CREATE TABLE "${schema}".applied (partition text, id bigint, at bigint NOT NULL, times int NOT NULL,
       PRIMARY KEY (partition, id))`,
  );
}

/** Applies one ledger message of `partition` through the batch's client. */
export async function applyLedgerRow(
  client: PostgresClient,
  schema: string,
  partition: string,
  message: VerifiedMessage,
): Promise<void> {
  const { amount } = JSON.parse(message.body.toString()) as { amount: number };
  const id = message.identity!.publishingId.toString();
  await client.query(
    `INSERT INTO "${schema}".applied (partition, id, at, times) VALUES ($1, $2, $3, 1)
     ON CONFLICT (partition, id) DO UPDATE SET times = applied.times + 1, at = excluded.at`,
    [partition, id, Date.now()],
  );
  await client.query(
    `INSERT INTO "${schema}".balances (partition, balance, count) VALUES ($1, $2, 1)
     ON CONFLICT (partition) DO UPDATE SET balance = balances.balance + excluded.balance, count = balances.count + 1`,
    [partition, amount],
  );
}

/** Each partition's fold as the database holds it: balance, count, and IDs applied more than once. */
export async function ledgerFolds(
  pool: pg.Pool,
  schema: string,
): Promise<Record<string, { balance: number; count: number; doubles: number }>> {
  const { rows } = await pool.query<{ partition: string; balance: string; count: string; doubles: string }>(
    `SELECT b.partition, b.balance, b.count,
       (SELECT count(*) FROM "${schema}".applied a WHERE a.partition = b.partition AND a.times > 1) AS doubles
     FROM "${schema}".balances b ORDER BY b.partition`,
  );
  return Object.fromEntries(
    rows.map((r) => [
      r.partition,
      { balance: Number(r.balance), count: Number(r.count), doubles: Number(r.doubles) },
    ]),
  );
}
