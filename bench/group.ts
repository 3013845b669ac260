/**
 * Consumer groups (docs/design.md §12), for `bench:verify`, against the raw client in the same run:
 *
 * - Throughput: a 3-partition super stream holding `count` messages, read from the first offset by
 *   a group of two `SuperStreamVerifyingConsumer` members in one process (each with its own store,
 *   a LevelDB commit and a changelog append per 1 000 messages of a partition) against the raw
 *   client's super stream consumer reading the same messages. Both timed from the first message to
 *   the last (for the group: to the last partition committed); each read in a fresh process.
 * - Take-over: a member with an empty store takes over a partition whose changelog holds 100 000
 *   entries (one per input message, as `commitEvery: 1` writes them) and restores them all before
 *   its first delivery, against the raw client reading that changelog from its first entry to its
 *   last. The entries are the library's own encoding of the entry a real member wrote for the
 *   partition's first message (read back from its changelog), one per offset, appended by a raw
 *   publisher under the group's changelog producer name, each sent once the one before it is
 *   confirmed (one entry per chunk, as a member writes them). A member itself would take minutes
 *   to write 100 000 entries: each of its commits is a changelog append, a confirm, a query of the
 *   last ID and a LevelDB write.
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { Offset, type Client } from 'rabbitmq-stream-js-client';
import { SuperStreamVerifyingConsumer, type AssignmentEvent } from 'stream-dedup/stream';
import { decodeEntry, encodeEntry, entryId } from '../src/group/changelog-entry.js';
import { changelogProducerName, changelogStreamName, partitionNamespace } from '../src/group/consumer.js';
import { ID_HEADER, PRODUCER_HEADER } from '../src/identity/headers.js';
import { encodeOffset, offsetKey } from '../src/store/consumer-keys.js';
import { CONNECTION, connectClient, measureInChild, median, publishStamped, uniqueName } from './common.js';

export interface GroupRates {
  readonly messages: number;
  readonly rawPerSec: number;
  readonly groupPerSec: number;
  /** Each round's rate, in the order measured (raw and group interleaved). */
  readonly rounds: { readonly raw: readonly number[]; readonly group: readonly number[] };
  /**
   * With `snapshotEvery`: the group's rounds run with snapshots off (both options 0: at the
   * defaults none is due either, a partition writes 1 entry per 1 000 messages), and rounds with one
   * every `every` entries are interleaved with them.
   */
  readonly snapshots?: {
    readonly every: number;
    readonly offPerSec: number;
    readonly onPerSec: number;
    readonly rounds: { readonly off: readonly number[]; readonly on: readonly number[] };
    /** Snapshots the measured read of each `on` round wrote (all partitions). */
    readonly written: readonly number[];
    /**
     * Messages in the measured read's changelogs (all partitions; up to the last chunk's first
     * offset: the genesis, the entries and, in `on` rounds, the snapshots' parts and markers).
     */
    readonly changelog: { readonly off: readonly number[]; readonly on: readonly number[] };
    /** The 1-minute load average before each round. */
    readonly load: readonly number[];
    /** Before each off and on read. */
    readonly loads: { readonly off: readonly number[]; readonly on: readonly number[] };
    /** Which of the two ran first in each round (they alternate: drift hits both alike). */
    readonly firsts: readonly ('off' | 'on')[];
    /**
     * CPU time of the measured read's process per message (µs; set-up included), off and on: less
     * sensitive than the rate to other processes on the machine.
     */
    readonly cpuUsPerMessage: { readonly off: readonly number[]; readonly on: readonly number[] };
    /**
     * Each `on` read's snapshot writes as the library logs them (`ms`: the wall time the partition's
     * commit path waited for the write, its appender's first connect included), in the order
     * written; `first` marks a partition's first snapshot of the read.
     */
    readonly snapshotMs: readonly (readonly { readonly ms: number; readonly first: boolean }[])[];
  };
}

export interface TakeoverTimes {
  readonly entries: number;
  /** The new holder's take-over, from the broker's activation to its first delivery asked for (ms). */
  readonly takeoverMs: number;
  /** The raw client reading the same changelog from its first entry to its last (ms). */
  readonly rawReadMs: number;
}

export const PARTITIONS = 3;
/**
 * The group's snapshots when set (STREAM_DEDUP_BENCH_SNAPSHOTS): `off` (both options 0) or one every
 * N entries (not by bytes); else the defaults.
 */
const SNAPSHOTS = process.env.STREAM_DEDUP_BENCH_SNAPSHOTS;
/** `appendsInFlight` of the group's members when set (STREAM_DEDUP_BENCH_APPENDS), else the default. */
const APPENDS_IN_FLIGHT =
  process.env.STREAM_DEDUP_BENCH_APPENDS === undefined
    ? undefined
    : Number(process.env.STREAM_DEDUP_BENCH_APPENDS);

