import { describe, expect, it, vi } from 'vitest';
import { Resubscriber, type Generation, type ResubscriberOptions } from '../../src/consumer/resubscribe.js';
import { silentLogger } from '../../src/telemetry/logger.js';

/** A stand-in for a transport's connection. */
class FakeConnection {
  closed = false;
  onClose: (() => void) | undefined;
  close(): Promise<void> {
    this.closed = true;
    this.onClose?.();
    return Promise.resolve();
  }
}

type Attempt = (generation: Generation<FakeConnection>, connection: FakeConnection) => Promise<void>;

/** A resubscriber whose attempts each open a fake connection, then do what `script` says (the last step repeats). */
function harness(script: readonly Attempt[], options: Partial<ResubscriberOptions<FakeConnection>> = {}) {
  const connections: FakeConnection[] = [];
  const generations: Array<Generation<FakeConnection>> = [];
  const core = { consumerName: 'c', committedOffset: 7n, discardPending: vi.fn() };
  const warn = vi.fn();
  const subscriptions = new Resubscriber<FakeConnection>({
    subscribe: async (generation) => {
      const connection = new FakeConnection();
      connections.push(connection);
      generations.push(generation);
      generation.opened(connection);
      await script[Math.min(generations.length, script.length) - 1]!(generation, connection);
    },
    core,
    reconnect: { initialDelayMs: 1, maxDelayMs: 1 },
    logger: { ...silentLogger, warn },
    target: { queue: 'orders' },
    ...options,
  });
  return { subscriptions, connections, generations, core, warn };
}

const succeed: Attempt = () => Promise.resolve();
/** As amqplib does when the broker refuses a consume: the channel's 'close' first, then the rejection. */
const refuse: Attempt = async (generation, connection) => {
  generation.lost();
  connection.onClose = () => generation.lost(); // closing it reports a loss too
  await connection.close();
  throw new Error('NOT_FOUND - no queue');
};
const settle = (ms = 30) => new Promise((resolve) => setTimeout(resolve, ms));

