import { describe, expect, it } from 'vitest';
import type { Client } from 'rabbitmq-stream-js-client';
import { encodeEntry, encodeGenesis, entryId, GENESIS_ID } from '../../src/group/changelog-entry.js';
import { changelogProducerName, partitionNamespace } from '../../src/group/consumer.js';
import { resolveGroupOptions } from '../../src/group/options.js';
import { RestoreAbandoned, type RestoreReport } from '../../src/group/restore.js';
import { chooseStandbys } from '../../src/group/standby-choice.js';
import { adoptStandbyCopy, standbyKey, standbyView } from '../../src/group/standby-copy.js';
import { StandbyTailer } from '../../src/group/standby-tail.js';
import { namespaceRanges, snapshotProducerName } from '../../src/group/snapshot-entry.js';
import { restoreWithSnapshots } from '../../src/group/snapshot-restore.js';
import {
  changelogPositionKey,
  effectKeyPrefix,
  encodeOffset,
  offsetKey,
} from '../../src/store/consumer-keys.js';
import type { KeyValueDb } from '../../src/store/store.js';
import { FakeChangelog, type ChangelogRecordSpec } from '../support/changelog-client.js';

const NAMESPACE = partitionNamespace('billing', 'orders');
const OURS = changelogProducerName('billing');
const SNAP = snapshotProducerName(OURS);
const CHANGELOG = 'orders.billing.changelog';
const key = (k: string): string => `${effectKeyPrefix(NAMESPACE)}${k}`;

/** Entry `last`: message `o` puts key `k<o % 5>` = o and deletes `k<(o + 2) % 5>`: the state is a fold. */
function entry(last: number): ChangelogRecordSpec {
  return {
    producer: OURS,
    id: entryId(BigInt(last)),
    content: () =>
      encodeEntry({
        lastOffset: BigInt(last),
        baseOffset: last === 0 ? undefined : BigInt(last - 1),
        ops: [
          { type: 'put', key: key(`k${last % 5}`), value: Buffer.from([last]) },
          { type: 'del', key: key(`k${(last + 2) % 5}`) },
          { type: 'put', key: offsetKey(NAMESPACE), value: encodeOffset(BigInt(last)) },
        ],
      }),
  };
}
const genesis: ChangelogRecordSpec = { producer: OURS, id: GENESIS_ID, content: () => encodeGenesis(0n) };
const history = (n: number): ChangelogRecordSpec[] => [
  genesis,
  ...Array.from({ length: n }, (_, i) => entry(i)),
];

/** A LevelDB as the restore sees it: sorted keys, atomic batches; `failAfter` batches and it throws. */
function memoryDb(): { db: KeyValueDb; kv: Map<string, Uint8Array> } {
  const kv = new Map<string, Uint8Array>();
  const db: KeyValueDb = {
    status: 'open',
    open: () => Promise.resolve(),
    close: () => Promise.resolve(),
    get: (k) => Promise.resolve(kv.get(k)),
    batch: (ops) => {
      for (const op of ops) {
        if (op.type === 'put') kv.set(op.key, op.value);
        else kv.delete(op.key);
      }
      return Promise.resolve();
    },
    iterator: ({ gte, lt }) => {
      const entries = [...kv].filter(([k]) => k >= gte && k < lt).sort(([a], [b]) => (a < b ? -1 : 1));
      let at = 0;
      // As abstract-level: its own next() resolves to an entry or undefined (not an IteratorResult);
      // for-await goes through Symbol.asyncIterator.
      const iterator = {
        next: () => Promise.resolve(entries[at++]),
        close: () => Promise.resolve(),
        [Symbol.asyncIterator]: () => ({
          next: () =>
            Promise.resolve(
              at < entries.length
                ? { done: false as const, value: entries[at++]! }
                : { done: true as const, value: undefined },
            ),
        }),
      };
      return iterator as unknown as ReturnType<KeyValueDb['iterator']>;
    },
  };
  return { db, kv };
}

