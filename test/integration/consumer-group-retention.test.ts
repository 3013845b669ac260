import { afterAll, describe, expect, it } from 'vitest';
import { changelogProducerName, changelogStreamName } from '../../src/group/consumer.js';
import { snapshotProducerName } from '../../src/group/snapshot-entry.js';
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

// Changelog retention on the real broker (docs/design.md §12.2): changelogs created with a small
// max-length-bytes and segment size, trimmed by the broker during the test (first offset > 0); a
// member with an empty store takes the partitions over from the snapshots retention kept (exact
// folds), and a take-over whose snapshot is gone stops with DEDUP_CHANGELOG_INVALID.

const GROUP = 'retention-projection';
const EVERY = 5;
const RETENTION = { maxLengthBytes: 256 * 1024, segmentBytes: 32 * 1024 };
const SNAPSHOTS = snapshotProducerName(changelogProducerName(GROUP));
const client = useClient();
const superStream = useSuperStreams(client);
const tempDir = useTempDir();
const changelogs: string[] = [];
/** Warnings and errors the members logged. */
const logged: string[] = [];
const logger = {
  debug: () => undefined,
  info: () => undefined,
  warn: (_obj: object, msg?: string) => void logged.push(`warn ${msg}`),
  error: (_obj: object, msg?: string) => void logged.push(`error ${msg}`),
};
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
    commitEvery: 1,
    commitLingerMs: 5,
    snapshotEveryEntries: EVERY,
    snapshotEveryBytes: 16 * 1024,
    changelogRetention: RETENTION,
    handler: ledgerHandler,
    logger,
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

describe('consumer group changelog retention (real broker)', () => {
  it('the broker trims the changelogs; a take-over restores exactly from a kept snapshot, and refuses when its snapshot is gone', async () => {
    const started = performance.now();
    const name = await superStream('group-retention');
    const partitions = await client().queryPartitions({ superStream: name });
    changelogs.push(...partitions.map((p) => changelogStreamName(p, GROUP)));
    const sent = new Map<string, Sent>();
    await publish(client(), partitions, 1, 400, sent);

    const a = await member(name, new Map());
    await caughtUp(a, sent);
    await a.close();
    const stats = await Promise.all(
      partitions.map((p) => client().streamStatsRequest(changelogStreamName(p, GROUP))),
    );
    // The broker trimmed every changelog: their genesis is gone.
    for (const s of stats) expect(s.firstChunkId).toBeGreaterThan(0n);

    // B: an empty store, from the snapshots retention kept.
    const restoredB = new Map<string, number>();
    const b = await member(name, restoredB);
    await caughtUp(b, sent);
    expect(b.stats.snapshotRestores).toBe(partitions.length);
    for (const p of partitions) expect(restoredB.get(p)).toBeLessThanOrEqual(EVERY + 1);
    await expectFolds(b, sent);
    await b.close();
    // No snapshot outgrew the retention, no changelog was declared otherwise.
    expect(logged).toEqual([]);

    // D, without retention, on changelogs created with it: the broker keeps their arguments; D says
    // so once per partition it takes, and restores as any member.
    const d = await member(name, new Map(), { changelogRetention: undefined });
    await caughtUp(d, sent);
    await expectFolds(d, sent);
    await d.close();
    expect(logged.filter((line) => line.includes('other retention arguments'))).toHaveLength(
      partitions.length,
    );

    // Partition 0's reference moved to an offset retention removed (as if its latest snapshot were
    // there): C, with an empty store, must stop with DEDUP_CHANGELOG_INVALID, not guess.
    const changelog = changelogStreamName(partitions[0]!, GROUP);
    const locator = (client() as unknown as { locatorConnection: { storeOffset(p: object): Promise<void> } })
      .locatorConnection;
    await locator.storeOffset({ reference: SNAPSHOTS, stream: changelog, offsetValue: 0n });
    // The first activation is part of open(): it rejects (or the member stops, if later).
    const error = await member(name, new Map()).then(
      async (c) => {
        const stopped = await c.closed();
        await c.close();
        return stopped;
      },
      (err: unknown) => err,
    );
    expect(error).toMatchObject({
      code: 'DEDUP_CHANGELOG_INVALID',
      message: expect.stringMatching(/trimmed away/) as unknown,
    });
    console.log(
      `[retention] first offsets ${stats.map((s) => s.firstChunkId).join('/')}, ends ${stats
        .map((s) => s.committedChunkId)
        .join(
          '/',
        )}; restored ${[...restoredB.values()].join('/')}; ${Math.round(performance.now() - started)} ms`,
    );
  }, 60_000);
});
