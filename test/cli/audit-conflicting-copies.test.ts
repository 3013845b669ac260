/**
 * A copy marked `x-dedup-transport: amqp091` is an expected AMQP 0-9-1 re-send only when it is the
 * same message as the first copy of its (producer, ID): same body, same caller headers. Two AMQP
 * 0-9-1 publishers given one producer name (two pods of a deployment; AMQP 0-9-1 has no broker-side
 * name check), or one whose store was restored from a backup, write different messages under the
 * same IDs: a verifying consumer drops the second of each pair, so the audit must fail.
 */
import { describe, expect, it } from 'vitest';
import { formatAuditReport } from '../../src/cli/audit-format.js';
import { auditExitCode, auditRecords, type AuditRecord } from '../../src/cli/audit.js';
import { AMQP091_TRANSPORT, identityHeaders, TRANSPORT_HEADER } from '../../src/identity/headers.js';

/** A record as read over the stream protocol from an AMQP 0-9-1 publisher, with its body. */
function amqp(
  writer: string,
  id: number,
  offset: number,
  extra: { headers?: Record<string, unknown>; annotations?: Record<string, unknown> } = {},
): AuditRecord {
  return {
    offset: BigInt(offset),
    applicationProperties: { ...extra.headers },
    messageAnnotations: {
      ...identityHeaders('orders', BigInt(id)),
      [TRANSPORT_HEADER]: AMQP091_TRANSPORT,
      ...extra.annotations,
    },
    body: Buffer.from(`${writer}: order ${id}`),
  };
}

/** A record of a stream-protocol publisher: stamps and caller headers in application properties. */
function stream(
  writer: string,
  id: number,
  offset: number,
  headers: Record<string, unknown> = {},
): AuditRecord {
  return {
    offset: BigInt(offset),
    applicationProperties: { ...identityHeaders('orders', BigInt(id)), ...headers },
    body: Buffer.from(`${writer}: order ${id}`),
  };
}

describe('cli audit - marked copies of another message (conflicting copies)', () => {
  it('two AMQP 0-9-1 publishers with one producer name (different messages, same IDs) fail the audit', () => {
    const report = auditRecords([
      amqp('A', 1, 0),
      amqp('B', 1, 1),
      amqp('A', 2, 2),
      amqp('B', 2, 3),
      amqp('A', 3, 4),
      amqp('B', 3, 5),
    ]);
    expect(report).toMatchObject({ conflictingCopies: 3, expectedCopies: 0, duplicates: 0, ok: false });
    expect(report.producers[0]!.conflictingCopySamples).toEqual([
      { publishingId: 1n, offset: 1n, firstOffset: 0n },
      { publishingId: 2n, offset: 3n, firstOffset: 2n },
      { publishingId: 3n, offset: 5n, firstOffset: 4n },
    ]);
    expect(auditExitCode(report)).toBe(1);
    const text = formatAuditReport('s', report);
    expect(text).toContain('orders: 3 conflicting copies (marked AMQP 0-9-1 but another body or headers');
    expect(text.split('\n').at(-1)).toBe(
      'audit: FAILED — 0 duplicates, 0 missing ids in 0 gaps, 0 out of order, 3 conflicting copies',
    );
  });

  it('an AMQP 0-9-1 publisher re-using IDs after its store was restored from a backup fails the audit', () => {
    // Life 1 published 1..4; the store is restored to a copy taken after 2; life 2 hands out 3, 4, 5
    // for new, different messages.
    const report = auditRecords([
      amqp('life1', 1, 0),
      amqp('life1', 2, 1),
      amqp('life1', 3, 2),
      amqp('life1', 4, 3),
      amqp('life2', 3, 4),
      amqp('life2', 4, 5),
      amqp('life2', 5, 6),
    ]);
    expect(report).toMatchObject({ conflictingCopies: 2, expectedCopies: 0, gaps: 0, ok: false });
  });

  it('a stream-protocol publisher and an AMQP 0-9-1 publisher given one producer name (different messages) fail the audit', () => {
    // The stream publisher's IDs are deduplicated by the broker; the AMQP 0-9-1 one's are not, and
    // it does not advance the name's last ID either: both write 1, 2, 3.
    const report = auditRecords([
      stream('stream', 1, 0),
      stream('stream', 2, 1),
      stream('stream', 3, 2),
      amqp('amqp', 1, 3),
      amqp('amqp', 2, 4),
      amqp('amqp', 3, 5),
    ]);
    expect(report).toMatchObject({ conflictingCopies: 3, ok: false });
  });

  it('a different caller header alone (same body) conflicts; the same message is an expected copy', () => {
    const a = amqp('A', 1, 0, { headers: { tenant: 'a' } });
    const report = auditRecords([
      a,
      { ...a, offset: 1n },
      { ...amqp('A', 1, 2, { headers: { tenant: 'b' } }) },
      { ...amqp('A', 1, 3, { headers: { tenant: 'a' }, annotations: { 'x-tag': 1 } }) },
    ]);
    expect(report).toMatchObject({ expectedCopies: 1, conflictingCopies: 2, ok: false });
  });

  it('a re-send matches its first copy whatever the transport added: routing annotations, header section, integer type', () => {
    // Life 1 over the stream protocol (caller headers, x- ones too, in application properties, a
    // number); life 2 over AMQP 0-9-1 re-sends its outbox: RabbitMQ 4 puts the x- headers and its
    // own x-exchange / x-routing-key / x-basic-* in the annotations, and reads the integer back as a long.
    const first = stream('one', 7, 0, { tenant: 'a', 'x-trace': 'abc', count: 2 ** 40 });
    const resend = amqp('one', 7, 1, {
      headers: { tenant: 'a', count: 2n ** 40n },
      annotations: { 'x-trace': 'abc', 'x-exchange': '', 'x-routing-key': 'orders', 'x-basic-type': 't' },
    });
    // Another AMQP 0-9-1 re-send of it through a named exchange.
    const again = {
      ...resend,
      offset: 2n,
      messageAnnotations: { ...resend.messageAnnotations, 'x-exchange': 'ex' },
    };
    expect(auditRecords([first, resend, again])).toMatchObject({
      expectedCopies: 2,
      conflictingCopies: 0,
      ok: true,
    });
  });

  it('an unmarked copy stays a duplicate whatever its body (the broker should have dropped it)', () => {
    const report = auditRecords([stream('one', 1, 0), stream('other', 1, 1), stream('one', 1, 2)]);
    expect(report).toMatchObject({ duplicates: 2, conflictingCopies: 0, ok: false });
  });
});
