import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { auditRecords, type AuditRecord } from '../src/cli/audit.js';
import {
  AMQP091_TRANSPORT,
  identityHeaders,
  readIdentity,
  TRANSPORT_HEADER,
} from '../src/identity/headers.js';

// The seed is set globally by property-tests/setup.ts.

// Issue 36, item 5: the audit of a stream written by AMQP 0-9-1 publishers that crash (their outbox
// re-sends the last k messages, which the broker stores again, marked) and by stream-protocol
// writers that duplicate (unmarked copies). The missing dimension of the unit tests: the copies'
// transport interleaved with the history, and an audit that starts anywhere (--from).
// Review A (F1): a second AMQP 0-9-1 writer under the same name (another pod, or a life on a
// restored store) writes other messages under the same IDs: marked copies that are not re-sends.
// Review A (F2): a range that starts after a message whose unmarked copy it holds.

type Step =
  | { readonly kind: 'send'; readonly producer: number }
  | {
      readonly kind: 'resend';
      readonly producer: number;
      readonly k: number;
      readonly inAnnotations: boolean;
    }
  | { readonly kind: 'rawCopy'; readonly producer: number; readonly back: number }
  | { readonly kind: 'twin'; readonly producer: number; readonly k: number };

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
  {
    weight: 1,
    arbitrary: fc.record({
      kind: fc.constant('twin' as const),
      producer: fc.nat(2),
      k: fc.integer({ min: 1, max: 3 }),
    }),
  },
);

/** What the model says each copy is, counted as the audit should. */
interface Built {
  readonly records: AuditRecord[];
  /** Marked copies of the same message (re-sends). */
  readonly marked: number;
  /** Unmarked copies. */
  readonly unmarked: number;
  /** Marked copies of another message under the same (producer, ID). */
  readonly conflicting: number;
}

/** The stream the steps write, and how many of each kind of copy it holds. */
function build(steps: readonly Step[]): Built {
  const sent = [0, 0, 0];
  const twinSent = [0, 0, 0];
  /** The body of each (producer, ID)'s first copy. */
  const firstBody = new Map<string, string>();
  const records: AuditRecord[] = [];
  let marked = 0;
  let unmarked = 0;
  let conflicting = 0;
  const push = (
    producer: number,
    id: number,
    mark: 'annotations' | 'properties' | undefined,
    body: string,
  ): void => {
    const identity = identityHeaders(`p${producer}`, BigInt(id));
    const stamp = { ...identity, ...(mark === undefined ? {} : { [TRANSPORT_HEADER]: AMQP091_TRANSPORT }) };
    records.push({
      offset: BigInt(records.length),
      // RabbitMQ 4 hands AMQP 0-9-1 x- headers to stream readers as annotations; AMQP readers see headers.
      ...(mark === 'annotations' ? { messageAnnotations: stamp } : { applicationProperties: stamp }),
      body: Buffer.from(body),
    });
    const key = `${producer}:${id}`;
    const first = firstBody.get(key);
    if (first === undefined) firstBody.set(key, body);
    else if (mark === undefined) unmarked++;
    else if (first === body) marked++;
    else conflicting++;
  };
  for (const s of steps) {
    // Producers 0 and 1 publish over AMQP 0-9-1 (marked), producer 2 over the stream protocol.
    const mark = s.producer < 2 ? 'annotations' : undefined;
    const n = sent[s.producer]!;
    if (s.kind === 'send') {
      sent[s.producer] = n + 1;
      push(s.producer, n + 1, mark, `p${s.producer} message ${n + 1}`);
    } else if (s.kind === 'resend' && s.producer < 2) {
      // A crash: the outbox re-sends the last k unconfirmed messages, in order, already stored.
      for (let id = Math.max(1, n - s.k + 1); id <= n; id++) {
        push(s.producer, id, s.inAnnotations ? 'annotations' : 'properties', `p${s.producer} message ${id}`);
      }
    } else if (s.kind === 'rawCopy' && n > 0) {
      // A writer that retries without deduplication: an unmarked copy of an earlier message.
      const id = Math.max(1, n - s.back);
      push(s.producer, id, undefined, `p${s.producer} message ${id}`);
    } else if (s.kind === 'twin') {
      // A second AMQP 0-9-1 writer given the same name: its own IDs from 1, its own messages.
      for (let i = 0; i < s.k; i++) {
        const id = ++twinSent[s.producer]!;
        push(s.producer, id, 'annotations', `twin of p${s.producer}: message ${id}`);
      }
    }
  }
  return { records, marked, unmarked, conflicting };
}

const isMarked = (r: AuditRecord): boolean =>
  r.messageAnnotations?.[TRANSPORT_HEADER] === AMQP091_TRANSPORT ||
  r.applicationProperties?.[TRANSPORT_HEADER] === AMQP091_TRANSPORT;

describe('audit - AMQP 0-9-1 re-send copies against stream-protocol duplicates (model)', () => {
  it('counts marked re-sends as expected, marked copies of another message as conflicting and unmarked ones as duplicates; only the latter two fail it', () => {
    fc.assert(
      fc.property(fc.array(step, { maxLength: 80 }), (steps) => {
        const { records, marked, unmarked, conflicting } = build(steps);
        const report = auditRecords(records);
        expect(report.expectedCopies).toBe(marked);
        expect(report.conflictingCopies).toBe(conflicting);
        expect(report.duplicates).toBe(unmarked);
        expect(report.gaps).toBe(0);
        expect(report.outOfOrder).toBe(0);
        expect(report.ok).toBe(unmarked === 0 && conflicting === 0);
      }),
    );
  });

  it('a range (--from anywhere) of a stream with only re-send copies never fails', () => {
    fc.assert(
      fc.property(fc.array(step, { maxLength: 80 }), fc.nat(), (steps, at) => {
        const { records } = build(steps.filter((s) => s.kind !== 'rawCopy' && s.kind !== 'twin'));
        const from = records.length === 0 ? 0 : at % records.length;
        const report = auditRecords(records.slice(from), { partial: true });
        expect(report.duplicates).toBe(0);
        expect(report.outOfOrder).toBe(0);
        expect(report.gaps).toBe(0);
        expect(report.ok).toBe(true);
      }),
    );
  });

  it('a range (--from anywhere) fails when it holds an unmarked copy below its producer first id in the range or seen in it', () => {
    fc.assert(
      fc.property(fc.array(step, { maxLength: 80 }), fc.nat(), (steps, at) => {
        const { records } = build(steps.filter((s) => s.kind !== 'twin'));
        const from = records.length === 0 ? 0 : at % records.length;
        const range = records.slice(from);
        // The model's own reading: per producer, the first ID in the range and the IDs seen so far.
        const floor = new Map<string, bigint>();
        const seen = new Set<string>();
        let judgedCopy = false;
        for (const r of range) {
          const reading = readIdentity(r.applicationProperties, r.messageAnnotations);
          if (reading.kind !== 'ok') continue;
          const { producerName: name, publishingId: id } = reading.identity;
          if (!floor.has(name)) floor.set(name, id);
          const key = `${name}:${id}`;
          if (!isMarked(r) && (id < floor.get(name)! || seen.has(key))) judgedCopy = true;
          seen.add(key);
        }
        const report = auditRecords(range, { partial: true });
        if (judgedCopy) expect(report.ok).toBe(false);
      }),
    );
  });
});
