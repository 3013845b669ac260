import { describe, expect, it } from 'vitest';
import { reconcile, type ReconcileInput } from '../../src/publisher/reconcile.js';
import type { ProducerMeta } from '../../src/store/codec.js';

// reconcile() is the open-time decision as a pure function (docs/design.md §4.3): one row per case.

const meta = (m: Partial<ProducerMeta> & { lastId: bigint }): ProducerMeta => ({
  idMode: 'auto',
  reservedUpTo: 0n,
  ...m,
});

const base: ReconcileInput = {
  producerName: 'p',
  target: 'orders',
  idMode: 'auto',
  durability: 'outbox',
  onBrokerAhead: 'error',
  meta: undefined,
  outboxSize: 0,
  outboxLast: 0n,
  brokerLast: 0n,
};

type Row = [
  what: string,
  input: Partial<ReconcileInput>,
  expected:
    | {
        kind: 'resume' | 'adopt';
        start: bigint;
        skipFrom?: bigint;
        localLast?: bigint;
        forgetKeysAbove?: bigint;
      }
    | { refuses: string },
];

const rows: Row[] = [
  ['a new store and a new name start at 0', {}, { kind: 'resume', start: 0n }],
  ['a new store, the broker has nothing: same', { brokerLast: undefined }, { kind: 'resume', start: 0n }],
  [
    'an outbox store resumes after its last ID; its outbox goes out first',
    { meta: meta({ lastId: 7n, outboxHigh: 7n }), outboxSize: 2, outboxLast: 7n, brokerLast: 5n },
    { kind: 'resume', start: 7n, localLast: 7n },
  ],
  [
    'a broker ahead of the store is refused by default',
    { meta: meta({ lastId: 7n }), brokerLast: 9n },
    { refuses: 'DEDUP_SEQUENCE_REGRESSION' },
  ],
  [
    "a broker ahead with 'adopt' continues above the broker",
    { meta: meta({ lastId: 7n }), brokerLast: 9n, onBrokerAhead: 'adopt', outboxSize: 3, outboxLast: 7n },
    { kind: 'adopt', start: 9n },
  ],
  [
    'a lost store (none) with a broker that knows the name is refused',
    { brokerLast: 40n },
    { refuses: 'DEDUP_SEQUENCE_REGRESSION' },
  ],
  [
    'reserve: the next life starts above the block and declares the rest skipped from above the broker',
    { meta: meta({ lastId: 0n, reservedUpTo: 10_000n }), brokerLast: 3n, durability: 'reserve' },
    { kind: 'resume', start: 10_000n, skipFrom: 4n, localLast: 10_000n },
  ],
  [
    'reserve over AMQP 0-9-1: the skip starts above the store’s last ID below every unconfirmed one',
    { meta: meta({ lastId: 2n, reservedUpTo: 10_002n }), brokerLast: undefined, durability: 'reserve' },
    { kind: 'resume', start: 10_002n, skipFrom: 3n },
  ],
  [
    'reserve: a block used to its last ID leaves nothing to declare',
    { meta: meta({ lastId: 0n, reservedUpTo: 10n }), brokerLast: 10n },
    { kind: 'resume', start: 10n },
  ],
  [
    'reserve: an outbox left by an earlier outbox life raises the skip above it',
    { meta: meta({ lastId: 0n, reservedUpTo: 100n }), brokerLast: 3n, outboxSize: 2, outboxLast: 6n },
    { kind: 'resume', start: 100n, skipFrom: 7n },
  ],
  [
    'a skip an earlier life declared on a message that never landed is declared again',
    { meta: meta({ lastId: 0n, reservedUpTo: 20_000n, skipFrom: 4n }), brokerLast: 3n },
    { kind: 'resume', start: 20_000n, skipFrom: 4n },
  ],
  [
    'an outbox life after a reserve life: the pending skip is still declared until its message is confirmed',
    { meta: meta({ lastId: 30n, reservedUpTo: 20n, skipFrom: 4n, outboxHigh: 30n }), brokerLast: 30n },
    { kind: 'resume', start: 30n, skipFrom: 4n },
  ],
  [
    'explicit IDs resume after the broker and the outbox, never the store’s reserved ceiling',
    {
      idMode: 'explicit',
      durability: 'reserve',
      meta: meta({ idMode: 'explicit', lastId: 12n, reservedUpTo: 10_012n, outboxHigh: 8n }),
      brokerLast: 11n,
    },
    { kind: 'resume', start: 11n, localLast: 10_012n },
  ],
  [
    'explicit IDs without the broker’s last ID resume at the store’s last ID',
    {
      idMode: 'explicit',
      meta: meta({ idMode: 'explicit', lastId: 12n, outboxHigh: 12n }),
      brokerLast: undefined,
    },
    { kind: 'resume', start: 12n },
  ],
  [
    'explicit IDs in reserve durability need the broker’s last ID',
    { idMode: 'explicit', durability: 'reserve', brokerLast: undefined },
    { refuses: 'DEDUP_UNSAFE_OPTIONS' },
  ],
  [
    'explicit IDs in the outbox cannot be adopted above a broker that is ahead',
    {
      idMode: 'explicit',
      onBrokerAhead: 'adopt',
      meta: meta({ idMode: 'explicit', lastId: 5n }),
      outboxSize: 1,
      outboxLast: 5n,
      brokerLast: 9n,
    },
    { refuses: 'DEDUP_SEQUENCE_REGRESSION' },
  ],
  [
    'a keyed store of 0.1 whose last writer reserved IDs forgets records above the broker and its outbox',
    { idMode: 'keyed', meta: meta({ idMode: 'keyed', lastId: 0n, reservedUpTo: 10_000n }), brokerLast: 5n },
    { kind: 'resume', start: 10_000n, skipFrom: 6n, forgetKeysAbove: 5n },
  ],
  [
    'a keyed store written with an outbox keeps every record',
    { idMode: 'keyed', meta: meta({ idMode: 'keyed', lastId: 9n, outboxHigh: 9n }), brokerLast: 5n },
    { kind: 'resume', start: 9n },
  ],
];

describe('reconcile at open', () => {
  for (const [what, input, expected] of rows) {
    it(what, () => {
      const run = () => reconcile({ ...base, ...input });
      if ('refuses' in expected) {
        expect(run).toThrow(expect.objectContaining({ code: expected.refuses }) as Error);
        return;
      }
      const plan = run();
      expect(plan.kind).toBe(expected.kind);
      expect(plan.start).toBe(expected.start);
      expect(plan.skipFrom).toBe(expected.skipFrom);
      expect(plan.forgetKeysAbove).toBe(expected.forgetKeysAbove);
      if (expected.localLast !== undefined) expect(plan.localLast).toBe(expected.localLast);
    });
  }

  it('names both causes and the way out when the broker is ahead', () => {
    expect(() => reconcile({ ...base, meta: meta({ lastId: 7n }), brokerLast: 9n, outboxSize: 2 })).toThrow(
      /broker's last publishing ID for producer "p" on "orders" is 9, above this store's 7.*another process.*lost, replaced or restored.*onBrokerAhead: 'adopt'.*2 outbox messages/s,
    );
  });
});
