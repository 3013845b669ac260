// A snapshot restore takes the newest complete snapshot up to the snapshot producer's last ID, and
// falls back (never hangs, never leaves a store it cannot restore again) when none is usable
// (docs/design.md §12.1). From the hostile review revS (F1, F1b, F1c, F2, F4); each failed on e77e4bf.
import type { Client } from 'rabbitmq-stream-js-client';
import { describe, expect, it } from 'vitest';
import { encodeEntry, encodeGenesis, entryId, GENESIS_ID } from '../../src/group/changelog-entry.js';
import { changelogProducerName, partitionNamespace } from '../../src/group/consumer.js';
import type { RestoreReport } from '../../src/group/restore.js';
import {
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
  decodeOffset,
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
const put = (k: string, v: Uint8Array) => ({ type: 'put' as const, key: key(k), value: v });
const offsetOp = (o: bigint) => ({ type: 'put' as const, key: offsetKey(NAMESPACE), value: encodeOffset(o) });

/** Entry `last` of a history where message `o` puts key `k<o % 5>` = o. */
function entry(last: number): ChangelogRecordSpec {
  return {
    producer: OURS,
    id: entryId(BigInt(last)),
    content: () =>
      encodeEntry({
        lastOffset: BigInt(last),
        baseOffset: last === 0 ? undefined : BigInt(last - 1),
        ops: [put(`k${last % 5}`, Buffer.from([last])), offsetOp(BigInt(last))],
      }),
  };
}
const genesis: ChangelogRecordSpec = { producer: OURS, id: GENESIS_ID, content: () => encodeGenesis(0n) };

function stateAt(x: number) {
  const ops = new Map<string, { type: 'put'; key: string; value: Uint8Array }>();
  for (let o = 0; o <= x; o++) ops.set(`k${o % 5}`, put(`k${o % 5}`, Buffer.from([o])));
  return [offsetOp(BigInt(x)), ...[...ops.values()].sort((a, b) => (a.key < b.key ? -1 : 1))];
}

/** A snapshot of `ops` (the state at `x`), `perPart` ops a part, as the writer would write it. */
function snapshotOf(x: number, ops: ReturnType<typeof stateAt>, perPart: number): ChangelogRecordSpec[] {
  const digest = snapshotDigest();
  const records: ChangelogRecordSpec[] = [];
  for (let i = 0; i * perPart < ops.length; i++) {
    const message = encodePart(BigInt(x), i, ops.slice(i * perPart, (i + 1) * perPart));
    digest.update(partBody(message));
    records.push({ producer: SNAP, id: snapshotId(BigInt(x), i)!, content: () => message });
  }
  const marker = encodeMarker(BigInt(x), records.length, ops.length, digest.digest());
  records.push({ producer: SNAP, id: snapshotId(BigInt(x), records.length)!, content: () => marker });
  return records;
}
const snapshot = (x: number): ChangelogRecordSpec[] => snapshotOf(x, stateAt(x), 100);

async function contents(db: KeyValueDb): Promise<Record<string, string>> {
  const out: Record<string, string> = {};
  for (const range of namespaceRanges(NAMESPACE)) {
    for await (const [k, v] of db.iterator(range)) out[k] = Buffer.from(v).toString('hex');
  }
  return out;
}

async function restoreOn(
  changelog: FakeChangelog,
  db: KeyValueDb,
  more: {
    readAheadBytes?: number;
    bytesPerWrite?: number;
    timeoutMs?: number;
    snapshotMaxBytes?: number;
  } = {},
) {
  const warnings: string[] = [];
  const report: RestoreReport = await restoreWithSnapshots(
    {
      db,
      sync: false,
      namespace: NAMESPACE,
      changelog: CHANGELOG,
      producerName: OURS,
      client: changelog.client(),
      stallMs: 150,
      timeoutMs: more.timeoutMs ?? 1_500,
      isCurrent: () => true,
      ...(more.readAheadBytes === undefined ? {} : { readAheadBytes: more.readAheadBytes }),
      ...(more.bytesPerWrite === undefined ? {} : { bytesPerWrite: more.bytesPerWrite }),
      ...(more.snapshotMaxBytes === undefined ? {} : { snapshotMaxBytes: more.snapshotMaxBytes }),
    },
    { reference: SNAP, producerName: SNAP },
    (_fields, message) => warnings.push(message),
  );
  return { report, state: await contents(db), warnings };
}

async function fullState(records: ChangelogRecordSpec[]): Promise<Record<string, string>> {
  const changelog = new FakeChangelog(records.filter((r) => r.producer === OURS));
  return (await restoreOn(changelog, changelog.db(NAMESPACE))).state;
}

describe('snapshot restore: the newest complete snapshot, or the whole changelog', () => {
  it('F1: a complete zombie snapshot between the reference and the referenced snapshot: the restore ends at the changelog head, its store consistent', async () => {
    // Member B holds the partition at offset 9 and writes the snapshot of 9: it reads the committed
    // chunk (R) and begins. Zombie A — SIGSTOPped inside its own write() after its "last snapshot
    // ID" check, before B's — resumes and its whole snapshot of 4 (a state of the one history)
    // lands between R and B's first part (A's IDs (4+2)·2^20+i are above everything the snapshot
    // producer had). B's parts have higher IDs and land after; B's marker is confirmed, the entry
    // producer's last ID is still 9+2, B stores R. Entries 5..9 lie before R.
    const records = [genesis];
    for (let i = 0; i < 10; i++) records.push(entry(i));
    const reference = records.length; // R: the committed chunk B read (nothing of A's yet)
    records.push(...snapshot(4)); // A's, complete
    records.push(...snapshot(9)); // B's, complete, the one R was stored for
    const expected = await fullState(records);

    const changelog = new FakeChangelog(records);
    changelog.reference = BigInt(reference);
    const db = changelog.db(NAMESPACE);
    let first: Awaited<ReturnType<typeof restoreOn>> | Error;
    try {
      first = await restoreOn(changelog, db);
    } catch (err) {
      first = err as Error;
    }
    // What the store holds after that attempt, whatever it threw.
    const rawPosition = await db.get(changelogPositionKey(NAMESPACE));
    const rawOffset = await db.get(offsetKey(NAMESPACE));
    const held = {
      offset: rawOffset === undefined ? undefined : decodeOffset(rawOffset),
      position: rawPosition === undefined ? undefined : decodeOffset(rawPosition),
    };
    // e77e4bf: applies A's snapshot of 4, persists offset 4 with the changelog position past
    // entries 5..9 (after A's marker), then waits for entry 9+2 that lies behind it until
    // timeoutMs: DEDUP_BROKER_UNREACHABLE; every later take-over of this store reads from that
    // position and fails the same way (restoreTimeoutMs, 300 s by default, each time).
    expect({
      outcome: first instanceof Error ? `${first.name}: ${first.message}` : first.report.offset,
      held,
    }).toEqual({ outcome: 9n, held: { offset: 9n, position: BigInt(records.length) } });
    if (!(first instanceof Error)) expect(first.state).toEqual(expected);
  });

  it('F1b: the same store, second life: a restore of a store at the zombie snapshot ends (it does not wait for entries behind its position)', async () => {
    const records = [genesis];
    for (let i = 0; i < 10; i++) records.push(entry(i));
    const reference = records.length;
    records.push(...snapshot(4));
    records.push(...snapshot(9));
    const expected = await fullState(records);
    const changelog = new FakeChangelog(records);
    changelog.reference = BigInt(reference);
    const db = changelog.db(NAMESPACE);
    await restoreOn(changelog, db).catch(() => undefined); // the first life (F1)
    const second = await restoreOn(changelog, db).then(
      (r) => r,
      (err: Error) => err,
    );
    expect(second instanceof Error ? `${second.name}: ${second.message}` : second.report.offset).toBe(9n);
    if (!(second instanceof Error)) expect(second.state).toEqual(expected);
  });

  it('F1c: the store F1 left, once the partition moved on (entry 10 on 9, appended by the member that held it), is refused: the member stops', async () => {
    const records = [genesis];
    for (let i = 0; i < 10; i++) records.push(entry(i));
    const reference = records.length;
    records.push(...snapshot(4));
    records.push(...snapshot(9));
    const changelog = new FakeChangelog(records);
    changelog.reference = BigInt(reference);
    const db = changelog.db(NAMESPACE);
    await restoreOn(changelog, db).catch(() => undefined); // F1's first life
    // B, back with its own store at 9, held the partition meanwhile and appended entry 10.
    records.push(entry(10));
    const expected = await fullState(records);
    const later = await restoreOn(changelog, db).then(
      (r) => r,
      (err: Error) => err,
    );
    // e77e4bf: DEDUP_CHANGELOG_INVALID "computed on offset 9, past this member's state (offset 4):
    // the entries between are missing" — a permanent stop (partition.ts fails the member).
    expect(later instanceof Error ? `${later.name}: ${later.message}` : later.report.offset).toBe(10n);
    if (!(later instanceof Error)) expect(later.state).toEqual(expected);
  });

  it('F2: a reference with no snapshot message after it (foreign or stale offset-tracking state) falls back to the whole changelog instead of timing out', async () => {
    // The reference is broker state anyone with the name can store; it is trusted unchecked. The
    // snapshot producer has written (last ID > 0), but nothing of it lies after the reference:
    // seenId never reaches lastId, so the loop waits for a snapshot until timeoutMs.
    const records = [genesis];
    for (let i = 0; i < 6; i++) records.push(entry(i));
    records.push(...snapshot(5));
    for (let i = 6; i < 12; i++) records.push(entry(i));
    const expected = await fullState(records);
    const changelog = new FakeChangelog(records);
    changelog.reference = BigInt(records.length - 3); // entry 9: after the only snapshot
    const result = await restoreOn(changelog, changelog.db(NAMESPACE)).then(
      (r) => r,
      (err: Error) => err,
    );
    expect(result instanceof Error ? `${result.name}: ${result.message}` : result.report.offset).toBe(11n);
    if (!(result instanceof Error)) expect(result.state).toEqual(expected);
  });

  it('F4: a snapshot message this version cannot decode (a newer version, a corrupt part) makes an empty-store take-over read the whole changelog, not stop the member', async () => {
    const records = [genesis];
    for (let i = 0; i < 6; i++) records.push(entry(i));
    const reference = records.length;
    const snap = snapshot(5);
    const part0 = snap[0]!.content();
    const newer = Buffer.from(part0);
    newer[1] = 2; // version 2: what a rolling upgrade's newer member would write
    records.push({ ...snap[0]!, content: () => newer }, ...snap.slice(1));
    for (let i = 6; i < 9; i++) records.push(entry(i));
    const expected = await fullState(records);
    const changelog = new FakeChangelog(records);
    changelog.reference = BigInt(reference);
    const result = await restoreOn(changelog, changelog.db(NAMESPACE)).then(
      (r) => r,
      (err: Error) => err,
    );
    // e77e4bf: DEDUP_CHANGELOG_INVALID (permanent: the member stops), though a classic restore
    // skips snapshot messages undecoded and the whole changelog is intact.
    expect(result instanceof Error ? `${result.name}: ${result.message}` : result.report.offset).toBe(8n);
    if (!(result instanceof Error)) expect(result.state).toEqual(expected);
  });

  it('F3: a snapshot holding more than the cap is abandoned part-way (not held whole): the whole changelog is read, the fold exact', async () => {
    const records = [genesis];
    for (let i = 0; i < 6; i++) records.push(entry(i));
    const reference = records.length;
    records.push(...snapshotOf(5, stateAt(5), 1)); // one key a part: 6 parts, ~80 bytes
    for (let i = 6; i < 9; i++) records.push(entry(i));
    const expected = await fullState(records);
    const capped = new FakeChangelog(records);
    capped.reference = BigInt(reference);
    const result = await restoreOn(capped, capped.db(NAMESPACE), { snapshotMaxBytes: 40 });
    expect(result.report).toMatchObject({ offset: 8n, snapshot: undefined });
    expect(result.state).toEqual(expected);
    expect(result.warnings).toHaveLength(1);
    // Under the cap the same snapshot is used.
    const uncapped = new FakeChangelog(records);
    uncapped.reference = BigInt(reference);
    const used = await restoreOn(uncapped, uncapped.db(NAMESPACE), { snapshotMaxBytes: 1_000 });
    expect(used.report).toMatchObject({ offset: 8n, snapshot: 5n });
    expect(used.state).toEqual(expected);
  });

  it('F3: the writer skips a state holding more than the cap: no marker, no reference', async () => {
    const source = new FakeChangelog([]);
    const db = source.db(NAMESPACE);
    await db.batch(stateAt(9));
    const sent: ChangelogRecordSpec[] = [];
    let stored: bigint | undefined;
    const client = {
      locatorConnection: {
        queryPublisherSequence: ({ publisherRef }: { publisherRef: string }) =>
          Promise.resolve(publisherRef === SNAP ? 0n : entryId(9n)),
        storeOffset: ({ offsetValue }: { offsetValue: bigint }) => {
          stored = offsetValue;
          return Promise.resolve();
        },
      },
      streamStatsRequest: () =>
        Promise.resolve({ firstChunkId: 0n, committedChunkId: 20n, lastChunkId: 20n }),
    } as unknown as Client;
    const writerOf = (maxBytes: number) =>
      new SnapshotWriter({
        db,
        namespace: NAMESPACE,
        changelog: CHANGELOG,
        entryProducer: OURS,
        producer: SNAP,
        policy: { everyEntries: 1, everyBytes: 0 },
        writer: {
          maxEntryBytes: 60,
          append: (message, id) => {
            sent.push({ producer: SNAP, id, content: () => message });
            return Promise.resolve('landed');
          },
        },
        timeoutMs: 1_000,
        maxBytes,
      });
    expect(await writerOf(40).write(client, () => true)).toMatchObject({ kind: 'too-large', maxBytes: 40 });
    expect(stored).toBeUndefined();
    expect(sent).toEqual([]);
    sent.length = 0;
    expect(await writerOf(1_000).write(client, () => true)).toMatchObject({ kind: 'written', offset: 9n });
    expect(stored).toBe(20n);
  });

  it("the snapshot's offset record is written as it is (its chunk identity kept), once the snapshots are read", async () => {
    const records = [genesis];
    for (let i = 0; i < 6; i++) records.push(entry(i));
    const reference = records.length;
    const identity = encodeOffset(5n, { firstOffset: 3n, timestamp: 1_700_000_000_000n });
    const ops = [{ ...offsetOp(5n), value: identity }, ...stateAt(5).slice(1)];
    records.push(...snapshotOf(5, ops, 2));
    const changelog = new FakeChangelog(records);
    changelog.reference = BigInt(reference);
    const db = changelog.db(NAMESPACE);
    const { report } = await restoreOn(changelog, db);
    expect(report).toMatchObject({ offset: 5n, snapshot: 5n });
    expect(Buffer.from((await db.get(offsetKey(NAMESPACE)))!).toString('hex')).toBe(
      Buffer.from(identity).toString('hex'),
    );
    expect(decodeOffset((await db.get(changelogPositionKey(NAMESPACE)))!)).toBe(BigInt(records.length));
  });
});
