#!/usr/bin/env node
import { existsSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { createInterface } from 'node:readline/promises';
import { parseArgs } from 'node:util';
import { DedupError } from '../errors.js';
import { DedupStore } from '../store/store.js';
import { readStreamToEnd } from '../transport/stream.js';
import {
  auditSuperStream,
  chooseAuditTarget,
  formatSuperStreamAuditJson,
  formatSuperStreamAuditReport,
  lookUpName,
  type ForcedKind,
} from './audit-superstream.js';
import { auditExitCode, auditRecords, formatAuditJson, formatAuditReport } from './audit.js';
import { unknownCommandHint } from './command-hint.js';
import { createSuperStream, planSuperStream } from './create-super-stream.js';
import { deleteByName, describeDeletion } from './delete.js';
import { demo } from './demo.js';
import { connectionFromEnv } from './env.js';
import { formatInspection, formatInspectionJson, inspectStore, selectProducer } from './inspect.js';
import { describeRange, parseAuditRange, type AuditRange } from './audit-range.js';
import { CliError, plural, progressReporter, runningCount } from './output.js';
import { checkListArgs, formatList, formatListJson, listStreams } from './list.js';
import { outboxCommand } from './outbox.js';
import { produce } from './produce.js';
import { packageVersion } from './version.js';

const USAGE = `stream-dedup — producer-side deduplication for RabbitMQ Streams

Usage:
  stream-dedup audit <stream> [--json] [--from OFFSET | --since TIME]
                                                read the stream from its first message and report per
                                                producer name: messages, duplicates (an id seen again),
                                                gaps (missing id ranges), out-of-order ids, first/last id;
                                                and the messages without identity. Copies marked by an
                                                AMQP 0-9-1 publisher (its outbox re-sends after a crash:
                                                the broker does not deduplicate AMQP 0-9-1) are counted
                                                apart as expected copies and do not fail it.
                                                --from reads from an offset, --since from the first chunk
                                                at or after an ISO time; a range cannot see earlier ids,
                                                so a copy of an earlier message is not a duplicate there
  stream-dedup audit <super-stream> [--json]    the same for each partition of a super stream (recognised
                                                by the broker's partitions query), then the sums; a name
                                                that is both needs --stream or --super-stream; --since
                                                applies to each partition (--from does not: offsets are
                                                per partition)
  stream-dedup inspect <store-folder> [--json] [--producer NAME]
                                                list a LevelDB store: producers (ids, outbox), super
                                                stream producers (the same per partition), verifying
                                                consumers (committed offsets) and verifier scopes, or only
                                                what concerns producer NAME; needs the store's lock, so
                                                stop the processes using it first
  stream-dedup demo [--kills N] [--per-run N] [--keep]
                                                publish (--per-run ≥ 100 messages a run), get SIGKILLed
                                                mid-way --kills times, restart, recover, then audit the
                                                stream: 0 lost, 0 duplicated; the stream is deleted at
                                                the end unless --keep
  stream-dedup create-super-stream <name> --partitions N | --keys k1,k2,…
                                                create a super stream: partitions <name>-0 … <name>-(N-1)
                                                (N from 1 to 1000), or <name>-k1, <name>-k2, … bound with
                                                the keys k1, k2, …; one that exists is refused
  stream-dedup list <name>… [--group G]… [--producer P]… [--json]
                                                what the broker holds under the names: a super stream's
                                                partitions; each stream's leader, replicas, first offset
                                                and last chunk's offset (sizes in offsets, not bytes);
                                                the groups' changelogs <partition>.<G>.changelog; the
                                                broker's last id of each producer P. Only given names are
                                                seen: no protocol here can enumerate a broker's streams
  stream-dedup delete <name> [--group G]… [--yes]
                                                delete a super stream (its partitions) with the groups'
                                                changelogs, or a stream; asks on a terminal, and without
                                                one deletes only with --yes
  stream-dedup migrate <schema> [--url URL] [--json]
                                                create the PostgreSQL store's tables (stream-dedup/postgres)
                                                in <schema>, or check that they are of this version;
                                                the URL defaults to STREAM_DEDUP_PG_URL, then DATABASE_URL
  stream-dedup outbox status --schema S [--postgres URL] [--producer NAME] [--json]
                                                the PostgreSQL transactional outbox of schema S, per producer
                                                name: rows waiting, the oldest one's age, the relay holding
                                                the lock, the last published (confirmed) ID per target; the
                                                URL defaults as migrate's; exit 4 when the server refuses
  stream-dedup help | --help                    this text
  stream-dedup --version                        the version of stream-dedup

--json prints one JSON object on stdout (64-bit integers as decimal strings). Progress lines go to
stderr, and only when it is a terminal.
Environment (defaults in parentheses):
  RABBITMQ_HOST (127.0.0.1)        the broker's host
  RABBITMQ_STREAM_PORT (5552)      its stream protocol port
  RABBITMQ_STREAM_ENDPOINTS        a cluster's stream endpoints, host:port,host:port, used instead of
                                   RABBITMQ_HOST and RABBITMQ_STREAM_PORT (each reconnect takes the next)
  RABBITMQ_AMQP_PORT (5672)        its AMQP 0-9-1 port (producers using the AMQP transport)
  RABBITMQ_USER (guest)            the user name
  RABBITMQ_PASSWORD (guest)        the password
  RABBITMQ_VHOST (/)               the virtual host
  RABBITMQ_TLS                     1: connect with TLS (default ports then 5551 and 5671); set by any of:
  RABBITMQ_TLS_CA_FILE             a PEM file of the CA(s) to verify the broker with (else the system's)
  RABBITMQ_TLS_CERT_FILE           a PEM client certificate, and RABBITMQ_TLS_KEY_FILE its key
  RABBITMQ_TLS_KEY_PASSPHRASE      the key's passphrase (never printed)
  RABBITMQ_TLS_SERVERNAME          the name to verify in the broker's certificate (default: the host)
  STREAM_DEDUP_DEBUG               1: print the stack of an error, not only its one-line message
Exit codes: 0 ok; 1 the audit found a problem: duplicates, gaps, ids out of order or a contradicted
skip (each alone is enough, in any partition of a super stream; declared skips, expected AMQP 0-9-1
copies and messages without identity are reported but do not fail it), or delete was answered no;
2 usage (delete without --yes and without a terminal included); 3 broker unreachable or refused (for
example no stream or super stream has the name, for list any of the names, or create-super-stream's
name exists); 4 store locked, corrupt or missing, or it has no producer of the --producer name, or
the PostgreSQL server refused (migrate).`;

/** The command that starts this CLI again (under tsx when running from source). */
function selfCommand(): string[] {
  const self = fileURLToPath(import.meta.url);
  return self.endsWith('.ts') ? [process.execPath, '--import', 'tsx', self] : [process.execPath, self];
}

async function main(argv: string[]): Promise<number> {
  const [command, ...rest] = argv;
  switch (command) {
    case 'audit':
      return audit(rest);
    case 'inspect':
      return inspect(rest);
    case 'demo':
      return demo(rest, selfCommand());
    case 'create-super-stream':
      return createSuperStreamCommand(rest);
    case 'list':
      return listCommand(rest);
    case 'delete':
      return deleteCommand(rest);
    case 'migrate':
      return migrateCommand(rest);
    case 'outbox':
      return outboxCommand(rest);
    case '_produce': {
      const { values } = parseArgs({
        args: rest,
        options: {
          stream: { type: 'string' },
          'super-stream': { type: 'string' },
          producer: { type: 'string' },
          store: { type: 'string' },
          run: { type: 'string' },
          count: { type: 'string' },
          log: { type: 'string' },
          durability: { type: 'string', default: 'outbox' },
          concurrency: { type: 'string', default: '64' },
          transport: { type: 'string', default: 'stream' },
          keyed: { type: 'boolean', default: false },
          'sub-entry': { type: 'string' },
          compression: { type: 'string', default: 'none' },
          'confirm-timeout-ms': { type: 'string' },
          'connect-timeout-ms': { type: 'string' },
        },
      });
      const subEntrySize = values['sub-entry'];
      const confirmTimeout = values['confirm-timeout-ms'];
      const connectTimeout = values['connect-timeout-ms'];
      await produce({
        stream: values.stream!,
        superStream: values['super-stream'],
        producerName: values.producer!,
        store: values.store!,
        run: Number(values.run),
        count: Number(values.count),
        log: values.log!,
        durability: values.durability === 'reserve' ? 'reserve' : 'outbox',
        concurrency: Number(values.concurrency),
        transport: values.transport === 'amqp' ? 'amqp' : 'stream',
        keyed: values.keyed === true,
        subEntry:
          subEntrySize === undefined
            ? undefined
            : {
                size: Number(subEntrySize),
                compression: values.compression as 'none' | 'gzip' | 'zstd',
              },
        confirmTimeoutMs: confirmTimeout === undefined ? undefined : Number(confirmTimeout),
        connectTimeoutMs: connectTimeout === undefined ? undefined : Number(connectTimeout),
      });
      return 0;
    }
    case undefined:
    case 'help':
    case '--help':
    case '-h':
      console.log(USAGE);
      return command === undefined ? 2 : 0;
    case '--version':
    case '-v':
    case 'version':
      console.log(packageVersion());
      return 0;
    default:
      console.error(unknownCommandHint(command));
      return 2;
  }
}

/** Options of one command beyond `--json` and `--help`, as `parseArgs` takes them. */
type ExtraOptions = Record<string, { readonly type: 'string' | 'boolean' }>;

/**
 * Parses `<command> <what> [--json] [--help]` and the command's own options: the positional, the
 * flag and the other options' values, `'help'`, or `undefined` after a usage error (printed on stderr).
 */
function parseCommand(
  command: string,
  args: string[],
  what: string,
  extra: ExtraOptions = {},
  extraUsage = '',
):
  | {
      readonly target: string;
      readonly json: boolean;
      readonly values: Readonly<Record<string, string | boolean | undefined>>;
    }
  | 'help'
  | undefined {
  const usage = `usage: stream-dedup ${command} <${what}> [--json]${extraUsage}   (stream-dedup help for more)`;
  let parsed;
  try {
    parsed = parseArgs({
      args,
      options: {
        ...extra,
        json: { type: 'boolean', default: false },
        help: { type: 'boolean', short: 'h' },
      },
      allowPositionals: true,
      strict: true,
    });
  } catch (err) {
    console.error(`${command}: ${(err as Error).message}\n${usage}`);
    return undefined;
  }
  if (parsed.values.help === true) return 'help';
  const [target, ...extraPositionals] = parsed.positionals;
  if (target === undefined || target.length === 0 || extraPositionals.length > 0) {
    console.error(`${command}: expects exactly one argument, <${what}>\n${usage}`);
    return undefined;
  }
  return { target, json: parsed.values.json === true, values: parsed.values };
}

async function audit(args: string[]): Promise<number> {
  const parsed = parseCommand(
    'audit',
    args,
    'stream',
    {
      stream: { type: 'boolean' },
      'super-stream': { type: 'boolean' },
      from: { type: 'string' },
      since: { type: 'string' },
    },
    ' [--stream | --super-stream] [--from OFFSET | --since TIME]',
  );
  if (parsed === 'help') return help();
  if (parsed === undefined) return 2;
  const { target: name, json, values } = parsed;
  if (values.stream === true && values['super-stream'] === true) {
    console.error('audit: --stream and --super-stream exclude each other');
    return 2;
  }
  const range = parseAuditRange(values.from, values.since);
  if (typeof range === 'string') {
    console.error(`audit: ${range}`);
    return 2;
  }
  const forced: ForcedKind | undefined =
    values.stream === true ? 'stream' : values['super-stream'] === true ? 'super-stream' : undefined;
  const progress = progressReporter();
  const connection = connectionFromEnv();
  try {
    // --stream reads the stream as before detection existed: no extra query.
    const target =
      forced === 'stream'
        ? ({ kind: 'stream', stream: name } as const)
        : chooseAuditTarget(name, await lookUpName(connection, name), forced);
    if (target.kind === 'stream') return await auditStream(name, json, connection, progress, range);
    if (range !== undefined && 'from' in range) {
      console.error(
        `audit: --from takes an offset of one stream, and "${name}" is a super stream whose partitions ` +
          `each have their own offsets: use --since, or audit a partition with --from`,
      );
      return 2;
    }
    const { partitions } = target;
    progress(
      `audit: super stream "${name}" has ${plural(partitions.length, 'partition')}: ${partitions.join(', ')}`,
    );
    const report = await auditSuperStream(
      name,
      partitions,
      async (partition) => {
        progress(`audit: reading partition "${partition}" …`);
        return readStreamToEnd(connection, partition, {
          ...(range === undefined ? {} : { from: range.since }),
          onProgress: runningCount(progress, (n) => `audit: ${partition}: ${plural(n, 'message')} read …`),
        });
      },
      {
        partial: range !== undefined,
        onPartition: ({ partition, report: r }) =>
          progress(`audit: ${partition}: ${plural(r.messages, 'message')}, ${r.ok ? 'ok' : 'FAILED'}`),
      },
    );
    console.log(
      json ? formatSuperStreamAuditJson(report, range) : formatSuperStreamAuditReport(report, range),
    );
    return report.ok ? 0 : 1;
  } catch (err) {
    return reportError(err);
  }
}

/** `audit <stream>`: one stream, read from its first message or from the range's start. */
async function auditStream(
  stream: string,
  json: boolean,
  connection: ReturnType<typeof connectionFromEnv>,
  progress: (line: string) => void,
  range: AuditRange | undefined,
): Promise<number> {
  progress(
    `audit: reading stream "${stream}"${range === undefined ? '' : ` ${describeRange(range)}`} ` +
      `from ${connection.hostname}:${connection.port} …`,
  );
  const started = performance.now();
  const records = await readStreamToEnd(connection, stream, {
    ...(range === undefined ? {} : { from: 'from' in range ? range.from : range.since }),
    onProgress: runningCount(progress, (n) => `audit: ${plural(n, 'message')} read …`),
  });
  progress(
    `audit: read ${plural(records.length, 'message')} in ${((performance.now() - started) / 1000).toFixed(1)} s`,
  );
  const report = auditRecords(records, { partial: range !== undefined });
  console.log(json ? formatAuditJson(stream, report, range) : formatAuditReport(stream, report, range));
  return auditExitCode(report);
}

async function inspect(args: string[]): Promise<number> {
  const parsed = parseCommand(
    'inspect',
    args,
    'store-folder',
    { producer: { type: 'string' } },
    ' [--producer NAME]',
  );
  if (parsed === 'help') return help();
  if (parsed === undefined) return 2;
  const { target: path, json, values } = parsed;
  const producer = typeof values.producer === 'string' ? values.producer : undefined;
  // DedupStore.open creates a missing store: refuse first, so a typo does not leave a new one behind.
  if (!existsSync(path)) {
    console.error(`error: no store at ${path}: the folder does not exist`);
    return 4;
  }
  if (!statSync(path).isDirectory()) {
    console.error(`error: no store at ${path}: it is not a folder`);
    return 4;
  }
  if (!existsSync(join(path, 'CURRENT'))) {
    console.error(`error: ${path} is not a stream-dedup store (no LevelDB CURRENT file in it)`);
    return 4;
  }
  const progress = progressReporter();
  progress(`inspect: opening store ${path} …`);
  let store: DedupStore;
  try {
    store = await DedupStore.open(path);
  } catch (err) {
    if (err instanceof DedupError && err.code === 'DEDUP_STORE_LOCKED') {
      console.error(
        `error: DEDUP_STORE_LOCKED: store ${path} is locked by another process (a publisher or consumer ` +
          `using it); inspect it once that process has closed the store`,
      );
      return 4;
    }
    return reportError(err);
  }
  try {
    const all = await inspectStore(store);
    const inspection = producer === undefined ? all : selectProducer(path, all, producer);
    console.log(json ? formatInspectionJson(path, inspection) : formatInspection(path, inspection));
    return 0;
  } catch (err) {
    if (err instanceof CliError) return reportError(err);
    // LevelDB's own read errors (I/O, corruption) are store problems too.
    return reportError(
      err instanceof DedupError
        ? err
        : new DedupError('DEDUP_STORE_CORRUPT', `store ${path} cannot be read: ${String(err)}`, {
            cause: err,
          }),
    );
  } finally {
    await store.close();
  }
}

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

async function createSuperStreamCommand(args: string[]): Promise<number> {
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

async function listCommand(args: string[]): Promise<number> {
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

async function deleteCommand(args: string[]): Promise<number> {
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

/** `stream-dedup migrate <schema>`: loads the PostgreSQL store (and pg) only now. */
async function migrateCommand(args: string[]): Promise<number> {
  const parsed = parseCommand('migrate', args, 'schema', { url: { type: 'string' } }, ' [--url URL]');
  if (parsed === undefined) return 2;
  if (parsed === 'help') return help();
  const url =
    (parsed.values.url as string | undefined) ?? process.env.STREAM_DEDUP_PG_URL ?? process.env.DATABASE_URL;
  if (url === undefined || url === '') {
    console.error('migrate: no database URL: pass --url, or set STREAM_DEDUP_PG_URL or DATABASE_URL');
    return 2;
  }
  const { migrateFromUrl } = await import('../postgres/migrate-command.js');
  try {
    const result = await migrateFromUrl(url, parsed.target);
    if (parsed.json) console.log(JSON.stringify({ schema: parsed.target, ...result }));
    else
      console.log(
        result.previousVersion === undefined
          ? `schema ${parsed.target}: created at version ${result.version}`
          : `schema ${parsed.target}: version ${result.version}, nothing to do`,
      );
    return 0;
  } catch (err) {
    if (err instanceof TypeError || err instanceof RangeError) {
      console.error(`migrate: ${err.message}`);
      return 2;
    }
    return reportError(err);
  }
}

function help(): number {
  console.log(USAGE);
  return 0;
}

/** One line on stderr, not a stack trace, for the errors users meet; returns the exit code. */
function reportError(err: unknown): number {
  if (err instanceof CliError) {
    console.error(`error: ${err.message}`);
    return err.exitCode;
  }
  if (!(err instanceof DedupError)) throw err;
  console.error(`error: ${err.code}: ${err.message.replace(/\s*\n\s*/g, ' ')}`);
  return exitCodeOf(err);
}

function exitCodeOf(err: unknown): number {
  if (!(err instanceof DedupError)) return 1;
  if (err.code === 'DEDUP_BROKER_UNREACHABLE' || err.code === 'DEDUP_BROKER_REFUSED') return 3;
  if (err.code === 'DEDUP_STORE_LOCKED' || err.code === 'DEDUP_STORE_CORRUPT') return 4;
  if (err.code === 'DEDUP_STORE_REFUSED') return 4;
  return 1;
}

main(process.argv.slice(2)).then(
  (code) => {
    process.exitCode = code;
  },
  (err: unknown) => {
    // One clear line, not a stack trace, for any failure (STREAM_DEDUP_DEBUG=1 prints the stack).
    if (process.env.STREAM_DEDUP_DEBUG === '1') console.error(err);
    const message = err instanceof Error ? err.message : String(err);
    console.error(
      `error: ${err instanceof DedupError ? `${err.code}: ` : ''}${message.replace(/\s*\n\s*/g, ' ')}`,
    );
    process.exitCode = exitCodeOf(err);
  },
);