describe('resubscribe - one path for every transport', () => {
  it('a failed attempt whose own connection reported a loss is not retried behind the caller (the leak)', async () => {
    const { subscriptions, connections, core, warn } = harness([refuse]);
    await expect(subscriptions.subscribe()).rejects.toThrow('NOT_FOUND');
    await settle(50);
    // Before: the loss queued a resubscription that nothing stopped, retrying forever after open() failed.
    expect(connections).toHaveLength(1);
    expect(core.discardPending).not.toHaveBeenCalled();
    expect(warn).not.toHaveBeenCalled();
  });

  it('a lost subscription is dropped, its connection closed, and attempts go on with backoff until one succeeds, once', async () => {
    const { subscriptions, connections, generations, core, warn } = harness([
      succeed,
      refuse,
      refuse,
      succeed,
    ]);
    await subscriptions.subscribe();
    const first = generations[0]!;
    expect(first.isCurrent()).toBe(true);
    first.lost();
    first.lost(); // the channel and the connection both report it: one resubscription
    expect(first.isCurrent()).toBe(false);
    await vi.waitFor(() => expect(connections).toHaveLength(4));
    await settle(50);
    expect(connections).toHaveLength(4);
    expect(connections.map((c) => c.closed)).toEqual([true, true, true, false]);
    expect(generations[3]!.isCurrent()).toBe(true);
    expect(core.discardPending).toHaveBeenCalledTimes(1);
    expect(warn).toHaveBeenCalledTimes(1);
    expect(warn.mock.calls[0]![0]).toEqual({ consumer: 'c', queue: 'orders', committedOffset: '7' });
    await subscriptions.shutdown(() => Promise.resolve(), false);
    expect(connections[3]!.closed).toBe(true);
  });

  it('a loss reported while the attempt is under way resubscribes once the attempt succeeded', async () => {
    const lostAtOnce: Attempt = (generation) => {
      generation.lost();
      return Promise.resolve();
    };
    const { subscriptions, connections, generations } = harness([lostAtOnce, succeed]);
    await subscriptions.subscribe();
    expect(generations[0]!.isCurrent()).toBe(false);
    await vi.waitFor(() => expect(connections).toHaveLength(2));
    expect(connections[0]!.closed).toBe(true);
    expect(generations[1]!.isCurrent()).toBe(true);
    await subscriptions.shutdown(() => Promise.resolve(), true);
  });

  it('every generation change is announced (a transport drops what it buffered)', async () => {
    const onNewGeneration = vi.fn();
    const { subscriptions, generations } = harness([succeed], { onNewGeneration });
    await subscriptions.subscribe();
    expect(onNewGeneration).toHaveBeenCalledTimes(1);
    generations[0]!.lost();
    await vi.waitFor(() => expect(generations).toHaveLength(2));
    expect(onNewGeneration).toHaveBeenCalledTimes(3); // the loss, the new attempt
    await subscriptions.shutdown(() => Promise.resolve(), false);
    expect(onNewGeneration).toHaveBeenCalledTimes(4);
  });

  for (const commitFirst of [false, true]) {
    it(`shutdown (commitFirst: ${commitFirst}) during a backoff wait ends it at once and attempts nothing more`, async () => {
      const { subscriptions, connections, generations } = harness([succeed], {
        reconnect: { initialDelayMs: 60_000, maxDelayMs: 60_000 },
      });
      await subscriptions.subscribe();
      generations[0]!.lost();
      await settle();
      const closeCore = vi.fn(() => Promise.resolve());
      const started = performance.now();
      await subscriptions.shutdown(closeCore, commitFirst);
      expect(performance.now() - started).toBeLessThan(5_000);
      expect(closeCore).toHaveBeenCalledTimes(1);
      await settle();
      expect(connections).toHaveLength(1);
      generations[0]!.lost(); // late events after the stop change nothing
      await settle();
      expect(connections).toHaveLength(1);
    });

    it(`shutdown (commitFirst: ${commitFirst}) closes the connection a resubscription under way opens`, async () => {
      let answer: (() => void) | undefined;
      const parked: Attempt = () => new Promise<void>((resolve) => (answer = resolve));
      const { subscriptions, connections, generations } = harness([succeed, parked]);
      await subscriptions.subscribe();
      generations[0]!.lost();
      await vi.waitFor(() => expect(answer).toBeDefined());
      const order: string[] = [];
      const closing = subscriptions.shutdown(() => {
        order.push(`closeCore with the new connection ${connections[1]!.closed ? 'closed' : 'open'}`);
        return Promise.resolve();
      }, commitFirst);
      answer!();
      await closing;
      expect(generations[1]!.isCurrent()).toBe(false);
      expect(connections.map((c) => c.closed)).toEqual([true, true]);
      expect(order).toEqual([`closeCore with the new connection ${commitFirst ? 'open' : 'closed'}`]);
    });
  }

  it('runs queued work in order, a resubscription between deliveries', async () => {
    const { subscriptions, generations, core } = harness([succeed]);
    await subscriptions.subscribe();
    const seen: string[] = [];
    subscriptions.enqueue(async () => {
      await settle(5);
      seen.push(`delivery 1, current: ${generations[0]!.isCurrent()}`);
    });
    generations[0]!.lost();
    subscriptions.enqueue(() => {
      seen.push(`delivery 2, discarded: ${core.discardPending.mock.calls.length}`);
      return Promise.resolve();
    });
    await vi.waitFor(() => expect(seen).toHaveLength(2));
    expect(seen).toEqual(['delivery 1, current: false', 'delivery 2, discarded: 1']);
    await subscriptions.shutdown(() => Promise.resolve(), true);
  });

  describe('leave: out of the subscription for a while (a stalled consumer group partition)', () => {
    it('drops the subscription and closes its connection now, subscribes again only after the delay, without a loss warning', async () => {
      const { subscriptions, connections, generations, warn } = harness([succeed]);
      await subscriptions.subscribe();
      const left = performance.now();
      subscriptions.leave(generations[0]!, 300);
      expect(generations[0]!.isCurrent()).toBe(false);
      await vi.waitFor(() => expect(connections[0]!.closed).toBe(true));
      expect(connections).toHaveLength(1);
      await vi.waitFor(() => expect(connections).toHaveLength(2), { timeout: 3_000 });
      expect(performance.now() - left).toBeGreaterThanOrEqual(290);
      expect(generations[1]!.isCurrent()).toBe(true);
      expect(warn).not.toHaveBeenCalled();
      // The left generation's late loss report changes nothing.
      generations[0]!.lost();
      await settle(50);
      expect(connections).toHaveLength(2);
      await subscriptions.shutdown(() => Promise.resolve(), false);
    });

    it('is ignored for a generation that is no longer current, and while stopping', async () => {
      const { subscriptions, connections, generations } = harness([succeed]);
      await subscriptions.subscribe();
      generations[0]!.lost();
      await vi.waitFor(() => expect(connections).toHaveLength(2));
      subscriptions.leave(generations[0]!, 0);
      await settle(50);
      expect(connections).toHaveLength(2);
      expect(generations[1]!.isCurrent()).toBe(true);
      // Committing first (AMQP 0-9-1), the subscription stays current until the core has closed:
      // a leave meanwhile must not retire it.
      let currentAtCloseCore: boolean | undefined;
      const stopping = subscriptions.shutdown(() => {
        currentAtCloseCore = generations[1]!.isCurrent();
        return Promise.resolve();
      }, true);
      subscriptions.leave(generations[1]!, 0);
      await stopping;
      expect(currentAtCloseCore).toBe(true);
      await settle(50);
      expect(connections).toHaveLength(2);
    });

    it('a shutdown during the wait ends it at once and subscribes no more', async () => {
      const { subscriptions, connections, generations } = harness([succeed]);
      await subscriptions.subscribe();
      subscriptions.leave(generations[0]!, 60_000);
      await vi.waitFor(() => expect(connections[0]!.closed).toBe(true));
      const started = performance.now();
      await subscriptions.shutdown(() => Promise.resolve(), false);
      expect(performance.now() - started).toBeLessThan(5_000);
      await settle(50);
      expect(connections).toHaveLength(1);
    });
  });
});
