/**
 * Changelog snapshots and retention (issue 37), for `bench:verify` (STREAM_DEDUP_BENCH_ONLY=snapshot
 * runs them alone: bench/verify.ts) and on their own:
 *
 * - Restore: a group partition taken over with an empty store, its changelog a history of H
 *   entries writing a state of 10 000 keys, restored entry after entry (the whole changelog) and
 *   from a snapshot written by the real SnapshotWriter after entry H - 101 (then 100 more entries).
 * - Disk with retention: N entries (the same state) appended to a changelog created with the
 *   library's retention arguments (`changelogRetention: { maxLengthBytes }`, segments of max/8),
 *   with a snapshot by the real SnapshotWriter each time `maxLengthBytes / 4` bytes of entries
 *   were appended since the last (the most the rule of design §12.2 allows); then the stream's
 *   bytes on the broker's disk against the setting, its first offset, and a restore with an empty
 *   store from the latest snapshot retention kept.
 *
 *   node --import tsx bench/snapshot-restore.ts [H ...]   (default 10000 100000; RUNS, default 3)
 *   node --import tsx bench/snapshot-restore.ts retention [N] [maxLengthBytes]   (1000000, 64 MiB)
 *
 * Entries are published in bulk, so chunks hold many entries (a member's own appends make about
 * one per chunk): the figures favour the whole-changelog restore.
 */
import { mkdtemp, rm } from 'node:fs/promises';
import os, { loadavg } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import type { Client } from 'rabbitmq-stream-js-client';
import { encodeEntry, encodeGenesis, entryId, GENESIS_ID } from '../src/group/changelog-entry.js';
import { resolveRetention, retentionArguments } from '../src/group/changelog-retention.js';
import { ChangelogWriter } from '../src/group/changelog-writer.js';
import { changelogProducerName, partitionNamespace } from '../src/group/consumer.js';
import { restorePartition, type RestoreOptions, type RestoreReport } from '../src/group/restore.js';
import { snapshotProducerName } from '../src/group/snapshot-entry.js';
import { restoreWithSnapshots } from '../src/group/snapshot-restore.js';
import { SnapshotWriter, type SnapshotOutcome } from '../src/group/snapshot-writer.js';
import { ID_HEADER, PRODUCER_HEADER } from '../src/identity/headers.js';
import { effectKeyPrefix, encodeOffset, offsetKey } from '../src/store/consumer-keys.js';
import { DedupStore } from '../src/store/store.js';
import { silentLogger } from '../src/telemetry/logger.js';
import { connectStreamClient } from '../src/transport/stream-probe.js';
import { brokerStreamsDir, streamDisk } from './broker-files.js';

const CONNECTION = {
  hostname: process.env.RABBITMQ_HOST ?? '127.0.0.1',
  port: Number(process.env.RABBITMQ_STREAM_PORT ?? 5552),
  username: process.env.RABBITMQ_USER ?? 'guest',
  password: process.env.RABBITMQ_PASSWORD ?? 'guest',
  vhost: process.env.RABBITMQ_VHOST ?? '/',
};
const GROUP = 'bench';
const KEYS = 10_000;
const ENTRY = changelogProducerName(GROUP);
const SNAP = snapshotProducerName(ENTRY);

/** One history's restore times (ms), run by run. */
export interface SnapshotRestoreTimes {
  readonly history: number;
  readonly wholeMs: readonly number[];
  readonly snapshotMs: readonly number[];
  /** The snapshot's write (ms) and size. */
  readonly writeMs: number;
  readonly snapshotBytes: number;
  /** Entries the snapshot restore applied after the snapshot (100 in every run). */
  readonly appliedAfter: number;
}

