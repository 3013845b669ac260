import { describe, expect, it } from 'vitest';
import {
  VerifyingConsumerCore,
  type MessageHandler,
  type VerifyingConsumerOptions,
} from '../../src/consumer/core.js';
import { identityHeaders } from '../../src/identity/headers.js';
import { DedupStore } from '../../src/store/store.js';
import { ProcessDisk } from '../../property-tests/support/disk.js';
import { memoryDisk } from '../support/memory-store.js';
import type { IncomingMessage } from '../../src/consumer/types.js';

// Issue 15, item 1: a commit must never include a message whose handler has not returned. Every
// path that can begin a commit is tried while a handler is suspended between two of its writes:
// the linger behind a slow write, an explicit flush(), close(), commit: 'message', and eviction.

const credit = (offset: number, id: number, amount: number): IncomingMessage => ({
  offset: BigInt(offset),
  content: Buffer.from(String(amount)),
  applicationProperties: identityHeaders('a', BigInt(id)),
});
/** Credits 10, 20, 5 at offsets 0, 1, 2 (IDs 1, 2, 3): the balance is 35 once each took effect. */
const CREDITS = [credit(0, 1, 10), credit(1, 2, 20), credit(2, 3, 5)];

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
const turns = async (n = 20) => {
  for (let i = 0; i < n; i++) await new Promise((resolve) => setImmediate(resolve));
};

function deferred(): { promise: Promise<void>; resolve: () => void } {
  let resolve!: () => void;
  const promise = new Promise<void>((r) => (resolve = r));
  return { promise, resolve };
}

const number = (raw: Uint8Array | undefined) => Number(raw === undefined ? '0' : Buffer.from(raw).toString());

/**
 * Credits the balance, then awaits (a read of another key, or `pause` for the message at offset
 * `pauseAt`) before its second write, a count of applied credits; throws there when told to.
 */
function crediting(pauseAt: bigint, pause: Promise<void>, throwAt?: bigint): MessageHandler {
  return async (message, tx) => {
    tx.put('balance', String(number(await tx.get('balance')) + Number(message.body.toString())));
    if (message.offset === pauseAt) await pause;
    else await tx.get('other');
    if (message.offset === throwAt) throw new Error('boom');
    tx.put('count', String(number(await tx.get('count')) + 1));
  };
}

const plain: MessageHandler = crediting(-1n, Promise.resolve());

/** One process life on a disk that outlives it. */
async function life(disk: ReturnType<typeof memoryDisk>, options: Partial<VerifyingConsumerOptions>) {
  const processDisk = new ProcessDisk(disk);
  const core = await VerifyingConsumerCore.open({
    consumerName: 'balance-projection',
    store: await DedupStore.wrap(processDisk),
    handler: plain,
    ...options,
  });
  return { disk: processDisk, core };
}

/** A restart after a kill: redelivers from the committed offset and returns the committed effects. */
async function reopenAndFinish(disk: ReturnType<typeof memoryDisk>) {
  const { core } = await life(disk, { commit: 'message' });
  for (const message of CREDITS.slice(Number(core.resumeOffset ?? 0n))) await core.process(message);
  const balance = number(await core.readEffect('balance'));
  const count = number(await core.readEffect('count'));
  await core.close();
  return { balance, count };
}

