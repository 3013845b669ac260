/**
 * `stream-dedup audit <super-stream>`: every partition audited as a stream of its own (each
 * partition has its own publishing IDs per producer, so gaps and duplicates only mean something
 * within one), then the sums. Recognising the name asks the broker; the rest is pure.
 */
import type { Client } from 'rabbitmq-stream-js-client';
import { DedupError } from '../errors.js';
import { connectStreamClient } from '../transport/stream-probe.js';
import { EndpointRotation, errorText, withTimeout, type StreamConnectionOptions } from '../transport/util.js';
import { formatAuditDetails, formatAuditVerdict } from './audit-format.js';
import { describeRange, RANGE_NOTE, rangeJson, type AuditRange } from './audit-range.js';
import {
  auditRecords,
  type AuditOptions,
  type AuditRecord,
  type AuditReport,
  type AuditSums,
} from './audit.js';
import { CliError, formatTable, plural, printable, toJson } from './output.js';
import { DOES_NOT_EXIST, responseCode } from './broker-client.js';

/** What `audit <name>` reads: one stream, or every partition of a super stream. */
export type AuditTarget =
  | { readonly kind: 'stream'; readonly stream: string }
  | {
      readonly kind: 'super-stream';
      readonly superStream: string;
      /** In the broker's order (its bindings' partition order). */
      readonly partitions: readonly string[];
    };

/** What the broker knows under one name: a stream, a super stream, both or neither. */
export interface NameLookup {
  /** A stream of that name exists. */
  readonly stream: boolean;
  /** The partitions of the super stream of that name; empty when there is no such super stream. */
  readonly partitions: readonly string[];
}

/** `--stream` or `--super-stream` on the command line: how to read the name, past detection. */
export type ForcedKind = 'stream' | 'super-stream';

/**
 * Decides what to audit: a super stream when the broker lists partitions for the name, a stream
 * when a stream has it. A name that is both needs `--stream` or `--super-stream`.
 *
 * @throws DedupError `DEDUP_BROKER_REFUSED` when nothing of that name exists (or, with
 *   `--super-stream`, no super stream).
 * @throws CliError (exit code 2) when the name is both a stream and a super stream and no flag says which.
 */
export function chooseAuditTarget(name: string, lookup: NameLookup, forced?: ForcedKind): AuditTarget {
  const isSuper = lookup.partitions.length > 0;
  const superStream: AuditTarget = { kind: 'super-stream', superStream: name, partitions: lookup.partitions };
  if (forced === 'super-stream') {
    if (isSuper) return superStream;
    throw new DedupError(
      'DEDUP_BROKER_REFUSED',
      `super stream "${name}" does not exist (the broker's partitions query lists no partition for it)` +
        (lookup.stream ? `; a stream of that name does: audit it without --super-stream` : ''),
    );
  }
  if (forced === 'stream' || (lookup.stream && !isSuper)) return { kind: 'stream', stream: name };
  if (isSuper && lookup.stream) {
    throw new CliError(
      `"${name}" is both a stream and a super stream (partitions ${lookup.partitions.join(', ')}): ` +
        `pass --stream or --super-stream to say which to audit`,
      2,
    );
  }
  if (isSuper) return superStream;
  // The wording of readStreamToEnd's refusal, so that scripts matching it keep working.
  throw new DedupError(
    'DEDUP_BROKER_REFUSED',
    `cannot read stream "${name}": it does not exist, and no super stream of that name exists either`,
  );
}

/**
 * Asks the broker whether `name` is a stream and whether it is a super stream (its partitions),
 * on one connection.
 *
 * @throws DedupError `DEDUP_BROKER_UNREACHABLE` or `DEDUP_BROKER_REFUSED` (a query refused for
 *   another reason than "does not exist", such as access refused).
 */
export async function lookUpName(connection: StreamConnectionOptions, name: string): Promise<NameLookup> {
  const client = await connectStreamClient(new EndpointRotation(connection).next(), 10_000);
  try {
    const ask = async <T>(what: string, query: (c: Client) => Promise<T>): Promise<T> => {
      try {
        return await withTimeout(query(client), 10_000, what);
      } catch (err) {
        const code = responseCode(err) === undefined ? 'DEDUP_BROKER_UNREACHABLE' : 'DEDUP_BROKER_REFUSED';
        throw new DedupError(code, `${what}: ${errorText(err)}`, { cause: err });
      }
    };
    // An exchange that is not a super stream (amq.direct) answers an empty list: not one either.
    const partitions = await ask(`querying the partitions of "${name}"`, (c) =>
      c.queryPartitions({ superStream: name }).catch((err: unknown) => {
        if (responseCode(err) === DOES_NOT_EXIST) return [];
        throw err;
      }),
    );
    const [metadata] = await ask(`querying the metadata of "${name}"`, (c) =>
      c.queryMetadata({ streams: [name] }),
    );
    // Any other answer (a stream whose leader is being elected, say) is a stream that exists:
    // reading it reports what is wrong.
    return { stream: metadata !== undefined && metadata.responseCode !== DOES_NOT_EXIST, partitions };
  } finally {
    await withTimeout(client.close(), 5_000, 'closing').catch(() => undefined);
  }
}

