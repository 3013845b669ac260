/**
 * REV-A (hostile review) — FAILING ON PURPOSE until fixed. See /work/wt/notes2/rev-a.md.
 *
 * `audit --from/--since` (auditRecords with `partial`) does not judge any message whose ID is below
 * its producer's first ID in the range — marked or not. Only an AMQP 0-9-1 publisher's message
 * (marked `x-dedup-transport: amqp091`) can legitimately be there: a re-send of a message before
 * the range. Over the stream protocol the broker deduplicates by producer name, so an unmarked
 * message below an ID its producer already had in the stream is a defect either way (a duplicate
 * of a message before the range, or one out of order) — and the same audit without the range
 * FAILS it. With the range it says OK.
 */
import { describe, expect, it } from 'vitest';
import { auditExitCode, auditRecords, type AuditRecord } from '../../src/cli/audit.js';
import { identityHeaders } from '../../src/identity/headers.js';

const stream = (id: number, offset: number): AuditRecord => ({
  offset: BigInt(offset),
  applicationProperties: identityHeaders('orders', BigInt(id)),
});

describe('rev-a: audit of a range', () => {
  it('a stream-protocol (unmarked) copy of a message before the range fails the range audit, as it fails the whole-stream audit', () => {
    const before = Array.from({ length: 100 }, (_, i) => stream(i + 1, i));
    // The range starts at offset 100: 101, 102, then a stream-protocol copy of 50, then 103.
    const inRange = [stream(101, 100), stream(102, 101), stream(50, 102), stream(103, 103)];
    const whole = auditRecords([...before, ...inRange]);
    expect(whole.ok).toBe(false); // passes: 1 duplicate
    const range = auditRecords(inRange, { partial: true });
    expect(range.ok).toBe(false); // fails: ok, beforeRange 1
    expect(auditExitCode(range)).toBe(1);
  });
});