/** Publishes `count` stamped messages to each of `partitions` (producer names per partition). */
export async function fill(partitions: readonly string[], dir: string, count: number): Promise<void> {
  for (const [i, stream] of partitions.entries()) {
    await publishStamped(count, {
      stream,
      producerName: `bench-group-source-${i}`,
      store: join(dir, `producer-${i}`),
    });
  }
}

async function rawGroupRead(superStream: string, count: number): Promise<number> {
  const client = await connectClient();
  try {
    let seen = 0;
    let t0 = 0;
    let done = (): void => undefined;
    const all = new Promise<void>((resolve) => (done = resolve));
    const consumer = await client.declareSuperStreamConsumer(
      { superStream, offset: Offset.first(), consumerRef: uniqueName('raw') },
      () => {
        if (seen++ === 0) t0 = performance.now();
        if (seen === count) done();
      },
    );
    await all;
    const seconds = (performance.now() - t0) / 1000;
    await consumer.close();
    return count / seconds;
  } finally {
    await client.close();
  }
}

async function groupRead(
  superStream: string,
  dir: string,
  perPartition: number,
  round: string,
  written: { count: number; changelog: number; snapshotMs: { ms: number; first: boolean }[] },
): Promise<number> {
  const client = await connectClient();
  const consumerName = `bench-group-${round}`;
  let t0 = 0;
  let applied = 0;
  const snapshotted = new Set<string>();
  written.snapshotMs = [];
  // The library's own log line of each snapshot written carries the time its commit path waited.
  const info = (obj: object, msg?: string): void => {
    if (msg !== 'stream-dedup: changelog snapshot written') return;
    const { partition, ms } = obj as { partition: string; ms: number };
    written.snapshotMs.push({ ms, first: !snapshotted.has(partition) });
    snapshotted.add(partition);
  };
  const logger = { debug: () => undefined, info, warn: () => undefined, error: () => undefined };
  const open = (member: string) =>
    SuperStreamVerifyingConsumer.open({
      connection: CONNECTION,
      superStream,
      consumerName,
      store: join(dir, `${consumerName}-${member}`),
      startFrom: 'first',
      commitEvery: 1_000,
      logger,
      // Another depth than the default (bench/group-depths.ts compares them in one run).
      ...(APPENDS_IN_FLIGHT === undefined ? {} : { appendsInFlight: APPENDS_IN_FLIGHT }),
      ...(SNAPSHOTS === undefined
        ? {}
        : { snapshotEveryEntries: SNAPSHOTS === 'off' ? 0 : Number(SNAPSHOTS), snapshotEveryBytes: 0 }),
      handler: (_message, tx) => {
        if (t0 === 0) t0 = performance.now();
        applied++;
        tx.put('last', 'x');
      },
    });
  // One after the other: a member joined once the first one subscribed to every partition is the
  // second consumer of each, and the broker gives it partition 1. Started together, their
  // subscriptions can reach some partitions in the other order, and the broker may then give all
  // three to one member (seen in 1 of 5 runs), which is not the two-member group measured here.
  const members = [await open('a'), await open('b')] as const;
  try {
    const partitions = members[0].partitions;
    await Promise.all(
      partitions.map((p) => Promise.any(members.map((m) => m.waitForOffset(p, BigInt(perPartition - 1))))),
    );
    const seconds = (performance.now() - t0) / 1000;
    // A hand-over may have processed a batch twice (once by each member; one is kept): at least all.
    if (applied < perPartition * partitions.length)
      throw new Error(`the group applied ${applied} of ${perPartition * partitions.length}`);
    const held = members.map((m) => m.activePartitions().length);
    if (held.includes(0)) throw new Error(`a member holds no partition (${held.join('/')})`);
    written.count = members.reduce((sum, m) => sum + m.stats.snapshotsWritten, 0);
    written.changelog = 0;
    for (const p of partitions) {
      const stats = await client.streamStatsRequest(changelogStreamName(p, consumerName));
      written.changelog += Number(stats.committedChunkId) + 1;
    }
    return (perPartition * partitions.length) / seconds;
  } finally {
    await Promise.all(members.map((m) => m.close()));
    for (const p of members[0].partitions)
      await client.deleteStream({ stream: changelogStreamName(p, consumerName) }).catch(() => undefined);
    await client.close();
  }
}

/** Reads `stream` from its first message to its `count`th with the raw client's consumer: ms. */
async function rawStreamRead(client: Client, stream: string, count: number): Promise<number> {
  let seen = 0;
  let done = (): void => undefined;
  const all = new Promise<void>((resolve) => (done = resolve));
  const started = performance.now();
  const consumer = await client.declareConsumer({ stream, offset: Offset.first() }, () => {
    if (++seen === count) done();
  });
  await all;
  const ms = performance.now() - started;
  await client.closeConsumer(consumer.extendedId);
  return ms;
}

