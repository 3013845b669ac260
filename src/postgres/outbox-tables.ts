/**
 * The transactional outbox's tables (docs/design.md §14), part of schema version 1: created by
 * {@link migrate} next to the consumer store's tables.
 *
 * - `outbox`: one row per enqueued message, inserted in the application's transaction, waiting for
 *   the relay. `id` only orders rows within one relay read. The relay's numbering transaction moves
 *   a read's rows out of it (one DELETE per row: the only write a row gets after its INSERT).
 * - `outbox_batches`: one row per numbered batch and target, written by the numbering transaction
 *   that deleted its rows, committed before anything is sent: the target, the first publishing ID
 *   (the batch holds `first_id` … `first_id + cardinality(row_ids) - 1`, in `row_ids` order), the
 *   rows' ids, bodies and headers. Deleted once the broker confirmed every ID in it, or found
 *   stored at the next open.
 * - `outbox_relays`: one row per producer name: the lease (`epoch`, bumped by every relay that takes
 *   over; an assignment checks it under the row's lock, so a relay that lost the lease assigns
 *   nothing more), who holds it and since when, and a super stream's partition list as first seen
 *   (routing by hash follows the partition count: a change is refused, not followed silently).
 * - `outbox_ids`: per producer name and target stream, the highest publishing ID assigned. IDs of a
 *   target are dense: 1 … `last_assigned`, each in exactly one batch record until its confirm.
 */

/** The SQL names of the outbox's tables in a schema, quoted. */
export interface OutboxTables {
  readonly outbox: string;
  readonly relays: string;
  readonly ids: string;
  readonly batches: string;
}

/** The outbox tables of `schema` (already checked by `checkSchemaName`). */
export function outboxTablesOf(schema: string): OutboxTables {
  return {
    outbox: `"${schema}".outbox`,
    relays: `"${schema}".outbox_relays`,
    ids: `"${schema}".outbox_ids`,
    batches: `"${schema}".outbox_batches`,
  };
}

/** The NOTIFY channel of `schema`'s outbox (the payload is the producer name). */
export function outboxChannel(schema: string): string {
  return `stream_dedup_outbox_${schema}`.slice(0, 63);
}

/**
 * The statements that create the outbox's tables in `schema`; idempotent (`IF NOT EXISTS`), so a
 * version-1 schema created before the outbox existed gets them at its next migrate.
 */
export function outboxDdl(schema: string): string[] {
  const t = outboxTablesOf(schema);
  const channel = outboxChannel(schema);
  return [
    `CREATE TABLE IF NOT EXISTS ${t.outbox} (
       id bigserial PRIMARY KEY,
       producer_name text NOT NULL,
       body bytea NOT NULL,
       message_key text,
       routing_key text,
       headers jsonb,
       created_at timestamptz NOT NULL DEFAULT clock_timestamp())`,
    `CREATE INDEX IF NOT EXISTS outbox_waiting ON ${t.outbox} (producer_name, id)`,
    `CREATE TABLE IF NOT EXISTS ${t.batches} (
       producer_name text NOT NULL,
       target text NOT NULL,
       first_id bigint NOT NULL CHECK (first_id > 0),
       row_ids bigint[] NOT NULL CHECK (cardinality(row_ids) > 0),
       bodies bytea[] NOT NULL CHECK (cardinality(bodies) = cardinality(row_ids)),
       headers jsonb NOT NULL,
       created_at timestamptz NOT NULL,
       PRIMARY KEY (producer_name, target, first_id))`,
    `CREATE TABLE IF NOT EXISTS ${t.relays} (
       producer_name text PRIMARY KEY,
       epoch bigint NOT NULL,
       holder text NOT NULL,
       since timestamptz NOT NULL DEFAULT clock_timestamp(),
       partitions text[])`,
    `CREATE TABLE IF NOT EXISTS ${t.ids} (
       producer_name text NOT NULL,
       target text NOT NULL,
       last_assigned bigint NOT NULL,
       PRIMARY KEY (producer_name, target))`,
    // One notification per committing transaction and producer name (PostgreSQL folds identical
    // ones within a transaction), delivered at its commit: nothing for a rollback.
    `CREATE OR REPLACE FUNCTION "${schema}".outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
     BEGIN PERFORM pg_notify('${channel}', NEW.producer_name); RETURN NULL; END $$`,
    `DROP TRIGGER IF EXISTS outbox_notify ON ${t.outbox}`,
    `CREATE TRIGGER outbox_notify AFTER INSERT ON ${t.outbox} FOR EACH ROW EXECUTE FUNCTION "${schema}".outbox_notify()`,
  ];
}

/**
 * Every column the outbox's code reads or writes, by table, with its type as PostgreSQL names it
 * (`pg_type.typname`, as `information_schema.columns.udt_name`): what
 * {@link outboxShapeProblems} holds a schema to.
 */