/** The changelog with retention after `entries` entries. */
export interface RetentionDisk {
  readonly entries: number;
  readonly maxLengthBytes: number;
  readonly segmentBytes: number;
  /**
   * The stream's segment and index files on the broker's disk (bench/broker-files.ts), apparent
   * and allocated bytes; undefined only with STREAM_DEDUP_BROKER_STREAMS=off.
   */
  readonly diskBytes: number | undefined;
  readonly diskAllocatedBytes: number | undefined;
  readonly diskFiles: number | undefined;
  /** Bytes of entries and snapshots appended (what the changelog holds without retention). */
  readonly appendedBytes: number;
  readonly firstOffset: bigint;
  readonly lastOffset: bigint;
  readonly snapshots: number;
  /** The restore with an empty store after the last entry, from the latest snapshot kept. */
  readonly restoreMs: number;
  readonly restoreApplied: number;
  /** Filling the changelog (entries and snapshots), ms. */
  readonly fillMs: number;
}

function entryOf(namespace: string, last: number): Buffer {
  return encodeEntry({
    lastOffset: BigInt(last),
    baseOffset: last === 0 ? undefined : BigInt(last - 1),
    ops: [
      {
        type: 'put',
        key: `${effectKeyPrefix(namespace)}k${last % KEYS}`,
        value: Buffer.from(`value-${last}`),
      },
      { type: 'put', key: offsetKey(namespace), value: encodeOffset(BigInt(last)) },
    ],
  });
}

/** Appends entries `from` … `to - 1` (after the genesis, if asked), waits for the confirms: bytes. */
async function publish(
  client: Client,
  stream: string,
  namespace: string,
  from: number,
  to: number,
  genesis: boolean,
): Promise<number> {
  const publisher = await client.declarePublisher({ stream, publisherRef: ENTRY });
  let confirmed = 0;
  let total = 0;
  let bytes = 0;
  let done = (): void => undefined;
  publisher.on('publish_confirm', (_e, ids) => {
    confirmed += ids.length;
    if (confirmed >= total) done();
  });
  const send = (id: bigint, body: Buffer) => {
    total++;
    bytes += body.length;
    return publisher.basicSend(id, body, {
      applicationProperties: { [PRODUCER_HEADER]: ENTRY, [ID_HEADER]: id.toString() },
    });
  };
  if (genesis) await send(GENESIS_ID, encodeGenesis(0n));
  for (let o = from; o < to; o++) await send(entryId(BigInt(o)), entryOf(namespace, o));
  const all = new Promise<void>((resolve) => (done = resolve));
  await publisher.flush();
  if (confirmed < total) await all;
  await publisher.close();
  return bytes;
}

/** Makes `db` hold the state the entries 0..x wrote (the keys of the last 10 000 and the offset). */
async function stateAt(db: DedupStore['db'], namespace: string, x: number): Promise<void> {
  const ops = [];
  for (let o = Math.max(0, x - KEYS + 1); o <= x; o++)
    ops.push({
      type: 'put' as const,
      key: `${effectKeyPrefix(namespace)}k${o % KEYS}`,
      value: Buffer.from(`value-${o}`),
    });
  ops.push({ type: 'put' as const, key: offsetKey(namespace), value: encodeOffset(BigInt(x)) });
  await db.batch(ops);
}

/** A SnapshotWriter over `source` into `changelog` (its own ChangelogWriter, closed by the caller). */
function snapshotWriter(
  source: DedupStore,
  namespace: string,
  changelog: string,
  args: Readonly<Record<string, number>>,
) {
  const appender = new ChangelogWriter({
    stream: changelog,
    producerName: SNAP,
    connection: CONNECTION,
    connectTimeoutMs: 10_000,
    appendTimeoutMs: 30_000,
    reconnect: { initialDelayMs: 100, maxDelayMs: 1_000 },
    logger: silentLogger,
    streamArguments: args,
  });
  const writer = new SnapshotWriter({
    db: source.db,
    namespace,
    changelog,
    entryProducer: ENTRY,
    producer: SNAP,
    policy: { everyEntries: 1, everyBytes: 0 },
    writer: appender,
    timeoutMs: 10_000,
  });
  return { appender, writer };
}