describe('a commit never includes a handler that has not returned (issue 15, item 1)', () => {
  it('the linger waiting behind a slow write does not commit the first write of a suspended handler: kill and reopen apply each credit once', async () => {
    const disk = memoryDisk();
    const pause = deferred();
    const first = await life(disk, {
      commitEvery: 1,
      commitLingerMs: 1,
      handler: crediting(2n, pause.promise),
    });
    first.disk.hold(); // the first batch write is slow
    await first.core.process(CREDITS[0]!); // its commit starts, and is held
    await first.core.process(CREDITS[1]!); // waits behind it; the linger arms
    await sleep(10); // the linger fires: its flush() waits for the write in flight
    void first.core.process(CREDITS[2]!); // credits the balance, then waits for `pause`
    await turns();
    await first.disk.release(); // the held write completes
    await turns();
    await first.disk.crash(); // kill -9 while the third handler is suspended
    expect(await reopenAndFinish(disk)).toEqual({ balance: 35, count: 3 });
  });

  it('a handler that throws after its first write keeps nothing of it, even while a linger waits to commit', async () => {
    const disk = memoryDisk();
    const pause = deferred();
    const first = await life(disk, {
      commitEvery: 1,
      commitLingerMs: 1,
      handler: crediting(2n, pause.promise, 2n),
    });
    first.disk.hold();
    await first.core.process(CREDITS[0]!);
    await first.core.process(CREDITS[1]!);
    await sleep(10);
    const third = first.core.process(CREDITS[2]!)!;
    third.catch(() => undefined);
    await turns();
    await first.disk.release();
    await turns();
    pause.resolve();
    await expect(third).rejects.toThrow('boom');
    await first.core.close();
    // What is committed is whole messages and matches the offset: 10 at offset 0 (the failing
    // message's batch is dropped whole) or 30 at offset 1, never the failing handler's 35.
    const check = await life(disk, {});
    const offset = Number(check.core.committedOffset);
    expect(number(await check.core.readEffect('balance'))).toBe([10, 30][offset]);
    expect(number(await check.core.readEffect('count'))).toBe(offset + 1);
    await check.core.close();
    expect(await reopenAndFinish(disk)).toEqual({ balance: 35, count: 3 });
  });

  it('an explicit flush() while a handler is suspended waits for it and commits it whole', async () => {
    const disk = memoryDisk();
    const pause = deferred();
    const first = await life(disk, {
      commitEvery: 1_000,
      commitLingerMs: 60_000,
      handler: crediting(2n, pause.promise),
    });
    await first.core.process(CREDITS[0]!);
    await first.core.process(CREDITS[1]!);
    void first.core.process(CREDITS[2]!);
    await turns();
    let flushed = false;
    const flushing = first.core.flush().then(() => (flushed = true));
    await turns();
    expect(flushed).toBe(false); // not before the handler returned
    await first.disk.crash(); // killed: what was written before the kill counts
    void flushing;
    expect(await reopenAndFinish(disk)).toEqual({ balance: 35, count: 3 });
  });

  it('flush() resolves once the suspended handler returned and its message is durable', async () => {
    const disk = memoryDisk();
    const pause = deferred();
    const first = await life(disk, {
      commitEvery: 1_000,
      commitLingerMs: 60_000,
      handler: crediting(2n, pause.promise),
    });
    await first.core.process(CREDITS[0]!);
    await first.core.process(CREDITS[1]!);
    const third = first.core.process(CREDITS[2]!);
    await turns();
    const flushing = first.core.flush();
    pause.resolve();
    await third;
    await flushing;
    expect(first.core.committedOffset).toBe(2n);
    expect(number(await first.core.readEffect('balance'))).toBe(35);
    expect(number(await first.core.readEffect('count'))).toBe(3);
    await first.core.close();
  });

  it('close() while a handler is suspended commits nothing of it before it returned, refuses new messages, then commits it whole', async () => {
    const disk = memoryDisk();
    const pause = deferred();
    const first = await life(disk, {
      commitEvery: 1_000,
      commitLingerMs: 60_000,
      handler: crediting(2n, pause.promise),
    });
    await first.core.process(CREDITS[0]!);
    await first.core.process(CREDITS[1]!);
    const third = first.core.process(CREDITS[2]!);
    await turns();
    const closing = first.core.close();
    await turns();
    expect(() => first.core.process(credit(3, 4, 1))).toThrow(/closed/);
    expect(number(await first.core.readEffect('balance'))).toBe(0); // nothing committed yet
    pause.resolve();
    await third;
    await closing;
    expect(await reopenAndFinish(disk)).toEqual({ balance: 35, count: 3 });
  });

  it("commit: 'message' with a flush() racing a suspended handler applies each credit once", async () => {
    const disk = memoryDisk();
    const pause = deferred();
    const first = await life(disk, { commit: 'message', handler: crediting(2n, pause.promise) });
    first.disk.hold();
    const second = first.core.process(CREDITS[0]!)!; // waits for its held commit
    await turns();
    void first.core.flush();
    await first.disk.release();
    await second;
    await first.core.process(CREDITS[1]!);
    void first.core.process(CREDITS[2]!);
    await turns();
    void first.core.flush();
    await turns();
    await first.disk.crash();
    expect(await reopenAndFinish(disk)).toEqual({ balance: 35, count: 3 });
  });

  it('eviction while a handler is suspended neither crashes the consumer nor drops its scope from under it', async () => {
    const disk = memoryDisk();
    const pause = deferred();
    const first = await life(disk, {
      commitEvery: 1_000,
      commitLingerMs: 60_000,
      scopeTtlMs: 60_000,
      handler: crediting(2n, pause.promise),
    });
    await first.core.process(CREDITS[0]!);
    await first.core.process(CREDITS[1]!);
    await first.core.flush(); // the scope is committed and not in the pending batch
    const third = first.core.process(CREDITS[2]!);
    await turns();
    const evicting = first.core.evictIdle(Date.now() + 61_000);
    await turns();
    pause.resolve();
    await third;
    await evicting;
    await first.core.process(credit(3, 3, 5)); // a copy of ID 3: its scope remembers it
    await first.core.flush();
    expect(first.core.failure).toBeUndefined();
    expect(number(await first.core.readEffect('balance'))).toBe(35);
    await first.core.close();
  });
});

