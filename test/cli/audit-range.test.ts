import { describe, expect, it } from 'vitest';
import { formatAuditJson, formatAuditReport } from '../../src/cli/audit-format.js';
import { parseAuditRange, RANGE_NOTE } from '../../src/cli/audit-range.js';
import { auditExitCode, auditRecords } from '../../src/cli/audit.js';
import { runningCount } from '../../src/cli/output.js';
import { amqpRecords, ids, records } from '../support/audit-records.js';

describe('cli audit - a range (--from, --since)', () => {
  it('parses --from as a decimal offset and --since as an ISO 8601 time; neither is no range', () => {
    expect(parseAuditRange(undefined, undefined)).toBeUndefined();
    expect(parseAuditRange('0', undefined)).toEqual({ from: 0n });
    expect(parseAuditRange('18446744073709551615', undefined)).toEqual({ from: 0xffff_ffff_ffff_ffffn });
    expect(parseAuditRange(undefined, '2026-12-03T10:00:00Z')).toEqual({
      since: new Date('2026-12-03T10:00:00Z'),
    });
    expect(parseAuditRange(undefined, '2026-12-03')).toEqual({ since: new Date('2026-12-03') });
  });

  it('refuses what is not an offset or an ISO time, and both at once, with what it got', () => {
    for (const bad of ['', '-1', '0x10', ' 7', '1.5', '01', '18446744073709551616', 'first']) {
      expect(parseAuditRange(bad, undefined), bad).toMatch(/^--from expects an offset/);
    }
    for (const bad of ['', 'yesterday', '12/03/2026', '2026-13-45T00:00:00Z', 'Thu Dec 3 2026']) {
      expect(parseAuditRange(undefined, bad), bad).toMatch(/^--since expects an ISO 8601 time/);
    }
    expect(parseAuditRange('5', '2026-12-03')).toBe('--from and --since exclude each other');
  });

  it('the report names the range and says what a range cannot see; --json carries from and since', () => {
    const report = auditRecords(records(...ids('orders', 7, 8, 9)));
    const text = formatAuditReport('s', report, { from: 100n });
    expect(text.split('\n').slice(0, 2)).toEqual([
      'stream "s" from offset 100: 3 messages, 1 producer, 0 without identity',
      RANGE_NOTE,
    ]);
    expect(formatAuditReport('s', report)).not.toContain(RANGE_NOTE);
    expect(JSON.parse(formatAuditJson('s', report, { from: 100n }))).toMatchObject({
      from: '100',
      since: null,
    });
    expect(
      JSON.parse(formatAuditJson('s', report, { since: new Date('2026-12-03T10:00:00Z') })),
    ).toMatchObject({ from: null, since: '2026-12-03T10:00:00.000Z' });
  });
});

describe('cli audit - a range that starts inside a re-send', () => {
  it('an id below the producer first id in the range is not judged: not out of order, not a failure', () => {
    // Stream 1 2 3 | 2 3 (an AMQP 0-9-1 re-send, marked as all its messages) 4 5, read from offset 2: 3 2 3 4 5.
    const range = amqpRecords(...ids('p', 3, 2, 3, 4, 5));
    const partial = auditRecords(range, { partial: true });
    expect(partial).toMatchObject({
      beforeRange: 1,
      outOfOrder: 0,
      duplicates: 0,
      expectedCopies: 1,
      ok: true,
    });
    expect(auditRecords(range)).toMatchObject({ beforeRange: 0, outOfOrder: 1 });
    expect(formatAuditReport('s', partial, { from: 2n })).toContain(
      "1 message below its producer's first id in the range, not judged (its first copy may be before the range)",
    );
  });
});

describe('cli audit - a range judges what the broker would have deduplicated', () => {
  // Over the stream protocol the broker deduplicates by producer name: an unmarked message below an
  // ID its producer already had is a defect either way (a duplicate of one before the range, or out
  // of order), and the whole-stream audit fails it. Only a marked AMQP 0-9-1 re-send may be skipped.
  it('an unmarked (stream-protocol) copy of a message before the range fails the range audit, as the whole audit', () => {
    const before = records(...ids('orders', ...Array.from({ length: 100 }, (_, i) => i + 1)));
    const inRange = records(...ids('orders', 101, 102, 50, 103)).map((r, i) => ({
      ...r,
      offset: 100n + BigInt(i),
    }));
    expect(auditRecords([...before, ...inRange])).toMatchObject({ duplicates: 1, ok: false });
    const range = auditRecords(inRange, { partial: true });
    expect(range).toMatchObject({ beforeRange: 0, outOfOrder: 1, ok: false });
    expect(auditExitCode(range)).toBe(1);
    // The same message marked (an AMQP 0-9-1 re-send) is not judged.
    const marked = amqpRecords(...ids('orders', 101, 102, 50, 103));
    expect(auditRecords(marked, { partial: true })).toMatchObject({
      beforeRange: 1,
      outOfOrder: 0,
      ok: true,
    });
  });
});

describe('cli - runningCount', () => {
  it('writes the first count at once, then at most one line per interval', () => {
    const lines: string[] = [];
    let t = 0;
    const report = runningCount(
      (l) => lines.push(l),
      (n) => `${n} read`,
      1_000,
      () => t,
    );
    for (let n = 1; n <= 5_000; n++) {
      t = n; // one message per millisecond: 5 s
      report(n);
    }
    expect(lines).toEqual(['1 read', '1001 read', '2001 read', '3001 read', '4001 read']);
  });
});
