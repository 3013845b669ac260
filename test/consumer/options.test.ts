import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { VerifyingConsumerCore } from '../../src/consumer/core.js';
import { resolveSubscriptionOptions, resolveVerifyingConsumerOptions } from '../../src/consumer/options.js';
import { AmqpVerifyingConsumer } from '../../src/transport/amqp-consumer.js';
import { StreamVerifyingConsumer } from '../../src/transport/stream-consumer.js';
import { silentLogger } from '../../src/telemetry/logger.js';
import { memoryStore } from '../support/memory-store.js';
import { useTempDir } from '../support/tmp.js';
import { thrown } from '../support/thrown.js';

// Every connection attempt either consumer makes goes through one of these: counted, never answered.
const attempts = { stream: 0, amqp: 0 };
vi.mock(import('../../src/transport/stream-probe.js'), async (importOriginal) => ({
  ...(await importOriginal()),
  connectStreamClient: () => {
    attempts.stream++;
    return Promise.reject(new Error('no broker in unit tests'));
  },
}));
vi.mock(import('../../src/transport/amqp-connect.js'), async (importOriginal) => ({
  ...(await importOriginal()),
  connectAmqp: () => {
    attempts.amqp++;
    return Promise.reject(new Error('no broker in unit tests'));
  },
}));

afterEach(() => {
  attempts.stream = 0;
  attempts.amqp = 0;
});

const handler = (): void => undefined;
const base = { consumerName: 'c', store: './never-opened', handler };
const WINDOW = 'an integer from 1 to 1048576';
const TIMER = 'an integer ≥ 1';

type Case = readonly [what: string, patch: Record<string, unknown>, error: typeof TypeError, message: string];

/** Each option of the core with bad values: the error's class and exact message. */
const CORE_CASES: readonly Case[] = [
  ['consumerName', { consumerName: 42 }, TypeError, 'Expected consumerName to be a non-empty string, got 42'],
  [
    'consumerName',
    { consumerName: '' },
    RangeError,
    'Expected consumerName to be a non-empty string, got ""',
  ],
  [
    'consumerName',
    { consumerName: 'x\uD800' },
    RangeError,
    'Expected consumerName to be a string without lone UTF-16 surrogates, got "x\\ud800"',
  ],
  [
    'store',
    { store: 42 },
    TypeError,
    'Expected store to be a folder path, an opened DedupStore or a PostgresStore, got 42',
  ],
  [
    'store',
    { store: {} },
    TypeError,
    'Expected store to be a folder path, an opened DedupStore or a PostgresStore, got an object',
  ],
  [
    'store',
    { store: '' },
    RangeError,
    'Expected store to be a folder path, an opened DedupStore or a PostgresStore, got ""',
  ],
  ['sync', { sync: 'yes' }, TypeError, 'Expected sync to be a boolean, got "yes"'],
  ['handler', { handler: undefined }, TypeError, 'Expected handler to be a function, got undefined'],
  ['handler', { handler: 'h' }, TypeError, 'Expected handler to be a function, got "h"'],
  ['policy', { policy: 'window' }, TypeError, 'Expected policy to be an object, got "window"'],
  [
    'policy',
    { policy: {} },
    TypeError,
    "Expected policy.kind to be one of 'highest', 'window', got undefined",
  ],
  [
    'policy',
    { policy: { kind: 'windows', size: 4 } },
    RangeError,
    `Expected policy.kind to be one of 'highest', 'window', got "windows"`,
  ],
  [
    'policy',
    { policy: { kind: 'window' } },
    TypeError,
    `Expected policy.size to be ${WINDOW}, got undefined`,
  ],
  [
    'policy',
    { policy: { kind: 'window', size: '4' } },
    TypeError,
    `Expected policy.size to be ${WINDOW}, got "4"`,
  ],
  [
    'policy',
    { policy: { kind: 'window', size: 0 } },
    RangeError,
    `Expected policy.size to be ${WINDOW}, got 0`,
  ],
  [
    'policy',
    { policy: { kind: 'window', size: 1_048_577 } },
    RangeError,
    `Expected policy.size to be ${WINDOW}, got 1048577`,
  ],
  ['tenant', { tenant: 'acme' }, TypeError, 'Expected tenant to be a function, got "acme"'],
  [
    'unidentified',
    { unidentified: 'pass' },
    RangeError,
    `Expected unidentified to be one of 'reject', 'pass-through', got "pass"`,
  ],
  [
    'unidentified',
    { unidentified: true },
    TypeError,
    `Expected unidentified to be one of 'reject', 'pass-through', got true`,
  ],
  [
    'commit',
    { commit: 'batched' },
    RangeError,
    `Expected commit to be one of 'message', 'batch', got "batched"`,
  ],
  ['commit', { commit: 1 }, TypeError, `Expected commit to be one of 'message', 'batch', got 1`],
  ['commitEvery', { commitEvery: 0 }, RangeError, 'Expected commitEvery to be an integer ≥ 1, got 0'],
  ['commitEvery', { commitEvery: 1.5 }, RangeError, 'Expected commitEvery to be an integer ≥ 1, got 1.5'],
  ['commitEvery', { commitEvery: '10' }, TypeError, 'Expected commitEvery to be an integer ≥ 1, got "10"'],
  ['commitLingerMs', { commitLingerMs: 0 }, RangeError, `Expected commitLingerMs to be ${TIMER}, got 0`],
  ['commitLingerMs', { commitLingerMs: '5' }, TypeError, `Expected commitLingerMs to be ${TIMER}, got "5"`],
  ['scopeTtlMs', { scopeTtlMs: -1 }, RangeError, 'Expected scopeTtlMs to be an integer ≥ 0, got -1'],
  ['scopeTtlMs', { scopeTtlMs: '1h' }, TypeError, 'Expected scopeTtlMs to be an integer ≥ 0, got "1h"'],
  ['onEvent', { onEvent: {} }, TypeError, 'Expected onEvent to be a function, got an object'],
  [
    'logger',
    { logger: 'console' },
    TypeError,
    'Expected logger to be a pino-compatible logger (info, warn and error functions)',
  ],
  [
    'logger',
    { logger: { info: handler } },
    TypeError,
    'Expected logger to be a pino-compatible logger (info, warn and error functions)',
  ],
  ['hooks', { hooks: 1 }, TypeError, 'Expected hooks to be an object, got 1'],
  ['hooks', { hooks: { beforeCommit: 1 } }, TypeError, 'Expected hooks.beforeCommit to be a function, got 1'],
  [
    'hooks',
    { hooks: { afterCommit: 'x' } },
    TypeError,
    'Expected hooks.afterCommit to be a function, got "x"',
  ],
];

