import { EventEmitter } from 'node:events';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { DedupError } from '../../src/errors.js';
import type { TransportHandlers } from '../../src/publisher/types.js';
import { silentLogger } from '../../src/telemetry/logger.js';
import { AmqpDedupPublisher } from '../../src/transport/amqp-publisher.js';
import { AmqpTransport } from '../../src/transport/amqp-transport.js';
import { AmqpVerifyingConsumer } from '../../src/transport/amqp-consumer.js';
import { memoryStore } from '../support/memory-store.js';

// One connectTimeoutMs bounds the whole AMQP connect: the handshake, the channel's open, the
// queue check and the consume. amqplib bounds none of the steps after the handshake; a broker
// that answers the handshake and then falls silent held open(), each reconnect and close() until
// the heartbeat noticed (minutes), or for ever with heartbeat=0. A channel that opens after the
// bound ran out is closed. No broker: amqplib's connect is replaced by fakes whose steps answer
// when the test says so, or never.

/** A promise the test settles. */
class Deferred<T> {
  readonly promise: Promise<T>;
  resolve!: (value: T) => void;
  constructor() {
    this.promise = new Promise<T>((resolve) => (this.resolve = resolve));
  }
}

const never = <T>(): Promise<T> => new Promise<T>(() => undefined);

/** What each step of the next connections does: answer at once, or the deferred's answer. */
interface Script {
  handshakeMs?: number;
  channel?: Deferred<FakeChannel> | 'never';
  queueCheck?: 'never';
  consume?: 'never';
  /** The connection's close: never answered (a broker gone silent). */
  close?: 'never';
}

let scripts: Script[] = [];
const models: FakeModel[] = [];
const waiting: Array<{ count: number; resolve: () => void }> = [];

/** Resolves once `count` connections were made. */
function connections(count: number): Promise<void> {
  if (models.length >= count) return Promise.resolve();
  return new Promise((resolve) => waiting.push({ count, resolve }));
}

class FakeChannel extends EventEmitter {
  readonly closed = new Deferred<void>();
  closes = 0;
  constructor(private readonly script: Script) {
    super();
  }
  checkQueue(): Promise<object> {
    return this.script.queueCheck === 'never' ? never() : Promise.resolve({});
  }
  assertQueue(): Promise<object> {
    return this.checkQueue();
  }
  prefetch(): Promise<void> {
    return Promise.resolve();
  }
  consume(): Promise<object> {
    return this.script.consume === 'never' ? never() : Promise.resolve({ consumerTag: 't' });
  }
  close(): Promise<void> {
    this.closes++;
    this.closed.resolve();
    return Promise.resolve();
  }
}

class FakeModel extends EventEmitter {
  closes = 0;
  constructor(private readonly script: Script) {
    super();
  }
  #channel(): Promise<FakeChannel> {
    const c = this.script.channel;
    if (c === 'never') return never();
    return c?.promise ?? Promise.resolve(new FakeChannel(this.script));
  }
  createConfirmChannel(): Promise<FakeChannel> {
    return this.#channel();
  }
  createChannel(): Promise<FakeChannel> {
    return this.#channel();
  }
  close(): Promise<void> {
    if (this.script.close === 'never') {
      this.closes++;
      return never();
    }
    if (this.closes++ === 0) this.emit('close');
    return Promise.resolve();
  }
}

vi.mock(import('amqplib'), async (importOriginal) => ({
  ...(await importOriginal()),
  connect: (() => {
    const script = scripts.shift() ?? {};
    const model = new FakeModel(script);
    models.push(model);
    for (const w of waiting) if (models.length >= w.count) w.resolve();
    if (script.handshakeMs === undefined) return Promise.resolve(model);
    return new Promise((resolve) => setTimeout(() => resolve(model), script.handshakeMs));
  }) as never,
}));

afterEach(() => {
  vi.useRealTimers();
  scripts = [];
  models.length = 0;
  waiting.length = 0;
});

const handlers: TransportHandlers = { confirmed: () => undefined, disconnected: () => undefined };

/** The promise's state after the fake clock advanced `ms`. */
async function stateAfter(promise: Promise<unknown>, ms: number): Promise<'pending' | 'settled'> {
  let settled = false;
  promise.then(
    () => (settled = true),
    () => (settled = true),
  );
  await vi.advanceTimersByTimeAsync(ms);
  return settled ? 'settled' : 'pending';
}

function transport(connectTimeoutMs = 50): AmqpTransport {
  return new AmqpTransport({
    url: 'amqp://localhost',
    queue: 'orders',
    producerName: 'p',
    store: './never-opened',
    connectTimeoutMs,
  });
}

