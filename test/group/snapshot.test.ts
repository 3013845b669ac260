import { describe, expect, it } from 'vitest';
import type { Client } from 'rabbitmq-stream-js-client';
import { encodeEntry, encodeGenesis, entryId, GENESIS_ID } from '../../src/group/changelog-entry.js';
import { changelogProducerName, partitionNamespace } from '../../src/group/consumer.js';
import { resolveGroupOptions } from '../../src/group/options.js';
import type { RestoreReport } from '../../src/group/restore.js';
import {
  decodeSnapshotRecord,
  encodeMarker,
  encodePart,
  namespaceRanges,
  partBody,
  snapshotDigest,
  snapshotId,
  snapshotProducerName,
} from '../../src/group/snapshot-entry.js';
import { restoreWithSnapshots } from '../../src/group/snapshot-restore.js';
import { SnapshotWriter } from '../../src/group/snapshot-writer.js';
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
const put = (k: string, v: number) => ({ type: 'put' as const, key: key(k), value: Buffer.from([v]) });
const offsetOp = (o: bigint) => ({ type: 'put' as const, key: offsetKey(NAMESPACE), value: encodeOffset(o) });

/** Entry `last` of a history where message `o` puts key `k<o % 5>` = o: the state at `x` is a fold. */
function entry(last: number): ChangelogRecordSpec {
  return {
    producer: OURS,
    id: entryId(BigInt(last)),
    content: () =>
      encodeEntry({
        lastOffset: BigInt(last),
        baseOffset: last === 0 ? undefined : BigInt(last - 1),
        ops: [put(`k${last % 5}`, last), offsetOp(BigInt(last))],
      }),
  };
}
const genesis: ChangelogRecordSpec = { producer: OURS, id: GENESIS_ID, content: () => encodeGenesis(0n) };

/** The state at offset `x` as a snapshot's ops. */
function stateAt(x: number) {
  const ops = new Map<string, { type: 'put'; key: string; value: Uint8Array }>();
  for (let o = 0; o <= x; o++) ops.set(`k${o % 5}`, put(`k${o % 5}`, o));
  return [offsetOp(BigInt(x)), ...[...ops.values()].sort((a, b) => (a.key < b.key ? -1 : 1))];
}

/** A snapshot of the state at `x` in `split` parts; `tamper` changes the marker. */
function snapshot(
  x: number,
  split: number,
  tamper: { parts?: number; digest?: boolean } = {},
): ChangelogRecordSpec[] {
  const ops = stateAt(x);
  const size = Math.ceil(ops.length / split);
  const digest = snapshotDigest();
  const records: ChangelogRecordSpec[] = [];
  for (let i = 0; i * size < ops.length; i++) {
    const message = encodePart(BigInt(x), i, ops.slice(i * size, (i + 1) * size));
    digest.update(partBody(message));
    records.push({ producer: SNAP, id: snapshotId(BigInt(x), i)!, content: () => message });
  }
  const d = digest.digest();
  if (tamper.digest === true) d[0] = d[0]! ^ 1;
  const marker = encodeMarker(BigInt(x), tamper.parts ?? records.length, ops.length, d);
  records.push({ producer: SNAP, id: snapshotId(BigInt(x), records.length)!, content: () => marker });
  return records;
}

async function contents(db: KeyValueDb): Promise<Record<string, string>> {
  const out: Record<string, string> = {};
  for (const range of namespaceRanges(NAMESPACE)) {
    for await (const [k, v] of db.iterator(range)) out[k] = Buffer.from(v).toString('hex');
  }
  return out;
}

async function restore(records: ChangelogRecordSpec[], reference: number | undefined) {
  const changelog = new FakeChangelog(records);
  changelog.reference = reference === undefined ? undefined : BigInt(reference);
  const db = changelog.db(NAMESPACE);
  const warnings: string[] = [];
  const report: RestoreReport = await restoreWithSnapshots(
    {
      db,
      sync: false,
      namespace: NAMESPACE,
      changelog: CHANGELOG,
      producerName: OURS,
      client: changelog.client(),
      stallMs: 2_000,
      timeoutMs: 20_000,
      isCurrent: () => true,
    },
    { reference: SNAP, producerName: SNAP },
    (_fields, message) => warnings.push(message),
  );
  return { report, state: await contents(db), warnings };
}

/** The history 0..n-1 with snapshots inserted after the entries they follow. */
function history(n: number, snapshots: Map<number, ChangelogRecordSpec[]>): ChangelogRecordSpec[] {
  const records = [genesis];
  for (let i = 0; i < n; i++) {
    records.push(entry(i));
    records.push(...(snapshots.get(i) ?? []));
  }
  return records;
}

