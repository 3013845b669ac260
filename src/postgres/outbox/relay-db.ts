/**
 * The relay's statements (docs/design.md §14): taking the producer name over, numbering committed
 * rows in a transaction of their own, reading back what an earlier life numbered, deleting what the
 * broker holds. Every statement runs on the relay's work connection with a bound.
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

/** The relay lost the producer name to another relay (its lease epoch moved on). */
export class FencedError extends Error {}

/** @internal */
export class RelayDb {
  readonly tables: OutboxTables;

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

  /** Sets the work connection's server-side bound. */
  async prepare(client: PoolClient): Promise<void> {
    await this.run(client, `SET statement_timeout = ${this.queryTimeoutMs}`);
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
    await this.run(client, 'BEGIN');
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
        `SELECT target, count(*) AS rows FROM ${t.outbox}
          WHERE producer_name = $1 AND publishing_id IS NOT NULL AND NOT (target = ANY($2::text[]))
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

  /**
   * Deletes the rows of `target` whose IDs the broker holds (at or below `upTo`); their count.
   *
   * @throws FencedError when another relay took the name over since `epoch` (nothing deleted).
   */
  async deleteUpTo(client: PoolClient, target: string, upTo: bigint, epoch: bigint): Promise<number> {
    return this.#fencedDelete(client, 'publishing_id <= $3', [target, upTo.toString()], epoch);
  }

  /**
   * One DELETE of `target`'s rows matching `where` ($2 is the target, $3… the `values` after it),
   * only while the lease is still at `epoch`: the statement reads the lease row in its own snapshot,
   * so a relay that lost the lease deletes nothing (docs/design.md §14, "the lease").
   */
  async #fencedDelete(
    client: PoolClient,
    where: string,
    values: readonly string[],
    epoch: bigint,
  ): Promise<number> {
    const t = this.tables;
    const epochParam = `$${values.length + 2}`;
    const done = await this.run<{ epoch: string | null; deleted: number }>(
      client,
      `WITH lease AS (SELECT epoch FROM ${t.relays} WHERE producer_name = $1),
            gone AS (DELETE FROM ${t.outbox} WHERE producer_name = $1 AND target = $2 AND ${where}
                       AND (SELECT epoch FROM lease) = ${epochParam} RETURNING 1)
       SELECT (SELECT epoch FROM lease) AS epoch, (SELECT count(*) FROM gone)::int AS deleted`,
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

  /**
   * Deletes confirmed rows of `target`: one range statement per run of consecutive IDs (confirms
   * come in ID order, so a burst is usually one run). A list of IDs joined against the outbox made
   * the planner read every numbered row of the target per burst.
   *
   * @throws FencedError when another relay took the name over since `epoch`.
   */
  async deleteIds(client: PoolClient, target: string, ids: readonly bigint[], epoch: bigint): Promise<void> {
    const sorted = [...ids].sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
    let from = 0;
    while (from < sorted.length) {
      let to = from;
      while (to + 1 < sorted.length && sorted[to + 1]! === sorted[to]! + 1n) to++;
      await this.#fencedDelete(
        client,
        'publishing_id BETWEEN $3 AND $4',
        [target, sorted[from]!.toString(), sorted[to]!.toString()],
        epoch,
      );
      from = to + 1;
    }
  }

  /** Numbered rows of `target` with IDs above `after`, in ID order, at most `limit`. */
  async assignedAfter(
    client: PoolClient,
    target: string,
    after: bigint,
    limit: number,
  ): Promise<AssignedRow[]> {
    const found = await this.run<{
      id: string;
      publishing_id: string;
      body: Buffer;
      headers: Headers | null;
    }>(
      client,
      `SELECT id, publishing_id, body, headers FROM ${this.tables.outbox}
       WHERE producer_name = $1 AND target = $2 AND publishing_id > $3 ORDER BY publishing_id LIMIT $4`,
      [this.producerName, target, after.toString(), limit],
    );
    return found.rows.map((r) => ({
      id: BigInt(r.id),
      target,
      publishingId: BigInt(r.publishing_id),
      body: r.body,
      headers: r.headers ?? undefined,
    }));
  }

  /**
   * Numbers up to `limit` committed, unnumbered rows in the order this transaction reads them, per
   * target from its last numbered ID + 1, and commits before anything is sent (docs/design.md §14).
   * Stops before a poison row: the rows before it are numbered, it is returned.
   *
   * @throws FencedError when another relay took the name over since `epoch` (nothing numbered).
   */
  async assign(
    client: PoolClient,
    epoch: bigint,
    limit: number,
    place: (row: WaitingRow) => Placement,
  ): Promise<{
    rows: AssignedRow[];
    poison?: { id: bigint; reason: string };
    oldestAgeMs: number | undefined;
  }> {
    const t = this.tables;
    // The numbering UPDATE joins a batch of IDs to the outbox: on a freshly filled table (no
    // statistics) or a large one the planner hashes a scan of the whole table per batch, which made
    // the relay quadratic in the backlog (2 110 rows/s from 100 000 rows); PK lookups it is.
    await this.run(client, 'BEGIN; SET LOCAL enable_hashjoin = off; SET LOCAL enable_mergejoin = off');
    try {
      // The lease row's lock orders numberings: one at a time per producer name, and none by a
      // relay whose lease was taken over.
      const lease = await this.run<{ epoch: string }>(
        client,
        `SELECT epoch FROM ${t.relays} WHERE producer_name = $1 FOR UPDATE`,
        [this.producerName],
      );
      if (lease.rows[0] === undefined || BigInt(lease.rows[0].epoch) !== epoch) {
        throw new FencedError(
          `outbox relay "${this.producerName}" was taken over by another relay (lease epoch ${lease.rows[0]?.epoch ?? 'gone'}, ours ${epoch})`,
        );
      }
      const waiting = await this.run<{
        id: string;
        body: Buffer;
        headers: unknown;
        message_key: string | null;
        routing_key: string | null;
        age_ms: number;
      }>(
        client,
        `SELECT id, body, headers, message_key, routing_key,
                (EXTRACT(EPOCH FROM clock_timestamp() - created_at) * 1000)::float8 AS age_ms
         FROM ${t.outbox} WHERE producer_name = $1 AND publishing_id IS NULL ORDER BY id LIMIT $2`,
        [this.producerName, limit],
      );
      const oldestAgeMs = waiting.rows[0]?.age_ms;
      if (waiting.rows.length === 0) {
        await this.run(client, 'COMMIT');
        return { rows: [], oldestAgeMs };
      }
      const lastIds = new Map<string, bigint>();
      const known = await this.run<{ target: string; last_assigned: string }>(
        client,
        `SELECT target, last_assigned FROM ${t.ids} WHERE producer_name = $1`,
        [this.producerName],
      );
      for (const r of known.rows) lastIds.set(r.target, BigInt(r.last_assigned));
      const rows: AssignedRow[] = [];
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
        rows.push({ id, target: placed.target, publishingId, body: r.body, headers: placed.headers });
      }
      if (rows.length > 0) {
        await this.run(
          client,
          `UPDATE ${t.outbox} o SET target = u.target, publishing_id = u.pid
           FROM unnest($1::bigint[], $2::text[], $3::bigint[]) AS u(id, target, pid)
           WHERE o.id = u.id AND o.publishing_id IS NULL`,
          [rows.map((r) => String(r.id)), rows.map((r) => r.target), rows.map((r) => String(r.publishingId))],
        );
        const targets = [...new Set(rows.map((r) => r.target))];
        await this.run(
          client,
          `INSERT INTO ${t.ids} (producer_name, target, last_assigned)
           SELECT $1, u.target, u.last FROM unnest($2::text[], $3::bigint[]) AS u(target, last)
           ON CONFLICT (producer_name, target) DO UPDATE SET last_assigned = EXCLUDED.last_assigned`,
          [this.producerName, targets, targets.map((x) => String(lastIds.get(x)))],
        );
      }
      await this.run(client, 'COMMIT');
      return poison === undefined ? { rows, oldestAgeMs } : { rows, poison, oldestAgeMs };
    } catch (err) {
      await this.run(client, 'ROLLBACK').catch(() => undefined);
      throw err;
    }
  }
}