/** Restore options over a fresh store `name` in `dir` (each store opened is added to `opened`). */
function restoreOptions(
  client: Client,
  dir: string,
  namespace: string,
  changelog: string,
  opened: DedupStore[],
) {
  return async (name: string): Promise<RestoreOptions> => ({
    db: opened[opened.push(await DedupStore.open(path.join(dir, name))) - 1]!.db,
    sync: false,
    namespace,
    changelog,
    producerName: ENTRY,
    client,
    stallMs: 5_000,
    timeoutMs: 600_000,
    isCurrent: () => true,
  });
}

/** A restore with an empty store from the snapshot reference: must begin at a snapshot. */
async function fromSnapshot(options: RestoreOptions): Promise<RestoreReport> {
  const report = await restoreWithSnapshots(
    options,
    { reference: SNAP, producerName: SNAP },
    (fields, message) => {
      throw new Error(`${message} ${JSON.stringify(fields)}`);
    },
  );
  if (report.snapshot === undefined) throw new Error('the restore did not begin at a snapshot');
  return report;
}

async function timed<T>(run: () => Promise<T>): Promise<[number, T]> {
  const started = performance.now();
  const result = await run();
  return [performance.now() - started, result];
}

function written(outcome: SnapshotOutcome): Extract<SnapshotOutcome, { kind: 'written' }> {
  if (outcome.kind !== 'written') throw new Error(`snapshot not written: ${JSON.stringify(outcome)}`);
  return outcome;
}

/** Restore times of a partition whose changelog holds `history` entries (`runs` of each, interleaved). */
export async function measureSnapshotRestore(history: number, runs = 3): Promise<SnapshotRestoreTimes> {
  const client = await connectStreamClient(CONNECTION, 10_000);
  const partition = `bench-snapshot-${history}-${process.pid}-${Date.now().toString(36)}`;
  const changelog = `${partition}.${GROUP}.changelog`;
  const namespace = partitionNamespace(GROUP, partition);
  await client.createStream({ stream: changelog, arguments: {} });
  const dir = await mkdtemp(path.join(os.tmpdir(), 'bench-snapshot-'));
  const opened: DedupStore[] = [];
  try {
    const x = history - 101;
    await publish(client, changelog, namespace, 0, x + 1, true);
    const source = await DedupStore.open(path.join(dir, 'source'));
    await stateAt(source.db, namespace, x);
    const { appender, writer } = snapshotWriter(source, namespace, changelog, {});
    const [writeMs, outcome] = await timed(() => writer.write(client, () => true));
    const snapshot = written(outcome);
    await appender.close();
    await source.close();
    await publish(client, changelog, namespace, x + 1, history, false);
    const options = restoreOptions(client, dir, namespace, changelog, opened);
    const wholeMs: number[] = [];
    const snapshotMs: number[] = [];
    let appliedAfter = 0;
    for (let run = 0; run < runs; run++) {
      const [whole, full] = await timed(async () =>
        restorePartition({ ...(await options(`full-${run}`)), snapshotProducer: SNAP }),
      );
      if (full.offset !== BigInt(history - 1)) throw new Error(`whole restore reached ${full.offset}`);
      wholeMs.push(whole);
      const [fast, report] = await timed(async () => fromSnapshot(await options(`snap-${run}`)));
      if (report.offset !== BigInt(history - 1)) throw new Error(`snapshot restore reached ${report.offset}`);
      snapshotMs.push(fast);
      appliedAfter = report.applied;
    }
    return { history, wholeMs, snapshotMs, writeMs, snapshotBytes: snapshot.bytes, appliedAfter };
  } finally {
    for (const store of opened) await store.close();
    await client.deleteStream({ stream: changelog }).catch(() => undefined);
    await client.close();
    await rm(dir, { recursive: true, force: true });
  }
}

/**
 * `entries` entries into a changelog with `changelogRetention: { maxLengthBytes }`, a snapshot every
 * `maxLengthBytes / 4` bytes of entries: see the file comment.
 */
