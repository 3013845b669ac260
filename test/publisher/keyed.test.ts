import fc from 'fast-check';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { DedupPublisherCore } from '../../src/publisher/core.js';
import { assertKey, MAX_KEY_BYTES } from '../../src/publisher/message.js';
import type { DedupPublisherOptions } from '../../src/publisher/types.js';
import { memoryDisk, memoryStore } from '../support/memory-store.js';
import { ModelBroker, ModelTransport } from '../support/model-broker.js';

const body = (s: string): Buffer => Buffer.from(s);

/** 'sent' or 'aborted': how a send that may be aborted ended. */
const outcome = (sent: Promise<unknown>): Promise<string> =>
  sent.then(
    () => 'sent',
    () => 'aborted',
  );

/**
 * After `aborted` (sends given an abort signal, aborted by the caller) the last ID is 2 again and
 * key K's first send (ID 2) waits: a repeat of K is its duplicate, and the stream holds x and K1.
 */
async function expectKBackToFirst(
  core: DedupPublisherCore,
  transport: ModelTransport,
  x: Promise<unknown>,
  first: Promise<unknown>,
  aborted: ReadonlyArray<Promise<string>>,
): Promise<void> {
  expect(await Promise.all(aborted)).toEqual(Array(aborted.length).fill('aborted'));
  expect(core.lastPublishingId).toBe(2n);
  const repeat = core.send(body('K-again'), { key: 'K' });
  transport.faults.holdConfirms = false;
  transport.releaseConfirms();
  await expect(x).resolves.toEqual({ publishingId: 1n, outcome: 'published' });
  await expect(first).resolves.toEqual({ publishingId: 2n, outcome: 'published' });
  await expect(repeat).resolves.toEqual({ publishingId: 2n, outcome: 'duplicate' });
  expect(transport.published.map((m) => Buffer.from(m.body).toString())).toEqual(['x', 'K1']);
  await core.close();
}

async function life(
  broker: ModelBroker,
  disk: ReturnType<typeof memoryDisk>,
  options: Partial<DedupPublisherOptions> = {},
) {
  const transport = new ModelTransport(broker, 'ledger', 'p');
  const core = await DedupPublisherCore.open(transport, {
    producerName: 'p',
    store: await memoryStore(disk),
    idMode: 'keyed',
    ...options,
  });
  return { transport, core };
}

/** One send in flight, a retention of 2 IDs (an hour). */
const RETAIN_2 = { maxInFlight: 1, keyRetention: { maxKeys: 2, maxAgeMs: 3_600_000 } };

/**
 * K committed and sent as 1; once it is confirmed, a committed and sent as 2; b (with `signal`)
 * waiting for room as 3. Confirms are held from then on.
 */
async function kThenAThenWaitingB(disk: ReturnType<typeof memoryDisk>, signal?: AbortSignal) {
  const broker = new ModelBroker();
  const { transport, core } = await life(broker, disk, RETAIN_2);
  transport.faults.holdConfirms = true;
  const k = core.send(body('K'), { key: 'K' });
  const a = core.send(body('a'), { key: 'a' });
  const b = core.send(body('b'), signal === undefined ? { key: 'b' } : { key: 'b', signal });
  while (transport.published.length < 1) await new Promise((r) => setImmediate(r));
  transport.releaseConfirms();
  while (transport.published.length < 2) await new Promise((r) => setImmediate(r));
  return { broker, transport, core, k, a, b };
}

afterEach(() => {
  vi.useRealTimers();
});

