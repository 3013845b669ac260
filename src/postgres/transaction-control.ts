/**
 * Finds transaction control in SQL text (BEGIN, START TRANSACTION, COMMIT, END, ROLLBACK, ABORT,
 * SAVEPOINT, RELEASE, PREPARE TRANSACTION): the handler's client refuses it, since the batch's
 * transaction is the library's. Statements are split on `;` outside literals, quoted identifiers,
 * dollar quotes and comments, and each one's first words are read.
 */

/** A dollar quote's opening tag, and a word (sticky: matched where `lastIndex` says, no copies). */
const DOLLAR_TAG = /\$([A-Za-z_][A-Za-z0-9_]*)?\$/y;
const WORD = /[A-Za-z_][A-Za-z0-9_$]*/y;

/** Statements whose first word ends, nests or splits the transaction. */
const CONTROL = new Set(['begin', 'start', 'commit', 'end', 'rollback', 'abort', 'savepoint', 'release']);

/**
 * The first transaction-control statement of `sql` (its first word, lower-case), or `undefined`.
 * Text that cannot be read to its end (an unterminated literal or comment) is reported as `'?'`:
 * the server would refuse it anyway, and what follows cannot be judged.
 */
export function transactionControlIn(sql: string): string | undefined {
  const words: string[] = [];
  let i = 0;
  const n = sql.length;
  // Only a statement's first two words matter.
  const push = (word: string): void => {
    if (words.length < 2) words.push(word);
  };
  const check = (): string | undefined => {
    const [first, second] = words;
    words.length = 0;
    if (first === undefined) return undefined;
    if (CONTROL.has(first)) return first;
    if (first === 'prepare' && second === 'transaction') return 'prepare transaction';
    return undefined;
  };
  while (i < n) {
    const c = sql[i]!;
    if (c === ';') {
      const found = check();
      if (found !== undefined) return found;
      i++;
    } else if (c === '-' && sql[i + 1] === '-') {
      const end = sql.indexOf('\n', i);
      i = end < 0 ? n : end + 1;
    } else if (c === '/' && sql[i + 1] === '*') {
      // Block comments nest in PostgreSQL.
      let depth = 1;
      i += 2;
      while (i < n && depth > 0) {
        if (sql[i] === '/' && sql[i + 1] === '*') {
          depth++;
          i += 2;
        } else if (sql[i] === '*' && sql[i + 1] === '/') {
          depth--;
          i += 2;
        } else i++;
      }
      if (depth > 0) return '?';
    } else if (c === "'" || c === '"') {
      // E'…' takes backslash escapes; the E was read as a word already (harmless: one word).
      const escapes =
        c === "'" && /[eE]$/.test(sql.slice(Math.max(0, i - 1), i)) && !/\w/.test(sql[i - 2] ?? '');
      i++;
      for (;;) {
        if (i >= n) return '?';
        const d = sql[i]!;
        if (escapes && d === '\\') i += 2;
        else if (d === c && sql[i + 1] === c) i += 2;
        else if (d === c) break;
        else i++;
      }
      i++;
      push('');
    } else if (c === '$') {
      DOLLAR_TAG.lastIndex = i;
      const tag = DOLLAR_TAG.exec(sql);
      if (tag === null) {
        i++; // a parameter ($1)
        push('');
        continue;
      }
      const end = sql.indexOf(tag[0], i + tag[0].length);
      if (end < 0) return '?';
      i = end + tag[0].length;
      push('');
    } else if (/[A-Za-z_]/.test(c)) {
      WORD.lastIndex = i;
      const word = WORD.exec(sql)![0];
      push(word.toLowerCase());
      i += word.length;
    } else if (/\s/.test(c)) {
      i++;
    } else {
      push('');
      i++;
    }
  }
  return check();
}
