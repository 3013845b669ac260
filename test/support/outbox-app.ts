/**
 * The application of the outbox fault tests and benches (issue 35): `workers` concurrent
 * transactions, each inserting one to three rows into a truth table of its own and enqueueing one
 * outbox row per truth row in the same transaction, with a random pause between the INSERTs and the
 * COMMIT (so transactions commit in another order than their INSERTs) and some rolling back.
 *
 * The truth is the table: a row is committed exactly when its truth row is there, even when a
 * COMMIT's outcome was unknown to the application (PostgreSQL killed under it). Each key belongs to
 * one worker, whose transactions are sequential, so a key's commit order is its worker's order.
 */
import type pg from 'pg';
import { checkHistory, type HistoryReport, type ObservedMessage } from '../../src/history/checker.js';
import { checkout, type CheckedOut } from '../../src/postgres/checkout.js';

/** What the application puts into the outbox: the caller's client, in its open transaction. */
export type Enqueue = (
  client: pg.PoolClient,
  body: Buffer,
  options: { readonly key: string; readonly headers?: Record<string, string> },
) => Promise<unknown>;

/** One outbox row's body: JSON of its label and key. */
export interface AppBody {
  readonly label: string;
  readonly key: string;
}

export interface ApplicationOptions {
  readonly pool: pg.Pool;
  /** The schema holding the truth table (see {@link createTruthTable}). */
  readonly schema: string;
  readonly enqueue: Enqueue;
  /** Concurrent transactions. Default 8. */
  readonly workers?: number;
  /** Transactions each worker runs. Default 50. */
  readonly transactionsPerWorker?: number;
  /** Fraction of transactions that ROLLBACK instead of COMMIT. Default 0.2. */
  readonly rollbackRatio?: number;
  /** Longest pause between a transaction's INSERTs and its COMMIT, ms. Default 15. */
  readonly maxPauseMs?: number;
  /** Keys per worker. Default 3. */
  readonly keysPerWorker?: number;
  /** Stops the workers after their current transaction. */
  readonly signal?: AbortSignal;
  /** Label prefix (a test that runs the application twice keeps labels unique). Default `a`. */
  readonly prefix?: string;
}

export interface ApplicationResult {
  /** Transactions whose COMMIT resolved. */
  readonly committed: number;
  /** Labels of every row of a transaction that rolled back: none may reach the stream. */
  readonly rolledBack: readonly string[];
  /** Transactions whose COMMIT failed (outcome unknown: the truth table decides). */
  readonly unknown: number;
}

/** Creates `schema.app_truth`: one row per committed outbox row. */
export async function createTruthTable(pool: pg.Pool, schema: string): Promise<void> {
  await pool.query(
    `CREATE TABLE IF NOT EXISTS "${schema}".app_truth (
       label text PRIMARY KEY, key text NOT NULL, worker int NOT NULL, txn int NOT NULL, row int NOT NULL)`,
  );
}

const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