/** The subscription options both transports take. */
const SUBSCRIPTION_CASES: readonly Case[] = [
  [
    'startFrom',
    { startFrom: 'last' },
    RangeError,
    `Expected startFrom to be one of 'first', 'next', got "last"`,
  ],
  ['startFrom', { startFrom: 0 }, TypeError, `Expected startFrom to be one of 'first', 'next', got 0`],
  ['reconnect', { reconnect: 100 }, TypeError, 'Expected reconnect to be an object, got 100'],
  [
    'reconnect',
    { reconnect: { initialDelayMs: 0 } },
    RangeError,
    `Expected reconnect.initialDelayMs to be ${TIMER}, got 0`,
  ],
  [
    'reconnect',
    { reconnect: { maxDelayMs: '5s' } },
    TypeError,
    `Expected reconnect.maxDelayMs to be ${TIMER}, got "5s"`,
  ],
  [
    'connectTimeoutMs',
    { connectTimeoutMs: 0 },
    RangeError,
    `Expected connectTimeoutMs to be ${TIMER}, got 0`,
  ],
  [
    'connectTimeoutMs',
    { connectTimeoutMs: '10s' },
    TypeError,
    `Expected connectTimeoutMs to be ${TIMER}, got "10s"`,
  ],
];

const PORT = 'an integer from 1 to 65535';
const STREAM_CASES: readonly Case[] = [
  ['stream', { stream: undefined }, TypeError, 'Expected stream to be a non-empty string, got undefined'],
  ['stream', { stream: '' }, RangeError, 'Expected stream to be a non-empty string, got ""'],
  [
    'connection',
    { connection: 'localhost' },
    TypeError,
    'Expected connection to be an object, got "localhost"',
  ],
  ['connection', { connection: { port: 0 } }, RangeError, `Expected connection.port to be ${PORT}, got 0`],
  [
    'connection',
    { connection: { hostname: '' } },
    RangeError,
    'Expected connection.hostname to be a non-empty string, got ""',
  ],
  [
    'connection',
    { connection: { endpoints: {} } },
    TypeError,
    'Expected connection.endpoints to be an array, got an object',
  ],
  [
    'connection',
    { connection: { endpoints: [{ hostname: 'a' }] } },
    TypeError,
    `Expected connection.endpoints[0].port to be ${PORT}, got undefined`,
  ],
  [
    'connection',
    { connection: { endpoints: [{ host: 'a', port: 5552 }] } },
    TypeError,
    'Expected connection.endpoints[0].hostname to be a non-empty string, got undefined',
  ],
  [
    'connection',
    { connection: { ssl: { key: 'not a PEM key' } } },
    TypeError,
    'connection.ssl: the TLS options cannot be used',
  ],
  [
    'maxInflatedBytes',
    { maxInflatedBytes: -1 },
    RangeError,
    'Expected maxInflatedBytes to be an integer from 0 to 4294967295, got -1',
  ],
  [
    'maxInflatedBytes',
    { maxInflatedBytes: '16MiB' },
    TypeError,
    'Expected maxInflatedBytes to be an integer from 0 to 4294967295, got "16MiB"',
  ],
];