describe('a commit hook that throws stops the consumer and loses nothing', () => {
  it('beforeCommit: the batch is not written, the next one never goes, and a reopen applies each credit once', async () => {
    const disk = memoryDisk();
    let commits = 0;
    const first = await life(disk, {
      commitEvery: 1,
      hooks: {
        beforeCommit: () => {
          if (++commits === 2) throw new Error('hook failed');
        },
      },
    });
    await first.core.process(CREDITS[0]!);
    await first.core.flush();
    await first.core.process(CREDITS[1]!); // its commit's hook throws
    await turns();
    expect(first.core.failure?.message).toBe('hook failed');
    expect(() => first.core.process(CREDITS[2]!)).toThrow('hook failed');
    await first.core.close().catch(() => undefined);
    const check = await life(disk, {});
    expect(check.core.committedOffset).toBe(0n);
    expect(number(await check.core.readEffect('balance'))).toBe(10);
    await check.core.close();
    expect(await reopenAndFinish(disk)).toEqual({ balance: 35, count: 3 });
  });

  it('afterCommit: the batch stays committed and its offset is told, then the consumer stops', async () => {
    const disk = memoryDisk();
    const first = await life(disk, {
      commitEvery: 2,
      hooks: {
        afterCommit: () => {
          // A thrown non-Error whose toString is not a function: String() of it would throw.
          // eslint-disable-next-line @typescript-eslint/only-throw-error
          throw Object.assign(Object.create(null) as object, { toString: 'not a function' });
        },
      },
    });
    const told: bigint[] = [];
    first.core.onCommitted((offset) => told.push(offset));
    await first.core.process(CREDITS[0]!);
    await first.core.process(CREDITS[1]!); // the batch of two commits; the hook throws after it
    await turns();
    expect(told).toEqual([1n]);
    expect(first.core.failure?.message).toBe('hooks.afterCommit threw [object Object]');
    await first.core.close().catch(() => undefined);
    const check = await life(disk, {});
    expect(check.core.committedOffset).toBe(1n);
    expect(number(await check.core.readEffect('balance'))).toBe(30);
    await check.core.close();
    expect(await reopenAndFinish(disk)).toEqual({ balance: 35, count: 3 });
  });
});
