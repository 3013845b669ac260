import { Offset } from 'rabbitmq-stream-js-client';
import { afterAll, describe, expect, it, vi } from 'vitest';
import { encodeEntry, encodeGenesis, entryId, GENESIS_ID } from '../../src/group/changelog-entry.js';
import { changelogProducerName, changelogStreamName, partitionNamespace } from '../../src/group/consumer.js';
import { ID_HEADER, PRODUCER_HEADER } from '../../src/identity/headers.js';
import { effectKeyPrefix, encodeOffset, offsetKey } from '../../src/store/consumer-keys.js';
import { creditPolicyOf } from '../../src/transport/stream-delivery.js';
import {
  SuperStreamVerifyingConsumer,
  type AssignmentEvent,
  type SuperStreamChangelogConsumerOptions,
} from '../../src/stream.js';
import { ledgerHandler, ledgerIds, publishLedger as publish, type Sent } from '../support/group-ledger.js';
import { STREAM_CONNECTION } from '../support/broker.js';
import { useClient } from '../support/stream.js';
import { useSuperStreams } from '../support/superstream.js';
import { useTempDir } from '../support/tmp.js';

const client = useClient();
const superStream = useSuperStreams(client);
const tempDir = useTempDir();
/** The changelog streams the members created: removed after the file's tests. */
const changelogs: string[] = [];
afterAll(async () => {
  for (const stream of changelogs)
    await client()
      .deleteStream({ stream })
      .catch(() => undefined);
});

/** A 3-partition super stream, and its changelogs remembered for removal. */
async function groupSuperStream(prefix: string): Promise<{ name: string; partitions: string[] }> {
  const name = await superStream(prefix);
  const partitions = await client().queryPartitions({ superStream: name });
  changelogs.push(...partitions.map((p) => `${p}.balance-projection.changelog`));
  return { name, partitions };
}

async function member(
  name: string,
  superStreamName: string,
  events: string[],
  store?: string,
  more: Partial<SuperStreamChangelogConsumerOptions> = {},
): Promise<SuperStreamVerifyingConsumer> {
  return SuperStreamVerifyingConsumer.open({
    superStream: superStreamName,
    consumerName: 'balance-projection',
    store: store ?? (await tempDir()),
    connection: STREAM_CONNECTION,
    commitEvery: 20,
    handler: ledgerHandler,
    onAssignment: (e: AssignmentEvent) =>
      events.push(`${name} ${e.kind} ${e.partition.slice(superStreamName.length)}`),
    ...more,
  });
}

/** Waits until whichever of `members` holds each partition has committed up to what was sent. */
async function caughtUp(members: SuperStreamVerifyingConsumer[], sent: Map<string, Sent>): Promise<void> {
  await Promise.all(
    [...sent].map(([partition, s]) =>
      Promise.any(members.map((m) => m.waitForOffset(partition, s.lastOffset))),
    ),
  );
}

async function expectFold(holder: SuperStreamVerifyingConsumer, partition: string, s: Sent): Promise<void> {
  expect({
    partition,
    balance: Number((await holder.readEffect(partition, 'balance'))?.toString()),
    count: Number((await holder.readEffect(partition, 'count'))?.toString()),
    doubles: (await holder.readEffect(partition, 'doubles'))?.toString(),
  }).toEqual({ partition, balance: s.balance, count: s.distinct, doubles: undefined });
}

