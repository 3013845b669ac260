/**
 * REV-A (hostile review) — FAILING ON PURPOSE until fixed. See /work/wt/notes2/rev-a.md.
 *
 * audit counts a copy of (producer, id) as an "expected AMQP 0-9-1 copy" — never a failure — on the
 * copy's own `x-dedup-transport: amqp091` mark alone, without checking that it is a copy of the
 * same message. Two AMQP 0-9-1 publishers given the same producer name (two pods of one
 * deployment; AMQP 0-9-1 has no broker-side name check, no last-ID query) or one AMQP 0-9-1
 * publisher whose store was restored from a backup (it hands out IDs the stream already holds:
 * nothing tells it, the broker reports no last ID) write *different* messages under the same IDs.
 * A verifying consumer drops the second of each pair: messages lost. Before cli36 the audit
 * FAILED such a stream with duplicates; now it says OK.
 */
import { describe, expect, it } from 'vitest';
import { auditExitCode, auditRecords, type AuditRecord } from '../../src/cli/audit.js';
import { AMQP091_TRANSPORT, identityHeaders, TRANSPORT_HEADER } from '../../src/identity/headers.js';

/** A record as read over the stream protocol from an AMQP 0-9-1 publisher, with its body. */
function amqp(pod: string, id: number, offset: number): AuditRecord & { body: Buffer } {
  return {
    offset: BigInt(offset),
    applicationProperties: {},
    messageAnnotations: { ...identityHeaders('orders', BigInt(id)), [TRANSPORT_HEADER]: AMQP091_TRANSPORT },
    body: Buffer.from(`${pod}: order ${id}`),
  };
}

describe('rev-a: audit expected AMQP 0-9-1 copies', () => {
  it('two AMQP 0-9-1 publishers with one producer name (different messages, same IDs) fail the audit', () => {
    // Pod A and pod B, both named 'orders', interleaved on the stream.
    const stream = [
      amqp('A', 1, 0),
      amqp('B', 1, 1),
      amqp('A', 2, 2),
      amqp('B', 2, 3),
      amqp('A', 3, 4),
      amqp('B', 3, 5),
    ];
    const report = auditRecords(stream);
    // Half the messages are lost to any verifying consumer: this must not be "OK".
    expect(report.ok).toBe(false);
    expect(auditExitCode(report)).toBe(1);
  });

  it('an AMQP 0-9-1 publisher re-using IDs after its store was restored from a backup fails the audit', () => {
    // Life 1 published 1..4; the store is restored to a copy taken after 2; life 2 hands out 3, 4, 5
    // for new, different messages.
    const stream = [
      amqp('life1', 1, 0),
      amqp('life1', 2, 1),
      amqp('life1', 3, 2),
      amqp('life1', 4, 3),
      amqp('life2', 3, 4),
      amqp('life2', 4, 5),
      amqp('life2', 5, 6),
    ];
    const report = auditRecords(stream);
    expect(report.ok).toBe(false);
  });

  it('a stream-protocol publisher and an AMQP 0-9-1 publisher given one producer name (different messages) fail the audit', () => {
    // The stream publisher's IDs are deduplicated by the broker; the AMQP 0-9-1 one's are not, and
    // it does not advance the name's last ID either: both write 1, 2, 3.
    const stream = (id: number, offset: number): AuditRecord & { body: Buffer } => ({
      offset: BigInt(offset),
      applicationProperties: identityHeaders('orders', BigInt(id)),
      body: Buffer.from(`stream: order ${id}`),
    });
    const report = auditRecords([stream(1, 0), stream(2, 1), stream(3, 2), amqp('amqp', 1, 3), amqp('amqp', 2, 4), amqp('amqp', 3, 5)]);
    expect(report.ok).toBe(false);
  });
});
