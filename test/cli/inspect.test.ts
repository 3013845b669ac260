import { describe, expect, it } from 'vitest';
import {
  formatInspection,
  formatInspectionJson,
  inspectPostgresRows,
  inspectStore,
  selectProducer,
  type StoreInspection,
} from '../../src/cli/inspect.js';
import { CliError } from '../../src/cli/output.js';
import { VerifyingConsumerCore } from '../../src/consumer/core.js';
import { DedupError } from '../../src/errors.js';
import { identityHeaders } from '../../src/identity/headers.js';
import { encodeScopeKey } from '../../src/identity/scope-key.js';
import { encodeScopeState } from '../../src/store/consumer-keys.js';
import type { DedupStore } from '../../src/store/store.js';
import { createTracker } from '../../src/verifier/index.js';
import { memoryStore } from '../support/memory-store.js';

const entry = (id: bigint) => ({ publishingId: id, body: Buffer.from(`m-${id}`), headers: undefined });

/** A store with two producers (one with a two-segment outbox), a verifying consumer and its scopes. */
async function populated(): Promise<DedupStore> {
  const store = await memoryStore();
  const orders = store.claimProducer('orders', 'orders-svc');
  await orders.commit({ meta: { idMode: 'auto', lastId: 40n, reservedUpTo: 0n } });
  orders.release();
  const billing = store.claimProducer('billing', 'billing-svc');
  await billing.commit({
    meta: { idMode: 'explicit', lastId: 102n, reservedUpTo: 0n },
    segment: [entry(100n), entry(101n)],
  });
  await billing.commit({
    meta: { idMode: 'explicit', lastId: 103n, reservedUpTo: 0n },
    segment: [entry(103n)],
  });
  billing.release();

  const core = await VerifyingConsumerCore.open({
    consumerName: 'projection',
    store,
    policy: { kind: 'window', size: 64 },
    tenant: ({ headers }) => (typeof headers.tenant === 'string' ? headers.tenant : ''),
    handler: () => undefined,
    commit: 'message',
  });
  const message = (offset: number, producer: string, id: number, tenant?: string) => ({
    offset: BigInt(offset),
    content: Buffer.from('x'),
    applicationProperties: {
      ...identityHeaders(producer, BigInt(id)),
      ...(tenant === undefined ? {} : { tenant }),
    },
  });
  await core.process(message(10, 'orders-svc', 1));
  await core.process(message(11, 'orders-svc', 2, 'acme'));
  await core.process(message(12, 'orders-svc', 7));
  await core.close();
  const strict = await VerifyingConsumerCore.open({
    consumerName: 'audit-log',
    store,
    policy: { kind: 'highest' },
    handler: () => undefined,
    commit: 'message',
  });
  await strict.process(message(3, 'billing-svc', 100));
  await strict.close();
  return store;
}

