import { describe, expect, it } from 'vitest';
import {
  auditExitCode,
  auditRecords,
  formatAuditJson,
  formatAuditReport,
  type AuditRecord,
} from '../../src/cli/audit.js';
import { AMQP091_TRANSPORT, identityHeaders, TRANSPORT_HEADER } from '../../src/identity/headers.js';
import { decodeAmqp10Message } from '../../src/transport/amqp10-decode.js';
import { ids, records } from '../support/audit-records.js';
import { amqpMap, amqpString, section } from '../support/chunks.js';

describe('cli audit - analysis', () => {
  it('a clean producer: every id once, in order, no gaps: ok and exit code 0', () => {
    const report = auditRecords(records(...ids('orders', 1, 2, 3, 4, 5)));
    expect(report.ok).toBe(true);
    expect(auditExitCode(report)).toBe(0);
    expect(report.messages).toBe(5);
    expect(report.producers).toEqual([
      {
        producerName: 'orders',
        messages: 5,
        distinctIds: 5,
        firstId: 1n,
        lastId: 5n,
        firstOffset: 0n,
        lastOffset: 4n,
        duplicates: 0,
        duplicateSamples: [],
        expectedCopies: 0,
        expectedCopySamples: [],
        conflictingCopies: 0,
        conflictingCopySamples: [],
        missingIds: 0n,
        gaps: 0,
        gapRanges: [],
        skippedIds: 0n,
        skippedRanges: [],
        contradictions: 0,
        contradictionSamples: [],
        outOfOrder: 0,
        outOfOrderSamples: [],
      },
    ]);
    expect(report.unidentified).toEqual({ count: 0, missing: 0, malformed: 0, samples: [] });
  });

  it('counts every extra copy of an id as a duplicate, with the offsets of the copy and of the first', () => {
    const report = auditRecords(records(...ids('orders', 1, 2, 3, 2, 3, 3)));
    const [p] = report.producers;
    expect(p).toMatchObject({ messages: 6, distinctIds: 3, duplicates: 3, outOfOrder: 0, gaps: 0 });
    expect(p!.duplicateSamples).toEqual([
      { publishingId: 2n, offset: 3n, firstOffset: 1n },
      { publishingId: 3n, offset: 4n, firstOffset: 2n },
      { publishingId: 3n, offset: 5n, firstOffset: 2n },
    ]);
    expect(report.duplicates).toBe(3);
    expect(report.ok).toBe(false);
    expect(auditExitCode(report)).toBe(1);
  });

  it('counts copies marked x-dedup-transport: amqp091 apart as expected copies: they do not fail the audit', () => {
    // An AMQP 0-9-1 publisher SIGKILLed after 2 and 3 were stored but not confirmed re-sends them.
    const amqp = (id: number, offset: number): AuditRecord => ({
      offset: BigInt(offset),
      applicationProperties: {},
      messageAnnotations: { ...identityHeaders('orders', BigInt(id)), [TRANSPORT_HEADER]: AMQP091_TRANSPORT },
    });
    const report = auditRecords([amqp(1, 0), amqp(2, 1), amqp(3, 2), amqp(2, 3), amqp(3, 4), amqp(4, 5)]);
    expect(report.producers[0]).toMatchObject({
      messages: 6,
      distinctIds: 4,
      duplicates: 0,
      expectedCopies: 2,
    });
    expect(report.producers[0]!.expectedCopySamples).toEqual([
      { publishingId: 2n, offset: 3n, firstOffset: 1n },
      { publishingId: 3n, offset: 4n, firstOffset: 2n },
    ]);
    expect(report).toMatchObject({ duplicates: 0, expectedCopies: 2, ok: true });
    expect(auditExitCode(report)).toBe(0);
    const text = formatAuditReport('s', report);
    expect(text).toContain('orders: 2 expected copies (AMQP 0-9-1 re-sends');
    expect(text).toContain(
      'audit: OK — no duplicates, no gaps, nothing out of order (2 expected AMQP 0-9-1 copies)',
    );
  });

  it('a copy without the mark is a duplicate even when the first copy had it (the copy decides)', () => {
    const first: AuditRecord = {
      offset: 0n,
      messageAnnotations: { ...identityHeaders('orders', 1n), [TRANSPORT_HEADER]: AMQP091_TRANSPORT },
    };
    const streamCopy: AuditRecord = { offset: 1n, applicationProperties: identityHeaders('orders', 1n) };
    const wrongValue: AuditRecord = {
      offset: 2n,
      applicationProperties: { ...identityHeaders('orders', 1n), [TRANSPORT_HEADER]: 'stream' },
    };
    const report = auditRecords([first, streamCopy, wrongValue]);
    expect(report).toMatchObject({ duplicates: 2, expectedCopies: 0, ok: false });
    expect(auditExitCode(report)).toBe(1);
  });

  it('reports gaps between the first and the last id as ranges, with the number of missing ids', () => {
    const report = auditRecords(records(...ids('orders', 3, 4, 7, 8, 12, 13)));
    const [p] = report.producers;
    expect(p).toMatchObject({ firstId: 3n, lastId: 13n, missingIds: 5n, gaps: 2 });
    expect(p!.gapRanges).toEqual([
      { from: 5n, to: 6n },
      { from: 9n, to: 11n },
    ]);
    // IDs below the first one seen are not a gap: a stream may start mid-way (retention).
    expect(report.missingIds).toBe(5n);
    expect(auditExitCode(report)).toBe(1);
  });

  it('keeps only the first maxSamples ranges but counts every gap', () => {
    const odd = Array.from({ length: 50 }, (_, i) => 2 * i + 1); // 1, 3, 5, …, 99
    const report = auditRecords(records(...ids('p', ...odd)), { maxSamples: 3 });
    const [p] = report.producers;
    expect(p).toMatchObject({ gaps: 49, missingIds: 49n });
    expect(p!.gapRanges).toEqual([
      { from: 2n, to: 2n },
      { from: 4n, to: 4n },
      { from: 6n, to: 6n },
    ]);
    expect(formatAuditReport('s', report)).toContain('p: 49 missing ids in 49 gaps: 2, 4, 6, … 46 more');
  });

  it('counts a new id below the previous highest as out of order; a repeat counts as a duplicate only', () => {
    const report = auditRecords(records(...ids('orders', 1, 3, 2, 4, 6, 5, 3)));
    const [p] = report.producers;
    expect(p).toMatchObject({
      outOfOrder: 2,
      duplicates: 1,
      gaps: 0,
      missingIds: 0n,
      firstId: 1n,
      lastId: 6n,
    });
    expect(p!.outOfOrderSamples).toEqual([
      { publishingId: 2n, offset: 2n, previousMaxId: 3n },
      { publishingId: 5n, offset: 5n, previousMaxId: 6n },
    ]);
    expect(p!.duplicateSamples).toEqual([{ publishingId: 3n, offset: 6n, firstOffset: 1n }]);
  });

  it('out of order alone fails the audit (exit code 1)', () => {
    const report = auditRecords(records(...ids('orders', 2, 1, 3)));
    expect(report).toMatchObject({ duplicates: 0, gaps: 0, outOfOrder: 1, ok: false });
    expect(auditExitCode(report)).toBe(1);
  });

  it('finds gaps in ID order when messages arrived out of order', () => {
    const report = auditRecords(records(...ids('orders', 9, 1, 5, 3)));
    const [p] = report.producers;
    expect(p).toMatchObject({ firstId: 1n, lastId: 9n, missingIds: 5n, gaps: 3, outOfOrder: 3 });
    expect(p!.gapRanges).toEqual([
      { from: 2n, to: 2n },
      { from: 4n, to: 4n },
      { from: 6n, to: 8n },
    ]);
  });

  it('reports messages without identity, missing or malformed, without failing the audit', () => {
    const input: AuditRecord[] = [
      ...records(...ids('orders', 1, 2)),
      { offset: 2n, applicationProperties: { unrelated: 'x' } },
      { offset: 3n, applicationProperties: { 'x-dedup-producer': 'orders' } },
      { offset: 4n, applicationProperties: { 'x-dedup-producer': 'orders', 'x-dedup-id': '0' } },
      { offset: 5n },
    ];
    const report = auditRecords(input);
    expect(report.ok).toBe(true);
    expect(auditExitCode(report)).toBe(0);
    expect(report.messages).toBe(6);
    expect(report.producers[0]).toMatchObject({ producerName: 'orders', messages: 2 });
    expect(report.unidentified).toMatchObject({ count: 4, missing: 2, malformed: 2 });
    expect(report.unidentified.samples.map((s) => s.offset)).toEqual([2n, 3n, 4n, 5n]);
    expect(report.unidentified.samples[0]!.reason).toBe('no identity headers');
    expect(report.unidentified.samples[1]!.reason).toMatch(/x-dedup-id/);
  });

  it('names that are not UTF-8 or hold a lone surrogate are malformed, never one producer with a duplicate (issue 32)', () => {
    const named = (offset: bigint, name: Buffer): AuditRecord => ({
      ...decodeAmqp10Message(
        section(
          0x74,
          amqpMap([amqpString('x-dedup-producer'), name, amqpString('x-dedup-id'), amqpString('1')]),
        ),
      ),
      offset,
    });
    const report = auditRecords([
      named(0n, Buffer.from([0xa1, 4, 0x63, 0x61, 0x66, 0xe9])), // Latin-1 caf\xE9
      named(1n, Buffer.from([0xa1, 4, 0x63, 0x61, 0x66, 0xe8])), // Latin-1 caf\xE8
      named(2n, Buffer.from([0x73, 0, 0, 0xd8, 0])), // char U+D800
      { offset: 3n, applicationProperties: identityHeaders('caf\uFFFD', 1n) }, // amqplib's longstr of either
    ]);
    expect(report.producers).toEqual([]);
    expect(report.unidentified).toMatchObject({ count: 4, missing: 0, malformed: 4 });
    expect(report.ok).toBe(true);
    expect(auditExitCode(report)).toBe(0);
  });

  it('reads the identity from message annotations too (an AMQP 0-9-1 publisher into a stream)', () => {
    const report = auditRecords([
      { offset: 0n, applicationProperties: {}, messageAnnotations: identityHeaders('amqp-svc', 1n) },
      { offset: 1n, applicationProperties: {}, messageAnnotations: identityHeaders('amqp-svc', 2n) },
    ]);
    expect(report.producers).toMatchObject([{ producerName: 'amqp-svc', messages: 2, lastId: 2n }]);
    expect(report.unidentified.count).toBe(0);
  });

  it('keeps producers apart (the same id under two names is no duplicate), sorted by name, with totals', () => {
    const report = auditRecords(
      records(
        ['b-svc', 1],
        ['a-svc', 1],
        ['b-svc', 2],
        ['a-svc', 3],
        ['b-svc', 2],
        ['c-svc', 10],
        ['c-svc', 9],
        undefined,
      ),
    );
    expect(report.producers.map((p) => p.producerName)).toEqual(['a-svc', 'b-svc', 'c-svc']);
    expect(report.producers.map((p) => [p.messages, p.duplicates, p.gaps, p.outOfOrder])).toEqual([
      [2, 0, 1, 0],
      [3, 1, 0, 0],
      [2, 0, 0, 1],
    ]);
    expect(report.producers[0]!.gapRanges).toEqual([{ from: 2n, to: 2n }]);
    expect(report).toMatchObject({ messages: 8, duplicates: 1, gaps: 1, missingIds: 1n, outOfOrder: 1 });
    expect(report.unidentified.count).toBe(1);
  });

  it('an empty stream is clean', () => {
    const report = auditRecords([]);
    expect(report).toMatchObject({ messages: 0, producers: [], ok: true });
    expect(formatAuditReport('empty', report)).toBe(
      'stream "empty": 0 messages, 0 producers, 0 without identity\n\n' +
        'audit: OK — no duplicates, no gaps, nothing out of order',
    );
  });

  it('a hole that the producer declared skipped (x-dedup-skip-from) is reported apart and does not fail the audit', () => {
    // IDs 1-3, a restart in reserve durability skipped 4..11: message 12 declares it.
    const report = auditRecords([
      ...records(...ids('p', 1, 2, 3)),
      { offset: 3n, applicationProperties: { ...identityHeaders('p', 12n), 'x-dedup-skip-from': '4' } },
      { offset: 4n, applicationProperties: identityHeaders('p', 13n) },
    ]);
    expect(report.ok).toBe(true);
    expect(auditExitCode(report)).toBe(0);
    expect(report.producers[0]).toMatchObject({
      gaps: 0,
      missingIds: 0n,
      skippedIds: 8n,
      skippedRanges: [{ from: 4n, to: 11n }],
    });
    expect(formatAuditReport('s', report)).toContain(
      'p: 8 skipped ids, declared by the producer (not lost): 4..11',
    );
    expect(formatAuditReport('s', report)).toContain(
      'audit: OK — no duplicates, no gaps, nothing out of order (8 declared skipped ids)',
    );
  });

  it('a hole no skip declares is still a gap, beside a declared one; a message inside a declared skip contradicts it', () => {
    const report = auditRecords([
      ...records(...ids('p', 1, 3)), // 2 is missing: nothing declares it
      { offset: 2n, applicationProperties: { ...identityHeaders('p', 10n), 'x-dedup-skip-from': '4' } },
      { offset: 3n, applicationProperties: identityHeaders('p', 6n) }, // inside 4..9, after the declaration
    ]);
    expect(report.ok).toBe(false);
    expect(report.producers[0]!.gaps).toBe(1);
    expect(report.producers[0]!.gapRanges).toEqual([{ from: 2n, to: 2n }]);
    expect(report.producers[0]!.skippedRanges).toEqual([
      { from: 4n, to: 5n },
      { from: 7n, to: 9n },
    ]);
    expect(report.producers[0]).toMatchObject({
      contradictions: 1,
      contradictionSamples: [
        { publishingId: 6n, offset: 3n, declared: { from: 4n, to: 9n }, declaredAt: 2n },
      ],
    });
    expect(auditExitCode(report)).toBe(1);
  });

  it('a malformed skip declaration makes the message unidentified, never a crash', () => {
    const report = auditRecords(
      ['5', '0', 'x', '', 5 as unknown as string].map((skip, i) => ({
        offset: BigInt(i),
        applicationProperties: { ...identityHeaders('p', 5n), 'x-dedup-skip-from': skip },
      })),
    );
    expect(report.unidentified).toMatchObject({ count: 5, malformed: 5 });
    expect(report.producers).toEqual([]);
  });

  it('refuses a maxSamples that is not a non-negative integer', () => {
    expect(() => auditRecords([], { maxSamples: -1 })).toThrow(RangeError);
    expect(() => auditRecords([], { maxSamples: 1.5 })).toThrow(RangeError);
  });
});

