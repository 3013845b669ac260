import { describe, expect, it } from 'vitest';
import { VerifyingConsumerCore, type VerifyingConsumerOptions } from '../../src/consumer/core.js';
import { identityHeaders } from '../../src/identity/headers.js';
import { DedupStore, type KeyValueDb } from '../../src/store/store.js';
import { memoryDisk, passThroughDb } from '../support/memory-store.js';
import type { IncomingMessage } from '../../src/consumer/types.js';

// Issue 15, item 4: TTL eviction must never delete verifier state that a commit wrote after the
// eviction chose the scope.

const credit = (offset: number, producer: string, id: number, amount: number): IncomingMessage => ({
  offset: BigInt(offset),
  content: Buffer.from(String(amount)),
  applicationProperties: identityHeaders(producer, BigInt(id)),
});

const turns = async (n = 20) => {
  for (let i = 0; i < n; i++) await new Promise((resolve) => setImmediate(resolve));
};

const number = (raw: Uint8Array | undefined) => Number(raw === undefined ? '0' : Buffer.from(raw).toString());

/**
 * A database whose scans, once blocked, stop before each entry until `step()` lets them on: a slow iteration
 * over many scopes, during which commits happen.
 */
function slowScans(disk: KeyValueDb) {
  let waiting: Array<() => void> = [];
  let free = true;
  const db = passThroughDb(disk, {
    iterator: (options) => {
      const inner = disk.iterator(options);
      const entries = inner[Symbol.asyncIterator]();
      const it: ReturnType<KeyValueDb['iterator']> = {
        next: async () => {
          if (!free) await new Promise<void>((resolve) => waiting.push(resolve));
          return entries.next();
        },
        close: () => inner.close(),
        [Symbol.asyncIterator]: () => it,
      };
      return it;
    },
  });
  return {
    db,
    /** Scans stop before each entry from now on (open() scans too: block after it). */
    block() {
      free = false;
    },
    /** Lets every waiting scan read one more entry. */
    step() {
      const now = waiting;
      waiting = [];
      for (const resolve of now) resolve();
    },
    /** Scans run freely from now on. */
    unblock() {
      free = true;
      this.step();
    },
  };
}

async function open(db: KeyValueDb, options: Partial<VerifyingConsumerOptions> = {}) {
  return VerifyingConsumerCore.open({
    consumerName: 'balance-projection',
    store: await DedupStore.wrap(db),
    commit: 'message',
    scopeTtlMs: 60_000,
    handler: async (message, tx) => {
      tx.put('balance', String(number(await tx.get('balance')) + Number(message.body.toString())));
    },
    ...options,
  });
}

describe('TTL eviction never erases fresh dedup state (issue 15, item 4)', () => {
  it('a scope reloaded and committed during the eviction scan keeps its state: after a restart the copy of an ID committed moments earlier is a duplicate', async () => {
    const disk = memoryDisk() as unknown as KeyValueDb;
    await disk.open();
    // Two producers' scopes, committed at open.
    const first = await open(disk);
    await first.process(credit(0, 'a', 1, 10));
    await first.process(credit(1, 'b', 1, 1));
    await first.close();

    // A restarted consumer: no scope in memory. An eviction scan starts (the clock says both
    // scopes are idle) and is slow; meanwhile producer a's next message loads its scope and commits.
    const scans = slowScans(disk);
    const second = await open(scans.db);
    scans.block();
    const evicting = second.evictIdle(Date.now() + 61_000);
    await turns();
    await second.process(credit(2, 'a', 2, 20)); // reloaded and committed during the scan
    expect(second.committedOffset).toBe(2n);
    scans.unblock();
    await evicting;
    // The process dies here (the committed state is what counts), and restarts.
    const third = await open(disk);
    expect(third.resumeOffset).toBe(3n);
    await third.process(credit(3, 'a', 2, 20)); // a copy of the ID committed moments earlier
    await third.flush();
    expect(number(await third.readEffect('balance'))).toBe(31);
    expect(third.stats).toMatchObject({ new: 0, duplicate: 1 });
    await third.close();
  });

  it('a scope committed while the eviction batch waits for the write in flight keeps its state', async () => {
    const disk = memoryDisk() as unknown as KeyValueDb;
    await disk.open();
    const first = await open(disk);
    await first.process(credit(0, 'a', 1, 10));
    await first.close();

    const scans = slowScans(disk);
    const second = await open(scans.db, { commit: 'batch', commitEvery: 1_000, commitLingerMs: 60_000 });
    scans.block();
    const evicting = second.evictIdle(Date.now() + 61_000);
    await turns();
    scans.step(); // the scan reads scope a (idle by the clock) ...
    await turns();
    await second.process(credit(1, 'a', 2, 20)); // ... and a's next message loads the scope
    const flushing = second.flush(); // committed while the scan goes on
    scans.unblock();
    await Promise.all([flushing, evicting]);
    await second.process(credit(2, 'a', 2, 20)); // a copy: still a duplicate in this life
    await second.flush();
    expect(second.stats).toMatchObject({ new: 1, duplicate: 1 });
    await second.close();

    const third = await open(disk);
    await third.process(credit(3, 'a', 2, 20)); // and after a restart
    expect(number(await third.readEffect('balance'))).toBe(30);
    expect(third.stats).toMatchObject({ new: 0, duplicate: 1 });
    await third.close();
  });

  it('scopes that stayed idle through the scan are still evicted, durably', async () => {
    const disk = memoryDisk() as unknown as KeyValueDb;
    await disk.open();
    const first = await open(disk);
    await first.process(credit(0, 'a', 1, 10));
    await first.process(credit(1, 'b', 1, 1));
    await first.close();
    const scans = slowScans(disk);
    const second = await open(scans.db);
    scans.block();
    const evicting = second.evictIdle(Date.now() + 61_000);
    await turns();
    await second.process(credit(2, 'a', 2, 20));
    scans.unblock();
    expect(await evicting).toBe(1); // b only
    await second.close();
    const third = await open(disk);
    await third.process(credit(3, 'b', 1, 1)); // b was forgotten: applied again (documented)
    await third.process(credit(4, 'a', 2, 20)); // a was not: a duplicate
    expect(number(await third.readEffect('balance'))).toBe(32);
    await third.close();
  });
});
