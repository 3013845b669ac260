/**
 * PgOutbox.enqueue refuses what the relay could not publish before the INSERT (issue 35, poison
 * rows): the fake client records every query, so "before any I/O" is checked, not assumed.
 */
import { describe, expect, it } from 'vitest';
import { OUTBOX_MAX_MESSAGE_BYTES, PgOutbox } from '../../src/postgres.js';
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
      batchSize: 500,
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
