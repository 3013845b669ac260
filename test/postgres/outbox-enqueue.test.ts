/**
 * PgOutbox.enqueue refuses what the relay could not publish before the INSERT (issue 35, poison
 * rows): the fake client records every query, so "before any I/O" is checked, not assumed.
 */
import { describe, expect, it } from 'vitest';
import { OUTBOX_ENQUEUE_MANY_BYTES, OUTBOX_MAX_MESSAGE_BYTES, PgOutbox } from '../../src/postgres.js';
import { resolveRelayOptions } from '../../src/postgres/outbox/relay-options.js';

function fakeClient(): {
  queries: Array<{ text: string; values: unknown[] | undefined }>;
  query: PgClientQuery;
} {
  const queries: Array<{ text: string; values: unknown[] | undefined }> = [];
  return {
    queries,
    query: (text, values) => {
      queries.push({ text, values });
      return Promise.resolve({ rows: [{ id: '7' }] });
    },
  };
}
type PgClientQuery = (text: string, values?: unknown[]) => Promise<{ rows: unknown[] }>;

const outbox = PgOutbox.create({ schema: 'app', producerName: 'orders' });

describe('PgOutbox', () => {
  it('inserts the body, key, routing key and headers as one row of the producer name', async () => {
    const c = fakeClient();
    const result = await outbox.enqueue(c, Buffer.from('x'), {
      key: 'k',
      routingKey: 'r',
      headers: { a: 'b', n: 3 },
    });
    expect(result).toEqual({ id: 7n });
    expect(c.queries).toHaveLength(1);
    expect(c.queries[0]!.text).toContain('INSERT INTO "app".outbox');
    expect(c.queries[0]!.values).toEqual(['orders', Buffer.from('x'), 'k', 'r', '{"a":"b","n":3}']);
  });

  it.each([
    ['a body that is not bytes', 'text', {}, TypeError],
    ['a message over the frame bound', Buffer.alloc(OUTBOX_MAX_MESSAGE_BYTES), {}, RangeError],
    ['a header with U+0000', Buffer.from('x'), { headers: { a: 'x\u0000' } }, RangeError],
    ['a header name with U+0000', Buffer.from('x'), { headers: { 'a\u0000': 'x' } }, RangeError],
    ['a header with a lone surrogate', Buffer.from('x'), { headers: { a: '\ud800' } }, RangeError],
    ['a reserved header', Buffer.from('x'), { headers: { 'x-dedup-id': '1' } }, RangeError],
    ['a zero header', Buffer.from('x'), { headers: { a: 0 } }, RangeError],
    ['an object header', Buffer.from('x'), { headers: { a: {} } }, TypeError],
    ['a key with U+0000', Buffer.from('x'), { key: 'a\u0000' }, RangeError],
    ['an empty routing key', Buffer.from('x'), { routingKey: '' }, RangeError],
    ['a key over 512 bytes', Buffer.from('x'), { key: 'k'.repeat(513) }, RangeError],
    ['a numeric key', Buffer.from('x'), { key: 1 }, TypeError],
  ])('refuses %s before the INSERT', async (_what, body, options, type) => {
    const c = fakeClient();
    await expect(outbox.enqueue(c, body as never, options as never)).rejects.toThrow(type);
    expect(c.queries).toHaveLength(0);
  });

  it('checks its options without I/O', () => {
    expect(() => PgOutbox.create({ schema: 'Bad-Name', producerName: 'p' })).toThrow(RangeError);
    expect(() => PgOutbox.create({ schema: 'app', producerName: '' })).toThrow(RangeError);
    expect(() => PgOutbox.create({ schema: 'app', producerName: 'p', maxMessageBytes: 0 })).toThrow(
      RangeError,
    );
  });
});

