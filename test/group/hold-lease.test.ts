/**
 * A group member's hold lease (src/group/hold-lease.ts, docs/design.md §12 "After a pause") in the
 * commit pipeline, with a fake clock and a fake round trip: a member paused after a batch was
 * decided — its changelog entry landed, or its store write under way — neither writes nor reports
 * it after the pause unless a new round trip on its subscription shows it still holds the partition
 * (consumer-group-crash's pause case at appendsInFlight 4, 1 run in 3, made deterministic).
 */
import { describe, expect, it } from 'vitest';
import { CommitPipeline, type JournalEntry } from '../../src/consumer/commit-pipeline.js';
import type { ConsumerStore, StoreBatch } from '../../src/consumer/consumer-store.js';
import type { ResolvedVerifyingConsumerOptions } from '../../src/consumer/options.js';
import type { VerifyStats } from '../../src/consumer/types.js';
import { HoldLease, LEASE_MS, MAX_STALE_ANSWERS, pauseClock } from '../../src/group/hold-lease.js';

interface Deferred {
  readonly entry: JournalEntry;
  resolve(): void;
}

/** A round trip the test answers (or fails) by hand. */
interface Trip {
  answer(): void;
  fail(error: Error): void;
}

/** `ahead`: each batch's journal sends the round trip ahead, as a group partition's does (partition.ts). */
function setUp(journalDepth: number, ahead = false) {
  let now = 0;
  const journaled: Deferred[] = [];
  /** Store writes begun, and the ones the test completes by hand (a LevelDB write under way). */
  const writes: Array<{ lastOffset: bigint; done: () => void }> = [];
  const reported: bigint[] = [];
  const stops: Error[] = [];
  const trips: Trip[] = [];
  const lost: string[] = [];
  let current = true;
  const store: ConsumerStore = {
    committedOffset: undefined,
    committedChunk: undefined,
    get: () => Promise.resolve(undefined),
    enter: () => undefined,
    handlerContext: () => undefined,
    write: (batch: StoreBatch) =>
      new Promise<void>((resolve) => writes.push({ lastOffset: batch.lastOffset, done: resolve })),
    discard: () => undefined,
    close: () => Promise.resolve(),
  };
  const lease = new HoldLease({
    partition: 'p0',
    clock: () => now,
    isCurrent: () => current,
    roundTrip: () => new Promise<void>((answer, fail) => trips.push({ answer, fail })),
    lost: (why) => {
      lost.push(why);
      current = false;
    },
  });
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
      hooks: { afterCommit: (info: { lastOffset: bigint }) => reported.push(info.lastOffset) },
    } as unknown as ResolvedVerifyingConsumerOptions,
    stats: { commits: 0 } as VerifyStats,
    onStop: (error) => stops.push(error),
    journal: (entry) => {
      if (ahead) lease.proveAhead();
      return new Promise<void>((resolve) => journaled.push({ entry, resolve }));
    },
    journalDepth,
    gate: () => lease.gate(),
  });
  const message = (offset: bigint): void => {
    pipeline.beginMessage();
    pipeline.putEffect(`k${offset}`, String(offset));
    void pipeline.endMessage(offset, undefined);
  };
  return {
    pipeline,
    lease,
    journaled,
    writes,
    reported,
    stops,
    trips,
    lost,
    message,
    advance: (ms: number) => (now += ms),
    hearLoss: () => (current = false),
  };
}

/** Lets every queued promise callback run. */
const settle = (): Promise<void> => new Promise((resolve) => setImmediate(resolve));

/** An activation's first batch: proves the hold once (answered), written and reported. */
async function firstBatch(t: ReturnType<typeof setUp>): Promise<void> {
  t.message(0n);
  t.message(1n);
  await settle();
  t.journaled[0]!.resolve();
  await settle();
  expect(t.trips).toHaveLength(1); // nothing proven yet at an activation
  t.trips[0]!.answer();
  await settle();
  t.writes[0]!.done();
  await settle();
  expect(t.reported).toEqual([1n]);
}

