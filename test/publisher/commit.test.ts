import { describe, expect, it } from 'vitest';
import { GroupCommitter } from '../../src/publisher/commit.js';
import { Entry } from '../../src/publisher/entry.js';
import { PendingQueue } from '../../src/publisher/pending.js';
import type { ReconcilePlan } from '../../src/publisher/reconcile.js';
import { SkipDeclaration } from '../../src/publisher/skip.js';
import { DedupStore, type KeyValueDb, type ProducerState } from '../../src/store/store.js';
import { memoryDisk, passThroughDb } from '../support/memory-store.js';

/** A store over a memory disk whose next batch can be made to fail (a disk full for a moment). */
async function failingStore(): Promise<{ store: DedupStore; failNext: () => void }> {
  const disk = memoryDisk() as unknown as KeyValueDb;
  let fail = false;
  const db = passThroughDb(disk, {
    batch: (ops, options) => {
      if (!fail) return disk.batch(ops, options);
      fail = false;
      return Promise.reject(new Error('no space left on device'));
    },
  });
  return { store: await DedupStore.wrap(db), failNext: () => (fail = true) };
}

/** A committer for a fresh producer (outbox durability, automatic IDs). */
function committer(state: ProducerState): GroupCommitter {
  const plan: ReconcilePlan = {
    kind: 'resume',
    start: 0n,
    localLast: 0n,
    reservedUpTo: 0n,
    outboxHigh: 0n,
    skipFrom: undefined,
    forgetKeysAbove: undefined,
  };
  const options = { durability: 'outbox', idMode: 'auto', reserveBlock: 1_000 } as const;
  return new GroupCommitter(
    state,
    options,
    plan,
    new SkipDeclaration(undefined),
    undefined,
    new PendingQueue<Entry>(),
    undefined,
  );
}

const entry = (id: bigint): Entry => new Entry(id, Buffer.from(`m${id}`), undefined, undefined);

describe('GroupCommitter', () => {
  it('a failed re-assignment write leaves the replaced segments to the next open: a later write does not delete them', async () => {
    // The write that replaces segments (an adopting open) carries their new copies; if it fails
    // and a later write succeeded with the old segments' deletes handed back, their messages would
    // be in no segment at all.
    const { store, failNext } = await failingStore();
    const state = store.claimProducer('orders', 'p');
    await state.load();
    const commits = committer(state);
    await commits.write([entry(1n), entry(2n)]);
    commits.replaceSegments([1n]);
    failNext();
    await expect(commits.write([entry(3n), entry(4n)], true)).rejects.toThrow('no space left');
    await commits.write([]);
    const { segments } = await state.load();
    expect(segments.map((s) => s.firstId)).toEqual([1n]);
    expect(segments[0]!.entries.map((e) => e.publishingId)).toEqual([1n, 2n]);
    state.release();
  });

  it('a failed write hands its confirmed segments back: the next write deletes them', async () => {
    const { store, failNext } = await failingStore();
    const state = store.claimProducer('orders', 'p');
    await state.load();
    const commits = committer(state);
    const [a, b] = [entry(1n), entry(2n)];
    await commits.write([a, b]);
    commits.confirmed(a);
    commits.confirmed(b);
    failNext();
    await expect(commits.write([entry(3n)])).rejects.toThrow('no space left');
    expect(commits.hasConfirmWork).toBe(true);
    await commits.write([]);
    const { segments } = await state.load();
    expect(segments.map((s) => s.firstId)).toEqual([]);
    state.release();
  });
});