describe('cli inspect - reading a store', () => {
  it('lists producers with their ids and outbox, consumers with their offsets, and verifier scopes', async () => {
    const before = Date.now();
    const store = await populated();
    const inspection = await inspectStore(store);
    await store.close();
    expect(inspection.producers).toEqual([
      {
        target: 'billing',
        producerName: 'billing-svc',
        idMode: 'explicit',
        lastId: 103n,
        reservedUpTo: 0n,
        outboxMessages: 3,
        outboxSegments: 2,
        outboxFirstId: 100n,
        outboxLastId: 103n,
      },
      {
        target: 'orders',
        producerName: 'orders-svc',
        idMode: 'auto',
        lastId: 40n,
        reservedUpTo: 0n,
        outboxMessages: 0,
        outboxSegments: 0,
        outboxFirstId: undefined,
        outboxLastId: undefined,
      },
    ]);
    expect(inspection.consumers).toEqual([
      { consumerName: 'audit-log', committedOffset: 3n },
      { consumerName: 'projection', committedOffset: 12n },
    ]);
    expect(inspection.scopes.map(({ lastSeenMs: _ms, lastSeen: _iso, ...s }) => s)).toEqual([
      {
        consumer: 'audit-log',
        tenant: '',
        producer: 'billing-svc',
        policy: { kind: 'highest' },
        highest: 100n,
      },
      {
        consumer: 'projection',
        tenant: '',
        producer: 'orders-svc',
        policy: { kind: 'window', size: 64 },
        highest: 7n,
      },
      {
        consumer: 'projection',
        tenant: 'acme',
        producer: 'orders-svc',
        policy: { kind: 'window', size: 64 },
        highest: 2n,
      },
    ]);
    for (const s of inspection.scopes) {
      expect(s.lastSeenMs).toBeGreaterThanOrEqual(before);
      expect(s.lastSeenMs).toBeLessThanOrEqual(Date.now());
      expect(s.lastSeen).toBe(new Date(s.lastSeenMs).toISOString());
    }
  });

  it('an empty store has nothing to list', async () => {
    const store = await memoryStore();
    expect(await inspectStore(store)).toEqual({ producers: [], superStreams: [], consumers: [], scopes: [] });
    await store.close();
  });

  it('refuses undecodable records with DEDUP_STORE_CORRUPT, naming the key', async () => {
    for (const [key, value] of [
      ['c:4:name/offset', Buffer.from([1, 2, 3])],
      ['c:4:name/other', Buffer.alloc(8)],
      ['v:4:name0:1:p', Buffer.from([0, 0, 0])],
      ['v:4:name0:1:p', Buffer.concat([Buffer.alloc(8), Buffer.from([9, 9])])],
      ['v:not-a-scope-key', Buffer.alloc(18)],
    ] as const) {
      const store = await memoryStore();
      await store.db.batch([{ type: 'put', key, value }]);
      const err = await inspectStore(store).catch((e: unknown) => e);
      expect(err).toMatchObject({ name: 'DedupError', code: 'DEDUP_STORE_CORRUPT' });
      expect((err as Error).message).toContain(key.slice(2, 8));
      await store.close();
    }
  });
});

