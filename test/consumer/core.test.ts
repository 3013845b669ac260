import { describe, expect, it } from 'vitest';
import {
  VerifyingConsumerCore,
  type VerifyEvent,
  type VerifyingConsumerOptions,
} from '../../src/consumer/core.js';
import { identityHeaders, SKIP_HEADER } from '../../src/identity/headers.js';
import { DedupStore, type KeyValueDb } from '../../src/store/store.js';
import { memoryDisk, memoryStore, passThroughDb } from '../support/memory-store.js';

const credit = (offset: number, producer: string, id: number, amount = 1) => ({
  offset: BigInt(offset),
  content: Buffer.from(String(amount)),
  applicationProperties: identityHeaders(producer, BigInt(id)),
});

/** A credit whose producer declares it skipped IDs `from .. id - 1` before it. */
const afterSkip = (offset: number, producer: string, id: number, from: number, amount = 1) => ({
  ...credit(offset, producer, id, amount),
  applicationProperties: { ...identityHeaders(producer, BigInt(id)), [SKIP_HEADER]: String(from) },
});

async function open(options: Partial<VerifyingConsumerOptions> = {}, disk = memoryDisk()) {
  const events: VerifyEvent[] = [];
  const core = await VerifyingConsumerCore.open({
    consumerName: 'balance-projection',
    store: await memoryStore(disk),
    handler: async (message, tx) => {
      const balance = Number(Buffer.from((await tx.get('balance')) ?? Buffer.from('0')).toString());
      tx.put('balance', String(balance + Number(message.body.toString())));
    },
    onEvent: (e) => events.push(e),
    ...options,
  });
  const balance = async (): Promise<number> =>
    Number(Buffer.from((await core.readEffect('balance')) ?? Buffer.from('0')).toString());
  return { core, events, disk, balance };
}