describe('changelog snapshots (design §12.1)', () => {
  it('encodes and decodes parts and markers; a part writing outside the partition is refused', () => {
    const part = encodePart(7n, 2, [put('a', 1)]);
    const decoded = decodeSnapshotRecord(part, (k) => k.startsWith(effectKeyPrefix(NAMESPACE)), 'here');
    expect(decoded).toMatchObject({ kind: 'part', offset: 7n, index: 2 });
    expect(() => decodeSnapshotRecord(part, () => false, 'here')).toThrow(/outside its partition/);
    const marker = decodeSnapshotRecord(encodeMarker(7n, 3, 4, Buffer.alloc(32, 9)), () => true, 'here');
    expect(marker).toMatchObject({ kind: 'marker', offset: 7n, parts: 3, keys: 4 });
    expect(snapshotId(7n, 0)).toBe(9n << 20n);
    expect(snapshotId(1n << 50n, 0)).toBeUndefined();
  });

  it('a take-over with an empty store begins at the referenced snapshot: fewer messages read, the same state', async () => {
    const full = await restore(history(40, new Map()), undefined);
    const records = history(40, new Map([[29, snapshot(29, 3)]]));
    // The reference: a committed chunk before the snapshot's first part (entry 27 here).
    const from = records.findIndex((r) => r.producer === OURS && r.id === entryId(27n));
    const snap = await restore(records, from);
    expect(snap.report.snapshot).toBe(29n);
    expect(snap.report.offset).toBe(39n);
    expect(snap.state).toEqual(full.state);
    expect(full.report.read).toBe(41);
    // Entries 27..39 and the snapshot's 4 messages.
    expect(snap.report.read).toBe(13 + 4);
    expect(snap.warnings).toEqual([]);
  });

  it('a torn snapshot (digest or count wrong, or no marker) is ignored for the one before it', async () => {
    for (const torn of [
      snapshot(29, 3, { digest: true }),
      snapshot(29, 3, { parts: 2 }),
      snapshot(29, 3).slice(0, 2),
    ]) {
      const records = history(
        40,
        new Map([
          [9, snapshot(9, 2)],
          [29, torn],
        ]),
      );
      const from = records.findIndex((r) => r.producer === OURS && r.id === entryId(9n));
      const result = await restore(records, from);
      expect(result.report.snapshot).toBe(9n);
      expect(result.state).toEqual((await restore(history(40, new Map()), undefined)).state);
    }
  });

  it('a torn snapshot with none before it: the whole changelog is read (a warning), never half a snapshot', async () => {
    const records = history(40, new Map([[29, snapshot(29, 3, { digest: true })]]));
    const from = records.findIndex((r) => r.producer === OURS && r.id === entryId(29n));
    const result = await restore(records, from);
    expect(result.report.snapshot).toBeUndefined();
    expect(result.report.read).toBe(records.length);
    expect(result.warnings).toHaveLength(1);
    expect(result.state).toEqual((await restore(history(40, new Map()), undefined)).state);
  });

  it('a snapshot with an entry past its offset before it is not used (the entry would be missed)', async () => {
    const records = history(40, new Map());
    // Entry 31 landed before the snapshot of 29 began: a reference there would skip it.
    const at = records.findIndex((r) => r.producer === OURS && r.id === entryId(31n));
    records.splice(at + 1, 0, ...snapshot(29, 2));
    const result = await restore(records, at - 3);
    expect(result.report.snapshot).toBeUndefined();
    expect(result.state).toEqual((await restore(history(40, new Map()), undefined)).state);
  });

  it('the writer writes what a restore reads back; it skips a state a snapshot was begun at, and an entry past it', async () => {
    // A store holding the state at 29, written through the fake's db.
    const source = new FakeChangelog([]);
    const db = source.db(NAMESPACE);
    await db.batch(stateAt(29));
    const sent: ChangelogRecordSpec[] = [];
    let lastEntry = entryId(29n);
    let stored: bigint | undefined;
    const client = {
      locatorConnection: {
        queryPublisherSequence: ({ publisherRef }: { publisherRef: string }) =>
          Promise.resolve(
            publisherRef === SNAP ? sent.reduce((m, r) => (r.id > m ? r.id : m), 0n) : lastEntry,
          ),
        storeOffset: ({ offsetValue }: { offsetValue: bigint }) => {
          stored = offsetValue;
          return Promise.resolve();
        },
      },
      streamStatsRequest: () =>
        Promise.resolve({ firstChunkId: 0n, committedChunkId: 55n, lastChunkId: 55n }),
    } as unknown as Client;
    const writer = new SnapshotWriter({
      db,
      namespace: NAMESPACE,
      changelog: CHANGELOG,
      entryProducer: OURS,
      producer: SNAP,
      policy: { everyEntries: 2, everyBytes: 0 },
      writer: {
        maxEntryBytes: 60, // a part per op or two
        append: (message, id) => {
          sent.push({ producer: SNAP, id, content: () => message });
          return Promise.resolve('landed');
        },
      },
      timeoutMs: 1_000,
    });
    expect(writer.due).toBe(false);
    writer.noteEntry(10);
    writer.noteEntry(10);
    expect(writer.due).toBe(true);
    const outcome = await writer.write(client, () => true);
    expect(outcome).toMatchObject({ kind: 'written', offset: 29n, keys: 6, from: 55n });
    expect(sent.length).toBeGreaterThan(3);
    expect(stored).toBe(55n);
    expect(writer.due).toBe(false);
    // Read back: the history with the writer's messages after entry 29.
    const records = history(40, new Map([[29, sent]]));
    const from = records.findIndex((r) => r.producer === OURS && r.id === entryId(29n));
    const result = await restore(records, from);
    expect(result.report.snapshot).toBe(29n);
    expect(result.state).toEqual((await restore(history(40, new Map()), undefined)).state);
    // Again at the same state: begun already.
    expect(await writer.write(client, () => true)).toMatchObject({ kind: 'skipped' });
    // A later state whose entry is no longer the last one: written, not referenced.
    await db.batch(stateAt(31));
    lastEntry = entryId(32n);
    stored = undefined;
    expect(await writer.write(client, () => true)).toMatchObject({ kind: 'skipped', why: /last entry ID/ });
    expect(stored).toBeUndefined();
  });

  it('options: defaults, 0 turns a trigger off, others refused before any I/O', () => {
    const base = {
      superStream: 'orders',
      consumerName: 'billing',
      store: '/tmp/x',
      handler: () => undefined,
    };
    const resolved = resolveGroupOptions(base);
    expect(resolved.strategy).toMatchObject({
      snapshots: { everyEntries: 10_000, everyBytes: 64 * 1024 * 1024 },
    });
    expect(
      resolveGroupOptions({ ...base, snapshotEveryEntries: 0, snapshotEveryBytes: 0 }).strategy,
    ).toMatchObject({
      snapshots: { everyEntries: 0, everyBytes: 0 },
    });
    expect(() => resolveGroupOptions({ ...base, snapshotEveryEntries: -1 })).toThrow(RangeError);
    expect(() => resolveGroupOptions({ ...base, snapshotEveryBytes: 1.5 })).toThrow(RangeError);
    expect(() => resolveGroupOptions({ ...base, snapshotEveryEntries: '5' as never })).toThrow(TypeError);
    // A name of 225–233 bytes (accepted before snapshots, revS F5) opens with snapshots on: its
    // snapshot producer name (also the offset reference) is hashed to stay within 256 bytes.
    const long = 'b'.repeat(228);
    expect(() => resolveGroupOptions({ ...base, consumerName: long })).not.toThrow();
    const names = [long, 'b'.repeat(229), 'b'.repeat(233)].map((n) =>
      snapshotProducerName(changelogProducerName(n)),
    );
    for (const name of names) expect(Buffer.byteLength(name)).toBeLessThanOrEqual(256);
    expect(new Set(names).size).toBe(3);
    expect(snapshotProducerName(changelogProducerName('billing'))).toBe(
      `${changelogProducerName('billing')}.snapshot`,
    );
    expect(() => resolveGroupOptions({ ...base, consumerName: 'b'.repeat(234) })).toThrow(RangeError);
  });
});