describe('AMQP connect - one bound for the whole connect', () => {
  it('a confirm channel that never opens: connect() rejects at connectTimeoutMs, unreachable', async () => {
    vi.useFakeTimers({ toFake: ['setTimeout', 'clearTimeout', 'performance'] });
    scripts = [{ channel: 'never' }];
    const connecting = transport(50).connect(handlers);
    connecting.catch(() => undefined);
    expect(await stateAfter(connecting, 49)).toBe('pending');
    expect(await stateAfter(connecting, 1)).toBe('settled');
    const err = await connecting.catch((e: unknown) => e);
    expect(err).toBeInstanceOf(DedupError);
    expect(err).toMatchObject({ code: 'DEDUP_BROKER_UNREACHABLE' });
    expect((err as Error).message).toContain(
      'opening a confirm channel did not complete within connectTimeoutMs (50 ms)',
    );
    expect(models[0]!.closes).toBe(1);
  });

  it('a broker that answers neither the queue check nor the close: connect() rejects at connectTimeoutMs, not 5 s later', async () => {
    // Before: the failed connect's teardown waited up to 5 s for the close the silent broker
    // never answers, so open() and each reconnect attempt took connectTimeoutMs + 5 s.
    vi.useFakeTimers({ toFake: ['setTimeout', 'clearTimeout', 'performance'] });
    scripts = [{ queueCheck: 'never', close: 'never' }];
    const connecting = transport(50).connect(handlers);
    connecting.catch(() => undefined);
    expect(await stateAfter(connecting, 49)).toBe('pending');
    expect(await stateAfter(connecting, 1)).toBe('settled');
    expect(await connecting.catch((e: unknown) => e)).toMatchObject({ code: 'DEDUP_BROKER_UNREACHABLE' });
    expect(models[0]!.closes).toBe(1);
  });

  it('a channel that opens after the bound ran out is closed', async () => {
    const late = new Deferred<FakeChannel>();
    scripts = [{ channel: late }];
    const err = await transport(20)
      .connect(handlers)
      .catch((e: unknown) => e);
    expect(err).toMatchObject({ code: 'DEDUP_BROKER_UNREACHABLE' });
    const channel = new FakeChannel({});
    late.resolve(channel);
    await channel.closed.promise;
    expect(channel.closes).toBe(1);
  }, 5_000);

  it('the handshake, the channel and the queue check share one bound', async () => {
    vi.useFakeTimers({ toFake: ['setTimeout', 'clearTimeout', 'performance'] });
    scripts = [{ handshakeMs: 30, queueCheck: 'never' }];
    const connecting = transport(50).connect(handlers);
    connecting.catch(() => undefined);
    // 30 ms of handshake leave 20 ms for the rest: not 50 more.
    expect(await stateAfter(connecting, 49)).toBe('pending');
    expect(await stateAfter(connecting, 1)).toBe('settled');
    await expect(connecting).rejects.toThrow(
      'checking queue "orders" did not complete within connectTimeoutMs',
    );
  });

  it('open() of the publisher rejects within the bound and closes what it opened', async () => {
    scripts = [{ queueCheck: 'never' }];
    const store = await memoryStore();
    const opening = AmqpDedupPublisher.open({
      url: 'amqp://localhost',
      queue: 'orders',
      producerName: 'p',
      store,
      connectTimeoutMs: 30,
      logger: silentLogger,
    });
    await expect(opening).rejects.toMatchObject({ code: 'DEDUP_BROKER_UNREACHABLE' });
    expect(models.map((m) => m.closes)).toEqual([1]);
    await store.close();
  }, 5_000);

  it('close() during a reconnect whose channel never opens returns within the bound', async () => {
    scripts = [{}, { channel: 'never' }, { channel: 'never' }];
    const store = await memoryStore();
    const pub = await AmqpDedupPublisher.open({
      url: 'amqp://localhost',
      queue: 'orders',
      producerName: 'p',
      store,
      connectTimeoutMs: 50,
      reconnect: { initialDelayMs: 1, maxDelayMs: 1 },
      logger: silentLogger,
    });
    // The connection drops; the reconnect's handshake answers, its channel never does.
    await models[0]!.close();
    await connections(2);
    await pub.close();
    expect(await pub.closed()).toBeUndefined();
    await store.close();
  }, 5_000);
});

describe('AMQP verifying consumer connect - one bound', () => {
  it.each<[string, Script]>([
    ['a channel that never opens', { channel: 'never' }],
    ['a consume that is never answered', { consume: 'never' }],
  ])(
    '%s: open() rejects within connectTimeoutMs, unreachable',
    async (_what, script) => {
      scripts = [script];
      const opening = AmqpVerifyingConsumer.open({
        url: 'amqp://localhost',
        queue: 'orders',
        consumerName: 'projection',
        store: await memoryStore(),
        handler: () => undefined,
        connectTimeoutMs: 30,
        logger: silentLogger,
      });
      await expect(opening).rejects.toMatchObject({ code: 'DEDUP_BROKER_UNREACHABLE' });
      expect(models.every((m) => m.closes > 0)).toBe(true);
    },
    5_000,
  );

  it('a consume and a close that are never answered: open() rejects at connectTimeoutMs, not 2 s later', async () => {
    // Before: the failed subscribe waited up to 2 s for the close the silent broker never answers.
    scripts = [{ consume: 'never', close: 'never' }];
    const started = performance.now();
    const opening = AmqpVerifyingConsumer.open({
      url: 'amqp://localhost',
      queue: 'orders',
      consumerName: 'projection',
      store: await memoryStore(),
      handler: () => undefined,
      connectTimeoutMs: 30,
      logger: silentLogger,
    });
    await expect(opening).rejects.toMatchObject({ code: 'DEDUP_BROKER_UNREACHABLE' });
    expect(performance.now() - started).toBeLessThan(1_000);
    expect(models[0]!.closes).toBe(1);
  }, 5_000);
});