/** One take-over measurement in this process: see the file comment. */
async function takeover(entries: number): Promise<TakeoverTimes> {
  const client = await connectClient();
  const dir = await mkdtemp(join(tmpdir(), 'bench-takeover-'));
  const superStream = uniqueName('bench-takeover');
  const consumerName = 'bench-takeover';
  await client.createSuperStream({ streamName: superStream, arguments: {} }, undefined, 1);
  const [partition] = (await client.queryPartitions({ superStream })) as [string];
  const changelog = changelogStreamName(partition, consumerName);
  const member = (name: string, onAssignment?: (e: AssignmentEvent) => void) =>
    SuperStreamVerifyingConsumer.open({
      connection: CONNECTION,
      superStream,
      consumerName,
      store: join(dir, name),
      startFrom: 'first',
      commitEvery: 1,
      handler: (_message, tx) => tx.put('last', 'x'),
      ...(onAssignment === undefined ? {} : { onAssignment }),
    });
  try {
    // A real member writes the genesis and the entry of offset 0: its ops are the template of
    // every other entry.
    await fill([partition], dir, 1);
    const first = await member('first');
    await first.waitForOffset(partition, 0n);
    await first.close();
    const namespace = partitionNamespace(consumerName, partition);
    let templateRead = (_content: Buffer): void => undefined;
    const read = new Promise<Buffer>((resolve) => (templateRead = resolve));
    // The changelog's second message (the first is its genesis).
    const reader = await client.declareConsumer({ stream: changelog, offset: Offset.first() }, (m) => {
      if ((m.offset ?? 0n) >= 1n) templateRead(m.content);
    });
    const template = await read;
    await client.closeConsumer(reader.extendedId);
    const { ops } = decodeEntry(template, () => true, 'template');
    const offsetOp = offsetKey(namespace);
    if (!ops.some((op) => op.key === offsetOp)) throw new Error('the template entry writes no offset');
    await fill([partition], dir, entries - 1);

    // One entry per chunk, as a member writes them (each append waits for its confirm).
    const publisher = await client.declarePublisher({
      stream: changelog,
      publisherRef: changelogProducerName(consumerName),
    });
    let confirmedUpTo = 0n;
    let onConfirm = (): void => undefined;
    publisher.on('publish_confirm', (err, ids) => {
      if (err !== null) throw new Error(`publish error ${err}`);
      for (const id of ids) if (id > confirmedUpTo) confirmedUpTo = id;
      onConfirm();
    });
    for (let offset = 1n; offset < BigInt(entries); offset++) {
      const entry = encodeEntry({
        lastOffset: offset,
        baseOffset: offset - 1n,
        ops: ops.map((op) =>
          op.key === offsetOp && op.type === 'put' ? { ...op, value: encodeOffset(offset) } : op,
        ),
      });
      const id = entryId(offset);
      const landed = new Promise<void>((resolve) => (onConfirm = () => confirmedUpTo >= id && resolve()));
      await publisher.basicSend(id, entry, {
        applicationProperties: {
          [PRODUCER_HEADER]: changelogProducerName(consumerName),
          [ID_HEADER]: String(id),
        },
      });
      await publisher.flush();
      await landed;
    }
    await publisher.close();

    const rawReadMs = await rawStreamRead(client, changelog, entries);

    let assigned = (_e: AssignmentEvent & { kind: 'assigned' }): void => undefined;
    const takenOver = new Promise<AssignmentEvent & { kind: 'assigned' }>((resolve) => (assigned = resolve));
    const holder = await member('holder', (e) => {
      if (e.kind === 'assigned') assigned(e);
    });
    const event = await takenOver;
    await holder.close();
    if (event.restored !== entries || event.offset !== BigInt(entries - 1))
      throw new Error(`restored ${event.restored} entries up to ${event.offset}, not ${entries}`);
    return { entries, takeoverMs: event.ms, rawReadMs };
  } finally {
    await client.deleteSuperStream({ streamName: superStream }).catch(() => undefined);
    await client.deleteStream({ stream: changelog }).catch(() => undefined);
    await client.close();
    await rm(dir, { recursive: true, force: true });
  }
}

/**
 * Fills a 3-partition super stream with `count` messages, then reads it `rounds` times each way,
 * interleaved, each read in a fresh process.
 */
