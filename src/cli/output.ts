/**
 * Output helpers of the command-line tool: JSON with bigints, plain-text tables and progress
 * lines. Only the CLI writes to the console; the library never does.
 */

/**
 * `JSON.stringify` that writes bigints as decimal strings (JSON numbers lose precision above 2^53)
 * and `undefined` as `null`, so that every object has all its keys.
 */
export function toJson(value: unknown, indent?: number): string {
  return JSON.stringify(
    value,
    (_key, v: unknown) => (typeof v === 'bigint' ? v.toString() : v === undefined ? null : v),
    indent,
  );
}

/** How a column of {@link formatTable} is aligned: numbers right, text left. */
export type Align = 'left' | 'right';

/**
 * A plain-text table: a header row, then one row per entry, columns two spaces apart, trailing
 * spaces trimmed. Lengths are counted in UTF-16 code units, which is exact for the ASCII that
 * names usually are.
 */
export function formatTable(
  headers: readonly string[],
  rows: ReadonlyArray<readonly string[]>,
  align: readonly Align[] = [],
): string {
  const widths = headers.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] ?? '').length)));
  const line = (cells: readonly string[]): string =>
    widths
      .map((w, i) => {
        const cell = cells[i] ?? '';
        return align[i] === 'right' ? cell.padStart(w) : cell.padEnd(w);
      })
      .join('  ')
      .trimEnd();
  return [line(headers), ...rows.map(line)].join('\n');
}

/** `n thing` or `n things`. */
export function plural(n: number | bigint, singular: string, pluralForm = `${singular}s`): string {
  return `${n} ${n === 1 || n === 1n ? singular : pluralForm}`;
}

/**
 * A progress reporter: writes lines to stderr only when stderr is a terminal, so that pipes,
 * logs and `--json` consumers see nothing but the result.
 */
export function progressReporter(stream: NodeJS.WriteStream = process.stderr): (line: string) => void {
  return stream.isTTY === true ? (line) => stream.write(`${line}\n`) : () => undefined;
}

/**
 * A running count for a long read: `report(n)` writes `line(n)` through `progress` at most once per
 * `intervalMs` (the first call at once), so a million messages cost a few dozen lines, not a
 * million. `progress` is a {@link progressReporter}: nothing is written unless stderr is a terminal.
 */
export function runningCount(
  progress: (line: string) => void,
  line: (n: number) => string,
  intervalMs = 1_000,
  now: () => number = () => performance.now(),
): (n: number) => void {
  let next = -Infinity;
  return (n) => {
    const t = now();
    if (t < next) return;
    next = t + intervalMs;
    progress(line(n));
  };
}

// eslint-disable-next-line no-control-regex -- control characters are exactly what this looks for
const CONTROL = /[\u0000-\u001f\u007f-\u009f]/;

/** A name as a table cell: as it is, or JSON-quoted when it holds control characters or is empty. */
export function printable(name: string): string {
  return name.length === 0 || CONTROL.test(name) ? JSON.stringify(name) : name;
}

/**
 * A failure of the command line's input that no library error describes (a name that is both a
 * stream and a super stream, a producer the store does not hold): `main.ts` prints its message as
 * one line and exits with {@link CliError.exitCode}.
 */
export class CliError extends Error {
  /** The process exit code: 2 for usage, 4 for the store (see `stream-dedup help`). */
  readonly exitCode: number;

  constructor(message: string, exitCode: number) {
    super(message);
    this.name = 'CliError';
    this.exitCode = exitCode;
  }
}