describe('cli inspect - output', () => {
  const inspection: StoreInspection = {
    producers: [
      {
        target: 'orders',
        producerName: 'orders-svc',
        idMode: 'auto',
        lastId: 40n,
        reservedUpTo: 0n,
        outboxMessages: 0,
        outboxSegments: 0,
        outboxFirstId: undefined,
        outboxLastId: undefined,
      },
      {
        target: 'billing',
        producerName: 'billing-svc',
        idMode: 'explicit',
        lastId: 103n,
        reservedUpTo: 20000n,
        outboxMessages: 3,
        outboxSegments: 2,
        outboxFirstId: 100n,
        outboxLastId: 103n,
      },
    ],
    superStreams: [],
    consumers: [{ consumerName: 'projection', committedOffset: 12n }],
    scopes: [
      {
        consumer: 'projection',
        tenant: '',
        producer: 'orders-svc',
        policy: { kind: 'window', size: 1024 },
        highest: 7n,
        lastSeenMs: Date.UTC(2025, 0, 2, 3, 4, 5),
        lastSeen: '2025-01-02T03:04:05.000Z',
      },
      {
        consumer: 'projection',
        tenant: 'acme',
        producer: 'billing-svc',
        policy: { kind: 'highest' },
        highest: 18446744073709551615n,
        lastSeenMs: 9e15,
        lastSeen: undefined,
      },
    ],
  };

  it('the human listing: a table per kind of state, and what the outbox means', () => {
    expect(formatInspection('/var/lib/app/.dedup', inspection)).toBe(
      [
        'store /var/lib/app/.dedup',
        '',
        'producers: 2',
        'target   producer     id mode   last id  reserved up to  outbox  outbox ids',
        'orders   orders-svc   auto           40               0       0  -',
        'billing  billing-svc  explicit      103           20000       3  100..103',
        '',
        'super stream producers: none',
        '',
        'verifying consumers: 1',
        'consumer    committed offset',
        'projection                12',
        '',
        'verifier scopes: 2',
        'consumer    tenant  producer     policy                     highest  last seen',
        'projection  -       orders-svc   window(1024)                     7  2025-01-02T03:04:05.000Z',
        'projection  acme    billing-svc  highest       18446744073709551615  9000000000000000 ms',
        '',
        '3 messages in the outbox: the producer re-sends them with their original ids when it opens again',
      ].join('\n'),
    );
  });

  it('says "none" for empty sections', () => {
    expect(formatInspection('s', { producers: [], superStreams: [], consumers: [], scopes: [] })).toBe(
      'store s\n\nproducers: none\n\nsuper stream producers: none\n\nverifying consumers: none\n\nverifier scopes: none',
    );
  });

  it('--json: one object, 64-bit integers as decimal strings, absent values as null', () => {
    const json = JSON.parse(formatInspectionJson('/s', inspection)) as Record<string, unknown>;
    expect(json).toEqual({
      store: '/s',
      producers: [
        {
          target: 'orders',
          producerName: 'orders-svc',
          idMode: 'auto',
          lastId: '40',
          reservedUpTo: '0',
          outboxMessages: 0,
          outboxSegments: 0,
          outboxFirstId: null,
          outboxLastId: null,
        },
        {
          target: 'billing',
          producerName: 'billing-svc',
          idMode: 'explicit',
          lastId: '103',
          reservedUpTo: '20000',
          outboxMessages: 3,
          outboxSegments: 2,
          outboxFirstId: '100',
          outboxLastId: '103',
        },
      ],
      superStreams: [],
      consumers: [{ consumerName: 'projection', committedOffset: '12' }],
      scopes: [
        {
          consumer: 'projection',
          tenant: '',
          producer: 'orders-svc',
          policy: { kind: 'window', size: 1024 },
          highest: '7',
          lastSeenMs: Date.UTC(2025, 0, 2, 3, 4, 5),
          lastSeen: '2025-01-02T03:04:05.000Z',
        },
        {
          consumer: 'projection',
          tenant: 'acme',
          producer: 'billing-svc',
          policy: { kind: 'highest' },
          highest: '18446744073709551615',
          lastSeenMs: 9e15,
          lastSeen: null,
        },
      ],
    });
  });
});

/**
 * A store with a super stream producer "billing" on "invoices" (3 partitions: state on -0 with an
 * outbox, none on -1, state on -2), beside a plain producer of the same name and one of a partition
 * under another name.
 */
async function withSuperStream(): Promise<DedupStore> {
  const store = await memoryStore();
  await store.writePartitions('invoices', 'billing', ['invoices-0', 'invoices-1', 'invoices-2']);
  const p0 = store.claimProducer('invoices-0', 'billing');
  await p0.commit({
    meta: { idMode: 'auto', lastId: 12n, reservedUpTo: 0n },
    segment: [entry(11n), entry(12n)],
  });
  p0.release();
  const p2 = store.claimProducer('invoices-2', 'billing');
  await p2.commit({ meta: { idMode: 'auto', lastId: 9n, reservedUpTo: 0n } });
  p2.release();
  const plain = store.claimProducer('ledger', 'billing');
  await plain.commit({ meta: { idMode: 'explicit', lastId: 70n, reservedUpTo: 0n } });
  plain.release();
  const other = store.claimProducer('invoices-1', 'someone-else');
  await other.commit({ meta: { idMode: 'auto', lastId: 1n, reservedUpTo: 0n } });
  other.release();
  return store;
}

const state = (target: string, producerName: string, extra: Partial<Record<string, unknown>> = {}) => ({
  target,
  producerName,
  idMode: 'auto',
  reservedUpTo: 0n,
  outboxMessages: 0,
  outboxSegments: 0,
  outboxFirstId: undefined,
  outboxLastId: undefined,
  ...extra,
});

