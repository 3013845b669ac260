/**
 * A partition's first batch ever (docs/design.md §12): its genesis is appended, then read back to
 * learn whose genesis the changelog kept. The read-back's connection is opened while the genesis is
 * appended, not after it landed: one connect less before the partition's first commit (issue 39,
 * the group against the raw super stream consumer). It reads only after the genesis landed, and a
 * connection not used (the genesis fenced) is closed.
 */
import { describe, expect, it, vi } from 'vitest';
import type { Client } from 'rabbitmq-stream-js-client';
import { GENESIS_ID } from '../../src/group/changelog-entry.js';
import { changelogProducerName, partitionNamespace } from '../../src/group/consumer.js';
import { encodeOffset, offsetKey } from '../../src/store/consumer-keys.js';

const h = vi.hoisted(() => ({
  /** IDs appended, in order. */
  sent: [] as bigint[],
  /** The genesis append's outcome, given by the test. */
  genesis: undefined as ((outcome: 'landed' | 'fenced') => void) | undefined,
  /** Genesis read-backs. */
  readBacks: 0,
}));

vi.mock('../../src/group/changelog-writer.js', () => ({
  ChangelogWriter: class {
    get maxEntryBytes(): number {
      return 1_000_000;
    }
    warmUp(): void {}
    close(): Promise<void> {
      return Promise.resolve();
    }
    append(_entry: Buffer, id: bigint): Promise<'landed' | 'fenced'> {
      h.sent.push(id);
      if (id === 1n) return new Promise((resolve) => (h.genesis = resolve));
      return Promise.resolve('landed');
    }
  },
}));
vi.mock('../../src/group/snapshot-restore.js', () => ({
  // An empty changelog: the partition's first batch writes the genesis.
  restoreWithSnapshots: () =>
    Promise.resolve({ offset: undefined, start: undefined, read: 0, applied: 0, changelogLastId: 0n }),
}));
vi.mock('../../src/group/restore.js', async (orig) => ({
  ...(await orig<object>()),
  readGenesis: () => {
    h.readBacks++;
    return Promise.resolve(0n);
  },
}));

import { ChangelogStrategy } from '../../src/group/changelog-strategy.js';
import { resolveVerifyingConsumerOptions } from '../../src/consumer/options.js';
import type { JournalEntry } from '../../src/consumer/commit-pipeline.js';

const NAMESPACE = partitionNamespace('billing', 'orders-0');

async function firstBatch() {
  h.sent.length = 0;
  h.genesis = undefined;
  h.readBacks = 0;
  const connects: number[] = [];
  let closed = 0;
  const restarts: string[] = [];
  const host = {
    partition: 'orders-0',
    consumerName: 'billing',
    stats: { fenced: 0, snapshotsWritten: 0, snapshotRestores: 0 },
    log: { info: () => undefined, warn: () => undefined, debug: () => undefined, error: () => undefined },
    epoch: 1,
    restart: (why: string) => restarts.push(why),
    fail: (err: Error) => expect.fail(err.message),
    connectReader: () => {
      connects.push(h.sent.length);
      return Promise.resolve({ close: () => Promise.resolve(void closed++) } as unknown as Client);
    },
  };
  const settings = {
    partition: 'orders-0',
    consumerName: 'billing',
    namespace: NAMESPACE,
    changelog: 'orders-0.billing.changelog',
    changelogProducer: changelogProducerName('billing'),
    consumer: resolveVerifyingConsumerOptions({
      consumerName: 'billing',
      store: '/nonexistent',
      handler: () => undefined,
    }),
    subscription: { connectTimeoutMs: 1_000, reconnect: { initialDelayMs: 1, maxDelayMs: 5 } },
    appendTimeoutMs: 1_000,
    appendsInFlight: 4,
    restoreTimeoutMs: 1_000,
  };
  const strategy = new ChangelogStrategy(settings as never, { db: {}, sync: false } as never, host as never);
  let journal: ((entry: JournalEntry) => Promise<void>) | undefined;
  const plan = await strategy.activate({
    epoch: 1,
    current: () => true,
    openCore: (j) => {
      journal = j;
      return Promise.resolve({ committedOffset: undefined } as never);
    },
  });
  // The restore's reader is not the read-back's.
  connects.length = 0;
  closed = 0;
  expect(plan.accept(0n)).toBe(true);
  const journaled = journal!({
    ops: [{ type: 'put', key: offsetKey(NAMESPACE), value: encodeOffset(0n) }],
    lastOffset: 0n,
    baseOffset: undefined,
  });
  journaled.catch(() => undefined);
  // The genesis is on its way, not answered.
  await vi.waitFor(() => expect(h.genesis).toBeDefined());
  return { journaled, connects, closed: () => closed, restarts };
}

describe('a partition’s genesis and its read-back', () => {
  it('connects the read-back’s reader while the genesis is appended, and reads only once it landed', async () => {
    const { journaled, connects, closed } = await firstBatch();
    // Connected as the genesis was handed to the writer (nothing appended before it), which has not
    // answered; nothing read yet.
    expect(connects).toEqual([0]);
    expect(h.sent).toEqual([GENESIS_ID]);
    expect(h.readBacks).toBe(0);
    h.genesis!('landed');
    await journaled;
    expect(h.readBacks).toBe(1);
    // The genesis, then the batch's entry (ID = last offset + 2).
    expect(h.sent).toEqual([GENESIS_ID, 2n]);
    expect(closed()).toBe(1);
  });

  it('closes the reader when the genesis is fenced (another member’s genesis kept), reading nothing', async () => {
    const { journaled, closed, restarts } = await firstBatch();
    h.genesis!('fenced');
    await expect(journaled).rejects.toThrow(/fenced/);
    expect(h.readBacks).toBe(0);
    expect(h.sent).toEqual([GENESIS_ID]);
    await vi.waitFor(() => expect(closed()).toBe(1));
    expect(restarts).toHaveLength(1);
  });
});
