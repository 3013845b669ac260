import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { DedupError } from '../../src/errors.js';
import {
  resolveAmqpPublisherOptions,
  type AmqpDedupPublisherOptions,
} from '../../src/transport/amqp-options.js';
import { AmqpDedupPublisher } from '../../src/transport/amqp-publisher.js';
import { useTempDir } from '../support/tmp.js';

// Every option of AmqpDedupPublisher.open is checked before any I/O — no store folder, no
// connection — and so is a combination that can never work over AMQP 0-9-1: explicit IDs with
// durability 'reserve' resume after the broker's last ID, which AMQP 0-9-1 cannot report. Before,
// that one was refused only by the reconcile, after the store was opened and the broker dialled
// (with the broker down: DEDUP_BROKER_UNREACHABLE, and the store folder created).

let connects = 0;
vi.mock(import('amqplib'), async (importOriginal) => ({
  ...(await importOriginal()),
  connect: () => {
    connects++;
    return Promise.reject<never>(new Error('connect ECONNREFUSED 127.0.0.1:5672 (no broker in unit tests)'));
  },
}));
afterEach(() => {
  connects = 0;
});

const tempDir = useTempDir();

async function options(patch: Record<string, unknown>): Promise<AmqpDedupPublisherOptions> {
  const store = join(await tempDir(), 'store');
  return {
    url: 'amqp://127.0.0.1:5672',
    queue: 'orders',
    producerName: 'p',
    store,
    connectTimeoutMs: 1_000,
    ...patch,
  };
}

describe('AMQP publisher options - refused before any I/O', () => {
  it.each<[string, Record<string, unknown>]>([
    ["explicit IDs with durability 'reserve'", { idMode: 'explicit', durability: 'reserve' }],
    ["keyed IDs with durability 'reserve'", { idMode: 'keyed', durability: 'reserve' }],
  ])('%s: DEDUP_UNSAFE_OPTIONS, no store folder, no connect', async (_what, patch) => {
    const opts = await options(patch);
    const err = await AmqpDedupPublisher.open(opts).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(DedupError);
    expect(err).toMatchObject({ code: 'DEDUP_UNSAFE_OPTIONS' });
    expect(existsSync(opts.store as string)).toBe(false);
    expect(connects).toBe(0);
  });

  it("explicit IDs with durability 'outbox' pass: the same store and broker are then used", async () => {
    const opts = await options({ idMode: 'explicit' });
    expect(resolveAmqpPublisherOptions(opts).publisher.idMode).toBe('explicit');
    await expect(AmqpDedupPublisher.open(opts)).rejects.toMatchObject({ code: 'DEDUP_BROKER_UNREACHABLE' });
    expect(connects).toBe(1);
  });

  it.each<[string, Record<string, unknown>, typeof TypeError, string]>([
    [
      'queue',
      { queue: '' },
      RangeError,
      'Expected queue to be a non-empty string of at most 255 UTF-8 bytes, got ""',
    ],
    [
      'queue',
      // 200 characters, 400 UTF-8 bytes: AMQP 0-9-1 counts bytes (a shortstr), so amqplib refused
      // it only after the store folder was made and the broker dialled (hostile review).
      { queue: '\u00e9'.repeat(200) },
      RangeError,
      'Expected queue to be a non-empty string of at most 255 UTF-8 bytes, got "\u00e9\u00e9',
    ],
    [
      'queue',
      { queue: 42 },
      TypeError,
      'Expected queue to be a non-empty string of at most 255 UTF-8 bytes, got 42',
    ],
    ['url', { url: 42 }, TypeError, 'Expected url to be an AMQP URL or amqplib connect options, got 42'],
    ['declareQueue', { declareQueue: 'yes' }, TypeError, 'Expected declareQueue to be a boolean, got "yes"'],
    [
      'connectTimeoutMs',
      { connectTimeoutMs: 0 },
      RangeError,
      'Expected connectTimeoutMs to be an integer ≥ 1, got 0',
    ],
    [
      'connectTimeoutMs',
      { connectTimeoutMs: '5000' },
      TypeError,
      'Expected connectTimeoutMs to be an integer ≥ 1, got "5000"',
    ],
    ['socketOptions', { socketOptions: 5 }, TypeError, 'Expected socketOptions to be an object, got 5'],
    ['maxInFlight', { maxInFlight: 0 }, RangeError, 'Expected maxInFlight to be an integer ≥ 1, got 0'],
  ])(
    '%s: %o is refused with its message, no store folder, no connect',
    async (_name, patch, type, message) => {
      const opts = await options(patch);
      const err = await AmqpDedupPublisher.open(opts).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(type);
      expect((err as Error).message).toContain(message);
      expect(existsSync(opts.store as string)).toBe(false);
      expect(connects).toBe(0);
    },
  );

  it('a missing options object is a TypeError', async () => {
    await expect(AmqpDedupPublisher.open(undefined as never)).rejects.toThrow(
      'Expected options to be an object, got undefined',
    );
  });
});
