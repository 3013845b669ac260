/**
 * The relay's check of its tables' shape at open (outboxShapeProblems): a table or a column
 * missing, a column of another type, a primary key missing or on other columns, a NOT NULL column
 * of its own with no default is named; the
 * tables migrate() creates pass. The catalog queries themselves run against the real server in
 * test/integration/outbox-refusals.test.ts.
 */
import { describe, expect, it } from 'vitest';
import { OUTBOX_COLUMNS, OUTBOX_KEYS, outboxShapeProblems } from '../../src/postgres/outbox-tables.js';

const asCreated = Object.entries(OUTBOX_COLUMNS).flatMap(([table_name, columns]) =>
  Object.entries(columns).map(([column_name, udt_name]) => ({ table_name, column_name, udt_name })),
);
const keys = Object.entries(OUTBOX_KEYS).map(([table_name, columns]) => ({ table_name, columns }));

describe('outbox tables - shape check', () => {
  it('passes the tables as migrate() creates them, extra columns aside', () => {
    expect(outboxShapeProblems(asCreated, keys)).toEqual([]);
    expect(
      outboxShapeProblems(
        [...asCreated, { table_name: 'outbox', column_name: 'tenant', udt_name: 'text' }],
        keys,
      ),
    ).toEqual([]);
    // NOT NULL, but with a default, an identity or a generated value: an INSERT fills it.
    expect(
      outboxShapeProblems(
        [...asCreated, { table_name: 'outbox_ids', column_name: 'note', udt_name: 'text', required: false }],
        keys,
      ),
    ).toEqual([]);
  });

  it('names a column of its own that is NOT NULL with no default: every INSERT of the library would fail', () => {
    const found = [
      ...asCreated.map((c) => ({ ...c, required: true })),
      { table_name: 'outbox', column_name: 'tenant', udt_name: 'text', required: true },
      { table_name: 'outbox_batches', column_name: 'shard', udt_name: 'int4', required: true },
      // A name an object's prototype has: still a column of its own.
      { table_name: 'outbox_ids', column_name: 'constructor', udt_name: 'text', required: true },
    ];
    expect(outboxShapeProblems(found, keys)).toEqual([
      "outbox.tenant is NOT NULL with no default, and this library's INSERTs leave it empty",
      "outbox_batches.shard is NOT NULL with no default, and this library's INSERTs leave it empty",
      "outbox_ids.constructor is NOT NULL with no default, and this library's INSERTs leave it empty",
    ]);
  });

  it('names a missing table, a missing column, a column of another type and a wrong or missing key', () => {
    const found = asCreated
      .filter((c) => c.table_name !== 'outbox_relays')
      .filter((c) => !(c.table_name === 'outbox' && c.column_name === 'routing_key'))
      .map((c) =>
        c.table_name === 'outbox_batches' && c.column_name === 'bodies' ? { ...c, udt_name: 'bytea' } : c,
      );
    const foundKeys = keys
      .filter((k) => k.table_name !== 'outbox_ids')
      .map((k) => (k.table_name === 'outbox_batches' ? { ...k, columns: ['producer_name', 'first_id'] } : k));
    expect(outboxShapeProblems(found, foundKeys)).toEqual([
      'outbox.routing_key is missing',
      'outbox_batches.bodies is bytea, not _bytea',
      "outbox_batches's primary key is (producer_name, first_id), not (producer_name, target, first_id)",
      'table outbox_relays is missing',
      'outbox_ids has no primary key (producer_name, target)',
    ]);
  });
});
