/**
 * A member's `open()` subscribes to its partitions several at a time, not one after the other: in
 * sequence its later partitions began up to (n − 1) subscriptions and activations after the first
 * (issue 39: the third of 3 partitions 0.57–1.15 s after the first on a loaded machine, in a read
 * of 1–2 s). The partitions here are fakes whose subscribe takes a few milliseconds.
 */
import { describe, expect, it, vi } from 'vitest';
import { memoryStore } from '../support/memory-store.js';

const h = vi.hoisted(() => ({
  partitions: [] as string[],
  /** Subscribes under way now, the most at once, and the partitions whose subscribe ended. */
  running: 0,
  most: 0,
  subscribed: [] as string[],
  closed: [] as string[],
  /** A partition whose subscribe is refused. */
  refuse: undefined as string | undefined,
}));

vi.mock('../../src/superstream/partitions.js', async (orig) => ({
  ...(await orig<object>()),
  Locator: class {
    partitions(): Promise<string[]> {
      return Promise.resolve(h.partitions);
    }
    existing(): Promise<Set<string>> {
      return Promise.resolve(new Set());
    }
    close(): Promise<void> {
      return Promise.resolve();
    }
  },
}));
vi.mock('../../src/group/partition.js', () => ({
  GroupPartition: class {
    readonly name: string;
    readonly isActive = false;
    constructor(settings: { partition: string }) {
      this.name = settings.partition;
    }
    async subscribe(): Promise<void> {
      h.most = Math.max(h.most, ++h.running);
      await new Promise((resolve) => setTimeout(resolve, 5));
      h.running--;
      if (this.name === h.refuse) throw new Error(`refused ${this.name}`);
      h.subscribed.push(this.name);
    }
    close(): Promise<void> {
      // Closed only once no subscribe is under way.
      expect(h.running).toBe(0);
      h.closed.push(this.name);
      return Promise.resolve();
    }
    onCommitted(): () => void {
      return () => undefined;
    }
  },
}));

import { SuperStreamVerifyingConsumer } from '../../src/group/consumer.js';

function reset(partitions: number, refuse?: number): void {
  h.partitions = Array.from({ length: partitions }, (_, i) => `orders-${i}`);
  h.running = 0;
  h.most = 0;
  h.subscribed = [];
  h.closed = [];
  h.refuse = refuse === undefined ? undefined : `orders-${refuse}`;
}

const open = async () =>
  SuperStreamVerifyingConsumer.open({
    superStream: 'orders',
    consumerName: 'billing',
    store: await memoryStore(),
    handler: () => undefined,
    connection: { hostname: '127.0.0.1', port: 1 },
  });

describe('consumer group member - open() subscribes to its partitions 8 at a time', () => {
  it('3 partitions: all three subscribe at once', async () => {
    reset(3);
    const member = await open();
    expect(h.most).toBe(3);
    expect(h.subscribed.sort()).toEqual(h.partitions);
    await member.close();
  });

  it('20 partitions: at most 8 at once, every one subscribed before open() returns', async () => {
    reset(20);
    const member = await open();
    expect(h.most).toBe(8);
    expect(h.subscribed).toHaveLength(20);
    await member.close();
  });

  it('a refused subscribe: open() rejects with it once the others of its group settled, and closes every partition', async () => {
    reset(12, 9);
    await expect(open()).rejects.toThrow('refused orders-9');
    // The first eight, then the other three of the second group: none of a later group begun.
    expect(h.subscribed).toHaveLength(11);
    expect(h.closed.sort()).toEqual([...h.partitions].sort());
  });
});
