import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { auditRecords, type AuditRecord } from '../src/cli/audit.js';
import { AMQP091_TRANSPORT, identityHeaders, TRANSPORT_HEADER } from '../src/identity/headers.js';

// The seed is set globally by property-tests/setup.ts.

// Issue 36, item 5: the audit of a stream written by AMQP 0-9-1 publishers that crash (their outbox
// re-sends the last k messages, which the broker stores again, marked) and by stream-protocol
// writers that duplicate (unmarked copies). The missing dimension of the unit tests: the copies'
// transport interleaved with the history, and an audit that starts anywhere (--from).

type Step =
  | { readonly kind: 'send'; readonly producer: number }
  | {
      readonly kind: 'resend';
      readonly producer: number;
      readonly k: number;
      readonly inAnnotations: boolean;
    }
  | { readonly kind: 'rawCopy'; readonly producer: number; readonly back: number };

const step: fc.Arbitrary<Step> = fc.oneof(
  { weight: 6, arbitrary: fc.record({ kind: fc.constant('send' as const), producer: fc.nat(2) }) },
  {
    weight: 2,
    arbitrary: fc.record({
      kind: fc.constant('resend' as const),
      producer: fc.nat(2),
      k: fc.integer({ min: 1, max: 8 }),
      inAnnotations: fc.boolean(),
    }),
  },
  {
    weight: 1,
    arbitrary: fc.record({ kind: fc.constant('rawCopy' as const), producer: fc.nat(2), back: fc.nat(8) }),
  },
);

/** The stream the steps write, and how many marked and unmarked copies it holds. */
function build(steps: readonly Step[]): { records: AuditRecord[]; marked: number; unmarked: number } {
  const sent = [0, 0, 0];
  const records: AuditRecord[] = [];
  let marked = 0;
  let unmarked = 0;
  const push = (producer: number, id: number, mark: 'annotations' | 'properties' | undefined): void => {
    const identity = identityHeaders(`p${producer}`, BigInt(id));
    const stamp = { ...identity, ...(mark === undefined ? {} : { [TRANSPORT_HEADER]: AMQP091_TRANSPORT }) };
    records.push({
      offset: BigInt(records.length),
      // RabbitMQ 4 hands AMQP 0-9-1 x- headers to stream readers as annotations; AMQP readers see headers.
      ...(mark === 'annotations' ? { messageAnnotations: stamp } : { applicationProperties: stamp }),
    });
  };
  for (const s of steps) {
    // Producers 0 and 1 publish over AMQP 0-9-1 (marked), producer 2 over the stream protocol.
    const mark = s.producer < 2 ? 'annotations' : undefined;
    const n = sent[s.producer]!;
    if (s.kind === 'send') {
      sent[s.producer] = n + 1;
      push(s.producer, n + 1, mark);
    } else if (s.kind === 'resend' && s.producer < 2) {
      // A crash: the outbox re-sends the last k unconfirmed messages, in order, already stored.
      for (let id = Math.max(1, n - s.k + 1); id <= n; id++) {
        push(s.producer, id, s.inAnnotations ? 'annotations' : 'properties');
        marked++;
      }
    } else if (s.kind === 'rawCopy' && n > 0) {
      // A writer that retries without deduplication: an unmarked copy of an earlier message.
      push(s.producer, Math.max(1, n - s.back), undefined);
      unmarked++;
    }
  }
  return { records, marked, unmarked };
}

describe('audit - AMQP 0-9-1 re-send copies against stream-protocol duplicates (model)', () => {
  it('counts marked copies as expected and unmarked ones as duplicates; only the latter fail it', () => {
    fc.assert(
      fc.property(fc.array(step, { maxLength: 80 }), (steps) => {
        const { records, marked, unmarked } = build(steps);
        const report = auditRecords(records);
        expect(report.expectedCopies).toBe(marked);
        expect(report.duplicates).toBe(unmarked);
        expect(report.gaps).toBe(0);
        expect(report.outOfOrder).toBe(0);
        expect(report.ok).toBe(unmarked === 0);
      }),
    );
  });

  it('a range (--from anywhere) of a stream with only re-send copies never fails', () => {
    fc.assert(
      fc.property(fc.array(step, { maxLength: 80 }), fc.nat(), (steps, at) => {
        const { records } = build(steps.filter((s) => s.kind !== 'rawCopy'));
        const from = records.length === 0 ? 0 : at % records.length;
        const report = auditRecords(records.slice(from), { partial: true });
        expect(report.duplicates).toBe(0);
        expect(report.outOfOrder).toBe(0);
        expect(report.gaps).toBe(0);
        expect(report.ok).toBe(true);
      }),
    );
  });
});