const AMQP_CASES: readonly Case[] = [
  ['url', { url: 42 }, TypeError, 'Expected url to be an AMQP URL or amqplib connect options, got 42'],
  ['url', { url: '' }, RangeError, 'Expected url to be an AMQP URL or amqplib connect options, got ""'],
  ['queue', { queue: '' }, RangeError, 'Expected queue to be a non-empty string, got ""'],
  ['prefetch', { prefetch: 0 }, RangeError, 'Expected prefetch to be an integer from 1 to 65535, got 0'],
  [
    'prefetch',
    { prefetch: 70_000 },
    RangeError,
    'Expected prefetch to be an integer from 1 to 65535, got 70000',
  ],
  ['prefetch', { prefetch: '10' }, TypeError, 'Expected prefetch to be an integer from 1 to 65535, got "10"'],
  ['socketOptions', { socketOptions: 'tls' }, TypeError, 'Expected socketOptions to be an object, got "tls"'],
  [
    'socketOptions',
    { socketOptions: { key: 'not a PEM key' } },
    TypeError,
    'socketOptions: the TLS options cannot be used',
  ],
];

describe('verifying consumer options - resolved before any I/O', () => {
  it('merges the defaults into one frozen object', () => {
    const resolved = resolveVerifyingConsumerOptions(base);
    expect(resolved).toEqual({
      consumerName: 'c',
      store: './never-opened',
      sync: false,
      handler,
      policy: { kind: 'window', size: 1024 },
      tenant: undefined,
      unidentified: 'reject',
      commit: 'batch',
      commitEvery: 1000,
      commitLingerMs: 5,
      scopeTtlMs: 0,
      onEvent: undefined,
      logger: silentLogger,
      hooks: undefined,
    });
    expect(Object.isFrozen(resolved)).toBe(true);
    expect(resolveVerifyingConsumerOptions(resolved)).toBe(resolved);
    expect(resolveSubscriptionOptions({})).toEqual({
      startFrom: 'first',
      reconnect: { initialDelayMs: 100, maxDelayMs: 5000 },
      connectTimeoutMs: 10_000,
    });
    expect(Object.isFrozen(resolveSubscriptionOptions({}).reconnect)).toBe(true);
  });

  it('takes null as left out, and waits no longer than a timer can (2^31 - 1 ms)', () => {
    const resolved = resolveVerifyingConsumerOptions({
      ...base,
      commitLingerMs: 2 ** 40,
      onEvent: null,
      logger: null,
      hooks: null,
      policy: null,
      scopeTtlMs: null,
    } as never);
    expect(resolved).toMatchObject({
      commitLingerMs: 2_147_483_647,
      onEvent: undefined,
      hooks: undefined,
      scopeTtlMs: 0,
    });
    expect(resolved.logger).toBe(silentLogger);
    expect(resolved.policy).toEqual({ kind: 'window', size: 1024 });
    expect(resolveSubscriptionOptions({ reconnect: null, connectTimeoutMs: 2 ** 32 } as never)).toMatchObject(
      {
        reconnect: { initialDelayMs: 100 },
        connectTimeoutMs: 2_147_483_647,
      },
    );
  });

  it('keeps what is given', () => {
    const hooks = { afterCommit: handler };
    const resolved = resolveVerifyingConsumerOptions({
      ...base,
      sync: true,
      policy: { kind: 'highest' },
      unidentified: 'pass-through',
      commit: 'message',
      commitEvery: 1,
      commitLingerMs: 2_147_483_647,
      scopeTtlMs: 0,
      hooks,
    });
    expect(resolved).toMatchObject({
      sync: true,
      policy: { kind: 'highest' },
      unidentified: 'pass-through',
      commit: 'message',
      commitEvery: 1,
      commitLingerMs: 2_147_483_647,
      hooks,
    });
  });

  it('refuses a value that is not an options object', () => {
    for (const options of [undefined, null, 'c', []]) {
      expect(() => resolveVerifyingConsumerOptions(options as never)).toThrow(TypeError);
    }
    expect(() => resolveVerifyingConsumerOptions(null as never)).toThrow(
      'Expected options to be an object, got null',
    );
  });

  for (const [what, patch, kind, message] of CORE_CASES) {
    it(`${what} ${JSON.stringify(patch)}: ${kind.name}`, () => {
      const error = thrown(() => resolveVerifyingConsumerOptions({ ...base, ...patch }));
      expect(error).toBeInstanceOf(kind);
      expect((error as Error).message).toBe(message);
    });
  }

  for (const [what, patch, kind, message] of SUBSCRIPTION_CASES) {
    it(`${what} ${JSON.stringify(patch)}: ${kind.name}`, () => {
      const error = thrown(() => resolveSubscriptionOptions(patch));
      expect(error).toBeInstanceOf(kind);
      expect((error as Error).message).toBe(message);
    });
  }
});