describe('keyed sends', () => {
  it('keyed sends - a key taken over past the retention goes back to its first send when the taker-over is aborted', async () => {
    // Found by a hostile review (present before the key table too): with maxKeys 3, a repeat of K
    // at ID 6 is new (6 - 2 >= 3) and takes K over; aborting it and the sends between lowers the
    // last ID to 2, K's first send (ID 2, still waiting) is inside the retention again, and a third
    // send of K was published as new: K twice on the stream.
    const broker = new ModelBroker();
    const { transport, core } = await life(broker, memoryDisk(), {
      maxInFlight: 1,
      keyRetention: { maxKeys: 3, maxAgeMs: 60_000 },
    });
    transport.faults.holdConfirms = true;
    const x = core.send(body('x'), { key: 'x' });
    const first = core.send(body('K1'), { key: 'K' });
    const abort = new AbortController();
    const aborted = ['o3', 'o4', 'o5'].map((k) =>
      outcome(core.send(body(k), { key: k, signal: abort.signal })),
    );
    aborted.push(outcome(core.send(body('K2'), { key: 'K', signal: abort.signal }))); // takes K over
    abort.abort();
    await expectKBackToFirst(core, transport, x, first, aborted);
  });

  it('keyed sends - a key taken over twice goes back to its waiting first send when both taker-overs are aborted, the first one first', async () => {
    const broker = new ModelBroker();
    const { transport, core } = await life(broker, memoryDisk(), {
      maxInFlight: 1,
      keyRetention: { maxKeys: 2, maxAgeMs: 60_000 },
    });
    transport.faults.holdConfirms = true;
    const x = core.send(body('x'), { key: 'x' });
    const first = core.send(body('K1'), { key: 'K' }); // ID 2, waits for room
    const a = new AbortController();
    const b = new AbortController();
    const between = [outcome(core.send(body('a3'), { key: 'a3', signal: a.signal }))];
    between.push(outcome(core.send(body('a4'), { key: 'a4', signal: a.signal })));
    const second = outcome(core.send(body('K2'), { key: 'K', signal: a.signal })); // ID 5: 5 - 2 >= 2, takes K over
    between.push(outcome(core.send(body('b6'), { key: 'b6', signal: b.signal })));
    between.push(outcome(core.send(body('b7'), { key: 'b7', signal: b.signal })));
    const third = outcome(core.send(body('K3'), { key: 'K', signal: b.signal })); // ID 8: takes K over from K2
    a.abort(); // K2 first: it no longer holds K (K3 does), and K3 must still lead back to K1
    b.abort();
    await expectKBackToFirst(core, transport, x, first, [...between, second, third]);
  });

  // Found by the publisher model once it had a small key retention (issue 39 session 4): K is
  // committed as 1; a and b wait for room as 2 and 3. Committing a pruned K's segment counting from
  // the last ID handed out (3 - 1 >= 2); b is then aborted, the last ID is 2 again and K is inside
  // the retention (2 - 1 < 2), but its record was gone from memory and from the store: a repeat of
  // K was published again, K twice on the stream. The minute's age prune did the same (a hostile
  // review: reverting that half alone passed every other test), and so does a crash that loses b.
  it.each([
    ['the group commits', false],
    ['the minute prune', true],
  ])(
    'keyed sends - retention is counted from what the store holds (%s): IDs an abort takes back do not push a key out',
    async (_, minute) => {
      if (minute) vi.useFakeTimers({ toFake: ['setInterval', 'clearInterval'] });
      const abort = new AbortController();
      const { transport, core, k, a, b } = await kThenAThenWaitingB(memoryDisk(), abort.signal);
      if (minute) {
        vi.advanceTimersByTime(60_000);
        await new Promise((r) => setImmediate(r));
      }
      abort.abort();
      expect(await outcome(b)).toBe('aborted');
      expect(core.lastPublishingId).toBe(2n);
      const repeat = core.send(body('K-again'), { key: 'K' });
      transport.faults.holdConfirms = false;
      transport.releaseConfirms();
      await expect(k).resolves.toEqual({ publishingId: 1n, outcome: 'published' });
      await expect(a).resolves.toEqual({ publishingId: 2n, outcome: 'published' });
      await expect(repeat).resolves.toEqual({ publishingId: 1n, outcome: 'duplicate' });
      expect(transport.published.map((m) => Buffer.from(m.body).toString())).toEqual(['K', 'a']);
      await core.close();
    },
  );

  it('keyed sends - IDs a crash loses do not push a key out of the store', async () => {
    const disk = memoryDisk();
    const first = await kThenAThenWaitingB(disk);
    first.b.catch(() => undefined);
    // A crash: the first life is abandoned, b (3) never written; the next life's last ID is 2.
    const second = await life(first.broker, disk, RETAIN_2);
    expect(second.core.lastPublishingId).toBe(2n);
    await expect(second.core.send(body('K-again'), { key: 'K' })).resolves.toEqual({
      publishingId: 1n,
      outcome: 'duplicate',
    });
    await second.core.close();
  });

  it('a key publishes once: repeats, concurrent or later, resolve with the first id as duplicates', async () => {
    const broker = new ModelBroker();
    const { transport, core } = await life(broker, memoryDisk());
    const [a, again, b] = await Promise.all([
      core.send(body('credit-17'), { key: 'credit-17' }),
      core.send(body('credit-17'), { key: 'credit-17' }),
      core.send(body('credit-18'), { key: 'credit-18' }),
    ]);
    expect(a).toEqual({ publishingId: 1n, outcome: 'published' });
    expect(again).toEqual({ publishingId: 1n, outcome: 'duplicate' });
    expect(b).toEqual({ publishingId: 2n, outcome: 'published' });
    expect(await core.send(body('credit-17'), { key: 'credit-17' })).toEqual({
      publishingId: 1n,
      outcome: 'duplicate',
    });
    expect(transport.published.map((m) => Buffer.from(m.body).toString())).toEqual([
      'credit-17',
      'credit-18',
    ]);
    await core.close();
  });

  it('keys survive a restart, and an outbox message recovered with its key answers repeats once confirmed', async () => {
    const broker = new ModelBroker();
    const disk = memoryDisk();
    const first = await life(broker, disk, { closeTimeoutMs: 0 });
    await first.core.send(body('a'), { key: 'a' });
    first.transport.faults.holdConfirms = true;
    const pending = first.core.send(body('b'), { key: 'b' });
    while (first.transport.published.length < 2) await new Promise((r) => setImmediate(r));
    await first.core.close(); // b unconfirmed: it stays in the outbox with its key
    await expect(pending).rejects.toMatchObject({ code: 'DEDUP_PUBLISHER_CLOSED' });

    const second = await life(broker, disk);
    expect(second.core.report.resent).toBe(1);
    const [a, b, c] = await Promise.all([
      second.core.send(body('a'), { key: 'a' }),
      second.core.send(body('b'), { key: 'b' }),
      second.core.send(body('c'), { key: 'c' }),
    ]);
    expect([a, b, c]).toEqual([
      { publishingId: 1n, outcome: 'duplicate' },
      { publishingId: 2n, outcome: 'duplicate' },
      { publishingId: 3n, outcome: 'published' },
    ]);
    expect(broker.messages('ledger').map((m) => m.body)).toEqual(['a', 'b', 'c']);
    await second.core.close();
  });

  it('after the retention (count or age) a key is forgotten and a late repeat is published again', async () => {
    vi.useFakeTimers({ toFake: ['Date'] });
    vi.setSystemTime(new Date('2026-01-01T00:00:00Z'));
    const broker = new ModelBroker();
    const { core } = await life(broker, memoryDisk(), { keyRetention: { maxKeys: 3, maxAgeMs: 60_000 } });
    for (const k of ['a', 'b', 'c', 'd']) await core.send(body(k), { key: k });
    expect(await core.send(body('d'), { key: 'd' })).toMatchObject({ outcome: 'duplicate' });
    // 'a' is 4 IDs back: beyond maxKeys = 3.
    expect(await core.send(body('a'), { key: 'a' })).toEqual({ publishingId: 5n, outcome: 'published' });
    vi.setSystemTime(new Date('2026-01-01T00:01:01Z'));
    expect(await core.send(body('d'), { key: 'd' })).toEqual({ publishingId: 6n, outcome: 'published' });
    await core.close();
  });

  it('past the retention, memory and the store hold about maxKeys keys, however fast keys arrive', async () => {
    // Keys used to leave memory only on the minute timer: at 250 000 sends a second that is
    // 15 million keys for a retention of 100 000.
    const broker = new ModelBroker();
    const disk = memoryDisk();
    const options = { keyRetention: { maxKeys: 50 }, maxBatch: 10 };
    const { core } = await life(broker, disk, options);
    let most = 0;
    for (let i = 0; i < 1_000; i += 10) {
      const sends = Array.from({ length: 10 }, (_, j) => core.send(body(`k${i + j}`), { key: `k${i + j}` }));
      await Promise.all(sends);
      most = Math.max(most, core.keysInMemory);
    }
    // Whole group commits are dropped: at most one more commit's worth than maxKeys.
    expect(most).toBeLessThanOrEqual(50 + 10);
    expect(most).toBeGreaterThanOrEqual(50);
    expect(await core.send(body('k999'), { key: 'k999' })).toMatchObject({ outcome: 'duplicate' });
    expect(await core.send(body('k950'), { key: 'k950' })).toMatchObject({ outcome: 'duplicate' });
    expect(await core.send(body('k900'), { key: 'k900' })).toMatchObject({ outcome: 'published' });
    await core.close();
    // The store dropped the same segments: a reopen loads as few keys.
    const again = await life(broker, disk, options);
    expect(again.core.keysInMemory).toBeLessThanOrEqual(50 + 10);
    expect(await again.core.send(body('k999'), { key: 'k999' })).toMatchObject({ outcome: 'duplicate' });
    await again.core.close();
  });

  it('rejects bad keys and mixing modes, without using an id', async () => {
    const broker = new ModelBroker();
    const { core } = await life(broker, memoryDisk());
    expect(() => core.send(body('x'), { key: '' })).toThrow(RangeError);
    expect(() => core.send(body('x'), { key: 'é'.repeat(257) })).toThrow(/514 UTF-8 bytes/);
    expect(() => core.send(body('x'), { key: 42 as unknown as string })).toThrow(TypeError);
    expect(() => core.send(body('x'), { key: 'a\uD800b' })).toThrow(/surrogate/);
    await expect(core.send(body('x'))).rejects.toMatchObject({ code: 'DEDUP_ID_MODE_MISMATCH' });
    await expect(core.send(body('x'), { key: 'k', publishingId: 5n })).rejects.toMatchObject({
      code: 'DEDUP_ID_MODE_MISMATCH',
    });
    expect(await core.send(body('ok'), { key: 'ok' })).toEqual({ publishingId: 1n, outcome: 'published' });
    await core.close();
    const auto = await DedupPublisherCore.open(new ModelTransport(broker, 'other', 'p'), {
      producerName: 'p',
      store: await memoryStore(),
    });
    await expect(auto.send(body('x'), { key: 'k' })).rejects.toMatchObject({
      code: 'DEDUP_ID_MODE_MISMATCH',
    });
    await auto.close();
  });
});