/** Runs the application until every worker has run its transactions (or `signal` aborts). */
export async function runApplication(options: ApplicationOptions): Promise<ApplicationResult> {
  const workers = options.workers ?? 8;
  const perWorker = options.transactionsPerWorker ?? 50;
  const rollbackRatio = options.rollbackRatio ?? 0.2;
  const maxPauseMs = options.maxPauseMs ?? 15;
  const keysPerWorker = options.keysPerWorker ?? 3;
  const prefix = options.prefix ?? 'a';
  const rolledBack: string[] = [];
  let committed = 0;
  let unknown = 0;
  const worker = async (w: number): Promise<void> => {
    for (let t = 0; t < perWorker && options.signal?.aborted !== true; t++) {
      const rows = 1 + Math.floor(Math.random() * 3);
      const rollback = Math.random() < rollbackRatio;
      const labels: string[] = [];
      let held: CheckedOut | undefined;
      try {
        // The library's checkout (src/postgres/checkout.ts): an 'error' listener from the pool's
        // hand-over on. After `await pool.connect()` it came too late once (a new client's
        // ReadyForQuery and the dying server's FATAL in one socket read, CI).
        held = await checkout(options.pool);
        const { client } = held;
        await client.query('BEGIN');
        for (let r = 0; r < rows; r++) {
          const label = `${prefix}-w${w}-t${t}-r${r}`;
          const key = `${prefix}-w${w}-k${Math.floor(Math.random() * keysPerWorker)}`;
          labels.push(label);
          await client.query(
            `INSERT INTO "${options.schema}".app_truth (label, key, worker, txn, row) VALUES ($1, $2, $3, $4, $5)`,
            [label, key, w, t, r],
          );
          const body: AppBody = { label, key };
          await options.enqueue(client, Buffer.from(JSON.stringify(body)), { key });
        }
        if (maxPauseMs > 0) await sleep(Math.random() * maxPauseMs);
        if (rollback) {
          await client.query('ROLLBACK');
          rolledBack.push(...labels);
        } else {
          await client.query('COMMIT');
          committed++;
        }
        held.release();
      } catch {
        // PostgreSQL went away under us: the truth table says whether it committed.
        held?.release(true);
        if (rollback) rolledBack.push(...labels);
        else unknown++;
        await sleep(50);
      }
    }
  };
  await Promise.all(Array.from({ length: workers }, (_, w) => worker(w)));
  return { committed, rolledBack, unknown };
}

/** A committed row, with its place in its key's commit order (1-based). */
export interface TruthRow {
  readonly label: string;
  readonly key: string;
  readonly order: number;
}

/** The committed rows, each key's in commit order. */
export async function readTruth(pool: pg.Pool, schema: string): Promise<TruthRow[]> {
  const { rows } = await pool.query<{ label: string; key: string }>(
    `SELECT label, key FROM "${schema}".app_truth ORDER BY worker, txn, row`,
  );
  const next = new Map<string, number>();
  return rows.map(({ label, key }) => {
    const order = (next.get(key) ?? 0) + 1;
    next.set(key, order);
    return { label, key, order };
  });
}

/** What {@link checkOutbox} found. */
export interface OutboxReport extends HistoryReport {
  /** Labels of rolled-back transactions found in the stream. */
  readonly rolledBackSeen: readonly string[];
  /** Stream messages whose body is not an application body. */
  readonly foreign: number;
}

/**
 * The history check of the outbox (src/history/checker.ts): every committed row once, none
 * rolled back, and per key in commit order — each key is the checker's "producer" and a row's
 * place in its key's commit order its "ID", so a key's rows out of commit order are order
 * violations.
 */
export function checkOutbox(
  truth: readonly TruthRow[],
  rolledBack: readonly string[],
  bodies: readonly Buffer[],
): OutboxReport {
  const orderOf = new Map(truth.map((row) => [row.label, row]));
  const observed: ObservedMessage[] = [];
  let foreign = 0;
  for (const body of bodies) {
    let parsed: AppBody;
    try {
      parsed = JSON.parse(body.toString()) as AppBody;
    } catch {
      foreign++;
      continue;
    }
    if (typeof parsed.label !== 'string') {
      foreign++;
      continue;
    }
    const row = orderOf.get(parsed.label);
    observed.push({
      label: parsed.label,
      producerName: parsed.key,
      publishingId: row === undefined ? undefined : BigInt(row.order),
    });
  }
  const labels = truth.map((row) => row.label);
  const report = checkHistory({ attempted: labels, acknowledged: labels, observed });
  const rolled = new Set(rolledBack);
  const rolledBackSeen = [...new Set(observed.map((m) => m.label).filter((l) => rolled.has(l)))].sort();
  return {
    ...report,
    rolledBackSeen,
    foreign,
    ok: report.ok && rolledBackSeen.length === 0 && foreign === 0,
  };
}