/** One partition's audit: the report `audit <partition>` would print. */
export interface PartitionAudit {
  readonly partition: string;
  readonly report: AuditReport;
}

/** One producer name's counts summed over the partitions it wrote to. */
export interface ProducerTotal {
  readonly producerName: string;
  /** How many partitions hold messages of this producer. */
  readonly partitions: number;
  readonly messages: number;
  readonly distinctIds: number;
  readonly duplicates: number;
  readonly expectedCopies: number;
  readonly conflictingCopies: number;
  readonly missingIds: bigint;
  readonly gaps: number;
  readonly skippedIds: bigint;
  readonly contradictions: number;
  readonly outOfOrder: number;
}

/** What {@link auditSuperStream} found: per partition, and the sums. */
export interface SuperStreamAuditReport extends AuditSums {
  readonly superStream: string;
  /** In the broker's partition order. */
  readonly partitions: readonly PartitionAudit[];
  /** Sums over the partitions, under the names a stream's report uses. */
  readonly messages: number;
  /** Messages not judged in a range (see `AuditReport.beforeRange`), summed. */
  readonly beforeRange: number;
  readonly unidentified: { readonly count: number; readonly missing: number; readonly malformed: number };
  /** Per producer name, sorted by name. */
  readonly producerTotals: readonly ProducerTotal[];
  /** The partitions whose own audit failed, in partition order. */
  readonly failedPartitions: readonly string[];
  /** Every partition's audit is ok. */
  readonly ok: boolean;
}

/**
 * Reads and audits each partition in turn (one partition's messages in memory at a time), then
 * sums. `read` is `readStreamToEnd` in the CLI, and `onPartition` reports progress.
 *
 * @internal The engine of `stream-dedup audit <super-stream>`.
 */
export async function auditSuperStream(
  superStream: string,
  partitions: readonly string[],
  read: (partition: string) => Promise<Iterable<AuditRecord>>,
  options: AuditOptions & { readonly onPartition?: (audit: PartitionAudit) => void } = {},
): Promise<SuperStreamAuditReport> {
  const audits: PartitionAudit[] = [];
  for (const partition of partitions) {
    const audit = { partition, report: auditRecords(await read(partition), options) };
    audits.push(audit);
    options.onPartition?.(audit);
  }
  return summarizeSuperStream(superStream, audits);
}

/**
 * The sums over the partitions' reports: a super stream is ok when every partition is.
 *
 * @internal
 */
export function summarizeSuperStream(
  superStream: string,
  partitions: readonly PartitionAudit[],
): SuperStreamAuditReport {
  const totals = new Map<string, ProducerTotal>();
  for (const { report } of partitions) {
    for (const p of report.producers) {
      const t = totals.get(p.producerName);
      totals.set(p.producerName, {
        producerName: p.producerName,
        partitions: (t?.partitions ?? 0) + 1,
        messages: (t?.messages ?? 0) + p.messages,
        distinctIds: (t?.distinctIds ?? 0) + p.distinctIds,
        duplicates: (t?.duplicates ?? 0) + p.duplicates,
        expectedCopies: (t?.expectedCopies ?? 0) + p.expectedCopies,
        conflictingCopies: (t?.conflictingCopies ?? 0) + p.conflictingCopies,
        missingIds: (t?.missingIds ?? 0n) + p.missingIds,
        gaps: (t?.gaps ?? 0) + p.gaps,
        skippedIds: (t?.skippedIds ?? 0n) + p.skippedIds,
        contradictions: (t?.contradictions ?? 0) + p.contradictions,
        outOfOrder: (t?.outOfOrder ?? 0) + p.outOfOrder,
      });
    }
  }
  const reports = partitions.map((p) => p.report);
  const sum = (f: (r: AuditReport) => number): number => reports.reduce((s, r) => s + f(r), 0);
  const sumBig = (f: (r: AuditReport) => bigint): bigint => reports.reduce((s, r) => s + f(r), 0n);
  const failedPartitions = partitions.filter((p) => !p.report.ok).map((p) => p.partition);
  return {
    superStream,
    partitions,
    messages: sum((r) => r.messages),
    beforeRange: sum((r) => r.beforeRange),
    unidentified: {
      count: sum((r) => r.unidentified.count),
      missing: sum((r) => r.unidentified.missing),
      malformed: sum((r) => r.unidentified.malformed),
    },
    duplicates: sum((r) => r.duplicates),
    expectedCopies: sum((r) => r.expectedCopies),
    conflictingCopies: sum((r) => r.conflictingCopies),
    missingIds: sumBig((r) => r.missingIds),
    gaps: sum((r) => r.gaps),
    skippedIds: sumBig((r) => r.skippedIds),
    outOfOrder: sum((r) => r.outOfOrder),
    contradictions: sum((r) => r.contradictions),
    producerTotals: [...totals.values()].sort((a, b) =>
      a.producerName < b.producerName ? -1 : a.producerName > b.producerName ? 1 : 0,
    ),
    failedPartitions,
    ok: failedPartitions.length === 0,
  };
}

