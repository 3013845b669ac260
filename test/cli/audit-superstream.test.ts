import { describe, expect, it } from 'vitest';
import {
  auditSuperStream,
  chooseAuditTarget,
  formatSuperStreamAuditJson,
  formatSuperStreamAuditReport,
  summarizeSuperStream,
} from '../../src/cli/audit-superstream.js';
import { auditRecords, formatAuditJson, type AuditRecord } from '../../src/cli/audit.js';
import { CliError } from '../../src/cli/output.js';
import { identityHeaders, SKIP_HEADER } from '../../src/identity/headers.js';
import { amqpRecords, ids, records } from '../support/audit-records.js';

const PARTITIONS = ['orders-0', 'orders-1', 'orders-2'];

/** Each partition numbered 1..n by its producer, as a super stream dedup publisher writes them. */
const clean: Record<string, AuditRecord[]> = {
  'orders-0': records(...ids('billing', 1, 2, 3, 4)),
  'orders-1': records(...ids('billing', 1, 2), ...ids('audit', 1)),
  'orders-2': records(...ids('billing', 1, 2, 3)),
};

const readFrom = (data: Record<string, AuditRecord[]>) => (partition: string) =>
  Promise.resolve(data[partition] ?? []);

describe('cli audit - recognising a super stream', () => {
  const none = { stream: false, partitions: [] };
  const stream = { stream: true, partitions: [] };
  const superStream = { stream: false, partitions: PARTITIONS };
  const both = { stream: true, partitions: PARTITIONS };

  it('a name with partitions is a super stream, a stream is a stream', () => {
    expect(chooseAuditTarget('orders', superStream)).toEqual({
      kind: 'super-stream',
      superStream: 'orders',
      partitions: PARTITIONS,
    });
    expect(chooseAuditTarget('orders', stream)).toEqual({ kind: 'stream', stream: 'orders' });
    expect(chooseAuditTarget('orders', both, 'stream')).toEqual({ kind: 'stream', stream: 'orders' });
    expect(chooseAuditTarget('orders', both, 'super-stream')).toMatchObject({ kind: 'super-stream' });
  });

  it('a name that is both, without a flag, is a usage error (exit code 2) saying which flags decide', () => {
    const err = (() => {
      try {
        chooseAuditTarget('orders', both);
      } catch (e) {
        return e;
      }
    })();
    expect(err).toBeInstanceOf(CliError);
    expect(err).toMatchObject({ exitCode: 2 });
    expect((err as Error).message).toBe(
      '"orders" is both a stream and a super stream (partitions orders-0, orders-1, orders-2): ' +
        'pass --stream or --super-stream to say which to audit',
    );
  });

  it('nothing of that name is DEDUP_BROKER_REFUSED, worded as a missing stream was before', () => {
    expect(() => chooseAuditTarget('nope', none)).toThrow(
      expect.objectContaining({
        code: 'DEDUP_BROKER_REFUSED',
        message:
          'cannot read stream "nope": it does not exist, and no super stream of that name exists either',
      }),
    );
  });

  it('--super-stream on a name without partitions is DEDUP_BROKER_REFUSED naming the super stream', () => {
    expect(() => chooseAuditTarget('nope', none, 'super-stream')).toThrow(
      expect.objectContaining({
        code: 'DEDUP_BROKER_REFUSED',
        message: expect.stringMatching(/^super stream "nope" does not exist \(/) as unknown,
      }),
    );
    expect(() => chooseAuditTarget('plain', stream, 'super-stream')).toThrow(
      /a stream of that name does: audit it without --super-stream/,
    );
  });
});

describe('cli audit - a super stream', () => {
  it('audits every partition in order, one at a time, and sums: clean partitions are ok', async () => {
    const read: string[] = [];
    const seen: string[] = [];
    const report = await auditSuperStream(
      'orders',
      PARTITIONS,
      (p) => {
        read.push(p);
        return readFrom(clean)(p);
      },
      { onPartition: (a) => seen.push(`${a.partition}:${a.report.messages}`) },
    );
    expect(read).toEqual(PARTITIONS);
    expect(seen).toEqual(['orders-0:4', 'orders-1:3', 'orders-2:3']);
    expect(report).toMatchObject({
      superStream: 'orders',
      messages: 10,
      unidentified: { count: 0, missing: 0, malformed: 0 },
      duplicates: 0,
      expectedCopies: 0,
      conflictingCopies: 0,
      missingIds: 0n,
      gaps: 0,
      skippedIds: 0n,
      outOfOrder: 0,
      contradictions: 0,
      failedPartitions: [],
      ok: true,
    });
    // Each partition's report is the one `audit <partition>` would make.
    expect(report.partitions.map((p) => p.partition)).toEqual(PARTITIONS);
    expect(report.partitions[1]!.report).toEqual(auditRecords(clean['orders-1']!));
    expect(report.producerTotals).toEqual([
      {
        producerName: 'audit',
        partitions: 1,
        messages: 1,
        distinctIds: 1,
        duplicates: 0,
        expectedCopies: 0,
        conflictingCopies: 0,
        missingIds: 0n,
        gaps: 0,
        skippedIds: 0n,
        contradictions: 0,
        outOfOrder: 0,
      },
      {
        producerName: 'billing',
        partitions: 3,
        messages: 9,
        distinctIds: 9,
        duplicates: 0,
        expectedCopies: 0,
        conflictingCopies: 0,
        missingIds: 0n,
        gaps: 0,
        skippedIds: 0n,
        contradictions: 0,
        outOfOrder: 0,
      },
    ]);
  });

  it('IDs are per partition: the same ID in two partitions is no duplicate, a gap in one fails the whole', async () => {
    const dirty = {
      ...clean,
      'orders-1': records(...ids('billing', 1, 2, 2), undefined),
      'orders-2': records(...ids('billing', 1, 2, 3, 6)),
    };
    const report = await auditSuperStream('orders', PARTITIONS, readFrom(dirty));
    expect(report).toMatchObject({
      messages: 12,
      unidentified: { count: 1, missing: 1, malformed: 0 },
      duplicates: 1,
      expectedCopies: 0,
      missingIds: 2n,
      gaps: 1,
      failedPartitions: ['orders-1', 'orders-2'],
      ok: false,
    });
    expect(report.producerTotals).toEqual([
      expect.objectContaining({
        producerName: 'billing',
        messages: 11,
        distinctIds: 10,
        duplicates: 1,
        gaps: 1,
      }),
    ]);
  });

  it('declared skips alone keep it ok; empty partitions are clean', async () => {
    const skipped = records(['p', 1]);
    skipped.push({
      offset: 1n,
      applicationProperties: { ...identityHeaders('p', 5n), [SKIP_HEADER]: '2' },
      messageAnnotations: {},
    });
    const report = await auditSuperStream('s', ['s-0', 's-1'], readFrom({ 's-0': skipped }));
    expect(report).toMatchObject({ ok: true, skippedIds: 3n, gaps: 0, messages: 2, failedPartitions: [] });
    expect(summarizeSuperStream('s', [])).toMatchObject({ ok: true, messages: 0, producerTotals: [] });
  });

  it('a range: the messages not judged in each partition are summed and named (--since)', () => {
    // An AMQP 0-9-1 producer's re-send of 2 (marked): a stream-protocol one would be judged.
    const partial = auditRecords(amqpRecords(...ids('p', 3, 2, 4)), { partial: true });
    const report = summarizeSuperStream('s', [
      { partition: 's-0', report: partial },
      { partition: 's-1', report: partial },
    ]);
    expect(report).toMatchObject({ beforeRange: 2, outOfOrder: 0, ok: true });
    expect(formatSuperStreamAuditReport(report, { since: new Date(0) })).toContain(
      "2 messages below its producer's first id in the range of its partition, not judged",
    );
  });

  it('the human report: partitions with a total row, (partition, producer) rows with totals, problems by partition, the failing partitions', async () => {
    const report = await auditSuperStream(
      'orders',
      PARTITIONS,
      readFrom({ ...clean, 'orders-2': records(...ids('billing', 1, 2, 4), undefined) }),
    );
    expect(formatSuperStreamAuditReport(report)).toBe(
      [
        'super stream "orders": 3 partitions, 11 messages, 2 producers, 1 without identity',
        '',
        'partition  messages  producers  without identity  duplicates  missing ids  gaps  skipped ids  out of order  result',
        'orders-0          4          1                 0           0            0     0            0             0  ok',
        'orders-1          3          2                 0           0            0     0            0             0  ok',
        'orders-2          4          1                 1           0            1     1            0             0  FAILED',
        'total            11          2                 1           0            1     1            0             0  FAILED',
        '',
        'partition  producer  messages  first id  last id  duplicates  missing ids  gaps  skipped ids  out of order',
        'orders-0   billing          4         1        4           0            0     0            0             0',
        'orders-1   audit            1         1        1           0            0     0            0             0',
        'orders-1   billing          2         1        2           0            0     0            0             0',
        'orders-2   billing          3         1        4           0            1     1            0             0',
        '(all)      audit            1         -        -           0            0     0            0             0',
        '(all)      billing          9         -        -           0            1     1            0             0',
        '',
        'orders-2: billing: 1 missing id in 1 gap: 3',
        'orders-2: 1 message without identity (1 missing, 0 malformed): offset 3 (no identity headers)',
        '',
        'audit: FAILED in 1 of 3 partitions (orders-2) — 0 duplicates, 1 missing id in 1 gap, 0 out of order',
      ].join('\n'),
    );
    const ok = await auditSuperStream('orders', PARTITIONS, readFrom(clean));
    expect(formatSuperStreamAuditReport(ok).split('\n').at(-1)).toBe(
      'audit: OK in all 3 partitions — no duplicates, no gaps, nothing out of order',
    );
  });

  it('--json: the sums at the top under a stream report’s names, each partition as `audit <partition> --json` prints it', async () => {
    const report = await auditSuperStream(
      'orders',
      PARTITIONS,
      readFrom({ ...clean, 'orders-0': records(...ids('billing', 1, 3)) }),
    );
    const text = formatSuperStreamAuditJson(report);
    expect(text).not.toContain('\n');
    const json = JSON.parse(text) as Record<string, unknown> & { partitions: unknown[] };
    expect(json).toMatchObject({
      superStream: 'orders',
      messages: 8,
      missingIds: '1',
      gaps: 1,
      skippedIds: '0',
      ok: false,
      failedPartitions: ['orders-0'],
      producerTotals: [
        { producerName: 'audit', partitions: 1 },
        { producerName: 'billing', partitions: 3, messages: 7, missingIds: '1' },
      ],
    });
    expect(json.partitions).toEqual(
      report.partitions.map((p) => JSON.parse(formatAuditJson(p.partition, p.report)) as unknown),
    );
  });
});
