import { EventEmitter } from 'node:events';
import { existsSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import fc from 'fast-check';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { DedupError } from '../src/errors.js';
import { silentLogger } from '../src/telemetry/logger.js';
import { AmqpDedupPublisher } from '../src/transport/amqp-publisher.js';
import { checkWithin } from './support/runs.js';

// AMQP publisher options model (issue 32, item 11): for any combination of the options that shape
// recovery, a combination the publisher refuses as unsafe with the broker up and an empty store
// is refused the same way before any I/O — no store folder, no connection — so that with the
// broker down it is DEDUP_UNSAFE_OPTIONS too, never DEDUP_BROKER_UNREACHABLE after a store folder
// was created. The broker is a fake amqplib that answers every step.

const broker = { up: true, connects: 0 };

class FakeChannel extends EventEmitter {
  checkQueue(): Promise<object> {
    return Promise.resolve({});
  }
  assertQueue(): Promise<object> {
    return Promise.resolve({});
  }
  close(): Promise<void> {
    return Promise.resolve();
  }
}

class FakeModel extends EventEmitter {
  createConfirmChannel(): Promise<FakeChannel> {
    return Promise.resolve(new FakeChannel());
  }
  close(): Promise<void> {
    this.emit('close');
    return Promise.resolve();
  }
}

vi.mock(import('amqplib'), async (importOriginal) => ({
  ...(await importOriginal()),
  connect: (() => {
    broker.connects++;
    return broker.up ? Promise.resolve(new FakeModel()) : Promise.reject(new Error('connect ECONNREFUSED'));
  }) as never,
}));

const dirs: string[] = [];
afterEach(async () => {
  await Promise.all(dirs.splice(0).map((d) => rm(d, { recursive: true, force: true })));
});

const combination = fc.record({
  idMode: fc.constantFrom('auto', 'explicit', 'keyed'),
  durability: fc.constantFrom('outbox', 'reserve'),
  onBrokerAhead: fc.constantFrom('error', 'adopt'),
  declareQueue: fc.boolean(),
  maxInFlight: fc.integer({ min: 1, max: 5 }),
});

/** Opens (and closes) a publisher with `combo` on a new store folder; what it threw, if anything. */
async function open(combo: Record<string, unknown>, up: boolean): Promise<{ err: unknown; folder: boolean }> {
  broker.up = up;
  broker.connects = 0;
  const dir = await mkdtemp(join(tmpdir(), 'stream-dedup-prop-'));
  dirs.push(dir);
  const store = join(dir, 'store');
  const err = await AmqpDedupPublisher.open({
    url: 'amqp://127.0.0.1:5672',
    queue: 'orders',
    producerName: 'p',
    store,
    connectTimeoutMs: 1_000,
    reconnect: { initialDelayMs: 1, maxDelayMs: 1, giveUpAfterMs: 1 },
    logger: silentLogger,
    ...combo,
  }).then(
    (pub) => pub.close(),
    (e: unknown) => e,
  );
  return { err, folder: existsSync(store) };
}

describe('AMQP publisher options model', () => {
  it('amqp options - a combination refused as unsafe is refused before any I/O', async () => {
    await checkWithin(
      'amqp options: unsafe before I/O',
      fc.asyncProperty(combination, async (combo) => {
        const withBroker = await open(combo, true);
        const unsafe = withBroker.err instanceof DedupError && withBroker.err.code === 'DEDUP_UNSAFE_OPTIONS';
        if (!unsafe) {
          expect(withBroker.err).toBeUndefined();
          return;
        }
        expect(broker.connects, 'no connection for an unsafe combination').toBe(0);
        expect(withBroker.folder, 'no store folder for an unsafe combination').toBe(false);
        const down = await open(combo, false);
        expect(down.err).toMatchObject({ code: 'DEDUP_UNSAFE_OPTIONS' });
        expect(down.folder).toBe(false);
      }),
      { runs: 60, timeLimitMs: 60_000 },
    );
  });
});
