#!/usr/bin/env node
import { existsSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { DedupError } from '../errors.js';
import { DedupStore } from '../store/store.js';
import { readStreamToEnd } from '../transport/stream-ops.js';
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
import { demo } from './demo.js';
import { connectionFromEnv } from './env.js';
import {
  formatInspection,
  formatInspectionJson,
  inspectPostgresRows,
  inspectStore,
  selectProducer,
} from './inspect.js';
import { describeRange, parseAuditRange, type AuditRange } from './audit-range.js';
import { CliError, plural, progressReporter, runningCount } from './output.js';
import { produce } from './produce.js';
import { redactUrl } from './redact.js';
import { packageVersion } from './version.js';
import { createSuperStreamCommand, deleteCommand, listCommand } from './housekeeping.js';
import { exitCodeOf, help, reportError, USAGE } from './usage.js';
import { outboxCommand } from './outbox.js';

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
    { producer: { type: 'string' }, schema: { type: 'string' } },
    ' [--producer NAME] [--schema S (with a postgres:// URL)]',
  );
  if (parsed === 'help') return help();
  if (parsed === undefined) return 2;
  const { target: path, json, values } = parsed;
  const producer = typeof values.producer === 'string' ? values.producer : undefined;
  const schema = typeof values.schema === 'string' ? values.schema : undefined;
  if (/^postgres(ql)?:\/\//i.test(path)) return inspectPostgres(path, schema, json, producer);
  if (schema !== undefined) {
    console.error('inspect: --schema is for a PostgreSQL store (a postgres:// URL), not a store folder');
    return 2;
  }
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

/** `stream-dedup inspect postgres://… --schema S`: loads the PostgreSQL reader (and pg) only now. */
async function inspectPostgres(
  url: string,
  schema: string | undefined,
  json: boolean,
  producer: string | undefined,
): Promise<number> {
  if (schema === undefined) {
    console.error('inspect: a PostgreSQL store needs --schema S (the schema migrate created)');
    return 2;
  }
  // The password stays out of what is printed.
  const shown = `${redactUrl(url)} schema ${schema}`;
  const { readPostgresStore } = await import('../postgres/inspect.js');
  let contents;
  try {
    contents = await readPostgresStore(url, schema);
  } catch (err) {
    if (err instanceof TypeError || err instanceof RangeError) {
      console.error(`inspect: ${err.message}`);
      return 2;
    }
    return reportError(err);
  }
  try {
    const all = inspectPostgresRows(contents);
    const inspection = producer === undefined ? all : selectProducer(shown, all, producer);
    const store = `${shown} (version ${contents.version})`;
    console.log(json ? formatInspectionJson(store, inspection) : formatInspection(store, inspection));
    return 0;
  } catch (err) {
    return reportError(err);
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
