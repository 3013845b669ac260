/** The housekeeping commands: `create-super-stream`, `list`, `delete`. */
import { createInterface } from 'node:readline/promises';
import { parseArgs } from 'node:util';
import { createSuperStream, planSuperStream } from './create-super-stream.js';
import { deleteByName, describeDeletion } from './delete.js';
import { connectionFromEnv } from './env.js';
import { checkListArgs, formatList, formatListJson, listStreams } from './list.js';
import { help, reportError } from './usage.js';

/**
 * `parseArgs` for the housekeeping commands: the positionals and values, or `undefined` after a
 * usage error (printed on stderr with the command's usage line), or `'help'`.
 */
function parseHousekeeping(
  command: string,
  args: string[],
  options: Record<string, { readonly type: 'string' | 'boolean'; readonly multiple?: boolean }>,
  usage: string,
):
  | { positionals: string[]; values: Record<string, string | boolean | string[] | boolean[] | undefined> }
  | 'help'
  | undefined {
  try {
    const parsed = parseArgs({
      args,
      options: { ...options, help: { type: 'boolean', short: 'h' } },
      allowPositionals: true,
      strict: true,
    });
    if (parsed.values.help === true) return 'help';
    return parsed;
  } catch (err) {
    console.error(`${command}: ${(err as Error).message}\nusage: ${usage}   (stream-dedup help for more)`);
    return undefined;
  }
}

const CREATE_USAGE = 'stream-dedup create-super-stream <name> --partitions N | --keys k1,k2,…';
const LIST_USAGE = 'stream-dedup list <name>… [--group G]… [--producer P]… [--json]';
const DELETE_USAGE = 'stream-dedup delete <name> [--group G]… [--yes]';

/** `stream-dedup create-super-stream`; returns the exit code. */
export async function createSuperStreamCommand(args: string[]): Promise<number> {
  const parsed = parseHousekeeping(
    'create-super-stream',
    args,
    { partitions: { type: 'string' }, keys: { type: 'string' } },
    CREATE_USAGE,
  );
  if (parsed === 'help') return help();
  if (parsed === undefined) return 2;
  const [name, ...more] = parsed.positionals;
  const plan =
    name === undefined || more.length > 0
      ? 'expects exactly one argument, <name>'
      : planSuperStream(
          name,
          parsed.values.partitions as string | undefined,
          parsed.values.keys as string | undefined,
        );
  if (typeof plan === 'string') {
    console.error(`create-super-stream: ${plan}\nusage: ${CREATE_USAGE}`);
    return 2;
  }
  try {
    console.log(await createSuperStream(connectionFromEnv(), plan));
    return 0;
  } catch (err) {
    return reportError(err);
  }
}

/** `stream-dedup list`; returns the exit code. */
export async function listCommand(args: string[]): Promise<number> {
  const parsed = parseHousekeeping(
    'list',
    args,
    {
      group: { type: 'string', multiple: true },
      producer: { type: 'string', multiple: true },
      json: { type: 'boolean' },
    },
    LIST_USAGE,
  );
  if (parsed === 'help') return help();
  if (parsed === undefined) return 2;
  const checked = checkListArgs({
    names: parsed.positionals,
    groups: (parsed.values.group as string[] | undefined) ?? [],
    producers: (parsed.values.producer as string[] | undefined) ?? [],
  });
  if (typeof checked === 'string') {
    console.error(`list: ${checked}\nusage: ${LIST_USAGE}`);
    return 2;
  }
  try {
    const report = await listStreams(connectionFromEnv(), checked);
    console.log(parsed.values.json === true ? formatListJson(report) : formatList(report));
    // Every name given must exist: a typo is not an empty listing.
    return report.missing.length === 0 ? 0 : 3;
  } catch (err) {
    return reportError(err);
  }
}

/** `stream-dedup delete`; returns the exit code. */
export async function deleteCommand(args: string[]): Promise<number> {
  const parsed = parseHousekeeping(
    'delete',
    args,
    { group: { type: 'string', multiple: true }, yes: { type: 'boolean' } },
    DELETE_USAGE,
  );
  if (parsed === 'help') return help();
  if (parsed === undefined) return 2;
  const [name, ...more] = parsed.positionals;
  const groups = (parsed.values.group as string[] | undefined) ?? [];
  const problem =
    name === undefined || name.length === 0 || more.length > 0
      ? 'expects exactly one argument, <name>'
      : groups.find((g) => g.length === 0 || g.includes('.')) !== undefined
        ? "--group expects a group name, non-empty and without '.'"
        : undefined;
  if (problem !== undefined) {
    console.error(`delete: ${problem}\nusage: ${DELETE_USAGE}`);
    return 2;
  }
  const yes = parsed.values.yes === true;
  const interactive = process.stdin.isTTY === true && process.stderr.isTTY === true;
  // Refused before any I/O: a script without --yes must not hang on a question nobody reads.
  if (!yes && !interactive) {
    console.error('delete: refusing to delete without --yes: there is no terminal to ask on');
    return 2;
  }
  try {
    const { plan, deleted } = await deleteByName(connectionFromEnv(), name!, groups, async (p) =>
      yes ? true : askYesNo(`delete ${describeDeletion(p)}? [y/N] `),
    );
    console.log(deleted ? `deleted ${describeDeletion(plan)}` : 'nothing deleted');
    return deleted ? 0 : 1;
  } catch (err) {
    return reportError(err);
  }
}

/** Asks on the terminal (stderr), true for y or yes. */
async function askYesNo(question: string): Promise<boolean> {
  const rl = createInterface({ input: process.stdin, output: process.stderr });
  try {
    const answer = await rl.question(question);
    return /^\s*y(es)?\s*$/i.test(answer);
  } finally {
    rl.close();
  }
}
