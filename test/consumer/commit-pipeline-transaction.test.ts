/**
 * The commit pipeline over a transactional store (the PostgreSQL store's contract, docs/design.md
 * §13): a batch cut by a message's end is handed to the store in that same call, so the next
 * message's enter() opens a new transaction instead of joining the one being committed. A write
 * begun a microtask later ran the next handler inside the batch being committed, revoked its
 * client under it ("used after the handler returned", postgres-crash.test.ts) and committed its
 * first statement with the wrong batch.
 */
import { describe, expect, it } from 'vitest';
import { CommitPipeline } from '../../src/consumer/commit-pipeline.js';
import type { ConsumerStore, StoreBatch } from '../../src/consumer/consumer-store.js';
import type { ResolvedVerifyingConsumerOptions } from '../../src/consumer/options.js';
import type { VerifyStats } from '../../src/consumer/types.js';

/** A store shaped like PgConsumerStore: one open transaction, taken by write(). */
function transactionalStore() {
  let next = 1;
  let open: number | undefined;
  const committed: Array<{ tx: number; lastOffset: bigint }> = [];
  const store: ConsumerStore = {
    committedOffset: undefined,
    committedChunk: undefined,
    get: () => Promise.resolve(undefined),
    // Ready at once while a transaction is open (PgConsumerStore.enter returns undefined then).
    enter: () => {
      open ??= next++;
      return undefined;
    },
    handlerContext: () => open,
    write: (batch: StoreBatch) => {
      const tx = open!;
      open = undefined;
      committed.push({ tx, lastOffset: batch.lastOffset });
      return Promise.resolve();
    },
    discard: () => (open = undefined),
    close: () => Promise.resolve(),
  };
  return { store, committed };
}

describe('commit pipeline - transactional store', () => {
  it('hands a batch to the store before the next message enters: its handler gets a new transaction', async () => {
    const { store, committed } = transactionalStore();
    const stops: Error[] = [];
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
    });
    const contexts: unknown[] = [];
    /** One message, processed as the core does: enter, the handler's context, a synchronous end. */
    const message = (offset: bigint): void => {
      pipeline.beginMessage();
      expect(store.enter()).toBeUndefined();
      contexts.push(store.handlerContext());
      void pipeline.endMessage(offset, undefined);
    };
    // Synchronously, as a chunk's deliveries (or a drain past duplicates) run one after another.
    message(0n);
    message(1n); // cuts batch [0, 1]
    message(2n);
    message(3n); // cuts batch [2, 3]
    await pipeline.idle();
    expect(committed).toEqual([
      { tx: 1, lastOffset: 1n },
      { tx: 2, lastOffset: 3n },
    ]);
    // Messages 2 and 3 ran in the second batch's transaction, not in the first one's.
    expect(contexts).toEqual([1, 1, 2, 2]);
    expect(stops).toEqual([]);
  });
});
