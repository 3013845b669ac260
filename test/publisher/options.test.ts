import { existsSync } from 'node:fs';
import { mkdtemp } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { DedupPublisherCore } from '../../src/publisher/core.js';
import { resolvePublisherOptions } from '../../src/publisher/options.js';
import type { DedupPublisherOptions, PublishTransport } from '../../src/publisher/types.js';

// Every publisher option is checked before any I/O, with one message shape: a typo fails open()
// at once instead of silently becoming the default (issue 17).

const valid: DedupPublisherOptions = { producerName: 'p', store: '/tmp/never-opened' };

type Bad = [option: string, value: unknown, error: typeof TypeError | typeof RangeError, message: string];

const bad: Bad[] = [
  [
    'durability',
    'outboxx',
    RangeError,
    `Expected durability to be one of 'outbox', 'reserve', got "outboxx"`,
  ],
  ['durability', 1, TypeError, `Expected durability to be one of 'outbox', 'reserve', got 1`],
  ['idMode', 'key', RangeError, `Expected idMode to be one of 'auto', 'explicit', 'keyed', got "key"`],
  ['onBrokerAhead', 'adapt', RangeError, `Expected onBrokerAhead to be one of 'error', 'adopt', got "adapt"`],
  ['sync', 'yes', TypeError, 'Expected sync to be a boolean, got "yes"'],
  ['maxInFlight', 0, RangeError, 'Expected maxInFlight to be an integer ≥ 1, got 0'],
  ['maxInFlight', 1.5, RangeError, 'Expected maxInFlight to be an integer ≥ 1, got 1.5'],
  ['maxInFlight', '10', TypeError, 'Expected maxInFlight to be an integer ≥ 1, got "10"'],
  ['maxBatch', -1, RangeError, 'Expected maxBatch to be an integer ≥ 1, got -1'],
  ['reserveBlock', Number.NaN, RangeError, 'Expected reserveBlock to be an integer ≥ 1, got NaN'],
  ['confirmTimeoutMs', 0, RangeError, 'Expected confirmTimeoutMs to be an integer ≥ 1, got 0'],
  ['closeTimeoutMs', -5, RangeError, 'Expected closeTimeoutMs to be an integer ≥ 0, got -5'],
  ['watchIntervalMs', 0.5, RangeError, 'Expected watchIntervalMs to be an integer ≥ 0, got 0.5'],
  ['keyRetention', 5, TypeError, 'Expected keyRetention to be an object, got 5'],
  ['reconnect', [], TypeError, 'Expected reconnect to be an object, got an array'],
  [
    'logger',
    'console',
    TypeError,
    'Expected logger to be a pino-compatible logger (info, warn and error functions)',
  ],
  ['store', 42, TypeError, 'Expected store to be a folder path or an opened DedupStore, got 42'],
  ['store', '', TypeError, 'Expected store to be a folder path or an opened DedupStore, got ""'],
];

const nested: Array<[string, Partial<DedupPublisherOptions>, string]> = [
  [
    'keyRetention.maxKeys',
    { keyRetention: { maxKeys: 0 } },
    'Expected keyRetention.maxKeys to be an integer ≥ 1, got 0',
  ],
  [
    'keyRetention.maxAgeMs',
    { keyRetention: { maxAgeMs: -1 } },
    'Expected keyRetention.maxAgeMs to be an integer ≥ 1, got -1',
  ],
  [
    'reconnect.initialDelayMs',
    { reconnect: { initialDelayMs: 0 } },
    'Expected reconnect.initialDelayMs to be an integer ≥ 1, got 0',
  ],
  [
    'reconnect.maxDelayMs',
    { reconnect: { maxDelayMs: 0.5 } },
    'Expected reconnect.maxDelayMs to be an integer ≥ 1, got 0.5',
  ],
  [
    'reconnect.giveUpAfterMs',
    { reconnect: { giveUpAfterMs: 0 } },
    'Expected reconnect.giveUpAfterMs to be an integer ≥ 1, got 0',
  ],
];

/** A transport that fails the test if anything touches it. */
const untouchable: PublishTransport = {
  target: 'orders',
  maxMessageBytes: 1_000_000,
  connect: () => Promise.reject(new Error('connect() was called')),
  publish: () => Promise.reject(new Error('publish() was called')),
  queryLastId: () => Promise.reject(new Error('queryLastId() was called')),
  close: () => Promise.resolve(),
};

describe('publisher options', () => {
  for (const [option, value, error, message] of bad) {
    it(`${option}: ${String(value)} is a ${error.name}`, () => {
      const run = () => resolvePublisherOptions({ ...valid, [option]: value });
      expect(run).toThrow(error);
      expect(run).toThrow(message);
    });
  }

  for (const [option, options, message] of nested) {
    it(`${option}: a bad value is a RangeError`, () => {
      expect(() => resolvePublisherOptions({ ...valid, ...options })).toThrow(new RangeError(message));
    });
  }

  it('takes null as left out; a confirm timeout of any size, timers no longer than 2^31 - 1 ms', () => {
    const resolved = resolvePublisherOptions({
      ...valid,
      keyRetention: null,
      reconnect: null,
      logger: null,
      maxInFlight: null,
      confirmTimeoutMs: Number.MAX_SAFE_INTEGER,
      closeTimeoutMs: 2 ** 40,
    } as never);
    expect(resolved).toMatchObject({
      maxInFlight: 5_000,
      keyRetention: { maxKeys: 100_000 },
      reconnect: { initialDelayMs: 100 },
      confirmTimeoutMs: Number.MAX_SAFE_INTEGER,
      closeTimeoutMs: 2 ** 31 - 1,
    });
  });

  it('fills every default, and the result is frozen', () => {
    const resolved = resolvePublisherOptions(valid);
    expect(resolved).toMatchObject({
      durability: 'outbox',
      idMode: 'auto',
      onBrokerAhead: 'error',
      sync: false,
      maxInFlight: 5_000,
      maxBatch: 2_000,
      reserveBlock: 10_000,
      confirmTimeoutMs: 30_000,
      closeTimeoutMs: 10_000,
      watchIntervalMs: 0,
      keyRetention: { maxKeys: 100_000, maxAgeMs: 7 * 24 * 3_600_000 },
      reconnect: { initialDelayMs: 100, maxDelayMs: 5_000, giveUpAfterMs: 120_000 },
    });
    expect(Object.isFrozen(resolved)).toBe(true);
    expect(Object.isFrozen(resolved.reconnect)).toBe(true);
  });

  it('keyed IDs without an outbox are refused before any I/O', async () => {
    const folder = join(await mkdtemp(join(tmpdir(), 'options-')), 'store');
    await expect(
      DedupPublisherCore.open(untouchable, {
        ...valid,
        store: folder,
        idMode: 'keyed',
        durability: 'reserve',
      }),
    ).rejects.toMatchObject({ code: 'DEDUP_UNSAFE_OPTIONS' });
    expect(existsSync(folder)).toBe(false);
  });

  it('open() with a bad option neither creates the store folder nor connects', async () => {
    const folder = join(await mkdtemp(join(tmpdir(), 'options-')), 'store');
    await expect(
      DedupPublisherCore.open(untouchable, { ...valid, store: folder, maxInFlight: 0 }),
    ).rejects.toThrow(RangeError);
    expect(existsSync(folder)).toBe(false);
  });
});
