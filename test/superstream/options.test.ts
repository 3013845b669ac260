import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { DedupError } from '../../src/errors.js';
import {
  resolveSuperStreamOptions,
  type SuperStreamDedupPublisherOptions,
} from '../../src/superstream/options.js';
import { SuperStreamDedupPublisher } from '../../src/superstream/publisher.js';
import { thrown } from '../support/thrown.js';
import { useTempDir } from '../support/tmp.js';

// Every super stream option is checked before any I/O (no store folder, no connection), with the
// single-stream publisher's message shape: "Expected <name> to be <what>, got <value>".

const tempDir = useTempDir();
const key = (): string => 'k';
const valid: SuperStreamDedupPublisherOptions = {
  superStream: 'invoices',
  producerName: 'p',
  store: '/tmp/never-opened',
  routing: { kind: 'hash', key },
};
const keyed: SuperStreamDedupPublisherOptions = {
  superStream: 'invoices',
  producerName: 'p',
  store: '/tmp/never-opened',
  idMode: 'keyed',
};

type Bad = [
  what: string,
  change: Record<string, unknown>,
  error: typeof TypeError | typeof RangeError,
  message: string,
];

const bad: Bad[] = [
  [
    'superStream missing',
    { superStream: undefined },
    TypeError,
    'Expected superStream to be a non-empty string of at most 255 UTF-8 bytes, got undefined',
  ],
  [
    'superStream empty',
    { superStream: '' },
    RangeError,
    'Expected superStream to be a non-empty string of at most 255 UTF-8 bytes, got ""',
  ],
  [
    'superStream too long',
    { superStream: 'x'.repeat(256) },
    RangeError,
    'Expected superStream to be a non-empty string of at most 255 UTF-8 bytes',
  ],
  [
    'superStream of 128 two-byte characters (256 UTF-8 bytes)',
    { superStream: 'é'.repeat(128) },
    RangeError,
    'Expected superStream to be a non-empty string of at most 255 UTF-8 bytes',
  ],
  [
    'superStream lone surrogate',
    { superStream: 'a\ud800' },
    RangeError,
    'Expected superStream to be a string without lone UTF-16 surrogates',
  ],
  [
    'stream given',
    { stream: 'invoices-0' },
    RangeError,
    'Expected stream to be left out (the partitions come from superStream), got "invoices-0"',
  ],
  [
    'createStream given',
    { createStream: true },
    RangeError,
    'Expected createStream to be left out (create the super stream beforehand), got true',
  ],
  [
    'routing missing',
    { routing: undefined },
    TypeError,
    "Expected routing to be an object { kind: 'hash' | 'key', key: (body, headers) => string }, got undefined",
  ],
  [
    'routing not an object',
    { routing: 'hash' },
    TypeError,
    "Expected routing to be an object { kind: 'hash' | 'key', key: (body, headers) => string }, got \"hash\"",
  ],
  [
    'routing.kind missing',
    { routing: { key } },
    TypeError,
    "Expected routing.kind to be one of 'hash', 'key', got undefined",
  ],
  [
    'routing.kind unknown',
    { routing: { kind: 'murmur', key } },
    RangeError,
    "Expected routing.kind to be one of 'hash', 'key', got \"murmur\"",
  ],
  [
    'routing.key missing',
    { routing: { kind: 'hash' } },
    TypeError,
    'Expected routing.key to be a function, got undefined',
  ],
  [
    'routing.key not a function',
    { routing: { kind: 'key', key: 'region' } },
    TypeError,
    'Expected routing.key to be a function, got "region"',
  ],
  [
    'connection not an object',
    { connection: 'localhost:5552' },
    TypeError,
    'Expected connection to be an object, got "localhost:5552"',
  ],
  [
    'connectTimeoutMs',
    { connectTimeoutMs: 0 },
    RangeError,
    'Expected connectTimeoutMs to be an integer ≥ 1, got 0',
  ],
  // The single-stream publisher's options, checked by its own code.
  [
    'durability',
    { durability: 'outboxx' },
    RangeError,
    `Expected durability to be one of 'outbox', 'reserve', got "outboxx"`,
  ],
  ['maxInFlight', { maxInFlight: 0 }, RangeError, 'Expected maxInFlight to be an integer ≥ 1, got 0'],
  ['store', { store: 42 }, TypeError, 'Expected store to be a folder path or an opened DedupStore, got 42'],
  ['producerName', { producerName: '' }, RangeError, 'producerName must not be empty'],
  // Keyed IDs: the domain key routes, by hash.
  [
    'keyed with a routing function',
    { idMode: 'keyed', routing: { kind: 'hash', key } },
    RangeError,
    "Expected routing.key to be left out with idMode 'keyed' (the domain key is the routing key), got a function",
  ],
  [
    'keyed with key routing',
    { idMode: 'keyed', routing: { kind: 'key' } },
    RangeError,
    "Expected routing.kind to be 'hash' with idMode 'keyed' (the domain key routes), got \"key\"",
  ],
];

