import { describe, expect, it } from 'vitest';
import {
  formatInspection,
  formatInspectionJson,
  inspectStore,
  type StoreInspection,
} from '../../src/cli/inspect.js';
import { VerifyingConsumerCore } from '../../src/consumer/core.js';
import { identityHeaders } from '../../src/identity/headers.js';
import type { DedupStore } from '../../src/store/store.js';
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
    expect(await inspectStore(store)).toEqual({ producers: [], consumers: [], scopes: [] });
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
    expect(formatInspection('s', { producers: [], consumers: [], scopes: [] })).toBe(
      'store s\n\nproducers: none\n\nverifying consumers: none\n\nverifier scopes: none',
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
