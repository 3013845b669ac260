/**
 * Changelog snapshots with pipelined appends (appendsInFlight > 1, design §12 and §12.1): a snapshot
 * is of the store's state, and is referenced only while that state's entry is the changelog's latest.
 * With batches in flight, the batch before the one being journaled is often sent but not yet in the
 * store: a snapshot taken then is skipped (its entry is no longer the latest), so before the merge's
 * wait for that batch's store write a member at depth 4 wrote no snapshot at all.
 */
import { describe, expect, it, vi } from 'vitest';
import type { Client } from 'rabbitmq-stream-js-client';
import type { JournalEntry } from '../../src/consumer/commit-pipeline.js';
import { entryId } from '../../src/group/changelog-entry.js';
import { changelogProducerName, partitionNamespace } from '../../src/group/consumer.js';
import { snapshotProducerName } from '../../src/group/snapshot-entry.js';
import { effectKeyPrefix, encodeOffset, offsetKey } from '../../src/store/consumer-keys.js';
import { FakeChangelog } from '../support/changelog-client.js';

/** What the fake writers appended, in order: it lands when appended, is confirmed a turn later. */
const h = vi.hoisted(() => ({
  sent: [] as Array<{ producer: string; id: bigint }>,
}));

vi.mock('../../src/group/changelog-writer.js', () => ({
  ChangelogWriter: class {
    readonly #producer: string;
    constructor(options: { producerName: string }) {
      this.#producer = options.producerName;
    }
    get maxEntryBytes(): number {
      return 1_000_000;
    }
    warmUp(): void {}
    close(): Promise<void> {
      return Promise.resolve();
    }
    append(_message: Buffer, id: bigint): Promise<'landed'> {
      h.sent.push({ producer: this.#producer, id });
      return new Promise((resolve) => setImmediate(() => resolve('landed')));
    }
  },
}));
vi.mock('../../src/group/snapshot-restore.js', () => ({
  restoreWithSnapshots: () =>
    Promise.resolve({ offset: undefined, start: 0n, read: 0, applied: 0, changelogLastId: 0n }),
}));

import { ChangelogStrategy } from '../../src/group/changelog-strategy.js';
import { resolveVerifyingConsumerOptions } from '../../src/consumer/options.js';

const NAMESPACE = partitionNamespace('billing', 'orders');
const OURS = changelogProducerName('billing');
const SNAP = snapshotProducerName(OURS);
const DEPTH = 4;
const BATCHES = 24;

/** The last ID the fake changelog holds of `producer`. */
const lastId = (producer: string): bigint =>
  h.sent.reduce((m, r) => (r.producer === producer && r.id > m ? r.id : m), 0n);

describe('changelog snapshots with appendsInFlight 4', () => {
  it('a due snapshot waits for the batch before it to be in the store, and is written', async () => {
    h.sent.length = 0;
    const db = new FakeChangelog([]).db(NAMESPACE);
    let reference: bigint | undefined;
    const client = {
      locatorConnection: {
        queryPublisherSequence: ({ publisherRef }: { publisherRef: string }) =>
          Promise.resolve(lastId(publisherRef)),
        storeOffset: ({ offsetValue }: { offsetValue: bigint }) => {
          reference = offsetValue;
          return Promise.resolve();
        },
      },
      streamStatsRequest: () =>
        Promise.resolve({ firstChunkId: 0n, committedChunkId: BigInt(h.sent.length), lastChunkId: 0n }),
      close: () => Promise.resolve(void readersClosed++),
    } as unknown as Client;
    let readers = 0;
    let readersClosed = 0;
    const stats = { snapshotsWritten: 0, snapshotRestores: 0, fenced: 0 };
    const skipped: unknown[] = [];
    const log = {
      info: (fields: { why?: string }, message: string) => {
        if (message.includes('snapshot skipped')) skipped.push(fields.why);
      },
      warn: () => undefined,
      debug: () => undefined,
      error: () => undefined,
    };
    const host = {
      partition: 'orders-0',
      consumerName: 'billing',
      stats,
      log,
      epoch: 1,
      restart: () => expect.fail('restarted'),
      fail: (err: Error) => expect.fail(err.message),
      connectReader: () => {
        readers++;
        return Promise.resolve(client);
      },
    };
    const settings = {
      partition: 'orders-0',
      consumerName: 'billing',
      namespace: NAMESPACE,
      changelog: 'orders-0.billing.changelog',
      changelogProducer: OURS,
      consumer: resolveVerifyingConsumerOptions({
        consumerName: 'billing',
        store: '/nonexistent',
        handler: () => Promise.resolve(),
      }),
      subscription: { connectTimeoutMs: 1_000, reconnect: { initialDelayMs: 1, maxDelayMs: 5 } },
      appendTimeoutMs: 1_000,
      appendsInFlight: DEPTH,
      restoreTimeoutMs: 1_000,
      snapshots: { everyEntries: 2, everyBytes: 0 },
    };
    const strategy = new ChangelogStrategy(settings as never, { db, sync: false } as never, host as never);

    // The core as the commit pipeline drives it at depth 4: up to 4 batches journaled at once, each
    // written to the store after its own journal and the write before it.
    let committed: bigint | undefined;
    const waiters: Array<{ offset: bigint; resolve: () => void }> = [];
    const core = {
      get committedOffset() {
        return committed;
      },
      waitForOffset: (offset: bigint) =>
        committed !== undefined && committed >= offset
          ? Promise.resolve()
          : new Promise<void>((resolve) => waiters.push({ offset, resolve })),
    };
    let journal: ((entry: JournalEntry) => Promise<void>) | undefined;
    await strategy.activate({
      epoch: 1,
      current: () => true,
      openCore: (j) => {
        journal = j;
        return Promise.resolve(core as never);
      },
    });
    let previousWrite: Promise<void> = Promise.resolve();
    const inFlight = new Set<Promise<void>>();
    for (let o = 0; o < BATCHES; o++) {
      while (inFlight.size >= DEPTH) await Promise.race(inFlight);
      const offset = BigInt(o);
      const ops = [
        { type: 'put' as const, key: `${effectKeyPrefix(NAMESPACE)}k${o % 3}`, value: Buffer.from([o]) },
        { type: 'put' as const, key: offsetKey(NAMESPACE), value: encodeOffset(offset) },
      ];
      const journaled = journal!({ ops, lastOffset: offset, baseOffset: o === 0 ? undefined : offset - 1n });
      const before = previousWrite;
      const write = (async () => {
        await before;
        await journaled;
        await db.batch(ops);
        committed = offset;
        for (const w of waiters.splice(0)) {
          if (w.offset <= offset) w.resolve();
          else waiters.push(w);
        }
      })();
      previousWrite = write;
      inFlight.add(write);
      void write.finally(() => inFlight.delete(write));
    }
    await Promise.all(inFlight);

    expect(committed).toBe(BigInt(BATCHES - 1));
    // Every snapshot was of a state whose entry was then the latest: none skipped, one every 2 entries.
    expect(stats.snapshotsWritten).toBeGreaterThanOrEqual(BATCHES / 8);
    expect(skipped).toEqual([]);
    expect(reference).toBeDefined();
    // The entries went in order, every snapshot between the entry of its state and the next one.
    const entries = h.sent.filter((r) => r.producer === OURS).map((r) => r.id);
    expect(entries).toEqual(Array.from({ length: BATCHES }, (_, o) => entryId(BigInt(o))));
    expect(lastId(SNAP)).toBeGreaterThan(0n);
    // One reader client for every snapshot (a connect each was ~50 ms of the commit path's wait),
    // closed by close(); the activation's restore reader is the other one.
    expect(stats.snapshotsWritten).toBeGreaterThan(1);
    expect(readers).toBe(2);
    await strategy.close();
    expect(readersClosed).toBe(2);
  });
});