/** The partition's namespace in `db`, hex values. */
async function contents(db: KeyValueDb): Promise<Record<string, string>> {
  const out: Record<string, string> = {};
  for (const range of namespaceRanges(NAMESPACE)) {
    for await (const [k, v] of db.iterator(range)) out[k] = Buffer.from(v).toString('hex');
  }
  const position = await db.get(changelogPositionKey(NAMESPACE));
  if (position !== undefined) out.position = Buffer.from(position).toString('hex');
  return out;
}

function clientOf(changelog: FakeChangelog): Client {
  return Object.assign(changelog.client(), { close: () => Promise.resolve() });
}

/** Today's take-over restore of `records` into `db` (`isCurrent` and `bytesPerWrite` for kills). */
function restore(
  db: KeyValueDb,
  changelog: FakeChangelog,
  extra: { isCurrent?: () => boolean; bytesPerWrite?: number } = {},
): Promise<RestoreReport> {
  return restoreWithSnapshots(
    {
      db,
      sync: false,
      namespace: NAMESPACE,
      changelog: CHANGELOG,
      producerName: OURS,
      client: clientOf(changelog),
      stallMs: 2_000,
      timeoutMs: 20_000,
      isCurrent: extra.isCurrent ?? (() => true),
      ...(extra.bytesPerWrite === undefined ? {} : { bytesPerWrite: extra.bytesPerWrite }),
    },
    { reference: SNAP, producerName: SNAP },
    () => undefined,
  );
}

function adopt(
  db: KeyValueDb,
  changelog: FakeChangelog,
  extra: { maxBytes?: number; isCurrent?: () => boolean } = {},
) {
  return adoptStandbyCopy({
    db,
    sync: false,
    namespace: NAMESPACE,
    changelog: CHANGELOG,
    client: clientOf(changelog),
    timeoutMs: 2_000,
    isCurrent: extra.isCurrent ?? (() => true),
    ...(extra.maxBytes === undefined ? {} : { maxBytes: extra.maxBytes }),
  });
}

/** What a take-over with an empty store writes after reading the whole of `records`. */
async function fromScratch(records: ChangelogRecordSpec[]): Promise<Record<string, string>> {
  const { db } = memoryDb();
  await restore(db, new FakeChangelog(records));
  return contents(db);
}

describe('warm standbys - the choice rule (§12.3)', () => {
  const partitions = Array.from({ length: 12 }, (_, i) => `orders-${i}`);

  it('picks n partitions the member does not hold, the same ones for the same ID and held set', () => {
    const held = new Set(['orders-1', 'orders-4', 'orders-7']);
    for (const member of ['a', 'b', 'c', 'd']) {
      for (const n of [0, 1, 3, 9, 20]) {
        const chosen = chooseStandbys(member, partitions, (p) => held.has(p), n);
        expect(chosen).toHaveLength(Math.min(n, partitions.length - held.size));
        expect(new Set(chosen).size).toBe(chosen.length);
        expect(chosen.filter((p) => held.has(p))).toEqual([]);
        expect(chooseStandbys(member, [...partitions].reverse(), (p) => held.has(p), n)).toEqual(chosen);
      }
    }
    // Members differ (the hash of their ID), so that not every member tails the same partition.
    const firsts = new Set(
      Array.from({ length: 16 }, (_, i) => chooseStandbys(`m${i}`, partitions, () => false, 1)[0]),
    );
    expect(firsts.size).toBeGreaterThan(3);
  });

  it('a partition gained or lost changes the choice by at most one partition', () => {
    for (let m = 0; m < 20; m++) {
      const held = new Set<string>();
      let before = chooseStandbys(`m${m}`, partitions, (p) => held.has(p), 3);
      for (const p of [...partitions.slice(m % 4), ...partitions.slice(0, m % 4)]) {
        held.add(p);
        const after = chooseStandbys(`m${m}`, partitions, (q) => held.has(q), 3);
        expect(after.filter((q) => !before.includes(q)).length).toBeLessThanOrEqual(1);
        expect(after).not.toContain(p);
        before = after;
      }
    }
  });
});