describe('changelog retention (design §12.2)', () => {
  /** Restores `records` of which retention kept those from index `first` on. */
  async function trimmed(
    records: ChangelogRecordSpec[],
    first: number,
    reference: number | undefined,
    before?: (db: KeyValueDb) => Promise<void>,
  ) {
    const changelog = new FakeChangelog(records);
    changelog.firstChunkId = BigInt(first);
    changelog.reference = reference === undefined ? undefined : BigInt(reference);
    const db = changelog.db(NAMESPACE);
    await before?.(db);
    const warnings: string[] = [];
    const report = await restoreWithSnapshots(
      {
        db,
        sync: false,
        namespace: NAMESPACE,
        changelog: CHANGELOG,
        producerName: OURS,
        client: changelog.client(),
        stallMs: 2_000,
        timeoutMs: 20_000,
        isCurrent: () => true,
      },
      { reference: SNAP, producerName: SNAP },
      (_fields, message) => warnings.push(message),
    );
    return { report, state: await contents(db), warnings };
  }
  const at = (records: ChangelogRecordSpec[], last: number): number =>
    records.findIndex((r) => r.producer === OURS && r.id === entryId(BigInt(last)));
  const fullState = async () => (await restore(history(60, new Map()), undefined)).state;

  it('a take-over after trimming restores exactly from the snapshot retention kept', async () => {
    const records = history(
      60,
      new Map([
        [19, snapshot(19, 2)],
        [49, snapshot(49, 3)],
      ]),
    );
    const result = await trimmed(records, at(records, 30), at(records, 48));
    expect(result.report.snapshot).toBe(49n);
    expect(result.report.offset).toBe(59n);
    expect(result.state).toEqual(await fullState());
  });

  it('a snapshot trimmed away, or none, or a torn one: DEDUP_CHANGELOG_INVALID, nothing applied', async () => {
    const records = history(
      60,
      new Map([
        [19, snapshot(19, 2)],
        [49, snapshot(49, 3, { digest: true })],
      ]),
    );
    const first = at(records, 30);
    // The reference still points at the snapshot of 19, which retention removed.
    await expect(trimmed(records, first, at(records, 18))).rejects.toMatchObject({
      code: 'DEDUP_CHANGELOG_INVALID',
      message: expect.stringMatching(/latest complete snapshot .* trimmed away/) as unknown,
    });
    // No reference: the head is gone.
    await expect(trimmed(records, first, undefined)).rejects.toMatchObject({
      code: 'DEDUP_CHANGELOG_INVALID',
      message: expect.stringMatching(/first entries are gone/) as unknown,
    });
    // The only snapshot after the trim point is torn: never applied, and the head is gone.
    const torn = await trimmed(records, first, at(records, 48)).catch((err: unknown) => err);
    expect(torn).toMatchObject({ code: 'DEDUP_CHANGELOG_INVALID' });
  });

  it('a store whose state lies before the trim point is replaced by the snapshot, not refused', async () => {
    const records = history(60, new Map([[49, snapshot(49, 3)]]));
    const result = await trimmed(records, at(records, 30), at(records, 48), async (db) => {
      // A member that held the partition up to offset 9 long ago: k4 = 9 ... and a key since gone.
      await db.batch([
        ...stateAt(9),
        { type: 'put', key: key('stale'), value: Buffer.from([1]) },
        { type: 'put', key: changelogPositionKey(NAMESPACE), value: encodeOffset(11n) },
      ]);
    });
    expect(result.report.snapshot).toBe(49n);
    const { [changelogPositionKey(NAMESPACE)]: _position, ...state } = result.state;
    const { [changelogPositionKey(NAMESPACE)]: _full, ...full } = await fullState();
    expect(state).toEqual(full);
  });

  it('options: retention only with snapshots by bytes that fit, refused before any I/O', () => {
    const base = {
      superStream: 'orders',
      consumerName: 'billing',
      store: '/tmp/x',
      handler: () => undefined,
    };
    const MiB = 1024 * 1024;
    expect(resolveGroupOptions(base).strategy).toMatchObject({ retention: undefined });
    expect(
      resolveGroupOptions({
        ...base,
        snapshotEveryBytes: 64 * MiB,
        changelogRetention: { maxLengthBytes: 256 * MiB },
      }).strategy,
    ).toMatchObject({ retention: { maxLengthBytes: 256 * MiB, segmentBytes: 32 * MiB } });
    const unsafe = (options: object) =>
      expect(() => resolveGroupOptions({ ...base, ...options })).toThrow(
        expect.objectContaining({ code: 'DEDUP_UNSAFE_OPTIONS' }) as unknown,
      );
    // The default snapshotEveryBytes (64 MiB) above maxLengthBytes / 4.
    unsafe({ changelogRetention: { maxLengthBytes: 128 * MiB } });
    unsafe({ snapshotEveryBytes: 0, changelogRetention: { maxLengthBytes: 1024 * MiB } });
    unsafe({
      snapshotEveryBytes: MiB,
      changelogRetention: { maxLengthBytes: 64 * MiB, segmentBytes: 16 * MiB },
    });
    unsafe({ snapshotEveryBytes: MiB, changelogRetention: { maxLengthBytes: 64 * MiB, maxAge: '7D' } });
    expect(() => resolveGroupOptions({ ...base, changelogRetention: { maxLengthBytes: 1000 } })).toThrow(
      RangeError,
    );
    expect(() => resolveGroupOptions({ ...base, changelogRetention: 5 as never })).toThrow(TypeError);
  });
});
