/**
 * revG's review of grp39 (b8a7626): the genesis read-back's reader is now connected while the
 * genesis is appended. When the partition moves meanwhile (epoch changed: a close, a loss), the
 * connect is left running in the background (`closeWhenOpen`): nothing waits for it, so the
 * strategy's close() returns while a reader connection is still being opened, and that connection
 * is opened — and only then closed, in the background, within 5 s — after close() returned.
 * Before, a moved partition never connected the read-back ("close() would wait for it").
 * REVIEW.md §4 (close() must leave nothing running) / §6 (resources on error paths). Now close()
 * waits for such a connect to end and its client to close.
 */
import { describe, expect, it, vi } from 'vitest';
import type { Client } from 'rabbitmq-stream-js-client';
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
vi.mock('../../src/group/changelog-head.js', async (orig) => ({
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

describe('the genesis read-back reader after the partition moved (revG)', () => {
  it('no reader connection is opened or left open after close() returned', async () => {
    let connecting = 0;
    /** Read-back connects started and not yet resolved. */
    let pending = 0;
    let opened = 0;
    let closed = 0;
    const host = {
      partition: 'orders-0',
      consumerName: 'billing',
      stats: { fenced: 0, snapshotsWritten: 0, snapshotRestores: 0 },
      log: { info: () => undefined, warn: () => undefined, debug: () => undefined, error: () => undefined },
      epoch: 1,
      restart: () => undefined,
      fail: (err: Error) => expect.fail(err.message),
      connectReader: () => {
        connecting++;
        // The restore's reader at once; the read-back's reader is slow to connect (a slow node).
        const client = { close: () => Promise.resolve(void closed++) } as unknown as Client;
        if (connecting === 1) return Promise.resolve(client);
        pending++;
        return new Promise<Client>((resolve) =>
          setTimeout(() => {
            pending--;
            opened++;
            resolve(client);
          }, 50),
        );
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
    const strategy = new ChangelogStrategy(
      settings as never,
      { db: {}, sync: false } as never,
      host as never,
    );
    let journal: ((entry: JournalEntry) => Promise<void>) | undefined;
    const plan = await strategy.activate({
      epoch: 1,
      current: () => true,
      openCore: (j) => {
        journal = j;
        return Promise.resolve({ committedOffset: undefined } as never);
      },
    });
    closed = 0;
    opened = 0;
    expect(plan.accept(0n)).toBe(true);
    const journaled = journal!({
      ops: [{ type: 'put', key: offsetKey(NAMESPACE), value: encodeOffset(0n) }],
      lastOffset: 0n,
      baseOffset: undefined,
    });
    journaled.catch(() => undefined);
    await vi.waitFor(() => expect(h.genesis).toBeDefined());
    // The partition moves (closing) while the genesis is appended; the append then ends.
    host.epoch = 2;
    h.genesis!('landed');
    await journaled.catch(() => undefined);
    await strategy.close();
    // close() returned: every reader connection the strategy started is settled and closed.
    expect({ pendingAtClose: pending, openAtClose: opened - closed }).toEqual({
      pendingAtClose: 0,
      openAtClose: 0,
    });
  });
});