describe('key validation', () => {
  /** The checks as first written: Buffer.byteLength and a regular expression. */
  function reference(key: string): 'ok' | 'empty' | 'long' | 'surrogate' {
    if (key.length === 0) return 'empty';
    if (Buffer.byteLength(key, 'utf8') > MAX_KEY_BYTES) return 'long';
    if (/[\uD800-\uDFFF]/u.test(key)) return 'surrogate';
    return 'ok';
  }

  function verdict(key: string): 'ok' | 'empty' | 'long' | 'surrogate' {
    try {
      assertKey(key);
      return 'ok';
    } catch (err) {
      const message = (err as Error).message;
      if (message.includes('empty')) return 'empty';
      if (message.includes('UTF-8 bytes')) {
        expect(message).toContain(`is ${Buffer.byteLength(key, 'utf8')} UTF-8 bytes`);
        return 'long';
      }
      expect(message).toContain('surrogate');
      return 'surrogate';
    }
  }

  it('key validation - agrees with byteLength and the surrogate regex on any string', () => {
    const units = fc.constantFrom('a', 'é', '€', '\uD83D\uDE00', '\uD800', '\uDC00', 'z', '\u07FF', '\u0800');
    fc.assert(
      fc.property(
        fc.oneof(
          fc.string({ unit: 'binary', maxLength: 600 }),
          fc.array(units, { maxLength: 300 }).map((xs) => xs.join('')),
        ),
        (key) => {
          expect(verdict(key)).toBe(reference(key));
        },
      ),
      { numRuns: 2_000 },
    );
  });
});
