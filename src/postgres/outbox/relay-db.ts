/**
 * The relay's statements (docs/design.md §14): taking the producer name over, numbering committed
 * rows into batch records in a transaction of their own, reading back what an earlier life
 * numbered, deleting the records the broker holds. Every statement runs on the relay's work connection with a bound.
 */
import type pg from 'pg';
import type { PoolClient } from 'pg';
import { DedupError } from '../../errors.js';
import type { Headers } from '../../store/codec.js';
import { outboxTablesOf, type OutboxTables } from '../outbox-tables.js';

/** A numbered row, ready to send. */
export interface AssignedRow {
  readonly id: bigint;
  readonly target: string;
  readonly publishingId: bigint;
  readonly body: Buffer;
  readonly headers: Headers | undefined;
}

/** A batch record: consecutive IDs of one target from `firstId`, in `rows` order. */
export interface NumberedBatch {
  readonly target: string;
  readonly firstId: bigint;
  readonly rows: readonly AssignedRow[];
}

/**
 * The body bytes one batch record holds at most (a read's rows of a target are split above it; a
 * single larger row is a record of its own). Bounds the server's memory for one record's arrays.
 */
export const BATCH_RECORD_BYTES: number = 8 * 1024 * 1024;

/**
 * The body bytes one numbering reads at most (the rows past it wait for the next read, at once; one
 * larger row is read alone): bounds the relay's memory for a read of `batchSize` large rows.
 */
export const READ_BYTES: number = 16 * 1024 * 1024;

/** A waiting row, as the numbering reads it. */
export interface WaitingRow {
  readonly id: bigint;
  readonly body: Buffer;
  readonly headers: unknown;
  readonly key: string | null;
  readonly routingKey: string | null;
  readonly ageMs: number;
}

/**
 * Where a waiting row goes: its target, or why it cannot be published (a poison row: the relay
 * stops there, numbering only the rows before it).
 */
export type Placement =
  { readonly target: string; readonly headers: Headers | undefined } | { readonly poison: string };

/** A SQL literal of a text[] (each element quoted by the driver). */
function textArray(client: PoolClient, values: readonly string[]): string {
  return `ARRAY[${values.map((v) => client.escapeLiteral(v)).join(',')}]::text[]`;
}

/** A SQL literal of a bigint[] from decimal strings (digits only: checked). */
function bigintArray(values: readonly string[]): string {
  for (const v of values) if (!/^-?\d+$/.test(v)) throw new TypeError(`not an integer: ${v}`);
  return `'{${values.join(',')}}'::bigint[]`;
}

/** The relay lost the producer name to another relay (its lease epoch moved on). */
export class FencedError extends Error {}

/** @internal */
export class RelayDb {
  readonly tables: OutboxTables;
  /**
   * `outbox_ids` as this relay last committed it, per target, valid for the lease epoch it was read
   * under: only the holder of the current epoch numbers, so nobody else moves it meanwhile. Dropped
   * at a takeover and whenever a numbering does not commit.
   */
  #lastIds: { epoch: bigint; ids: Map<string, bigint> } | undefined;

  constructor(
    schema: string,
    readonly producerName: string,
    private readonly queryTimeoutMs: number,
  ) {
    this.tables = outboxTablesOf(schema);
  }

  run<R extends pg.QueryResultRow>(
    client: PoolClient,
    text: string,
    values?: unknown[],
  ): Promise<pg.QueryResult<R>> {
    return client.query<R>({ text, values, query_timeout: this.queryTimeoutMs + 1_000 } as pg.QueryConfig);
  }

  /**
   * Sets the work connection's server-side bound, and commits without waiting for the WAL flush
   * (`synchronous_commit = off`) except where a transaction turns it on: the numbering and the
   * takeover do; the deletes of batch records the broker holds need not (a delete lost with a
   * server crash leaves a record whose IDs are at or below the broker's last: the next life deletes
   * it as stored, docs/design.md §14), and each was one WAL flush on the confirm's path. The
   * connection is destroyed, never returned to the pool, when the relay lets it go.
   */
  async prepare(client: PoolClient): Promise<void> {
    await this.run(client, `SET statement_timeout = ${this.queryTimeoutMs}; SET synchronous_commit = off`);
  }