describe('verifying consumer core', () => {
  it('applies new messages once, drops duplicates, reports stale ones without applying them', async () => {
    const { core, events, balance } = await open({ policy: { kind: 'window', size: 4 }, commit: 'message' });
    await core.process(credit(0, 'a', 1, 10));
    await core.process(credit(1, 'a', 1, 10)); // duplicate
    await core.process(credit(2, 'a', 6, 1));
    await core.process(credit(3, 'a', 2, 100)); // left of the window [3..6]: stale
    await core.process(credit(4, 'b', 1, 5)); // another producer, its own scope
    expect(await balance()).toBe(16);
    expect(core.stats).toMatchObject({ new: 3, duplicate: 1, stale: 1 });
    expect(events.map((e) => e.kind)).toEqual(['duplicate', 'gap', 'gap', 'stale']);
    expect(events.filter((e) => e.kind === 'gap')).toEqual([
      { kind: 'gap', scope: expect.any(String) as string, range: { from: 2n, to: 5n }, confirmed: false },
      { kind: 'gap', scope: expect.any(String) as string, range: { from: 2n, to: 2n }, confirmed: true },
    ]);
    await core.close();
  });

  it('a linger commit never races a handler read: the balance counts every message (lost-update regression)', async () => {
    // A disk whose commits take 5 ms, as LevelDB's can under load: the window the race needs.
    const disk = memoryDisk() as unknown as KeyValueDb;
    await disk.open();
    const slow = passThroughDb(disk, {
      batch: async (ops, options) => {
        await new Promise((r) => setTimeout(r, 5));
        await disk.batch(ops, options);
      },
    });
    const store = await DedupStore.wrap(slow);
    const { core, balance } = await open({
      store,
      commitLingerMs: 1,
      handler: async (message, tx) => {
        const before = Number(Buffer.from((await tx.get('balance')) ?? Buffer.from('0')).toString());
        await new Promise((r) => setTimeout(r, 2)); // longer than the linger
        tx.put('balance', String(before + Number(message.body.toString())));
      },
    });
    for (let i = 1; i <= 40; i++) await core.process(credit(i, 'a', i, 1));
    await core.flush();
    expect(await balance()).toBe(40);
    await core.close();
  });

  it('an uncommitted batch dies with the process: the restart reprocesses it from the committed offset', async () => {
    const disk = memoryDisk();
    const first = await open({ commitEvery: 1000, commitLingerMs: 10_000 }, disk);
    await first.core.process(credit(0, 'a', 1, 10));
    await first.core.flush();
    await first.core.process(credit(1, 'a', 2, 20)); // never committed: the "process" dies here
    const second = await open({}, disk);
    expect(second.core.resumeOffset).toBe(1n);
    expect(await second.balance()).toBe(10);
    await second.core.process(credit(1, 'a', 2, 20));
    await second.core.process(credit(2, 'a', 2, 20)); // the redelivered copy
    await second.core.flush();
    expect(await second.balance()).toBe(30);
    expect(second.core.stats.duplicate).toBe(1);
    await second.core.close();
  });

  it('messages without identity are rejected (reported) or passed through, never a crash', async () => {
    const { core, events, balance } = await open({ commit: 'message' });
    await core.process({ offset: 0n, content: Buffer.from('7'), applicationProperties: {} });
    await core.process({
      offset: 1n,
      content: Buffer.from('7'),
      applicationProperties: { 'x-dedup-producer': 'a', 'x-dedup-id': '01' },
    });
    expect(await balance()).toBe(0);
    expect(events).toEqual([
      { kind: 'unidentified', offset: 0n, reason: 'no identity headers', applied: false },
      {
        kind: 'unidentified',
        offset: 1n,
        reason: expect.stringMatching(/decimal/) as string,
        applied: false,
      },
    ]);
    await core.close();
    const pass = await open({ commit: 'message', unidentified: 'pass-through' });
    await pass.core.process({ offset: 0n, content: Buffer.from('7'), applicationProperties: undefined });
    expect(await pass.balance()).toBe(7);
    await pass.core.close();
  });

  it('a handler error stops the consumer and commits nothing of its batch', async () => {
    const { core, balance } = await open({
      commitEvery: 10,
      handler: (message, tx) => {
        if (message.offset === 3n) throw new Error('boom');
        tx.put('balance', '999');
      },
    });
    await core.process(credit(0, 'a', 1));
    await core.flush();
    await core.process(credit(1, 'a', 2));
    // process() is synchronous when it can be: a throwing handler throws from the call itself.
    expect(() => core.process(credit(3, 'a', 4))).toThrow('boom');
    expect(() => core.process(credit(4, 'a', 5))).toThrow('boom');
    expect(core.committedOffset).toBe(0n);
    expect(await balance()).toBe(999);
    await core.close();
  });

  it('retention: a scope idle longer than scopeTtlMs is forgotten, and a late repeat then takes effect again', async () => {
    const disk = memoryDisk();
    const { core, balance } = await open({ scopeTtlMs: 60_000, commit: 'message' }, disk);
    await core.process(credit(0, 'a', 1, 10));
    await core.process(credit(1, 'b', 1, 1));
    await core.process(credit(2, 'a', 1, 10)); // inside the retention: a duplicate
    expect(await balance()).toBe(11);
    expect(await core.evictIdle(Date.now())).toBe(0);
    expect(await core.evictIdle(Date.now() + 61_000)).toBe(2);
    await core.process(credit(3, 'a', 1, 10)); // the same message after eviction: applied again (documented)
    expect(await balance()).toBe(21);
    expect(core.stats).toMatchObject({ new: 3, duplicate: 1 });
    await core.close();
    // Eviction is durable: a restarted consumer has forgotten 'b' too.
    const again = await open({ scopeTtlMs: 60_000, commit: 'message' }, disk);
    await again.core.process(credit(4, 'b', 1, 1));
    expect(again.core.stats.new).toBe(1);
    await again.core.close();
  });

  it('the same consumer name cannot be opened twice on one store', async () => {
    const store = await memoryStore();
    const options = { consumerName: 'c', store, handler: () => undefined };
    const a = await VerifyingConsumerCore.open(options);
    await expect(VerifyingConsumerCore.open(options)).rejects.toMatchObject({ code: 'DEDUP_STORE_LOCKED' });
    await a.close();
  });

  it('after close(), process() is refused and a waitForOffset() still waiting rejects, both with DEDUP_CONSUMER_CLOSED', async () => {
    const { core } = await open({ commit: 'message' });
    await core.process(credit(0, 'a', 1));
    const waiting = core.waitForOffset(5n);
    await core.close();
    await expect(waiting).rejects.toMatchObject({
      name: 'DedupError',
      code: 'DEDUP_CONSUMER_CLOSED',
      message: 'the verifying consumer closed before reaching the offset',
    });
    expect(() => core.process(credit(1, 'a', 2))).toThrow(
      expect.objectContaining({
        code: 'DEDUP_CONSUMER_CLOSED',
        message: 'the verifying consumer is closed',
      }) as Error,
    );
    await core.waitForOffset(0n); // reached before the close: resolves
  });

  for (const policy of [{ kind: 'highest' as const }, { kind: 'window' as const, size: 4 }]) {
    it(`${policy.kind}: a declared skip is reported as 'skip', never as a gap; an undeclared hole still is`, async () => {
      const { core, events, balance } = await open({ policy, commit: 'message' });
      await core.process(credit(0, 'a', 1, 1));
      await core.process(afterSkip(1, 'a', 101, 2, 10)); // 2..100 skipped by the producer
      await core.process(credit(2, 'a', 102, 100));
      await core.process(afterSkip(3, 'a', 300, 200, 1000)); // 103..199 missing, 200..299 skipped
      await core.process(credit(4, 'a', 400, 5)); // 301..399 missing (window: confirmed once it moves)
      await core.process(credit(5, 'a', 410, 5));
      expect(await balance()).toBe(1121);
      expect(core.stats).toMatchObject({ new: 6, skips: 2 });
      const skips = events.filter((e) => e.kind === 'skip');
      expect(skips).toEqual([
        {
          kind: 'skip',
          scope: expect.any(String) as string,
          range: { from: 2n, to: 100n },
          publishingId: 101n,
          offset: 1n,
        },
        {
          kind: 'skip',
          scope: expect.any(String) as string,
          range: { from: 200n, to: 299n },
          publishingId: 300n,
          offset: 3n,
        },
      ]);
      const gaps = events.flatMap((e) =>
        e.kind === 'gap' ? [`${e.confirmed ? 'confirmed' : 'reported'} ${e.range.from}..${e.range.to}`] : [],
      );
      expect(gaps).toEqual(
        policy.kind === 'highest'
          ? [
              'reported 103..199',
              'confirmed 103..199',
              'reported 301..399',
              'confirmed 301..399',
              'reported 401..409',
              'confirmed 401..409',
            ]
          : [
              'reported 103..199',
              'confirmed 103..199',
              'reported 301..399',
              'confirmed 301..396', // the rest is still in the window [397..400]
              'reported 401..409',
              'confirmed 397..399',
              'confirmed 401..406',
            ],
      );
      await core.close();
    });
  }
});