export const OUTBOX_COLUMNS: Readonly<Record<string, Readonly<Record<string, string>>>> = {
  outbox: {
    id: 'int8',
    producer_name: 'text',
    body: 'bytea',
    message_key: 'text',
    routing_key: 'text',
    headers: 'jsonb',
    created_at: 'timestamptz',
  },
  outbox_batches: {
    producer_name: 'text',
    target: 'text',
    first_id: 'int8',
    row_ids: '_int8',
    bodies: '_bytea',
    headers: 'jsonb',
    created_at: 'timestamptz',
  },
  outbox_relays: {
    producer_name: 'text',
    epoch: 'int8',
    holder: 'text',
    since: 'timestamptz',
    partitions: '_text',
  },
  outbox_ids: { producer_name: 'text', target: 'text', last_assigned: 'int8' },
};

/**
 * Each table's primary key, in order: the relay's `ON CONFLICT` clauses and its deletes by key
 * need them (an `outbox_ids` without its key fails every numbering).
 */
export const OUTBOX_KEYS: Readonly<Record<string, readonly string[]>> = {
  outbox: ['id'],
  outbox_batches: ['producer_name', 'target', 'first_id'],
  outbox_relays: ['producer_name'],
  outbox_ids: ['producer_name', 'target'],
};

/** One column of a table, as the catalog reads it. */
export interface FoundColumn {
  readonly table_name: string;
  readonly column_name: string;
  readonly udt_name: string;
  /**
   * NOT NULL with nothing to fill it (no default, not an identity, not generated): an INSERT that
   * does not name it fails. Absent counts as false.
   */
  readonly required?: boolean;
}

/** One table's primary key, as the catalog reads it. */
export interface FoundKey {
  readonly table_name: string;
  readonly columns: readonly string[];
}

/**
 * The catalog queries behind {@link outboxShapeProblems}, each with the schema as $1 and the table
 * names as $2. From `pg_catalog`, not `information_schema`: the latter shows only columns the role
 * has rights on, so a role short of a right read as "table missing" (its real error, 42501, comes
 * from a read).
 */
export const OUTBOX_SHAPE_QUERIES = {
  columns: `SELECT c.relname::text AS table_name, a.attname::text AS column_name, t.typname::text AS udt_name,
           (a.attnotnull AND NOT a.atthasdef AND a.attidentity = '' AND a.attgenerated = '') AS required
      FROM pg_catalog.pg_attribute a
      JOIN pg_catalog.pg_class c ON c.oid = a.attrelid
      JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
      JOIN pg_catalog.pg_type t ON t.oid = a.atttypid
     WHERE n.nspname = $1 AND c.relname = ANY($2::text[]) AND c.relkind IN ('r', 'p')
       AND a.attnum > 0 AND NOT a.attisdropped`,
  keys: `SELECT c.relname::text AS table_name, array_agg(a.attname::text ORDER BY k.ord) AS columns
      FROM pg_catalog.pg_constraint con
      JOIN pg_catalog.pg_class c ON c.oid = con.conrelid
      JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
      CROSS JOIN LATERAL unnest(con.conkey) WITH ORDINALITY AS k(attnum, ord)
      JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid AND a.attnum = k.attnum
     WHERE con.contype = 'p' AND n.nspname = $1 AND c.relname = ANY($2::text[])
     GROUP BY c.relname`,
} as const;

/**
 * What is wrong with the outbox tables whose columns and primary keys are `found`, in words: a
 * table or column missing, a column of another type, a primary key missing or on other columns, a
 * column of its own that every INSERT of this library would leave empty although it is NOT NULL
 * with no default (`enqueue` writes `outbox`, the relay the other three: each such INSERT fails).
 * Empty when every column {@link OUTBOX_COLUMNS} names is there as named, every key is
 * {@link OUTBOX_KEYS}', and other columns may stay empty (CHECK constraints and triggers are not
 * looked at).
 */
export function outboxShapeProblems(found: readonly FoundColumn[], keys: readonly FoundKey[]): string[] {
  const problems: string[] = [];
  for (const [table, columns] of Object.entries(OUTBOX_COLUMNS)) {
    const present = new Map(
      found.filter((f) => f.table_name === table).map((f) => [f.column_name, f.udt_name]),
    );
    if (present.size === 0) {
      problems.push(`table ${table} is missing`);
      continue;
    }
    for (const [column, type] of Object.entries(columns)) {
      const actual = present.get(column);
      if (actual === undefined) problems.push(`${table}.${column} is missing`);
      else if (actual !== type) problems.push(`${table}.${column} is ${actual}, not ${type}`);
    }
    for (const f of found) {
      if (f.table_name === table && f.required === true && !Object.hasOwn(columns, f.column_name))
        problems.push(
          `${table}.${f.column_name} is NOT NULL with no default, and this library's INSERTs leave it empty`,
        );
    }
    const want = OUTBOX_KEYS[table]!;
    const key = keys.find((k) => k.table_name === table)?.columns;
    if (key === undefined) problems.push(`${table} has no primary key (${want.join(', ')})`);
    else if (key.join(',') !== want.join(','))
      problems.push(`${table}'s primary key is (${key.join(', ')}), not (${want.join(', ')})`);
  }
  return problems;
}