describe('warm standbys - the copy and the take-over from it (§12.3)', () => {
  it('the copy is kept under its own keys: nothing of the namespace (offset, effects, position) is written', async () => {
    const { db, kv } = memoryDb();
    const report = await restore(standbyView(db), new FakeChangelog(history(20)));
    expect(report.applied).toBe(20);
    expect(await contents(db)).toEqual({});
    expect(await db.get(offsetKey(NAMESPACE))).toBeUndefined();
    expect(await db.get(key('k4'))).toBeUndefined();
    expect([...kv.keys()].every((k) => k.startsWith('w:'))).toBe(true);
    expect(await contents(standbyView(db))).toEqual(await fromScratch(history(20)));
    expect(standbyKey(key('k4'))).toBe(`w:${key('k4')}`);
  });

  it('a take-over adopts the copy and applies only the tail: the state a restore from scratch writes', async () => {
    const { db } = memoryDb();
    await restore(standbyView(db), new FakeChangelog(history(30)));
    // The active member wrote 12 more entries since the copy's last tail.
    const later = new FakeChangelog(history(42));
    expect(await adopt(db, later)).toMatchObject({ kind: 'adopted', offset: 29n });
    const report = await restore(db, later);
    expect(report).toMatchObject({ read: 12, applied: 12, offset: 41n });
    expect(await contents(db)).toEqual(await fromScratch(history(42)));
    // The copy was moved into the namespace: nothing of it is left (it would only take disk).
    expect(await contents(standbyView(db))).toEqual({});
  });

  it('replaces an older state of the namespace (this member held the partition before), never a newer one', async () => {
    const { db } = memoryDb();
    await restore(db, new FakeChangelog(history(5)));
    await restore(standbyView(db), new FakeChangelog(history(25)));
    expect(await adopt(db, new FakeChangelog(history(30)))).toMatchObject({ kind: 'adopted', offset: 24n });
    expect(await contents(db)).toEqual(await fromScratch(history(25)));
    // The copy was moved: none is left to adopt.
    expect(await adopt(db, new FakeChangelog(history(30)))).toEqual({ kind: 'none' });
    await restore(db, new FakeChangelog(history(30)));
    expect(await contents(db)).toEqual(await fromScratch(history(30)));
    // A copy older than the namespace: left alone, the namespace unchanged.
    await restore(standbyView(db), new FakeChangelog(history(25)));
    expect(await adopt(db, new FakeChangelog(history(30)))).toMatchObject({ kind: 'ignored' });
    expect(await contents(db)).toEqual(await fromScratch(history(30)));
  });

  it('an unusable copy is ignored: none, no read position, trimmed past, too large, or undecodable', async () => {
    const { db, kv } = memoryDb();
    expect(await adopt(db, new FakeChangelog(history(10)))).toEqual({ kind: 'none' });
    await restore(standbyView(db), new FakeChangelog(history(10)));
    const trimmed = new FakeChangelog(history(40));
    trimmed.firstChunkId = 20n;
    const ignored = await adopt(db, trimmed);
    expect(ignored.kind === 'ignored' ? ignored.why : '').toContain('starts at 20');
    expect(await adopt(db, new FakeChangelog(history(40)), { maxBytes: 10 })).toMatchObject({
      kind: 'ignored',
    });
    const position = kv.get(standbyKey(changelogPositionKey(NAMESPACE)))!;
    kv.delete(standbyKey(changelogPositionKey(NAMESPACE)));
    expect(await adopt(db, new FakeChangelog(history(40)))).toMatchObject({ kind: 'ignored' });
    kv.set(standbyKey(changelogPositionKey(NAMESPACE)), position);
    const offset = kv.get(standbyKey(offsetKey(NAMESPACE)))!;
    kv.set(standbyKey(offsetKey(NAMESPACE)), Buffer.from([1, 2, 3]));
    expect(await adopt(db, new FakeChangelog(history(40)))).toMatchObject({ kind: 'ignored' });
    kv.set(standbyKey(offsetKey(NAMESPACE)), offset);
    // Nothing of the namespace was written by any of them.
    expect(await contents(db)).toEqual({});
    await expect(
      adopt(db, new FakeChangelog(history(40)), { isCurrent: () => false }),
    ).rejects.toBeInstanceOf(RestoreAbandoned);
    expect(await contents(db)).toEqual({});
  });

  it('a standby killed while it tails leaves a copy the take-over uses exactly (entries) or ignores (a snapshot half written)', async () => {
    for (const killAfter of [1, 2, 5, 17]) {
      const { db } = memoryDb();
      let writes = 0;
      const counting: KeyValueDb = {
        ...db,
        batch: async (ops, options) => {
          if (writes++ >= killAfter) throw new Error('killed');
          await db.batch(ops, options);
        },
      };
      // One batch per entry: the kill falls between any two.
      await expect(
        restore(standbyView(counting), new FakeChangelog(history(30)), { bytesPerWrite: 1 }),
      ).rejects.toThrow();
      const later = new FakeChangelog(history(35));
      const outcome = await adopt(db, later);
      expect(outcome.kind).toBe('adopted');
      await restore(db, later);
      expect(await contents(db)).toEqual(await fromScratch(history(35)));
    }
  });

  it('the tail stops when a take-over claims the partition, resumes after release, fails without stopping, and closes', async () => {
    const { db } = memoryDb();
    const records = history(8);
    const warnings: string[] = [];
    let failConnect = 2;
    const tailed: RestoreReport[] = [];
    const tailer = new StandbyTailer({
      db,
      sync: false,
      consumerName: 'billing',
      partitions: [{ partition: 'orders', namespace: NAMESPACE, changelog: CHANGELOG }],
      replicas: 1,
      producerName: OURS,
      settings: undefined,
      isActive: () => false,
      connect: () => {
        if (failConnect-- > 0) return Promise.reject(new Error('connection refused'));
        return Promise.resolve(clientOf(new FakeChangelog(records)));
      },
      restoreTimeoutMs: 5_000,
      log: {
        debug: () => undefined,
        info: () => undefined,
        error: () => undefined,
        warn: (_o, m) => warnings.push(m ?? ''),
      },
      intervalMs: 5,
      onTailed: (_p, report) => tailed.push(report),
    });
    await expect.poll(() => tailed.length, { timeout: 5_000 }).toBe(1);
    expect(warnings.length).toBe(2);
    expect(tailer.chosen).toEqual(['orders']);
    await tailer.claim('orders');
    expect(tailer.chosen).toEqual(['orders']);
    await new Promise((resolve) => setTimeout(resolve, 50));
    // Claimed: not chosen at the next round, nothing tailed.
    expect(tailer.chosen).toEqual([]);
    tailer.release('orders');
    await expect.poll(() => tailer.chosen, { timeout: 2_000 }).toEqual(['orders']);
    const started = performance.now();
    await tailer.close();
    expect(performance.now() - started).toBeLessThan(1_000);
    expect(await contents(standbyView(db))).toEqual(await fromScratch(records));
  });

  // rev5, finding S2: a take-over claims its partition and waits for the tail step under way — also
  // when that step is still connecting. connect() is bounded only by connectTimeoutMs (10 s) per
  // endpoint (openThroughEndpoints tries each), and a take-over happens precisely when a node went
  // away: the partition's new holder sits behind a standby's connect to the dead node.
  it('a take-over claiming the partition does not wait for the tail step to finish connecting', async () => {
    const { db } = memoryDb();
    let connecting = 0;
    let refuse: ((err: Error) => void) | undefined;
    const tailer = new StandbyTailer({
      db,
      sync: false,
      consumerName: 'billing',
      partitions: [{ partition: 'orders', namespace: NAMESPACE, changelog: CHANGELOG }],
      replicas: 1,
      producerName: OURS,
      settings: undefined,
      isActive: () => false,
      // A node that does not answer: the connect attempt ends only at its time-out.
      connect: () => {
        connecting++;
        return new Promise<Client>((_resolve, reject) => (refuse = reject));
      },
      restoreTimeoutMs: 5_000,
      log: { debug: () => undefined, info: () => undefined, error: () => undefined, warn: () => undefined },
      intervalMs: 5,
    });
    try {
      await expect.poll(() => connecting, { timeout: 5_000 }).toBe(1);
      const claimed = await Promise.race([
        tailer.claim('orders').then(() => 'claimed'),
        new Promise((resolve) => setTimeout(() => resolve('still waiting after 1 s'), 1_000)),
      ]);
      expect(claimed).toBe('claimed');
    } finally {
      refuse?.(new Error('connect timed out'));
      await tailer.close();
    }
  });

  // rev5, finding S3: the adopt's memory cap (STANDBY_ADOPT_MAX_BYTES, "the rename is one batch in
  // memory") counts only the copy's keys, in UTF-16 units: the deletes of the namespace's own older
  // state go into the same batch uncounted, and a key of non-ASCII characters is counted at a third
  // of its UTF-8 bytes. The one batch handed to the store is bounded by nothing.
  it('the adopt batch handed to the store stays within maxBytes (the deletes of the older state and UTF-8 bytes counted)', async () => {
    const { db } = memoryDb();
    // This member held the partition long ago: an older state with many keys.
    await db.batch(
      [
        { type: 'put', key: offsetKey(NAMESPACE), value: encodeOffset(1n) },
        { type: 'put', key: changelogPositionKey(NAMESPACE), value: encodeOffset(1n) },
        ...Array.from({ length: 2_000 }, (_, i) => ({
          type: 'put' as const,
          key: key(`old-€€€€€€€€-${i}`),
          value: Buffer.from([1]),
        })),
      ],
      {},
    );
    await restore(standbyView(db), new FakeChangelog(history(30)));
    let largest = 0;
    const measuring: KeyValueDb = {
      ...db,
      batch: (ops, options) => {
        const bytes = ops.reduce(
          (n, op) => n + Buffer.byteLength(op.key, 'utf8') + (op.type === 'put' ? op.value.length : 0),
          0,
        );
        largest = Math.max(largest, bytes);
        return db.batch(ops, options);
      },
    };
    const maxBytes = 4_096;
    const outcome = await adoptStandbyCopy({
      db: measuring,
      sync: false,
      namespace: NAMESPACE,
      changelog: CHANGELOG,
      client: clientOf(new FakeChangelog(history(30))),
      timeoutMs: 2_000,
      isCurrent: () => true,
      maxBytes,
    });
    // Adopted in one batch within the cap, or refused (ignored): never a batch past the cap.
    expect(outcome.kind === 'adopted' ? largest : 0).toBeLessThanOrEqual(maxBytes);
  });

  it('options: standbyReplicas defaults to 0, an integer from 0 to 1000, checked before any I/O', () => {
    const base = {
      superStream: 'orders',
      consumerName: 'billing',
      handler: () => undefined,
      store: '/tmp/x',
    };
    const strategy = (o: object) =>
      resolveGroupOptions({ ...base, ...o }).strategy as { standbyReplicas: number };
    expect(strategy({}).standbyReplicas).toBe(0);
    expect(strategy({ standbyReplicas: 2 }).standbyReplicas).toBe(2);
    expect(() => strategy({ standbyReplicas: -1 })).toThrow(RangeError);
    expect(() => strategy({ standbyReplicas: 1.5 })).toThrow(RangeError);
    expect(() => strategy({ standbyReplicas: 1_001 })).toThrow(RangeError);
    expect(() => strategy({ standbyReplicas: '1' })).toThrow(TypeError);
  });
});