describe('PgOutbox.enqueueMany', () => {
  /** A client answering the multi-row INSERT with `ids` (in any order, as RETURNING may). */
  function manyClient(ids: string[]) {
    const queries: Array<{ text: string; values: unknown[] | undefined }> = [];
    return {
      queries,
      query: (text: string, values?: unknown[]) => {
        queries.push({ text, values });
        return Promise.resolve({ rows: ids.map((id) => ({ id })) });
      },
    };
  }

  it("inserts every item with one statement and returns the ids in the items' order", async () => {
    const c = manyClient(['12', '10', '11']);
    const result = await outbox.enqueueMany(c, [
      { body: Buffer.from('a'), key: 'k', headers: { t: 'x', n: 2 } },
      { body: new Uint8Array([98]) },
      { body: Buffer.from('c'), routingKey: 'r' },
    ]);
    expect(result).toEqual([{ id: 10n }, { id: 11n }, { id: 12n }]);
    expect(c.queries).toHaveLength(1);
    expect(c.queries[0]!.text).toContain('INSERT INTO "app".outbox');
    expect(c.queries[0]!.text).toContain('ORDER BY u.n');
    expect(c.queries[0]!.values).toEqual([
      'orders',
      [Buffer.from('a'), Buffer.from('b'), Buffer.from('c')],
      ['k', null, null],
      [null, null, 'r'],
      ['{"t":"x","n":2}', null, null],
    ]);
  });

  it('sends nothing for no items', async () => {
    const c = manyClient([]);
    expect(await outbox.enqueueMany(c, [])).toEqual([]);
    expect(c.queries).toHaveLength(0);
  });

  it.each([
    ['a body that is not bytes', { body: 'text' }, TypeError],
    ['a message over the frame bound', { body: Buffer.alloc(OUTBOX_MAX_MESSAGE_BYTES) }, RangeError],
    ['a header with U+0000', { body: Buffer.from('x'), headers: { a: 'x\u0000' } }, RangeError],
    ['a reserved header', { body: Buffer.from('x'), headers: { 'x-dedup-id': '1' } }, RangeError],
    ['a key with a lone surrogate', { body: Buffer.from('x'), key: '\ud800' }, RangeError],
    ['an empty routing key', { body: Buffer.from('x'), routingKey: '' }, RangeError],
    ['an item that is not an object', 7, TypeError],
  ])('refuses %s with its index, inserting nothing', async (_what, bad, type) => {
    const c = manyClient(['1', '2', '3']);
    const items = [{ body: Buffer.from('ok') }, { body: Buffer.from('ok') }, bad];
    const refused = outbox.enqueueMany(c, items as never);
    await expect(refused).rejects.toThrow(type);
    await expect(refused).rejects.toThrow(/^items\[2\]: /);
    expect(c.queries).toHaveLength(0);
  });

  it('refuses more than OUTBOX_ENQUEUE_MANY_BYTES of bodies, and a non-array, before any I/O', async () => {
    const c = manyClient([]);
    const body = Buffer.alloc(1_000_000);
    const items = Array.from({ length: Math.ceil(OUTBOX_ENQUEUE_MANY_BYTES / body.length) + 1 }, () => ({
      body,
    }));
    await expect(outbox.enqueueMany(c, items)).rejects.toThrow(RangeError);
    await expect(outbox.enqueueMany(c, { body } as never)).rejects.toThrow(TypeError);
    expect(c.queries).toHaveLength(0);
  });

  it('fails when the INSERT returns fewer rows than items', async () => {
    const c = manyClient(['1']);
    await expect(
      outbox.enqueueMany(c, [{ body: Buffer.from('a') }, { body: Buffer.from('b') }]),
    ).rejects.toThrow('returned 1 rows for 2 items');
  });
});

describe('PgOutboxRelay options', () => {
  const pool = { connect: () => Promise.reject(new Error('no I/O expected')) } as never;
  it('takes exactly one of stream and superStream', () => {
    // @ts-expect-error neither target (the types refuse it too: test/types/)
    expect(() => resolveRelayOptions({ pool, schema: 'app', producerName: 'p' })).toThrow(TypeError);
    expect(() =>
      // @ts-expect-error both targets
      resolveRelayOptions({ pool, schema: 'app', producerName: 'p', stream: 's', superStream: 't' }),
    ).toThrow(TypeError);
  });
  it('fills the documented defaults', () => {
    const o = resolveRelayOptions({ pool, schema: 'app', producerName: 'p', stream: 's' });
    expect(o).toMatchObject({
      batchSize: 2_000,
      maxInFlight: 5_000,
      pollIntervalMs: 1_000,
      takeoverIntervalMs: 1_000,
      queryTimeoutMs: 30_000,
      confirmTimeoutMs: 30_000,
      closeTimeoutMs: 10_000,
      connectTimeoutMs: 10_000,
      leaseTimeoutMs: 5_000,
    });
    expect(() =>
      resolveRelayOptions({ pool, schema: 'app', producerName: 'p', stream: 's', batchSize: 0 }),
    ).toThrow(RangeError);
    expect(() =>
      resolveRelayOptions({ pool: {} as never, schema: 'app', producerName: 'p', stream: 's' }),
    ).toThrow(TypeError);
  });
  it('takes a lease of 0 (none) or 200 ms and more', () => {
    const lease = (leaseTimeoutMs: number): number =>
      resolveRelayOptions({ pool, schema: 'app', producerName: 'p', stream: 's', leaseTimeoutMs })
        .leaseTimeoutMs;
    expect([lease(0), lease(200), lease(60_000)]).toEqual([0, 200, 60_000]);
    for (const bad of [1, 199, -1, 1.5, 2 ** 31]) expect(() => lease(bad)).toThrow(RangeError);
  });
});