/**
 * The `--json` output: one object with the sums at the top (under the names of a stream's
 * report), then `partitions`, each what `audit <partition> --json` prints. Bigints as strings.
 */
export function formatSuperStreamAuditJson(report: SuperStreamAuditReport, range?: AuditRange): string {
  const { partitions, ...sums } = report;
  return toJson({
    ...rangeJson(range),
    ...sums,
    partitions: partitions.map(({ partition, report: r }) => ({
      stream: partition,
      ...rangeJson(range),
      ...r,
    })),
  });
}

/**
 * The human-readable report: a summary line, a table of partitions with a total row, a table of
 * (partition, producer) with each producer's total, the problems prefixed by their partition,
 * and a verdict naming the partitions that failed.
 */
export function formatSuperStreamAuditReport(report: SuperStreamAuditReport, range?: AuditRange): string {
  const { partitions } = report;
  const lines: string[] = [
    `super stream ${JSON.stringify(report.superStream)}${range === undefined ? '' : ` ${describeRange(range)}`}: ` +
      `${plural(partitions.length, 'partition')}, ` +
      `${plural(report.messages, 'message')}, ${plural(report.producerTotals.length, 'producer')}, ` +
      `${report.unidentified.count} without identity`,
    ...(range === undefined ? [] : [RANGE_NOTE]),
    ...(report.beforeRange > 0
      ? [
          `${plural(report.beforeRange, 'message')} below its producer's first id in the range of its partition, ` +
            `not judged (its first copy may be before the range)`,
        ]
      : []),
    '',
  ];
  const counts = (r: {
    duplicates: number;
    missingIds: bigint;
    gaps: number;
    skippedIds: bigint;
    outOfOrder: number;
  }): string[] => [r.duplicates, r.missingIds, r.gaps, r.skippedIds, r.outOfOrder].map(String);
  const countHeaders = ['duplicates', 'missing ids', 'gaps', 'skipped ids', 'out of order'];
  const right = (n: number): Array<'right'> => Array<'right'>(n).fill('right');
  lines.push(
    formatTable(
      ['partition', 'messages', 'producers', 'without identity', ...countHeaders, 'result'],
      [
        ...partitions.map(({ partition, report: r }) => [
          printable(partition),
          String(r.messages),
          String(r.producers.length),
          String(r.unidentified.count),
          ...counts(r),
          r.ok ? 'ok' : 'FAILED',
        ]),
        [
          'total',
          String(report.messages),
          String(report.producerTotals.length),
          String(report.unidentified.count),
          ...counts(report),
          report.ok ? 'ok' : 'FAILED',
        ],
      ],
      ['left', ...right(8), 'left'],
    ),
  );
  const rows = partitions.flatMap(({ partition, report: r }) =>
    r.producers.map((p) => [
      printable(partition),
      printable(p.producerName),
      String(p.messages),
      String(p.firstId),
      String(p.lastId),
      ...counts(p),
    ]),
  );
  if (rows.length > 0) {
    // IDs are per partition: a first or last ID over all of them would mean nothing.
    for (const t of report.producerTotals) {
      rows.push(['(all)', printable(t.producerName), String(t.messages), '-', '-', ...counts(t)]);
    }
    lines.push(
      '',
      formatTable(['partition', 'producer', 'messages', 'first id', 'last id', ...countHeaders], rows, [
        'left',
        'left',
        ...right(8),
      ]),
    );
  }
  const details = partitions.flatMap(({ partition, report: r }) =>
    formatAuditDetails(r, `${printable(partition)}: `),
  );
  if (details.length > 0) lines.push('', ...details);
  const failed = report.failedPartitions;
  const where = report.ok
    ? `in all ${plural(partitions.length, 'partition')}`
    : `in ${failed.length} of ${plural(partitions.length, 'partition')} (${failed.map(printable).join(', ')})`;
  lines.push('', formatAuditVerdict(report).replace(/^audit: (OK|FAILED)/, `audit: $1 ${where}`));
  return lines.join('\n');
}
