/**
 * Finds transaction control in SQL text (BEGIN, START TRANSACTION, COMMIT, END, ROLLBACK, ABORT,
 * SAVEPOINT, RELEASE, PREPARE TRANSACTION): the handler's client refuses it, since the batch's
 * transaction is the library's. Statements are split on `;` outside literals, quoted identifiers,
 * dollar quotes and comments, and each one's first words are read.
 */

/**
 * A dollar quote's opening tag, and a word (sticky: matched where `lastIndex` says, no copies). As
 * PostgreSQL's lexer (scan.l: ident_start `[A-Za-z\200-\377_]`, ident_cont adds `[0-9$]`; dollar
 * tags the same without `$`), every non-ASCII character is a letter: `ÿ$a$` is one identifier, not
 * `ÿ` and a dollar quote.
 */
const DOLLAR_TAG = /\$([A-Za-z_\u0080-\uffff][A-Za-z0-9_\u0080-\uffff]*)?\$/y;
const WORD = /[A-Za-z_\u0080-\uffff][A-Za-z0-9_$\u0080-\uffff]*/y;
const WORD_START = /[A-Za-z_\u0080-\uffff]/;

/**
 * Where the literal whose opening quote is at `open` ends (the index of its closing quote), or -1
 * when it is unterminated. With `backslashes`, `\x` is one escaped character (E'…', or '…' when
 * `standard_conforming_strings` is off).
 */
function literalEnd(sql: string, open: number, quote: string, backslashes: boolean): number {
  for (let i = open + 1; i < sql.length;) {
    const d = sql[i]!;
    if (backslashes && d === '\\') i += 2;
    else if (d === quote && sql[i + 1] === quote) i += 2;
    else if (d === quote) return i;
    else i++;
  }
  return -1;
}

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
  // The word just before `i`, with nothing between (E'…' is an escape string; the E'…' of "the'…'" is not).
  let previousWord = '';
  while (i < n) {
    const c = sql[i]!;
    const before = previousWord;
    previousWord = '';
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
      const escapes = c === "'" && /^[eE]$/.test(before);
      let end = literalEnd(sql, i, c, escapes);
      // A plain '…' takes them too when standard_conforming_strings is off (a SET, set_config, a
      // role's or database's default): read both ways, and a literal whose end depends on the
      // setting cannot be judged.
      if (c === "'" && !escapes && end !== literalEnd(sql, i, c, true)) end = -1;
      if (end < 0) return '?';
      i = end + 1;
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
    } else if (WORD_START.test(c)) {
      WORD.lastIndex = i;
      const word = WORD.exec(sql)![0];
      push(word.toLowerCase());
      i += word.length;
      previousWord = word;
      continue;
    } else if (/\s/.test(c)) {
      i++;
    } else {
      push('');
      i++;
    }
  }
  return check();
}