  /**
   * Takes the producer name over: bumps the lease epoch (an older holder's next numbering fails),
   * records the holder, and checks (or records) a super stream's partitions.
   *
   * @throws DedupError `DEDUP_PARTITIONS_CHANGED` when `partitions` differ from those recorded.
   */
  async takeover(
    client: PoolClient,
    holder: string,
    partitions: readonly string[] | undefined,
    targets: readonly string[],
  ): Promise<bigint> {
    const t = this.tables;
    this.#lastIds = undefined;
    await this.run(client, 'BEGIN');
    await this.run(client, 'SET LOCAL synchronous_commit = on');
    try {
      const found = await this.run<{ epoch: string; partitions: string[] | null }>(
        client,
        `INSERT INTO ${t.relays} AS r (producer_name, epoch, holder, partitions) VALUES ($1, 1, $2, $3)
         ON CONFLICT (producer_name) DO UPDATE SET epoch = r.epoch + 1, holder = $2, since = clock_timestamp(),
           partitions = COALESCE(r.partitions, $3)
         RETURNING epoch, partitions`,
        [this.producerName, holder, partitions ?? null],
      );
      const row = found.rows[0]!;
      if (
        partitions !== undefined &&
        row.partitions !== null &&
        row.partitions.join('\u0000') !== partitions.join('\u0000')
      ) {
        throw new DedupError(
          'DEDUP_PARTITIONS_CHANGED',
          `the super stream's partitions are [${partitions.join(', ')}], but the outbox relay "${this.producerName}" ` +
            `first numbered rows for [${row.partitions.join(', ')}]: keys would move to other partitions; nothing was sent`,
        );
      }
      // Rows an earlier life numbered for another target (the relay reopened on another stream, or a
      // super stream's relay reopened on a stream) would never be sent: their IDs belong to that
      // target's sequence (review A). Refused, nothing sent; the relay on the old target sends them.
      const stranded = await this.run<{ target: string; rows: string }>(
        client,
        `SELECT target, sum(cardinality(row_ids)) AS rows FROM ${t.batches}
          WHERE producer_name = $1 AND NOT (target = ANY($2::text[]))
          GROUP BY target ORDER BY target LIMIT 5`,
        [this.producerName, targets],
      );
      if (stranded.rows.length > 0) {
        const list = stranded.rows.map((r) => `${r.rows} for "${r.target}"`).join(', ');
        throw new DedupError(
          'DEDUP_UNSAFE_OPTIONS',
          `the outbox holds rows an earlier relay "${this.producerName}" numbered and may not have sent (${list}), ` +
            `but this relay publishes to [${targets.join(', ')}]: they would never be sent. Open the relay on the ` +
            'old target until they are confirmed (outbox status shows them), then move it; nothing was sent',
        );
      }
      await this.run(client, 'COMMIT');
      return BigInt(row.epoch);
    } catch (err) {
      await this.run(client, 'ROLLBACK').catch(() => undefined);
      throw err;
    }
  }

  /** The highest publishing ID numbered on `target` (0n when none). */
  async lastAssigned(client: PoolClient, target: string): Promise<bigint> {
    const found = await this.run<{ last_assigned: string }>(
      client,
      `SELECT last_assigned FROM ${this.tables.ids} WHERE producer_name = $1 AND target = $2`,
      [this.producerName, target],
    );
    const row = found.rows[0];
    return row === undefined ? 0n : BigInt(row.last_assigned);
  }

  /** The lease epoch of the producer name (undefined when no relay ever took it). */
  async leaseEpoch(client: PoolClient): Promise<bigint | undefined> {
    const found = await this.run<{ epoch: string }>(
      client,
      `SELECT epoch FROM ${this.tables.relays} WHERE producer_name = $1`,
      [this.producerName],
    );
    const row = found.rows[0];
    return row === undefined ? undefined : BigInt(row.epoch);
  }

