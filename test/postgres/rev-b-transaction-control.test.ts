/**
 * Hostile review B: SQL the transaction-control scanner reads differently from PostgreSQL's lexer.
 * Each string runs as written on PostgreSQL 13+ (checked against the server of scripts/postgres.sh
 * by test/integration/rev-b-postgres.test.ts) and ends the batch's transaction.
 */
import { describe, expect, it } from 'vitest';
import { transactionControlIn } from '../../src/postgres/transaction-control.js';

describe('rev-b: transaction-control scanner', () => {
  it.each([
    // PostgreSQL identifiers may start with any byte >= 0x80 and contain '$': "ÿ$a$" is one alias.
    // The scanner reads 'ÿ' as punctuation and "$a$" as a dollar quote up to the last alias.
    ['non-ASCII identifier containing $', 'SELECT 1 AS ÿ$a$; ROLLBACK; SELECT 1 AS ÿ$a$'],
    // After SET LOCAL standard_conforming_strings = off (a separate query), '\'' is one quote.
    ['backslash escape with standard_conforming_strings off', "SELECT '\\''; ROLLBACK; SELECT 1 --'"],
  ])('rev-b - finds the ROLLBACK after a %s', (_what, sql) => {
    expect(transactionControlIn(sql)).toMatch(/^(rollback|\?)$/);
  });
});
