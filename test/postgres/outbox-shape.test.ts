/**
 * The relay's check of its tables' shape at open (outboxShapeProblems): a table or a column
 * missing, or a column of another type, is named; the tables migrate() creates pass.
 */
import { describe, expect, it } from 'vitest';
import { OUTBOX_COLUMNS, outboxShapeProblems } from '../../src/postgres/outbox-tables.js';

const asCreated = Object.entries(OUTBOX_COLUMNS).flatMap(([table_name, columns]) =>
  Object.entries(columns).map(([column_name, udt_name]) => ({ table_name, column_name, udt_name })),
);

describe('outbox tables - shape check', () => {
  it('passes the tables as migrate() creates them, extra columns aside', () => {
    expect(outboxShapeProblems(asCreated)).toEqual([]);
    expect(
      outboxShapeProblems([...asCreated, { table_name: 'outbox', column_name: 'tenant', udt_name: 'text' }]),
    ).toEqual([]);
  });

  it('names a missing table, a missing column and a column of another type', () => {
    const found = asCreated
      .filter((c) => c.table_name !== 'outbox_relays')
      .filter((c) => !(c.table_name === 'outbox' && c.column_name === 'routing_key'))
      .map((c) =>
        c.table_name === 'outbox_batches' && c.column_name === 'bodies' ? { ...c, udt_name: 'bytea' } : c,
      );
    expect(outboxShapeProblems(found)).toEqual([
      'outbox.routing_key is missing',
      'outbox_batches.bodies is bytea, not _bytea',
      'table outbox_relays is missing',
    ]);
  });
});