export async function measureRetentionDisk(entries: number, maxLengthBytes: number): Promise<RetentionDisk> {
  const everyBytes = Math.floor(maxLengthBytes / 4);
  const retention = resolveRetention({ maxLengthBytes }, { everyEntries: 0, everyBytes })!;
  const args = retentionArguments(retention);
  // Before any I/O: a bench that cannot find the broker's folder says so now, not after the fill.
  const streamsDir = await brokerStreamsDir();
  const client = await connectStreamClient(CONNECTION, 10_000);
  const partition = `bench-retention-${entries}-${process.pid}-${Date.now().toString(36)}`;
  const changelog = `${partition}.${GROUP}.changelog`;
  const namespace = partitionNamespace(GROUP, partition);
  await client.createStream({ stream: changelog, arguments: args });
  const dir = await mkdtemp(path.join(os.tmpdir(), 'bench-retention-'));
  const source = await DedupStore.open(path.join(dir, 'source'));
  const { appender, writer } = snapshotWriter(source, namespace, changelog, args);
  const opened: DedupStore[] = [];
  try {
    const filled = performance.now();
    // One entry's bytes (all are within a few bytes): blocks of entries between two snapshots.
    const block = Math.max(1, Math.floor(everyBytes / entryOf(namespace, entries).length));
    let appendedBytes = 0;
    let snapshots = 0;
    for (let from = 0; from < entries; from += block) {
      const to = Math.min(entries, from + block);
      appendedBytes += await publish(client, changelog, namespace, from, to, from === 0);
      if (to === entries) break;
      await stateAt(source.db, namespace, to - 1);
      appendedBytes += written(await writer.write(client, () => true)).bytes;
      snapshots++;
    }
    const fillMs = performance.now() - filled;
    // The broker applies retention as it rolls a segment over: what it keeps once the last one is written.
    const disk =
      streamsDir === undefined ? undefined : await streamDisk(streamsDir, changelog, CONNECTION.vhost);
    const stats = await client.streamStatsRequest(changelog);
    const [restoreMs, report] = await timed(async () =>
      fromSnapshot(await restoreOptions(client, dir, namespace, changelog, opened)('after')),
    );
    if (report.offset !== BigInt(entries - 1)) throw new Error(`restore reached ${report.offset}`);
    return {
      entries,
      maxLengthBytes: retention.maxLengthBytes,
      segmentBytes: retention.segmentBytes,
      diskBytes: disk?.bytes,
      diskAllocatedBytes: disk?.allocatedBytes,
      diskFiles: disk?.files,
      appendedBytes,
      firstOffset: stats.firstChunkId,
      lastOffset: stats.committedChunkId,
      snapshots,
      restoreMs,
      restoreApplied: report.applied,
      fillMs,
    };
  } finally {
    await appender.close();
    await source.close();
    for (const store of opened) await store.close();
    await client.deleteStream({ stream: changelog }).catch(() => undefined);
    await client.close();
    await rm(dir, { recursive: true, force: true });
  }
}

if (process.argv[1] === fileURLToPath(import.meta.url) && process.argv[2] === 'retention') {
  // node --import tsx bench/snapshot-restore.ts retention [entries] [maxLengthBytes]: one JSON line.
  const disk = await measureRetentionDisk(
    Number(process.argv[3] ?? 1_000_000),
    Number(process.argv[4] ?? 64 * 1024 * 1024),
  );
  console.log(
    JSON.stringify({ ...disk, firstOffset: Number(disk.firstOffset), lastOffset: Number(disk.lastOffset) }),
  );
} else if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const sizes = process.argv.slice(2).map(Number);
  for (const history of sizes.length > 0 ? sizes : [10_000, 100_000]) {
    const t = await measureSnapshotRestore(history, Number(process.env.RUNS ?? 3));
    const whole = t.wholeMs.map(Math.round).join('/');
    const fast = t.snapshotMs.map(Math.round).join('/');
    console.log(
      `history ${history}: whole changelog ${whole} ms, from the snapshot ${fast} ms (snapshot written in ${Math.round(t.writeMs)} ms, ${t.snapshotBytes} bytes; ${t.appliedAfter} entries after it; load ${loadavg()[0]!.toFixed(2)})`,
    );
  }
}
