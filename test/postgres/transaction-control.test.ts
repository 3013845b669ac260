import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { transactionControlIn } from '../../src/postgres/transaction-control.js';

describe('transactionControlIn - the statements a handler may not run', () => {
  it.each([
    ['COMMIT', 'commit'],
    ['  commit work', 'commit'],
    ['BEGIN; UPDATE t SET a = 1', 'begin'],
    ['START TRANSACTION', 'start'],
    ['end', 'end'],
    ['ABORT', 'abort'],
    ['ROLLBACK TO SAVEPOINT s', 'rollback'],
    ['savepoint s', 'savepoint'],
    ['RELEASE s', 'release'],
    ['PREPARE TRANSACTION $$x$$', 'prepare transaction'],
    ["SELECT 'a;b'; COMMIT", 'commit'],
    ['SELECT "x;y"; commit', 'commit'],
    ['SELECT $q$ ; $q$; END', 'end'],
    ['/* a /* nested */ comment */ COMMIT', 'commit'],
    ['-- a comment\nCOMMIT', 'commit'],
    ["SELECT E'it\\'s'; ROLLBACK", 'rollback'],
    ["SELECT 'unterminated", '?'],
    ['/* unterminated', '?'],
    ['SELECT $a$ unterminated', '?'],
    // PostgreSQL's identifiers take any non-ASCII character and '$': "ÿ$a$" is one alias, not a
    // dollar quote hiding the ROLLBACK (ran as written on the server, ending the transaction).
    ['SELECT 1 AS ÿ$a$; ROLLBACK; SELECT 1 AS ÿ$a$', 'rollback'],
    ['SELECT 1 AS é$q$; COMMIT; SELECT 1 AS é$q$', 'commit'],
    // Dollar tags take non-ASCII letters too: the quote is inside the $ÿ$ … $ÿ$ body.
    ["SELECT $ÿ$ ' $ÿ$; ROLLBACK; SELECT '", 'rollback'],
    // With standard_conforming_strings off '\'' is one quote: a literal whose end depends on the
    // setting cannot be judged.
    ["SELECT '\\''; ROLLBACK; SELECT 1 --'", '?'],
    ["SELECT 'a\\'; ROLLBACK; SELECT 'b'", '?'],
    // "the'…'" is an identifier then a plain literal, not an E'…' escape string.
    ["SELECT the'\\'; ROLLBACK; --'", '?'],
  ])('%j is refused as %s', (sql, found) => {
    expect(transactionControlIn(sql)).toBe(found);
  });

  it.each([
    'UPDATE balances SET amount = amount + $1 WHERE account = $2',
    "SELECT 'COMMIT'; SELECT '; ROLLBACK'",
    'SELECT "commit" FROM t',
    'SELECT $$ ; COMMIT $$',
    '-- COMMIT\nSELECT 1',
    '/* ; COMMIT */ SELECT 1',
    'PREPARE q AS SELECT 1',
    'INSERT INTO begin_log (x) VALUES (1)',
    'SELECT 1; SELECT 2;',
    "SELECT E'\\\\'; SELECT 1",
    // A backslash that ends no literal reads the same either way.
    "SELECT 'C:\\temp', '\\\\'; SELECT 1",
    'SELECT 1 AS ÿ, 2 AS "é"; SELECT 3',
    '',
  ])('%j passes', (sql) => {
    expect(transactionControlIn(sql)).toBeUndefined();
  });

  it('never throws, and finds a COMMIT appended after any closed statement', () => {
    fc.assert(
      fc.property(fc.string({ unit: 'binary', maxLength: 200 }), (sql) => {
        const found = transactionControlIn(sql);
        expect(found === undefined || typeof found === 'string').toBe(true);
        // Whatever `sql` is, once it reads as closed text, a COMMIT after a ';' is seen.
        if (found === undefined) expect(transactionControlIn(`${sql}\n;COMMIT`)).toBe('commit');
      }),
      { numRuns: 2_000 },
    );
  });

  it('reads 1 MB of dollar signs and quotes in linear time', () => {
    const started = performance.now();
    expect(transactionControlIn('$'.repeat(1_000_000))).toBeUndefined();
    expect(transactionControlIn(`SELECT ${"'x' ".repeat(250_000)}`)).toBeUndefined();
    expect(performance.now() - started).toBeLessThan(2_000);
  });
});
