import { afterAll, describe, expect, it } from 'vitest';
import { SuperStreamVerifyingConsumer, type AssignmentEvent } from '../../src/transport/stream.js';
import { ledgerHandler, publishLedger as publish, type Sent } from '../support/group-ledger.js';
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
});