export async function measureGroup(count = 99_999, rounds = 5, snapshotEvery?: number): Promise<GroupRates> {
  const perPartition = Math.ceil(count / PARTITIONS);
  const dir = await mkdtemp(join(tmpdir(), 'bench-group-'));
  const superStream = uniqueName('bench-group');
  const client = await connectClient();
  const run = (
    mode: string,
    round: string,
    snapshots?: string,
  ): Promise<{
    rate: number;
    written: number;
    changelog: number;
    cpuUsPerMessage: number;
    snapshotMs: { ms: number; first: boolean }[];
  }> =>
    measureInChild(import.meta.url, [mode, superStream, dir, String(perPartition), round], {
      STREAM_DEDUP_BENCH_GROUP: '1',
      ...(snapshots === undefined ? {} : { STREAM_DEDUP_BENCH_SNAPSHOTS: snapshots }),
    });
  try {
    await client.createSuperStream({ streamName: superStream, arguments: {} }, undefined, PARTITIONS);
    await fill(await client.queryPartitions({ superStream }), dir, perPartition);
    const raw: number[] = [];
    const group: number[] = [];
    const on: number[] = [];
    const written: number[] = [];
    const load: number[] = [];
    const changelog = { off: [] as number[], on: [] as number[] };
    const loads = { off: [] as number[], on: [] as number[] };
    const firsts: ('off' | 'on')[] = [];
    const cpuUsPerMessage = { off: [] as number[], on: [] as number[] };
    const snapshotMs: { ms: number; first: boolean }[][] = [];
    for (let i = 0; i < rounds; i++) {
      load.push(loadavg()[0]!);
      raw.push((await run('raw', String(i))).rate);
      if (snapshotEvery === undefined) {
        group.push((await run('group', String(i))).rate);
        continue;
      }
      // Off and on alternate which runs first, so that a drifting load does not favour one.
      const order: ('off' | 'on')[] = i % 2 === 0 ? ['off', 'on'] : ['on', 'off'];
      firsts.push(order[0]!);
      for (const kind of order) {
        loads[kind].push(loadavg()[0]!);
        const r = await run(
          'group',
          kind === 'off' ? String(i) : `${i}-on`,
          kind === 'off' ? 'off' : String(snapshotEvery),
        );
        changelog[kind].push(r.changelog);
        cpuUsPerMessage[kind].push(r.cpuUsPerMessage);
        if (kind === 'off') group.push(r.rate);
        else {
          on.push(r.rate);
          written.push(r.written);
          snapshotMs.push(r.snapshotMs);
        }
      }
    }
    return {
      messages: perPartition * PARTITIONS,
      rawPerSec: median(raw),
      groupPerSec: median(group),
      rounds: { raw, group },
      ...(snapshotEvery === undefined
        ? {}
        : {
            snapshots: {
              every: snapshotEvery,
              offPerSec: median(group),
              onPerSec: median(on),
              rounds: { off: group, on },
              written,
              changelog,
              load,
              loads,
              firsts,
              cpuUsPerMessage,
              snapshotMs,
            },
          }),
    };
  } finally {
    await client.deleteSuperStream({ streamName: superStream }).catch(() => undefined);
    await client.close();
    await rm(dir, { recursive: true, force: true });
  }
}

/** The take-over of a partition with an `entries`-entry changelog, in a fresh process. */
export function measureTakeover(entries = 100_000): Promise<TakeoverTimes> {
  return measureInChild(import.meta.url, ['takeover', '', '', String(entries), '0'], {
    STREAM_DEDUP_BENCH_GROUP: '1',
  });
}

if (process.env.STREAM_DEDUP_BENCH_GROUP === '1') {
  const [mode, superStream, dir, n, round] = process.argv.slice(2) as [
    string,
    string,
    string,
    string,
    string,
  ];
  /**
   * A warm-up read, then the measured one, with the process's CPU time over its wall time (cpuShare)
   * and per message read.
   */
  const written = { count: 0, changelog: 0, snapshotMs: [] as { ms: number; first: boolean }[] };
  const measured = async (read: (warm: boolean) => Promise<number>) => {
    await read(true);
    const cpu = process.cpuUsage();
    const started = performance.now();
    const rate = await read(false);
    const used = process.cpuUsage(cpu);
    const cpuMs = (used.user + used.system) / 1000;
    // Set-up included (connections, members' open and restore): an upper bound per message.
    const cpuUsPerMessage = (cpuMs * 1000) / (Number(n) * PARTITIONS);
    return {
      rate,
      cpuShare: cpuMs / (performance.now() - started),
      cpuUsPerMessage,
      written: written.count,
      changelog: written.changelog,
      snapshotMs: written.snapshotMs,
    };
  };
  const result =
    mode === 'takeover'
      ? await takeover(Number(n))
      : await measured((warm) =>
          mode === 'raw'
            ? rawGroupRead(superStream, Number(n) * PARTITIONS)
            : groupRead(superStream, dir, Number(n), warm ? `warm-${round}` : round, written),
        );
  process.stdout.write(`${JSON.stringify(result)}\n`);
  process.exit(0);
}
