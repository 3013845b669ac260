import { Offset } from 'rabbitmq-stream-js-client';
import { afterAll, describe, expect, it } from 'vitest';
import { changelogProducerName, changelogStreamName, partitionNamespace } from '../../src/group/consumer.js';
import { encodeOffset, offsetKey } from '../../src/store/consumer-keys.js';
import {
  encodeMarker,
  encodePart,
  snapshotId,
  snapshotProducerName,
} from '../../src/group/snapshot-entry.js';
import { ID_HEADER, PRODUCER_HEADER } from '../../src/identity/headers.js';
import { queryPublisherSequence } from '../../src/transport/stream-client-internals.js';
import {
  SuperStreamVerifyingConsumer,
  type AssignmentEvent,
  type SuperStreamChangelogConsumerOptions,
} from '../../src/stream.js';
import { STREAM_CONNECTION } from '../support/broker.js';
import { ledgerHandler, publishLedger as publish, type Sent } from '../support/group-ledger.js';
import { useClient } from '../support/stream.js';
import { useSuperStreams } from '../support/superstream.js';
import { useTempDir } from '../support/tmp.js';

// Changelog snapshots on the real broker (docs/design.md §12.1): a member with an empty store takes
// partitions over from their latest snapshot (fewer entries applied than the history holds), and
// a torn snapshot makes the take-over read the whole changelog; the folds are exact either way.

const GROUP = 'snapshot-projection';
/** Entries between snapshots. */
const EVERY = 5;
const SNAPSHOTS = snapshotProducerName(changelogProducerName(GROUP));
const client = useClient();
const superStream = useSuperStreams(client);
const tempDir = useTempDir();
const changelogs: string[] = [];
afterAll(async () => {
  for (const stream of changelogs)
    await client()
      .deleteStream({ stream })
      .catch(() => undefined);
});

async function member(
  superStreamName: string,
  restored: Map<string, number>,
  more: Partial<SuperStreamChangelogConsumerOptions> = {},
): Promise<SuperStreamVerifyingConsumer> {
  return SuperStreamVerifyingConsumer.open({
    superStream: superStreamName,
    consumerName: GROUP,
    store: await tempDir(),
    connection: STREAM_CONNECTION,
    commitEvery: 2,
    commitLingerMs: 5,
    snapshotEveryEntries: EVERY,
    handler: ledgerHandler,
    onAssignment: (e: AssignmentEvent) => {
      if (e.kind === 'assigned') restored.set(e.partition, e.restored);
    },
    ...more,
  });
}

async function caughtUp(m: SuperStreamVerifyingConsumer, sent: Map<string, Sent>): Promise<void> {
  await Promise.all([...sent].map(([partition, s]) => m.waitForOffset(partition, s.lastOffset)));
}

async function expectFolds(m: SuperStreamVerifyingConsumer, sent: Map<string, Sent>): Promise<void> {
  for (const [partition, s] of sent) {
    expect({
      partition,
      balance: Number((await m.readEffect(partition, 'balance'))?.toString()),
      count: Number((await m.readEffect(partition, 'count'))?.toString()),
      doubles: (await m.readEffect(partition, 'doubles'))?.toString(),
    }).toEqual({ partition, balance: s.balance, count: s.distinct, doubles: undefined });
  }
}

/** The number of entries in a partition's changelog (messages under the group's producer name). */
async function entriesOf(changelog: string): Promise<number> {
  const producer = changelogProducerName(GROUP);
  const last = await queryPublisherSequence(client(), changelog, producer);
  let count = 0;
  let reached = (): void => undefined;
  const done = new Promise<void>((resolve) => (reached = resolve));
  const consumer = await client().declareConsumer({ stream: changelog, offset: Offset.first() }, (m) => {
    if (m.applicationProperties?.[PRODUCER_HEADER] !== producer) return;
    count++;
    if (BigInt(String(m.applicationProperties[ID_HEADER])) >= last) reached();
  });
  await done;
  await client().closeConsumer(consumer.extendedId);
  return count;
}

describe('consumer group changelog snapshots (real broker)', () => {
  it('a take-over with an empty store restores from the latest snapshot, and from the whole changelog when that snapshot is torn; exact folds', async () => {
    const name = await superStream('group-snapshot');
    const partitions = await client().queryPartitions({ superStream: name });
    changelogs.push(...partitions.map((p) => changelogStreamName(p, GROUP)));
    const sent = new Map<string, Sent>();
    await publish(client(), partitions, 1, 150, sent);

    const restoredA = new Map<string, number>();
    const a = await member(name, restoredA);
    await caughtUp(a, sent);
    expect(a.stats.snapshotsWritten).toBeGreaterThanOrEqual(3 * 2);
    await a.close();

    // B: an empty store. Each partition from its latest snapshot: 1 (the snapshot) + at most the
    // EVERY entries written after it, against the whole history.
    const restoredB = new Map<string, number>();
    const b = await member(name, restoredB);
    await caughtUp(b, sent);
    expect(b.stats.snapshotRestores).toBe(3);
    const histories = await Promise.all(partitions.map((p) => entriesOf(changelogStreamName(p, GROUP))));
    for (const [i, p] of partitions.entries()) {
      expect(histories[i]).toBeGreaterThanOrEqual(4 * EVERY);
      expect(restoredB.get(p)).toBeLessThanOrEqual(EVERY + 1);
    }
    await expectFolds(b, sent);
    console.log(
      `[snapshot] histories ${histories.join('/')} entries; restored from snapshots ${[...restoredB.values()].join('/')}`,
    );
    await b.close();

    // Partition 0: a torn snapshot past the latest one — one part (an offset record past the input)
    // of the two its marker counts — and the reference moved to just before it. Applied, the member
    // would hold nothing but that offset.
    const changelog = changelogStreamName(partitions[0]!, GROUP);
    const from = (await client().streamStatsRequest(changelog)).committedChunkId;
    const at = sent.get(partitions[0]!)!.lastOffset + 5n;
    const writer = await client().declarePublisher({ stream: changelog, publisherRef: SNAPSHOTS });
    let confirmed = 0;
    const both = new Promise<void>((resolve) =>
      writer.on('publish_confirm', (_err, ids) => {
        confirmed += ids.length;
        if (confirmed >= 2) resolve();
      }),
    );
    for (const [index, body] of [
      encodePart(at, 0, [
        { type: 'put', key: offsetKey(partitionNamespace(GROUP, partitions[0]!)), value: encodeOffset(at) },
      ]),
      encodeMarker(at, 2, 1, Buffer.alloc(32, 7)),
    ].entries()) {
      const id = snapshotId(at, index)!;
      await writer.basicSend(id, body, {
        applicationProperties: { [PRODUCER_HEADER]: SNAPSHOTS, [ID_HEADER]: String(id) },
      });
    }
    await both;
    await writer.close();
    const locator = (client() as unknown as { locatorConnection: { storeOffset(p: object): Promise<void> } })
      .locatorConnection;
    await locator.storeOffset({ reference: SNAPSHOTS, stream: changelog, offsetValue: from });

    const restoredC = new Map<string, number>();
    const c = await member(name, restoredC, { snapshotEveryEntries: 0, snapshotEveryBytes: 0 });
    await caughtUp(c, sent);
    expect(c.stats.snapshotRestores).toBe(2);
    // The whole history of partition 0 was applied, entry after entry (all but the genesis).
    expect(restoredC.get(partitions[0]!)).toBe(histories[0]! - 1);
    await expectFolds(c, sent);
    await c.close();
  }, 120_000);
});