describe('SuperStreamVerifyingConsumer (consumer group)', () => {
  it('hands partitions between two members with separate stores: each restores from the changelog, nothing applied twice or lost', async () => {
    const { name, partitions } = await groupSuperStream('group-handover');
    const sent = new Map<string, Sent>();
    const events: string[] = [];
    await publish(client(), partitions, 1, 60, sent);

    const a = await member('A', name, events);
    await caughtUp([a], sent);
    expect(a.activePartitions()).toEqual(partitions);

    // B joins: the broker moves one partition to it (after A answered its deactivation).
    const b = await member('B', name, events);
    await publish(client(), partitions, 61, 60, sent);
    await caughtUp([a, b], sent);
    expect([...a.activePartitions(), ...b.activePartitions()].sort()).toEqual([...partitions].sort());
    expect(b.activePartitions().length).toBeGreaterThan(0);
    expect(b.stats.entriesRestored).toBeGreaterThan(0);

    // A leaves: B takes the rest over, from the changelog (A's store is never read by B).
    await a.close();
    await publish(client(), partitions, 121, 40, sent);
    await caughtUp([b], sent);
    expect(b.activePartitions()).toEqual(partitions);
    for (const [partition, s] of sent) await expectFold(b, partition, s);
    await b.close();
    console.log(`[consumer group] ${events.join('; ')}`);
  });

  it('the stalled-partition watch: a member not active on a partition whose input waits past stalledPartitionMs leaves its group and joins again; effects stay exact', async () => {
    const { name, partitions } = await groupSuperStream('group-stalled');
    const sent = new Map<string, Sent>();
    const events: string[] = [];
    await publish(client(), partitions, 1, 30, sent);
    /** Round two's first offset per partition, and what A's handler waits for from there. */
    let round1End: Record<string, bigint> = {};
    let holdA: Promise<void> | undefined;
    const a = await member('A', name, events, undefined, {
      // A's handler stops at round two until the watch has acted: as a group the broker left
      // without an active consumer looks to its other members, input waits and the changelog stays.
      handler: async (message, tx, partition) => {
        if (holdA !== undefined && message.offset !== undefined && message.offset >= round1End[partition]!)
          await holdA;
        return ledgerHandler(message, tx, partition);
      },
    });
    await caughtUp([a], sent);
    round1End = Object.fromEntries([...sent].map(([partition, s]) => [partition, s.lastOffset + 1n]));
    let release!: () => void;
    holdA = new Promise<void>((resolve) => (release = resolve));
    let left!: (line: object) => void;
    const leaving = new Promise<object>((resolve) => (left = resolve));
    const b = await member('B', name, events, undefined, {
      stalledPartitionMs: 3_000,
      logger: {
        debug: () => undefined,
        info: () => undefined,
        error: () => undefined,
        warn: (obj, msg) => {
          if (msg?.includes('joining again') === true) left(obj);
        },
      },
    });
    await vi.waitFor(() => expect(b.activePartitions().length).toBeGreaterThan(0), { timeout: 30_000 });
    const heldByA = a.activePartitions();
    expect(heldByA.length).toBeGreaterThan(0);
    const stalledAt = performance.now();
    await publish(client(), partitions, 31, 60, sent);
    const warning = await leaving;
    const detectedMs = performance.now() - stalledAt;
    expect(b.stats.rejoins).toBeGreaterThan(0);
    expect(heldByA).toContain((warning as { partition: string }).partition);
    holdA = undefined;
    release();
    await caughtUp([a, b], sent);
    for (const [partition, s] of sent) {
      const holder = a.activePartitions().includes(partition) ? a : b;
      await expectFold(holder, partition, s);
    }
    // B joined that partition's group again (after 3000 + 3 × 1000 + 5000 ms): with A gone, B
    // takes every partition over, the one it left included, from the changelogs.
    await a.close();
    await publish(client(), partitions, 91, 20, sent);
    await caughtUp([b], sent);
    expect(b.activePartitions()).toEqual(partitions);
    for (const [partition, s] of sent) await expectFold(b, partition, s);
    console.log(
      `[consumer group stalled] A held ${heldByA.length} partition(s); B's watch left a group ${(detectedMs / 1000).toFixed(1)} s ` +
        `after round two (stalledPartitionMs 3000), rejoins=${b.stats.rejoins}; ${events.join('; ')}`,
    );
    await b.close();
  });

  it('a member reopened on its old store restores only what the changelog has beyond it', async () => {
    const { name, partitions } = await groupSuperStream('group-reopen');
    const sent = new Map<string, Sent>();
    const events: string[] = [];
    const storeA = await tempDir();
    await publish(client(), partitions, 1, 50, sent);
    const a = await member('A', name, events, storeA);
    await caughtUp([a], sent);
    await a.close();

    // B holds everything for a while, on its own store.
    const b = await member('B', name, events);
    await publish(client(), partitions, 51, 50, sent);
    await caughtUp([b], sent);
    await b.close();

    // A again: its store is at the first 50 of each partition; the changelog holds B's part.
    const again = await member('A2', name, events, storeA);
    await caughtUp([again], sent);
    const restored = again.stats.entriesRestored;
    expect(restored).toBeGreaterThan(0);
    for (const [partition, s] of sent) await expectFold(again, partition, s);
    await again.close();
    console.log(`[consumer group reopen] restored ${restored} entries; ${events.join('; ')}`);
  });

  it('restores a changelog whose chunks hold many entries, several chunks in flight: in order, every entry', async () => {
    // A changelog written by a pipelining publisher (members write one entry per confirm, so about
    // one per chunk): entries share chunks, and the restore's chunks in flight reach its handler
    // interleaved by the JS client (src/group/chunk-order.ts) — out of order they would stop it with
    // DEDUP_CHANGELOG_INVALID. Each entry puts the offset and 'n' = its offset.
    const { name, partitions } = await groupSuperStream('group-dense');
    const partition = partitions[0]!;
    const namespace = partitionNamespace('balance-projection', partition);
    const changelog = changelogStreamName(partition, 'balance-projection');
    await client().createStream({ stream: changelog, arguments: {} });
    const writer = await client().declarePublisher({
      stream: changelog,
      publisherRef: changelogProducerName('balance-projection'),
    });
    const ENTRIES = 5_000;
    let confirmed = 0;
    const allConfirmed = new Promise<void>((resolve) =>
      writer.on('publish_confirm', (_err, ids) => {
        confirmed += ids.length;
        if (confirmed >= ENTRIES + 1) resolve();
      }),
    );
    await writer.basicSend(GENESIS_ID, encodeGenesis(0n), {
      applicationProperties: {
        [PRODUCER_HEADER]: changelogProducerName('balance-projection'),
        [ID_HEADER]: String(GENESIS_ID),
      },
    });
    for (let offset = 0n; offset < BigInt(ENTRIES); offset++) {
      const entry = encodeEntry({
        lastOffset: offset,
        baseOffset: offset === 0n ? undefined : offset - 1n,
        ops: [
          { type: 'put', key: offsetKey(namespace), value: encodeOffset(offset) },
          { type: 'put', key: `${effectKeyPrefix(namespace)}n`, value: Buffer.from(String(offset)) },
        ],
      });
      await writer.basicSend(entryId(offset), entry, {
        applicationProperties: {
          [PRODUCER_HEADER]: changelogProducerName('balance-projection'),
          [ID_HEADER]: String(entryId(offset)),
        },
      });
    }
    await writer.flush();
    await allConfirmed;
    await writer.close();
    // How many chunks hold them: far fewer than entries, or the test shows nothing.
    let chunks = 0;
    let read = 0;
    let done = (): void => undefined;
    const allRead = new Promise<void>((resolve) => (done = resolve));
    const counter = await client().declareConsumer(
      {
        stream: changelog,
        offset: Offset.first(),
        creditPolicy: creditPolicyOf(
          (request) => request(1),
          1,
          () => chunks++,
        ),
      },
      () => {
        if (++read === ENTRIES + 1) done();
      },
    );
    await allRead;
    await client().closeConsumer(counter.extendedId);
    expect(chunks).toBeLessThan(ENTRIES / 10);

    // The partition holds the input the changelog says was applied: a take-over refuses an empty
    // partition behind the changelog's offset (recreated: DEDUP_STREAM_REGRESSION).
    await publish(client(), [partition], 1, ENTRIES, new Map<string, Sent>());
    const events: AssignmentEvent[] = [];
    const m = await SuperStreamVerifyingConsumer.open({
      superStream: name,
      consumerName: 'balance-projection',
      store: await tempDir(),
      connection: STREAM_CONNECTION,
      handler: ledgerHandler,
      onAssignment: (e) => events.push(e),
    });
    await m.waitForOffset(partition, BigInt(ENTRIES - 1));
    const assigned = events.find((e) => e.kind === 'assigned' && e.partition === partition);
    expect(assigned).toMatchObject({ restored: ENTRIES, offset: BigInt(ENTRIES - 1) });
    expect((await m.readEffect(partition, 'n'))?.toString()).toBe(String(ENTRIES - 1));
    expect(m.failure).toBeUndefined();
    await m.close();
    console.log(
      `[consumer group dense] ${ENTRIES} entries in ${chunks} chunks restored in ${(assigned as { ms: number }).ms} ms`,
    );
  });

  it("the changelog's genesis says where a partition's input begins: a member that began elsewhere is fenced and starts again from there", async () => {
    const { name, partitions } = await groupSuperStream('group-genesis');
    const partition = partitions[0]!;
    const changelog = changelogStreamName(partition, 'balance-projection');
    const events: AssignmentEvent[] = [];
    let holds = (): void => undefined;
    const held = new Promise<void>((resolve) => (holds = resolve));
    // startFrom 'first' on an empty partition with no changelog: the member will begin at offset 0.
    const m = await SuperStreamVerifyingConsumer.open({
      superStream: name,
      consumerName: 'balance-projection',
      store: await tempDir(),
      connection: STREAM_CONNECTION,
      startFrom: 'first',
      commitEvery: 20,
      handler: ledgerHandler,
      onAssignment: (e) => {
        events.push(e);
        if (e.kind === 'assigned' && e.partition === partition) holds();
      },
    });
    await held;
    // Meanwhile "another member" began the partition at the offset where the second round will
    // land (planted before the member has anything to commit, so that its genesis comes second).
    const firstRoundLength = BigInt(ledgerIds(1, 10).length);
    await client().createStream({ stream: changelog, arguments: {} });
    const writer = await client().declarePublisher({
      stream: changelog,
      publisherRef: changelogProducerName('balance-projection'),
    });
    const confirmed = new Promise<void>((resolve) => writer.on('publish_confirm', () => resolve()));
    await writer.basicSend(GENESIS_ID, encodeGenesis(firstRoundLength), {
      applicationProperties: {
        [PRODUCER_HEADER]: changelogProducerName('balance-projection'),
        [ID_HEADER]: String(GENESIS_ID),
      },
    });
    await confirmed;
    await writer.close();
    const sent = new Map<string, Sent>();
    await publish(client(), [partition], 1, 10, sent);
    const firstRound = { ...sent.get(partition)! };
    expect(firstRound.lastOffset + 1n).toBe(firstRoundLength);
    await publish(client(), [partition], 11, 20, sent);
    const all = sent.get(partition)!;

    await m.waitForOffset(partition, all.lastOffset);
    // The exact fold of the second round alone: nothing of the messages before the genesis' start.
    await expectFold(m, partition, {
      lastOffset: all.lastOffset,
      balance: all.balance - firstRound.balance,
      distinct: all.distinct - firstRound.distinct,
    });
    expect((await m.readEffect(partition, 'applied:1'))?.toString()).toBeUndefined();
    const revoked = events.filter((e) => e.kind === 'revoked' && e.partition === partition);
    expect(revoked.map((e) => (e.kind === 'revoked' ? e.reason : ''))).toEqual([
      'was fenced: another member wrote past this one in its changelog',
    ]);
    expect(m.failure).toBeUndefined();
    await m.close();

    // A member with an empty store restores the genesis and the entries: the same state.
    const fresh = await member('fresh', name, []);
    await fresh.waitForOffset(partition, all.lastOffset);
    await expectFold(fresh, partition, {
      lastOffset: all.lastOffset,
      balance: all.balance - firstRound.balance,
      distinct: all.distinct - firstRound.distinct,
    });
    await fresh.close();
  });

  it('refuses scopeTtlMs at open, before anything is opened', async () => {
    await expect(
      SuperStreamVerifyingConsumer.open({
        superStream: 'never-opened',
        consumerName: 'g',
        store: await tempDir(),
        handler: () => undefined,
        scopeTtlMs: 1000 as 0,
      }),
    ).rejects.toMatchObject({ code: 'DEDUP_UNSAFE_OPTIONS' });
  });

  it('refuses a stalledPartitionMs that is not an integer ≥ 0, or not above commitLingerMs, at open', async () => {
    const open = async (more: Partial<SuperStreamChangelogConsumerOptions>) =>
      SuperStreamVerifyingConsumer.open({
        superStream: 'never-opened',
        consumerName: 'g',
        store: await tempDir(),
        handler: () => undefined,
        ...more,
      });
    await expect(open({ stalledPartitionMs: -1 })).rejects.toThrow(
      'Expected stalledPartitionMs to be an integer ≥ 0, got -1',
    );
    await expect(open({ stalledPartitionMs: 1.5 })).rejects.toThrow(RangeError);
    await expect(open({ stalledPartitionMs: '60000' as unknown as number })).rejects.toThrow(TypeError);
    await expect(open({ stalledPartitionMs: 500, commitLingerMs: 500 })).rejects.toThrow(
      'Expected stalledPartitionMs to be 0 or more than commitLingerMs (500), got 500',
    );
    // 0 turns the watch off, whatever the linger: past the options, the missing super stream.
    await expect(open({ stalledPartitionMs: 0, commitLingerMs: 500 })).rejects.toMatchObject({
      code: 'DEDUP_BROKER_REFUSED',
    });
  });
});