describe('super stream publisher options', () => {
  it.each(bad)('refuses %s', (_what, change, error, message) => {
    const err = thrown(() => resolveSuperStreamOptions({ ...valid, ...change }));
    expect(err).toBeInstanceOf(error);
    expect((err as Error).message).toContain(message);
  });

  it('refuses keyed IDs without an outbox, as the single-stream publisher', () => {
    const err = thrown(() =>
      // @ts-expect-error keyed IDs with 'reserve': the types refuse it too (test/types/publisher-options.test.ts)
      resolveSuperStreamOptions({ ...keyed, durability: 'reserve' }),
    );
    expect(err).toBeInstanceOf(DedupError);
    expect((err as DedupError).code).toBe('DEDUP_UNSAFE_OPTIONS');
  });

  it('fills in the defaults: keyed IDs route by hash of the domain key, null counts as left out', () => {
    expect(resolveSuperStreamOptions({ ...keyed, routing: undefined }).routing).toEqual({
      kind: 'hash',
      key: undefined,
    });
    expect(resolveSuperStreamOptions({ ...keyed, routing: { kind: 'hash' } }).routing).toEqual({
      kind: 'hash',
      key: undefined,
    });
    const plain = resolveSuperStreamOptions({ ...valid, connection: null, connectTimeoutMs: null } as never);
    expect(plain).toMatchObject({ superStream: 'invoices', connection: undefined, connectTimeoutMs: 10_000 });
    expect(plain.routing).toEqual({ kind: 'hash', key });
    expect(plain.publisher).toMatchObject({ producerName: 'p', durability: 'outbox', idMode: 'auto' });
    expect(Object.isFrozen(plain)).toBe(true);
    const byKey = resolveSuperStreamOptions({ ...valid, routing: { kind: 'key', key } });
    expect(byKey.routing.kind).toBe('key');
  });

  it('open() refuses bad options before any I/O: no store folder, no connection', async () => {
    const store = join(await tempDir(), 'store');
    // Port 1: a connection attempt would fail with DEDUP_BROKER_UNREACHABLE, not a RangeError.
    const options = { ...valid, store, connection: { port: 1 }, maxBatch: 0 };
    await expect(SuperStreamDedupPublisher.open(options)).rejects.toThrow(
      new RangeError('Expected maxBatch to be an integer ≥ 1, got 0'),
    );
    await expect(
      // @ts-expect-error routing left out without keyed IDs: the types refuse it too
      SuperStreamDedupPublisher.open({ ...options, maxBatch: 1, routing: undefined }),
    ).rejects.toBeInstanceOf(TypeError);
    expect(existsSync(store)).toBe(false);
  });

  it('open() closes the store it opened when the broker cannot be reached', async () => {
    const store = join(await tempDir(), 'store');
    const options = {
      ...valid,
      store,
      connection: { hostname: '127.0.0.1', port: 1 },
      connectTimeoutMs: 2_000,
    };
    await expect(SuperStreamDedupPublisher.open(options)).rejects.toMatchObject({
      code: 'DEDUP_BROKER_UNREACHABLE',
    });
    // The store's lock was released: it opens again.
    await expect(SuperStreamDedupPublisher.open(options)).rejects.toMatchObject({
      code: 'DEDUP_BROKER_UNREACHABLE',
    });
  });
});
