/**
 * The one-line answer to a mistyped command: the nearest command when one is close, and where the
 * full help is — not the whole help text, which buries the mistake.
 */

/** The commands `stream-dedup` takes, as a user types them. */
export const COMMANDS: readonly string[] = [
  'audit',
  'inspect',
  'demo',
  'create-super-stream',
  'list',
  'delete',
  'migrate',
  'outbox',
  'help',
  '--version',
];

/** The hint for an unknown `command`: one line, with a suggestion within 2 edits (or a prefix of 3+). */
export function unknownCommandHint(command: string, commands: readonly string[] = COMMANDS): string {
  const nearest = commands
    .map((c) => ({ c, d: c.startsWith(command) && command.length >= 3 ? 0 : editDistance(command, c) }))
    .filter(({ d }) => d <= 2)
    .sort((a, b) => a.d - b.d)[0];
  return (
    `unknown command ${JSON.stringify(command)}` +
    (nearest === undefined ? '' : ` (did you mean ${nearest.c}?)`) +
    `: stream-dedup help lists the commands`
  );
}

/** Levenshtein distance, in UTF-16 code units (commands are ASCII); inputs are capped at 64. */
function editDistance(a: string, b: string): number {
  const x = a.slice(0, 64);
  const y = b.slice(0, 64);
  let previous = Array.from({ length: y.length + 1 }, (_, j) => j);
  for (let i = 1; i <= x.length; i++) {
    const row = [i];
    for (let j = 1; j <= y.length; j++) {
      row[j] = Math.min(
        previous[j]! + 1,
        row[j - 1]! + 1,
        previous[j - 1]! + (x[i - 1] === y[j - 1] ? 0 : 1),
      );
    }
    previous = row;
  }
  return previous[y.length]!;
}