  /**
   * Deletes the batch records of `target` whose every ID the broker holds (at or below `upTo`);
   * the number of rows they held.
   *
   * @throws FencedError when another relay took the name over since `epoch` (nothing deleted).
   */
  async deleteStoredBatches(
    client: PoolClient,
    target: string,
    upTo: bigint,
    epoch: bigint,
  ): Promise<number> {
    return this.#fencedDelete(
      client,
      'first_id + cardinality(row_ids) - 1 <= $3',
      [target, upTo.toString()],
      epoch,
    );
  }

  /**
   * Deletes the batch records of `target` starting at `firstIds` (every ID in them confirmed).
   *
   * @throws FencedError when another relay took the name over since `epoch` (nothing deleted).
   */
  async deleteBatches(
    client: PoolClient,
    target: string,
    firstIds: readonly bigint[],
    epoch: bigint,
  ): Promise<void> {
    await this.#fencedDelete(client, 'first_id = ANY($3::bigint[])', [target, firstIds.map(String)], epoch);
  }

  /**
   * One DELETE of `target`'s batch records matching `where` ($2 is the target, $3… the `values`
   * after it), only while the lease is still at `epoch`: the statement reads the lease row in its
   * own snapshot, so a relay that lost the lease deletes nothing (docs/design.md §14, "the lease").
   * The rows the deleted records held.
   */
  async #fencedDelete(
    client: PoolClient,
    where: string,
    values: readonly unknown[],
    epoch: bigint,
  ): Promise<number> {
    const t = this.tables;
    const epochParam = `$${values.length + 2}`;
    const done = await this.run<{ epoch: string | null; deleted: number }>(
      client,
      `WITH lease AS (SELECT epoch FROM ${t.relays} WHERE producer_name = $1),
            gone AS (DELETE FROM ${t.batches} WHERE producer_name = $1 AND target = $2 AND ${where}
                       AND (SELECT epoch FROM lease) = ${epochParam} RETURNING cardinality(row_ids) AS n)
       SELECT (SELECT epoch FROM lease) AS epoch, (SELECT coalesce(sum(n), 0) FROM gone)::int AS deleted`,
      [this.producerName, ...values, epoch.toString()],
    );
    const row = done.rows[0];
    if (row?.epoch === null || row === undefined || BigInt(row.epoch) !== epoch) {
      throw new FencedError(
        `outbox relay "${this.producerName}" was taken over by another relay (lease epoch ${row?.epoch ?? 'gone'}, ours ${epoch}): nothing deleted`,
      );
    }
    return row.deleted;
  }

  /** Batch records of `target` starting above `after`, in ID order, at most `limit` records. */
  async batchesAfter(
    client: PoolClient,
    target: string,
    after: bigint,
    limit: number,
  ): Promise<NumberedBatch[]> {
    const found = await this.run<{
      first_id: string;
      row_ids: string[];
      bodies: Buffer[];
      headers: (Headers | null)[];
    }>(
      client,
      `SELECT first_id, row_ids, bodies, headers FROM ${this.tables.batches}
        WHERE producer_name = $1 AND target = $2 AND first_id > $3 ORDER BY first_id LIMIT $4`,
      [this.producerName, target, after.toString(), limit],
    );
    return found.rows.map((r) => {
      const firstId = BigInt(r.first_id);
      return {
        target,
        firstId,
        rows: r.row_ids.map((id, i) => ({
          id: BigInt(id),
          target,
          publishingId: firstId + BigInt(i),
          body: r.bodies[i]!,
          headers: r.headers[i] ?? undefined,
        })),
      };
    });
  }

  /**
   * Numbers up to `limit` committed waiting rows in the order this transaction reads them, per
   * target from its last numbered ID + 1: moves them into batch records (the rows' DELETE is their
   * only write) and commits before anything is sent (docs/design.md §14). Stops before a poison
   * row: the rows before it are numbered, it is returned and stays in the outbox. The same
   * transaction deletes the batch records `done()` returns (target → first IDs, every ID confirmed
   * and checked): one COMMIT per batch instead of two. `done` is called once, after the read: the
   * relay's other-writer check of those records started before the numbering and runs beside it;
   * the transaction never waits for it (docs/design.md §14): `done` returns only records whose check
   * already passed, and throws (rolling back: nothing numbered, nothing deleted) when one failed.
   *
   * @throws FencedError when another relay took the name over since `epoch` (nothing numbered).
   */
  async assign(
    client: PoolClient,
    epoch: bigint,
    limit: number,
    place: (row: WaitingRow) => Placement,
    done: () => ReadonlyMap<string, readonly bigint[]> = () => new Map(),
  ): Promise<{
    batches: NumberedBatch[];
    poison?: { id: bigint; reason: string };
    oldestAgeMs: number | undefined;
    /** More rows may wait: the read reached its limit, or its byte cut left rows behind. */
    more: boolean;
  }> {
    const t = this.tables;
    // Two round trips per numbering (simple-query strings, values inlined as literals): each one
    // cost 5–8 ms on a loaded machine, and five of them per numbering saturated the relay at
    // 1 000 rows/s. The statements of a string still run one after the other, each with its own
    // snapshot (READ COMMITTED).
    const name = client.escapeLiteral(this.producerName);
    try {
      // Index order, never a scan of the backlog: on a freshly filled table (no statistics) the
      // planner chose a bitmap scan of every waiting row and a sort per read (48 ms for 500 rows of
      // 90 000, quadratic in the backlog); the (producer_name, id) index read in order stops at the
      // limit. JIT off: a disabled plan node costs 1e10, so any query in the transaction that still
      // needs one (a trigger's, on these tables) was JIT-compiled at every run, 300 ms of CPU each. The
      // lease row's lock orders numberings: one at a time per producer name, none by a
      // relay whose lease was taken over. The read takes no row locks: its snapshot is taken after
      // the lease lock is granted (it sees every earlier numbering's deletes), and the application
      // only INSERTs.
      // The numbering commits durably (synchronous_commit on) before anything is sent: a numbering
      // lost with a server crash after its rows were sent would number them again below the
      // broker's last ID.
      const results = (await this.run(
        client,
        `BEGIN; SET LOCAL synchronous_commit = on; SET LOCAL enable_bitmapscan = off; SET LOCAL enable_seqscan = off; SET LOCAL enable_sort = off; SET LOCAL jit = off;
         SELECT epoch FROM ${t.relays} WHERE producer_name = ${name} FOR UPDATE;
         SELECT id, body, headers, message_key, routing_key, age_ms, fetched FROM (
           SELECT w.*, sum(octet_length(w.body)) OVER (ORDER BY w.id) AS upto, count(*) OVER () AS fetched FROM (
             SELECT id, body, headers, message_key, routing_key,
                    (EXTRACT(EPOCH FROM clock_timestamp() - created_at) * 1000)::float8 AS age_ms
               FROM ${t.outbox} WHERE producer_name = ${name} ORDER BY id LIMIT ${Math.trunc(limit)}) w) c
          WHERE upto - octet_length(body) < ${READ_BYTES} ORDER BY id`,
      )) as unknown as pg.QueryResult[];
      // The last two results: the lease row, the read.
      const lease = results[results.length - 2]!.rows[0] as { epoch: string } | undefined;
      if (lease === undefined || BigInt(lease.epoch) !== epoch) {
        throw new FencedError(
          `outbox relay "${this.producerName}" was taken over by another relay (lease epoch ${lease?.epoch ?? 'gone'}, ours ${epoch})`,
        );
      }
      const waiting = results[results.length - 1]! as pg.QueryResult<{
        id: string;
        body: Buffer;
        headers: unknown;
        message_key: string | null;
        routing_key: string | null;
        age_ms: number;
        /** Rows the LIMIT fetched before the byte cut (the first row always passes it). */
        fetched: string;
      }>;
      const oldestAgeMs = waiting.rows[0]?.age_ms;
      const confirmed = done();
      const doneTargets = [...confirmed].flatMap(([target, firsts]) => firsts.map(() => target));
      const doneFirsts = [...confirmed.values()].flatMap((firsts) => firsts.map(String));
      const deleteDone =
        doneFirsts.length === 0
          ? ''
          : `DELETE FROM ${t.batches} b
              USING unnest(${textArray(client, doneTargets)}, ${bigintArray(doneFirsts)}) AS d(target, first_id)
              WHERE b.producer_name = ${name} AND b.target = d.target AND b.first_id = d.first_id;`;
      if (waiting.rows.length === 0) {
        await this.run(client, `${deleteDone} COMMIT`);
        return { batches: [], oldestAgeMs, more: false };
      }
      const cached = this.#lastIds?.epoch === epoch ? this.#lastIds.ids : undefined;
      this.#lastIds = undefined;
      const lastIds = new Map<string, bigint>(cached);
      if (cached === undefined) {
        const known = await this.run<{ target: string; last_assigned: string }>(
          client,
          `SELECT target, last_assigned FROM ${t.ids} WHERE producer_name = $1`,
          [this.producerName],
        );
        for (const r of known.rows) lastIds.set(r.target, BigInt(r.last_assigned));
      }
      // Per target, the open record and its body bytes; a record closes above BATCH_RECORD_BYTES.
      const open = new Map<string, { rows: AssignedRow[]; bytes: number }>();
      const batches: { target: string; firstId: bigint; rows: AssignedRow[] }[] = [];
      let poison: { id: bigint; reason: string } | undefined;
      for (const r of waiting.rows) {
        const id = BigInt(r.id);
        const placed = place({
          id,
          body: r.body,
          headers: r.headers,
          key: r.message_key,
          routingKey: r.routing_key,
          ageMs: r.age_ms,
        });
        if ('poison' in placed) {
          poison = { id, reason: placed.poison };
          break;
        }
        const publishingId = (lastIds.get(placed.target) ?? 0n) + 1n;
        lastIds.set(placed.target, publishingId);
        let record = open.get(placed.target);
        if (record === undefined || (record.bytes > 0 && record.bytes + r.body.length > BATCH_RECORD_BYTES)) {
          record = { rows: [], bytes: 0 };
          open.set(placed.target, record);
          batches.push({ target: placed.target, firstId: publishingId, rows: record.rows });
        }
        record.bytes += r.body.length;
        record.rows.push({ id, target: placed.target, publishingId, body: r.body, headers: placed.headers });
      }
      let move = deleteDone;
      if (batches.length > 0) {
        const expected = batches.reduce((sum, b) => sum + b.rows.length, 0);
        const targets = [...new Set(batches.map((b) => b.target))];
        // One statement: the rows leave the outbox (one DELETE each, by primary key) and land in
        // their batch records, ordered as numbered (nothing travels back from the client);
        // last_assigned moves up; the confirmed records go. One DELETE per record and no join: a
        // join of the deleted rows to their record numbers was planned as a nested loop (no
        // statistics on a CTE), 250 000 comparisons and 144 ms for 500 rows. By `id` alone (the
        // primary key; ids are unique, and these were read under the producer name in this
        // transaction): with `producer_name = … AND id = ANY(…)` the planner scanned the
        // (producer_name, id) index over EVERY waiting row of the name and filtered the ids (EXPLAIN:
        // 99 500 rows removed by the filter, 44.7 ms for 500 rows of 100 000; by the primary key
        // 3.0 ms): the move cost grew with the backlog, the whole drain with its square.
        const moves = batches.map(
          (b, i) => `m${i} AS (
             DELETE FROM ${t.outbox} WHERE id = ANY(${bigintArray(b.rows.map((r) => String(r.id)))})
             RETURNING id, body, headers, created_at)`,
        );
        const moved = batches.map((_, i) => `(SELECT count(*) FROM m${i})`).join(' + ');
        const inserts = batches.map(
          (b, i) => `SELECT ${name}, ${client.escapeLiteral(b.target)}, ${b.firstId.toString()}::bigint,
                  array_agg(m.id ORDER BY m.id), array_agg(m.body ORDER BY m.id), jsonb_agg(m.headers ORDER BY m.id),
                  min(m.created_at)
             FROM m${i} m, checked WHERE checked.ok = 0`,
        );
        move = `WITH ids AS (
             INSERT INTO ${t.ids} (producer_name, target, last_assigned)
             SELECT ${name}, u.target, u.last
               FROM unnest(${textArray(client, targets)}, ${bigintArray(targets.map((x) => String(lastIds.get(x))))})
                 AS u(target, last)
             ON CONFLICT (producer_name, target) DO UPDATE SET last_assigned = EXCLUDED.last_assigned),
           gone AS (
             DELETE FROM ${t.batches} b
              USING unnest(${textArray(client, doneTargets)}, ${bigintArray(doneFirsts)}) AS d(target, first_id)
              WHERE b.producer_name = ${name} AND b.target = d.target AND b.first_id = d.first_id),
           ${moves.join(',\n')},
           -- A row deleted by hand between the read and the move: the statement fails (a runtime
           -- cast error naming the counts), the transaction rolls back, the next life reads again.
           checked AS (
             SELECT CASE WHEN ${moved} = ${expected} THEN 0
                    ELSE ('outbox rows changed while being numbered: ' || (${moved}) || ' of ${expected} moved')::int
                    END AS ok)
           INSERT INTO ${t.batches} (producer_name, target, first_id, row_ids, bodies, headers, created_at)
           ${inserts.join('\n UNION ALL ')};`;
      }
      // One round trip: the move (or only the confirmed records' delete) and the COMMIT.
      await this.run(client, `${move} COMMIT`);
      this.#lastIds = { epoch, ids: lastIds };
      const fetched = Number(waiting.rows[0]!.fetched);
      const more = fetched === limit || waiting.rows.length < fetched;
      return poison === undefined ? { batches, oldestAgeMs, more } : { batches, poison, oldestAgeMs, more };
    } catch (err) {
      await this.run(client, 'ROLLBACK').catch(() => undefined);
      throw err;
    }
  }
}