describe('cli inspect - super stream producers', () => {
  it("lists each partition's state under its super stream producer (the s: record's order), and only there", async () => {
    const store = await withSuperStream();
    const inspection = await inspectStore(store);
    await store.close();
    expect(inspection.superStreams).toEqual([
      {
        superStream: 'invoices',
        producerName: 'billing',
        partitions: [
          {
            partition: 'invoices-0',
            state: state('invoices-0', 'billing', {
              lastId: 12n,
              outboxMessages: 2,
              outboxSegments: 1,
              outboxFirstId: 11n,
              outboxLastId: 12n,
            }),
          },
          { partition: 'invoices-1', state: undefined },
          { partition: 'invoices-2', state: state('invoices-2', 'billing', { lastId: 9n }) },
        ],
      },
    ]);
    // A partition's state under another producer name, and the name's plain stream, stay producers.
    expect(inspection.producers).toEqual([
      state('invoices-1', 'someone-else', { lastId: 1n }),
      state('ledger', 'billing', { idMode: 'explicit', lastId: 70n }),
    ]);
  });

  it('the human listing: one row per partition, "-" where the producer never sent, the outbox of every partition counted', async () => {
    const store = await withSuperStream();
    const text = formatInspection('/s', await inspectStore(store));
    await store.close();
    expect(text).toContain(
      [
        'super stream producers: 1',
        'super stream  producer  partition   id mode  last id  reserved up to  outbox  outbox ids',
        'invoices      billing   invoices-0  auto          12               0       2  11..12',
        'invoices      billing   invoices-1  -              -               -       -  -',
        'invoices      billing   invoices-2  auto           9               0       0  -',
        '(a partition with "-" has no state yet: the producer never sent to it)',
      ].join('\n'),
    );
    expect(text).toContain('2 messages in the outbox');
  });

  it('--json: the partitions with their state, null where there is none', async () => {
    const store = await withSuperStream();
    const json = JSON.parse(formatInspectionJson('/s', await inspectStore(store))) as {
      superStreams: unknown;
    };
    await store.close();
    expect(json.superStreams).toEqual([
      {
        superStream: 'invoices',
        producerName: 'billing',
        partitions: [
          {
            partition: 'invoices-0',
            state: {
              target: 'invoices-0',
              producerName: 'billing',
              idMode: 'auto',
              lastId: '12',
              reservedUpTo: '0',
              outboxMessages: 2,
              outboxSegments: 1,
              outboxFirstId: '11',
              outboxLastId: '12',
            },
          },
          { partition: 'invoices-1', state: null },
          expect.objectContaining({ partition: 'invoices-2' }),
        ],
      },
    ]);
  });

  it('refuses an s: record or key it cannot decode with DEDUP_STORE_CORRUPT, naming the key', async () => {
    for (const [key, value] of [
      ['s:8:invoices7:billing', Buffer.from([1, 0])],
      ['s:8:invoices7:billing', Buffer.from([1, 0, 0])],
      ['s:8:invoices9:billing', Buffer.from([1, 0, 1, 0, 1, 0x61])],
      ['s:99:short', Buffer.from([1, 0, 1, 0, 1, 0x61])],
    ] as const) {
      const store = await memoryStore();
      await store.db.batch([{ type: 'put', key, value }]);
      const err = await inspectStore(store).catch((e: unknown) => e);
      expect(err, key).toMatchObject({ name: 'DedupError', code: 'DEDUP_STORE_CORRUPT' });
      expect((err as Error).message).toContain(`store record "${key}"`);
      await store.close();
    }
  });
});

