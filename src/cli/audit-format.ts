/**
 * The text and `--json` forms of a `stream-dedup audit` report (audit.ts is the analysis). Pure.
 */
import type { AuditReport } from './audit-report.js';
import { describeRange, RANGE_NOTE, rangeJson, type AuditRange } from './audit-range.js';
import { formatTable, plural, printable, toJson } from './output.js';

/** The `--json` output: one object, bigints as decimal strings. */
export function formatAuditJson(stream: string, report: AuditReport, range?: AuditRange): string {
  return toJson({ stream, ...rangeJson(range), ...report });
}

/** The human-readable report: a summary line, a table per producer, the problems, a verdict. */
export function formatAuditReport(stream: string, report: AuditReport, range?: AuditRange): string {
  const lines: string[] = [];
  lines.push(
    `stream ${JSON.stringify(stream)}${range === undefined ? '' : ` ${describeRange(range)}`}: ` +
      `${plural(report.messages, 'message')}, ` +
      `${plural(report.producers.length, 'producer')}, ${report.unidentified.count} without identity`,
  );
  if (range !== undefined) lines.push(RANGE_NOTE);
  if (report.beforeRange > 0) {
    lines.push(
      `${plural(report.beforeRange, 'message')} below its producer's first id in the range, not judged ` +
        `(its first copy may be before the range)`,
    );
  }
  if (report.producers.length > 0) {
    lines.push('');
    lines.push(
      formatTable(
        [
          'producer',
          'messages',
          'first id',
          'last id',
          'duplicates',
          'amqp copies',
          'missing ids',
          'gaps',
          'skipped ids',
          'out of order',
        ],
        report.producers.map((p) => [
          printable(p.producerName),
          String(p.messages),
          String(p.firstId),
          String(p.lastId),
          String(p.duplicates),
          String(p.expectedCopies),
          String(p.missingIds),
          String(p.gaps),
          String(p.skippedIds),
          String(p.outOfOrder),
        ]),
        ['left', 'right', 'right', 'right', 'right', 'right', 'right', 'right', 'right', 'right'],
      ),
    );
  }
  const details = formatAuditDetails(report);
  if (details.length > 0) lines.push('', ...details);
  lines.push('');
  lines.push(formatAuditVerdict(report));
  return lines.join('\n');
}

/**
 * The problems of a report, one line each, with their samples: duplicates, gaps, declared skips,
 * contradicted skips, messages out of order and messages without identity. Lines start with the
 * producer name (then `prefix` before it, when given: the super stream audit names the partition).
 */
export function formatAuditDetails(report: AuditReport, prefix = ''): string[] {
  const details: string[] = [];
  for (const p of report.producers) {
    const name = prefix + printable(p.producerName);
    if (p.duplicates > 0) {
      const shown = p.duplicateSamples.map(
        (d) => `id ${d.publishingId} at offset ${d.offset} (first at ${d.firstOffset})`,
      );
      details.push(`${name}: ${plural(p.duplicates, 'duplicate')}: ${more(shown, p.duplicates)}`);
    }
    if (p.expectedCopies > 0) {
      const shown = p.expectedCopySamples.map(
        (d) => `id ${d.publishingId} at offset ${d.offset} (first at ${d.firstOffset})`,
      );
      details.push(
        `${name}: ${plural(p.expectedCopies, 'expected copy', 'expected copies')} (AMQP 0-9-1 re-sends, ` +
          `not deduplicated by the broker; not a failure): ${more(shown, p.expectedCopies)}`,
      );
    }
    if (p.conflictingCopies > 0) {
      const shown = p.conflictingCopySamples.map(
        (d) => `id ${d.publishingId} at offset ${d.offset} (first at ${d.firstOffset})`,
      );
      details.push(
        `${name}: ${plural(p.conflictingCopies, 'conflicting copy', 'conflicting copies')} (marked AMQP 0-9-1 ` +
          `but another body or headers than the first copy: another message under the same id, dropped ` +
          `by verifying consumers): ${more(shown, p.conflictingCopies)}`,
      );
    }
    if (p.gaps > 0) {
      const shown = p.gapRanges.map((r) => (r.from === r.to ? `${r.from}` : `${r.from}..${r.to}`));
      details.push(
        `${name}: ${plural(p.missingIds, 'missing id')} in ${plural(p.gaps, 'gap')}: ${more(shown, p.gaps)}`,
      );
    }
    if (p.skippedIds > 0n) {
      const shown = p.skippedRanges.map((r) => (r.from === r.to ? `${r.from}` : `${r.from}..${r.to}`));
      details.push(
        `${name}: ${plural(p.skippedIds, 'skipped id')}, declared by the producer (not lost): ${shown.join(', ')}` +
          (p.skippedRanges.length < 10 ? '' : ', …'),
      );
    }
    if (p.contradictions > 0) {
      const shown = p.contradictionSamples.map(
        (c) =>
          `id ${c.publishingId} at offset ${c.offset} (declared skipped at offset ${c.declaredAt}: ${c.declared.from}..${c.declared.to})`,
      );
      details.push(
        `${name}: ${plural(p.contradictions, 'message')} inside a declared skip: ${more(shown, p.contradictions)}`,
      );
    }
    if (p.outOfOrder > 0) {
      const shown = p.outOfOrderSamples.map(
        (o) => `id ${o.publishingId} at offset ${o.offset} after ${o.previousMaxId}`,
      );
      details.push(`${name}: ${p.outOfOrder} out of order: ${more(shown, p.outOfOrder)}`);
    }
  }
  const u = report.unidentified;
  if (u.count > 0) {
    const shown = u.samples.map((s) => `offset ${s.offset} (${s.reason})`);
    details.push(
      `${prefix}${plural(u.count, 'message')} without identity (${u.missing} missing, ${u.malformed} malformed): ` +
        more(shown, u.count),
    );
  }
  return details;
}

/** The last line of a report: `audit: OK …` or `audit: FAILED — ` and the counts. */
export function formatAuditVerdict(
  report: Pick<
    AuditReport,
    | 'ok'
    | 'duplicates'
    | 'expectedCopies'
    | 'conflictingCopies'
    | 'missingIds'
    | 'gaps'
    | 'skippedIds'
    | 'outOfOrder'
    | 'contradictions'
  >,
): string {
  const notes = [
    ...(report.expectedCopies > 0
      ? [plural(report.expectedCopies, 'expected AMQP 0-9-1 copy', 'expected AMQP 0-9-1 copies')]
      : []),
    ...(report.skippedIds > 0n ? [plural(report.skippedIds, 'declared skipped id')] : []),
  ];
  return report.ok
    ? `audit: OK — no duplicates, no gaps, nothing out of order${notes.length > 0 ? ` (${notes.join(', ')})` : ''}`
    : `audit: FAILED — ${plural(report.duplicates, 'duplicate')}, ` +
        `${plural(report.missingIds, 'missing id')} in ${plural(report.gaps, 'gap')}, ` +
        `${report.outOfOrder} out of order` +
        (report.conflictingCopies > 0
          ? `, ${plural(report.conflictingCopies, 'conflicting copy', 'conflicting copies')}`
          : '') +
        (report.contradictions > 0 ? `, ${plural(report.contradictions, 'contradicted skip')}` : '');
}

/** The samples, then how many more there are. */
function more(shown: readonly string[], total: number): string {
  const rest = total - shown.length;
  return shown.join(', ') + (rest > 0 ? `${shown.length > 0 ? ', ' : ''}… ${rest} more` : '');
}