describe('verifying consumer options - open() with a bad option does no I/O', () => {
  const tempDir = useTempDir();

  it('the core: the store folder is never created', async () => {
    const dir = await tempDir();
    for (const [what, patch, error, message] of CORE_CASES) {
      if (what === 'store') continue;
      const path = join(dir, 'store');
      const opening = VerifyingConsumerCore.open({
        ...base,
        store: path,
        ...patch,
      });
      await expect(opening, `${what} ${JSON.stringify(patch)}`).rejects.toThrow(error);
      await expect(opening).rejects.toThrow(message);
      expect(existsSync(path)).toBe(false);
    }
  });

  it('the core with an opened store: the name is not claimed', async () => {
    const store = await memoryStore();
    await expect(VerifyingConsumerCore.open({ ...base, store, commitEvery: 0 })).rejects.toThrow(RangeError);
    const core = await VerifyingConsumerCore.open({ ...base, store });
    await core.close();
    await store.close();
  });

  for (const transport of ['stream', 'amqp'] as const) {
    it(`the ${transport} consumer: neither the store nor a connection is opened`, async () => {
      const path = join(await tempDir(), 'store');
      const valid =
        transport === 'stream'
          ? { ...base, store: path, stream: 'ledger' }
          : { ...base, store: path, url: 'amqp://localhost', queue: 'orders' };
      const open = (options: object) =>
        transport === 'stream'
          ? StreamVerifyingConsumer.open(options as Parameters<typeof StreamVerifyingConsumer.open>[0])
          : AmqpVerifyingConsumer.open(options as Parameters<typeof AmqpVerifyingConsumer.open>[0]);
      const own = transport === 'stream' ? STREAM_CASES : AMQP_CASES;
      for (const [what, patch, error, message] of [...CORE_CASES, ...SUBSCRIPTION_CASES, ...own]) {
        if (what === 'store') continue;
        const opening = open({ ...valid, ...patch });
        await expect(opening, `${what} ${JSON.stringify(patch)}`).rejects.toThrow(error);
        await expect(opening).rejects.toThrow(message);
        expect(existsSync(path)).toBe(false);
      }
      expect(attempts[transport]).toBe(0);
      // The mock is in the way: with good options, a connection is attempted.
      await expect(open({ ...valid, store: await memoryStore() })).rejects.toThrow('no broker in unit tests');
      expect(attempts[transport]).toBe(1);
    });
  }
});