describe('cli audit - output', () => {
  const dirty = auditRecords(
    records(...ids('orders-svc', 1, 2, 2, 4, 5), ...ids('billing', 1, 2, 3), undefined),
  );

  it('the human report: a summary, a table per producer, the problems with offsets, and the verdict', () => {
    expect(formatAuditReport('orders', dirty)).toBe(
      [
        'stream "orders": 9 messages, 2 producers, 1 without identity',
        '',
        'producer    messages  first id  last id  duplicates  amqp copies  missing ids  gaps  skipped ids  out of order',
        'billing            3         1        3           0            0            0     0            0             0',
        'orders-svc         5         1        5           1            0            1     1            0             0',
        '',
        'orders-svc: 1 duplicate: id 2 at offset 2 (first at 1)',
        'orders-svc: 1 missing id in 1 gap: 3',
        '1 message without identity (1 missing, 0 malformed): offset 8 (no identity headers)',
        '',
        'audit: FAILED — 1 duplicate, 1 missing id in 1 gap, 0 out of order',
      ].join('\n'),
    );
  });

  it('the human report names out-of-order messages; a name with control characters is malformed, as the publisher refuses it', () => {
    const text = formatAuditReport('s', auditRecords(records(['a b', 2], ['a b', 1])));
    expect(text).toMatch(/^a b +2 +1 +2 +0 +0 +0 +0 +0 +1$/m);
    expect(text).toContain('a b: 1 out of order: id 1 at offset 1 after 2');
    const control = auditRecords(records(['a\nb', 2], ['a\nb', 1]));
    expect(control.producers).toEqual([]);
    expect(control.unidentified).toMatchObject({ count: 2, malformed: 2 });
    expect(control.unidentified.samples[0]!.reason).toMatch(/control characters/);
  });

  it('--json: one object, 64-bit integers as decimal strings', () => {
    const big = auditRecords(records(['p', 1], ['p', 2]));
    const json = JSON.parse(formatAuditJson('orders', dirty)) as Record<string, unknown>;
    expect(json).toMatchObject({
      stream: 'orders',
      messages: 9,
      duplicates: 1,
      missingIds: '1',
      gaps: 1,
      outOfOrder: 0,
      ok: false,
      unidentified: {
        count: 1,
        missing: 1,
        malformed: 0,
        samples: [{ offset: '8', reason: 'no identity headers' }],
      },
    });
    expect((json.producers as unknown[])[1]).toEqual({
      producerName: 'orders-svc',
      messages: 5,
      distinctIds: 4,
      firstId: '1',
      lastId: '5',
      firstOffset: '0',
      lastOffset: '4',
      duplicates: 1,
      duplicateSamples: [{ publishingId: '2', offset: '2', firstOffset: '1' }],
      expectedCopies: 0,
      expectedCopySamples: [],
      conflictingCopies: 0,
      conflictingCopySamples: [],
      missingIds: '1',
      gaps: 1,
      gapRanges: [{ from: '3', to: '3' }],
      skippedIds: '0',
      skippedRanges: [],
      contradictions: 0,
      contradictionSamples: [],
      outOfOrder: 0,
      outOfOrderSamples: [],
    });
    expect(formatAuditJson('x', big)).not.toContain('\n');
    const max = auditRecords([
      { offset: 0n, applicationProperties: identityHeaders('p', 0xffff_ffff_ffff_ffffn) },
    ]);
    expect(formatAuditJson('x', max)).toContain('"lastId":"18446744073709551615"');
  });
});
