import { EventEmitter } from 'node:events';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { AmqpVerifyingConsumer } from '../../src/transport/amqp-consumer.js';
import { memoryStore } from '../support/memory-store.js';

// The AMQP verifying consumer against fake amqplib objects that behave as amqplib does when the
// broker refuses a consume (a missing queue): the channel emits 'error' and 'close' first, then the
// consume call rejects; closing a connection emits 'close' on it.

/** What each connection's consume does: true subscribes, false is refused. */
let consumeAnswers: boolean[] = [];
let connects = 0;
const models: FakeModel[] = [];

class FakeChannel extends EventEmitter {
  constructor(private readonly refuse: boolean) {
    super();
  }
  prefetch(): Promise<void> {
    return Promise.resolve();
  }
  consume(): Promise<object> {
    if (!this.refuse) return Promise.resolve({ consumerTag: 'tag' });
    this.emit('error', new Error('NOT_FOUND'));
    this.emit('close');
    return Promise.reject(
      new Error('Channel closed by server: 404 (NOT-FOUND) with message "NOT_FOUND - no queue \'orders\'"'),
    );
  }
  ack(): void {}
}

class FakeModel extends EventEmitter {
  closed = false;
  constructor(private readonly refuse: boolean) {
    super();
  }
  createChannel(): Promise<FakeChannel> {
    return Promise.resolve(new FakeChannel(this.refuse));
  }
  close(): Promise<void> {
    if (!this.closed) {
      this.closed = true;
      this.emit('close');
    }
    return Promise.resolve();
  }
}

vi.mock(import('../../src/transport/amqp-connect.js'), async (importOriginal) => ({
  ...(await importOriginal()),
  connectAmqp: (_url: unknown, _budget: unknown, onClose: () => void) => {
    connects++;
    const model = new FakeModel(!(consumeAnswers.shift() ?? true));
    model.on('error', () => undefined);
    model.on('close', onClose);
    models.push(model);
    return Promise.resolve(model) as never;
  },
}));

afterEach(() => {
  consumeAnswers = [];
  connects = 0;
  models.length = 0;
});

const settle = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

async function open() {
  return AmqpVerifyingConsumer.open({
    url: 'amqp://localhost',
    queue: 'orders',
    consumerName: 'projection',
    store: await memoryStore(),
    handler: () => undefined,
    reconnect: { initialDelayMs: 1, maxDelayMs: 1 },
  });
}

describe('AMQP verifying consumer - resubscribing', () => {
  it('open() refused by the broker leaves nothing running: no reconnect loop, no connection', async () => {
    consumeAnswers = [false];
    await expect(open()).rejects.toMatchObject({ code: 'DEDUP_BROKER_REFUSED' });
    await settle(100);
    // Before: the channel's 'close' during the refused consume queued a resubscription that
    // nothing stopped; it reconnected forever (every attempt queuing one more) and kept the
    // process alive.
    expect(connects).toBe(1);
    expect(models.every((m) => m.closed)).toBe(true);
  });

  it('after a lost connection, refused attempts are retried until one subscribes, and then nothing more', async () => {
    consumeAnswers = [true, false, false, false, true];
    const consumer = await open();
    await models[0]!.close(); // the connection drops
    await vi.waitFor(() => expect(connects).toBe(5));
    await settle(100);
    // Before: each refused attempt queued one more resubscription, which then tore down the one
    // that worked and subscribed again.
    expect(connects).toBe(5);
    expect(models.map((m) => m.closed)).toEqual([true, true, true, true, false]);
    await consumer.close();
    expect(models[4]!.closed).toBe(true);
    expect(await consumer.closed()).toBeUndefined();
  });
});