describe('cli inspect --producer', () => {
  it('keeps one producer name: its producers, super stream producers, scopes and their consumers', async () => {
    const store = await withSuperStream();
    const billing = selectProducer('/s', await inspectStore(store), 'billing');
    await store.close();
    expect(billing.producers.map((p) => p.target)).toEqual(['ledger']);
    expect(billing.superStreams.map((x) => x.superStream)).toEqual(['invoices']);
    expect(billing.consumers).toEqual([]);

    const populatedStore = await populated();
    const orders = selectProducer('/s', await inspectStore(populatedStore), 'orders-svc');
    await populatedStore.close();
    expect(orders.producers.map((p) => p.producerName)).toEqual(['orders-svc']);
    expect(orders.scopes.map((x) => [x.consumer, x.producer])).toEqual([
      ['projection', 'orders-svc'],
      ['projection', 'orders-svc'],
    ]);
    expect(orders.consumers.map((c) => c.consumerName)).toEqual(['projection']);
  });

  it('a name the store does not hold is a CliError with exit code 4 that lists the names it has', async () => {
    const store = await withSuperStream();
    const inspection = await inspectStore(store);
    await store.close();
    const err = (() => {
      try {
        selectProducer('/var/s', inspection, 'bililng');
      } catch (e) {
        return e;
      }
    })();
    expect(err).toBeInstanceOf(CliError);
    expect(err).toMatchObject({ exitCode: 4 });
    expect((err as Error).message).toBe(
      'store /var/s has no producer named "bililng" (no producer state, super stream record or verifier ' +
        'scope; it has "billing", "someone-else")',
    );
    expect(() =>
      selectProducer('/e', { producers: [], superStreams: [], consumers: [], scopes: [] }, 'x'),
    ).toThrow(/has no producer named "x" .*it has none\)$/);
  });
});

describe('inspectPostgresRows (a PostgreSQL store, stream-dedup inspect postgres://…)', () => {
  const state = (ids: bigint[], lastSeenMs: number) => {
    const tracker = createTracker({ kind: 'window', size: 64 });
    for (const id of ids) tracker.record(id);
    return encodeScopeState(tracker, lastSeenMs);
  };

  it('lists consumers with a committed offset and decodes every scope, sorted as the LevelDB view', () => {
    const q = encodeScopeKey({ consumer: 'ledger', tenant: '', producer: 'q' });
    const p = encodeScopeKey({ consumer: 'ledger', tenant: 'acme', producer: 'p' });
    const inspection = inspectPostgresRows({
      offsets: [
        { consumer: 'zeta', committedOffset: 7n },
        { consumer: 'ledger', committedOffset: 41n },
        { consumer: 'opened-only', committedOffset: undefined },
      ],
      scopes: [
        { scopeKey: q, state: state([1n, 2n], 0) },
        { scopeKey: p, state: state([5n], 1_700_000_000_000) },
      ],
    });
    expect(inspection.producers).toEqual([]);
    expect(inspection.superStreams).toEqual([]);
    expect(inspection.consumers).toEqual([
      { consumerName: 'ledger', committedOffset: 41n },
      { consumerName: 'zeta', committedOffset: 7n },
    ]);
    expect(inspection.scopes.map((s) => [s.tenant, s.producer, s.highest, s.policy])).toEqual([
      ['', 'q', 2n, { kind: 'window', size: 64 }],
      ['acme', 'p', 5n, { kind: 'window', size: 64 }],
    ]);
    expect(inspection.scopes[1]!.lastSeen).toBe('2023-11-14T22:13:20.000Z');
    expect(formatInspection('postgres://u:***@h/db schema s (version 1)', inspection)).toMatch(
      /store postgres:\/\/u:\*\*\*@h\/db schema s \(version 1\)[\s\S]*verifying consumers: 2[\s\S]*verifier scopes: 2/,
    );
  });

  it('a scope state that does not decode is DEDUP_STORE_CORRUPT naming the row', () => {
    const key = encodeScopeKey({ consumer: 'ledger', tenant: '', producer: 'q' });
    let caught: unknown;
    try {
      inspectPostgresRows({ offsets: [], scopes: [{ scopeKey: key, state: Uint8Array.of(0xff, 1, 2) }] });
    } catch (err) {
      caught = err;
    }
    expect(caught).toBeInstanceOf(DedupError);
    expect((caught as DedupError).code).toBe('DEDUP_STORE_CORRUPT');
    expect((caught as DedupError).message).toMatch(/scope_states/);
  });
});
