/**
 * The commit pipeline's pipelined journal (`journalDepth`, a consumer group's `appendsInFlight`;
 * docs/design.md §12): batch n + 1 is journaled while batch n waits for its journal, the store
 * writes stay one at a time and in order, and a batch after one whose journal failed is never
 * written.
 */
import { describe, expect, it } from 'vitest';
import { CommitPipeline, type JournalEntry } from '../../src/consumer/commit-pipeline.js';
import type { ConsumerStore, StoreBatch } from '../../src/consumer/consumer-store.js';
import type { ResolvedVerifyingConsumerOptions } from '../../src/consumer/options.js';
import type { VerifyStats } from '../../src/consumer/types.js';

interface Deferred {
  readonly entry: JournalEntry;
  resolve(): void;
  reject(error: Error): void;
}

function setUp(journalDepth: number) {
  const journaled: Deferred[] = [];
  const written: bigint[] = [];
  const stops: Error[] = [];
  const store: ConsumerStore = {
    committedOffset: undefined,
    committedChunk: undefined,
    get: () => Promise.resolve(undefined),
    enter: () => undefined,
    handlerContext: () => undefined,
    write: (batch: StoreBatch) => {
      written.push(batch.lastOffset);
      return Promise.resolve();
    },
    discard: () => undefined,
    close: () => Promise.resolve(),
  };
  const pipeline = new CommitPipeline({
    store,
    offsetKey: 'offset',
    committedOffset: undefined,
    committedChunk: undefined,
    scopes: { stage: () => () => undefined, discard: () => undefined },
    options: {
      commit: 'batch',
      commitEvery: 2,
      commitLingerMs: 60_000,
      hooks: undefined,
    } as unknown as ResolvedVerifyingConsumerOptions,
    stats: { commits: 0 } as VerifyStats,
    onStop: (error) => stops.push(error),
    journal: (entry) => new Promise<void>((resolve, reject) => journaled.push({ entry, resolve, reject })),
    journalDepth,
  });
  /** One message at `offset` that writes `key`. */
  const message = (offset: bigint, key: string): void => {
    pipeline.beginMessage();
    pipeline.putEffect(key, String(offset));
    void pipeline.endMessage(offset, undefined);
  };
  return { pipeline, journaled, written, stops, message };
}

/** Lets every queued promise callback run. */
const settle = (): Promise<void> => new Promise((resolve) => setImmediate(resolve));

describe('commit pipeline - pipelined journal (journalDepth)', () => {
  it('journals batch 2 while batch 1 waits for its journal, and writes them in order once both resolved', async () => {
    const { pipeline, journaled, written, message } = setUp(2);
    message(0n, 'a');
    message(1n, 'b');
    message(2n, 'c');
    message(3n, 'a');
    await settle();
    // Both batches handed to the journal; nothing written yet.
    expect(journaled.map((j) => [j.entry.baseOffset, j.entry.lastOffset])).toEqual([
      [undefined, 1n],
      [1n, 3n],
    ]);
    expect(written).toEqual([]);
    // A handler of the next batch reads batch 2's write of `a`, not batch 1's.
    expect(pipeline.pendingEffect('a')).toEqual({ type: 'put', key: 'a', value: '3' });
    expect(pipeline.pendingEffect('b')).toEqual({ type: 'put', key: 'b', value: '1' });
    // Batch 2's journal resolves first: it still waits for batch 1.
    journaled[1]!.resolve();
    await settle();
    expect(written).toEqual([]);
    journaled[0]!.resolve();
    await pipeline.idle();
    expect(written).toEqual([1n, 3n]);
    expect(pipeline.committedOffset).toBe(3n);
  });

  it('never writes batch 2 when batch 1’s journal fails (fenced), even though batch 2’s journal resolved', async () => {
    const { pipeline, journaled, written, stops, message } = setUp(3);
    for (let o = 0n; o < 6n; o++) message(o, `k${o}`);
    await settle();
    expect(journaled).toHaveLength(3);
    journaled[1]!.resolve();
    journaled[2]!.resolve();
    await settle();
    journaled[0]!.reject(new Error('fenced'));
    await pipeline.idle();
    expect(written).toEqual([]);
    expect(pipeline.committedOffset).toBe(undefined);
    expect(stops.map((e) => e.message)).toEqual(['fenced']);
  });

  it('drops every batch after the first one not written, and keeps the ones before it', async () => {
    const { pipeline, journaled, written, message } = setUp(3);
    for (let o = 0n; o < 6n; o++) message(o, `k${o}`);
    await settle();
    journaled[0]!.resolve();
    journaled[2]!.resolve();
    journaled[1]!.reject(new Error('moved'));
    await pipeline.idle();
    expect(written).toEqual([1n]);
    expect(pipeline.committedOffset).toBe(1n);
  });

  it('with journalDepth 1, batch 2 is not journaled before batch 1 is written', async () => {
    const { pipeline, journaled, written, message } = setUp(1);
    for (let o = 0n; o < 4n; o++) message(o, `k${o}`);
    await settle();
    expect(journaled).toHaveLength(1);
    journaled[0]!.resolve();
    await settle();
    expect(written).toEqual([1n]);
    expect(journaled).toHaveLength(2);
    journaled[1]!.resolve();
    await pipeline.idle();
    expect(written).toEqual([1n, 3n]);
  });
});
