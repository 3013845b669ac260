import { EventEmitter } from 'node:events';
import fc from 'fast-check';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { DedupError } from '../src/errors.js';
import { AmqpTransport } from '../src/transport/amqp-transport.js';
import { checkWithin } from './support/runs.js';

// AMQP connect model (issue 32, item 10): the handshake, the confirm channel's open and the queue
// check (or declare) each answer after any delay, or never, on a fake amqplib whose clock is
// vitest's fake one. Whatever the delays, connect() settles by connectTimeoutMs; it succeeds when
// the steps together fit in the bound and fails with DEDUP_BROKER_UNREACHABLE when they do not;
// after a failure every connection and every channel that opened (in time or late) is closed.
// The connection's close answers after any delay too, or never (a broker that fell silent does
// not answer it): a failed connect must not wait for it beyond the bound (it waited 5 s).

/** A step's delay in ms, or undefined: it never answers. */
type Delay = number | undefined;

interface Steps {
  readonly handshake: Delay;
  readonly channel: Delay;
  readonly queue: Delay;
  /** The connection's close: when the broker answers it. */
  readonly close: Delay;
}

/** What the fake amqplib made in one run. */
const made = {
  steps: { handshake: 0, channel: 0, queue: 0, close: 0 } as Steps,
  models: [] as FakeModel[],
  channels: [] as FakeChannel[],
};

const after = <T>(delay: Delay, value: () => T): Promise<T> =>
  delay === undefined
    ? new Promise<T>(() => undefined)
    : new Promise<T>((resolve) => setTimeout(() => resolve(value()), delay));

class FakeChannel extends EventEmitter {
  /** Fake-clock time it was handed to the library. */
  readonly openedAt = performance.now();
  closes = 0;
  checkQueue(): Promise<object> {
    return after(made.steps.queue, () => ({}));
  }
  assertQueue(): Promise<object> {
    return this.checkQueue();
  }
  close(): Promise<void> {
    this.closes++;
    return Promise.resolve();
  }
}

class FakeModel extends EventEmitter {
  createConfirmChannel(): Promise<FakeChannel> {
    return after(made.steps.channel, () => {
      const channel = new FakeChannel();
      made.channels.push(channel);
      return channel;
    });
  }
  /** Calls of close(), answered or not. */
  closes = 0;
  #closeAnswered = false;
  close(): Promise<void> {
    this.closes++;
    return after(made.steps.close, () => {
      if (this.#closeAnswered) return;
      this.#closeAnswered = true;
      this.emit('close');
    });
  }
}

vi.mock(import('amqplib'), async (importOriginal) => ({
  ...(await importOriginal()),
  connect: (() =>
    after(made.steps.handshake, () => {
      const model = new FakeModel();
      made.models.push(model);
      return model;
    })) as never,
}));

afterEach(() => {
  vi.useRealTimers();
});

const delay = fc.option(fc.nat({ max: 120 }), { nil: undefined, freq: 4 });

describe('AMQP connect model', () => {
  it('amqp connect - settles within connectTimeoutMs whatever each step does, and closes what it opened', async () => {
    await checkWithin(
      'amqp connect: one bound',
      fc.asyncProperty(
        fc.record({ handshake: delay, channel: delay, queue: delay, close: delay }),
        fc.integer({ min: 1, max: 150 }),
        fc.boolean(),
        async (steps, timeoutMs, declareQueue) => {
          made.steps = steps;
          made.models = [];
          made.channels = [];
          // Per run: checkWithin's own clock stays real.
          vi.useFakeTimers({ toFake: ['setTimeout', 'clearTimeout', 'performance'] });
          try {
            await run(steps, timeoutMs, declareQueue);
          } finally {
            vi.useRealTimers();
          }
        },
      ),
      { runs: 500, timeLimitMs: 60_000 },
    );
  });
});

/** One connect on the fake clock: its outcome, when it settled, and what it left open. */
async function run(steps: Steps, timeoutMs: number, declareQueue: boolean): Promise<void> {
  const started = performance.now();
  const transport = new AmqpTransport({
    url: 'amqp://localhost',
    queue: 'orders',
    producerName: 'p',
    store: './never-opened',
    connectTimeoutMs: timeoutMs,
    declareQueue,
  });
  let settledAt: number | undefined;
  const outcome = transport.connect({ confirmed: () => undefined, disconnected: () => undefined }).then(
    () => {
      settledAt = performance.now();
      return undefined;
    },
    (err: unknown) => {
      settledAt = performance.now();
      return err;
    },
  );
  await vi.advanceTimersByTimeAsync(timeoutMs);
  // A step that answered at the deadline leaves the next one no time: its 0 ms timer
  // runs at the same instant. Timers due now run; the clock does not move.
  for (let i = 0; i < 3 && settledAt === undefined; i++) await vi.advanceTimersByTimeAsync(0);
  // Bounded: settled by connectTimeoutMs, whatever the steps do.
  expect(settledAt, 'connect() settled by connectTimeoutMs').toBeDefined();
  expect(settledAt! - started).toBeLessThanOrEqual(timeoutMs);
  const err = await outcome;
  // Then long enough for every step that answers at all to have answered (late ones too).
  await vi.advanceTimersByTimeAsync(3 * 120 + 1);
  const total = [steps.handshake, steps.channel, steps.queue].reduce<number>(
    (sum, d) => sum + (d ?? Number.POSITIVE_INFINITY),
    0,
  );
  if (total < timeoutMs) expect(err).toBeUndefined();
  if (total > timeoutMs) {
    expect(err).toBeInstanceOf(DedupError);
    expect((err as DedupError).code).toBe('DEDUP_BROKER_UNREACHABLE');
  }
  if (err === undefined) {
    // close() keeps its own bound (5 s) for a close the broker does not answer.
    const closing = transport.close();
    await vi.advanceTimersByTimeAsync(5_001);
    await closing;
  } else {
    for (const m of made.models) expect(m.closes, 'every connection closed').toBeGreaterThan(0);
    // A channel opened after the bound is closed itself; one opened in time goes with its
    // connection (amqplib closes a connection's channels).
    for (const c of made.channels) {
      if (c.openedAt > settledAt!) expect(c.closes, 'a late channel closed').toBeGreaterThan(0);
    }
  }
}