describe('group partition - hold lease before each local write and commit report', () => {
  for (const depth of [4, 1]) {
    it(`depth ${depth}: a batch whose store write was under way when the process stopped is not reported after it resumes, and nothing after it is written`, async () => {
      const t = setUp(depth);
      await firstBatch(t);
      t.message(2n);
      t.message(3n);
      await settle();
      t.journaled[1]!.resolve(); // decided (landed) before the stop
      await settle();
      expect(t.writes.map((w) => w.lastOffset)).toEqual([1n, 3n]); // its LevelDB write under way
      if (depth > 1) {
        t.message(4n);
        t.message(5n); // the stop comes in this batch's beforeCommit
        await settle();
        t.journaled[2]!.resolve();
      }
      // SIGSTOP past the heartbeat: the broker gives the partition to the other member.
      t.advance(6_000);
      t.writes[1]!.done(); // SIGCONT: the write completes before the closed connection is read
      await settle();
      expect(t.trips).toHaveLength(2);
      t.trips[1]!.fail(new Error('connection closed'));
      await t.pipeline.idle();
      expect(t.reported).toEqual([1n]);
      expect(t.pipeline.committedOffset).toBe(1n);
      expect(t.writes.map((w) => w.lastOffset)).toEqual([1n, 3n]);
      expect(t.lost).toHaveLength(1);
      expect(t.stops.map((e) => e.name)).toEqual(['PartitionMoved']);
    });

    it(`depth ${depth}: a batch decided before the process stopped is not written after it resumes unless a new round trip proves the hold`, async () => {
      const t = setUp(depth);
      await firstBatch(t);
      t.message(2n);
      t.message(3n);
      await settle();
      t.advance(6_000); // stopped after the batch's entry was decided, before its write
      t.journaled[1]!.resolve();
      await settle();
      expect(t.writes).toHaveLength(1);
      t.trips[1]!.fail(new Error('connection closed'));
      await t.pipeline.idle();
      expect(t.writes.map((w) => w.lastOffset)).toEqual([1n]);
      expect(t.reported).toEqual([1n]);
    });
  }

  it('a stop after which the partition is still held: one round trip, then the batch is written and reported', async () => {
    const t = setUp(4);
    await firstBatch(t);
    t.message(2n);
    t.message(3n);
    await settle();
    t.advance(6_000);
    t.journaled[1]!.resolve();
    await settle();
    t.trips[1]!.answer();
    await settle();
    t.writes[1]!.done();
    await t.pipeline.idle();
    expect(t.reported).toEqual([1n, 3n]);
    expect(t.trips).toHaveLength(2);
    expect(t.lost).toEqual([]);
  });

  it('within the lease no round trip is waited for; past half of it one is sent ahead and the write does not wait for it', async () => {
    const t = setUp(4);
    await firstBatch(t);
    t.advance(LEASE_MS / 2 - 1);
    t.message(2n);
    t.message(3n);
    await settle();
    t.journaled[1]!.resolve();
    await settle();
    t.writes[1]!.done();
    await settle();
    expect(t.reported).toEqual([1n, 3n]);
    expect(t.trips).toHaveLength(1);
    t.advance(2);
    t.message(4n);
    t.message(5n);
    await settle();
    t.journaled[2]!.resolve();
    await settle();
    expect(t.trips).toHaveLength(2); // sent ahead, never answered here
    t.writes[2]!.done();
    await t.pipeline.idle();
    expect(t.reported).toEqual([1n, 3n, 5n]);
  });

  it('a loss heard during the store write: the batch is not reported, without a round trip', async () => {
    const t = setUp(4);
    await firstBatch(t);
    t.message(2n);
    t.message(3n);
    await settle();
    t.journaled[1]!.resolve();
    await settle();
    t.hearLoss();
    t.writes[1]!.done();
    await t.pipeline.idle();
    expect(t.reported).toEqual([1n]);
    expect(t.trips).toHaveLength(1);
  });

  // rev5, finding L1: the process stops after the round trip was SENT and before its answer was
  // read. The broker answers, times the member out and moves the partition; on resume the answer
  // is first in the socket buffer (the close comes after it), so it is read while the activation
  // still looks current. The answer is 10 s old news: the hold it proves ended long ago.
  it('an answer read after the lease ran out (a stop between sending the round trip and reading its answer) proves nothing: the batch is not written on it', async () => {
    const t = setUp(4);
    await firstBatch(t);
    t.message(2n);
    t.message(3n);
    await settle();
    t.advance(6_000);
    t.journaled[1]!.resolve();
    await settle();
    expect(t.trips).toHaveLength(2); // sent now; the process stops right after
    t.advance(10_000); // stopped 10 s: the broker moved the partition meanwhile
    t.trips[1]!.answer(); // the answer was already in the socket buffer
    await settle();
    // Not written on a proof sent 10 s ago (> LEASE_MS): a fresh round trip must decide.
    expect(t.writes).toHaveLength(1);
  });

  // rev5, finding L1 on the report path: the round trip sent AHEAD (past half the lease) before a
  // stop during the store write is the one the report waits for after it; its answer, read first on
  // resume, is taken as proof although it was sent 10 s before.
  it('a round trip sent ahead before a stop during the store write does not let the batch be reported after the stop', async () => {
    const t = setUp(4);
    await firstBatch(t);
    t.advance(LEASE_MS / 2 + 50); // past half the lease: the next gate sends a round trip ahead
    t.message(2n);
    t.message(3n);
    await settle();
    t.journaled[1]!.resolve();
    await settle();
    expect(t.trips).toHaveLength(2); // sent ahead; the write began without waiting
    expect(t.writes).toHaveLength(2);
    t.advance(10_000); // stopped during the LevelDB write; the partition moved meanwhile
    t.writes[1]!.done();
    await settle();
    t.trips[1]!.answer(); // answered before the broker closed the connection: read first
    await settle();
    expect(t.reported).toEqual([1n]);
  });

  it(`a broker that answers every round trip later than the bound: after ${MAX_STALE_ANSWERS} stale answers the hold is lost, the batch dropped (the gate does not wait for ever)`, async () => {
    const t = setUp(4);
    await firstBatch(t);
    t.message(2n);
    t.message(3n);
    await settle();
    t.advance(6_000);
    t.journaled[1]!.resolve();
    await settle();
    for (let i = 1; i <= MAX_STALE_ANSWERS; i++) {
      expect(t.trips).toHaveLength(1 + i);
      t.advance(LEASE_MS + 1);
      t.trips[i]!.answer();
      await settle();
    }
    expect(t.lost).toHaveLength(1); // not a fourth round trip waited for: the hold is lost
    expect(t.trips).toHaveLength(1 + MAX_STALE_ANSWERS);
    await t.pipeline.idle();
    expect(t.writes.map((w) => w.lastOffset)).toEqual([1n]);
    expect(t.reported).toEqual([1n]);
    expect(t.lost).toHaveLength(1);
    expect(t.stops.map((e) => e.name)).toEqual(['PartitionMoved']);
  });

  it('a round trip sent as the batch is journaled: the write waits for its append only, not for a round trip after it', async () => {
    const t = setUp(4, true);
    t.message(0n);
    t.message(1n);
    await settle();
    // Sent with the entry (an activation's first batch: nothing proven yet), answered before the append.
    expect(t.trips).toHaveLength(1);
    t.trips[0]!.answer();
    await settle();
    t.journaled[0]!.resolve();
    await settle();
    expect(t.writes.map((w) => w.lastOffset)).toEqual([1n]);
    expect(t.trips).toHaveLength(1);
    t.writes[0]!.done();
    await settle();
    expect(t.reported).toEqual([1n]);
    // Within half the lease the next batch sends none; later one goes with its entry again.
    t.message(2n);
    t.message(3n);
    await settle();
    expect(t.trips).toHaveLength(1);
    t.advance(LEASE_MS);
    t.message(4n);
    t.message(5n);
    await settle();
    expect(t.trips).toHaveLength(2);
  });

  it('a round trip sent ahead and answered after a stop proves nothing: the batch waits for a fresh one', async () => {
    const t = setUp(1, true);
    t.message(0n);
    t.message(1n);
    await settle();
    expect(t.trips).toHaveLength(1);
    // Stopped between the send and the read of its answer, past the bound.
    t.advance(6_000);
    t.trips[0]!.answer();
    t.journaled[0]!.resolve();
    await settle();
    expect(t.writes).toEqual([]);
    expect(t.trips).toHaveLength(2);
    t.trips[1]!.fail(new Error('connection closed'));
    await t.pipeline.idle();
    expect(t.writes).toEqual([]);
    expect(t.reported).toEqual([]);
    expect(t.lost).toHaveLength(1);
  });

  it('pauseClock never goes back and counts a forward jump of the wall clock (a suspended machine)', () => {
    const realNow = Date.now;
    try {
      let wall = realNow();
      Date.now = () => wall;
      const clock = pauseClock();
      const a = clock();
      wall += 60_000;
      const b = clock();
      wall -= 120_000;
      const c = clock();
      expect(b - a).toBeGreaterThanOrEqual(60_000);
      expect(c).toBeGreaterThanOrEqual(b);
    } finally {
      Date.now = realNow;
    }
  });
});
