import { Offset } from 'rabbitmq-stream-js-client';
import { afterAll, describe, expect, it } from 'vitest';
import { changelogProducerName, changelogStreamName, partitionNamespace } from '../../src/group/consumer.js';
import { standbyKey } from '../../src/group/standby-copy.js';
import { ID_HEADER, PRODUCER_HEADER } from '../../src/identity/headers.js';
import { decodeOffset, offsetKey } from '../../src/store/consumer-keys.js';
import { DedupStore } from '../../src/store/store.js';
import { queryPublisherSequence } from '../../src/transport/stream-client-internals.js';
import {
  SuperStreamVerifyingConsumer,
  type AssignmentEvent,
  type SuperStreamChangelogConsumerOptions,
} from '../../src/stream.js';
import { STREAM_CONNECTION } from '../support/broker.js';
import { ledgerHandler, publishLedger as publish, type Sent } from '../support/group-ledger.js';
import {
  committedEverywhere,
  expectExactFolds,
  firstRound,
  holders,
  startGroup,
  useMemberProcesses,
} from '../support/group-members.js';
import { useClient } from '../support/stream.js';
import { useSuperStreams } from '../support/superstream.js';
import { useTempDir } from '../support/tmp.js';

// Warm standbys on the real broker (docs/design.md §12.3): a member keeps a copy of the partition
// it does not hold by tailing its changelog; when the holder leaves, the take-over adopts the copy
// and applies only the entries after it (snapshots off: without the copy it reads the whole
// history). A standby SIGKILLed while it tails leaves a copy the next take-over uses or ignores;
// the folds are exact either way.

const GROUP = 'standby-projection';
const client = useClient();
const superStream = useSuperStreams(client);
const tempDir = useTempDir();
useMemberProcesses();
const changelogs: string[] = [];
afterAll(async () => {
  for (const stream of changelogs)
    await client()
      .deleteStream({ stream })
      .catch(() => undefined);
});

type Timed = AssignmentEvent & { at: number };
/** The members' standby log lines and warnings (printed with the take-over's figures). */
const standbyLines: string[] = [];

async function member(
  name: string,
  store: DedupStore,
  events: Timed[],
  more: Partial<SuperStreamChangelogConsumerOptions> = {},
): Promise<SuperStreamVerifyingConsumer> {
  return SuperStreamVerifyingConsumer.open({
    superStream: name,
    consumerName: GROUP,
    store,
    connection: STREAM_CONNECTION,
    commitEvery: 2,
    commitLingerMs: 5,
    // No snapshots: a take-over without the standby copy reads the partition's whole history.
    snapshotEveryEntries: 0,
    snapshotEveryBytes: 0,
    standbyReplicas: 1,
    handler: ledgerHandler,
    onAssignment: (e) => events.push({ ...e, at: performance.now() }),
    logger: {
      debug: () => undefined,
      info: (obj, msg) => {
        if (/standby/.test(msg ?? '')) standbyLines.push(`${msg} ${JSON.stringify(obj)}`);
      },
      warn: (obj, msg) => standbyLines.push(`warn ${msg} ${JSON.stringify(obj)}`),
      error: (obj, msg) => standbyLines.push(`error ${msg} ${JSON.stringify(obj)}`),
    },
    ...more,
  });
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

async function expectFolds(m: SuperStreamVerifyingConsumer, sent: Map<string, Sent>): Promise<void> {
  for (const [partition, s] of sent) {
    await m.waitForOffset(partition, s.lastOffset);
    expect({
      partition,
      balance: Number((await m.readEffect(partition, 'balance'))?.toString()),
      count: Number((await m.readEffect(partition, 'count'))?.toString()),
      doubles: (await m.readEffect(partition, 'doubles'))?.toString(),
    }).toEqual({ partition, balance: s.balance, count: s.distinct, doubles: undefined });
  }
}

describe('consumer group warm standbys (real broker)', () => {
  it('the holder of one partition closes: the other member takes it over from its standby copy, applying only the tail; exact folds', async () => {
    const name = await superStream('group-standby');
    const partitions = await client().queryPartitions({ superStream: name });
    changelogs.push(...partitions.map((p) => changelogStreamName(p, GROUP)));
    const sent = new Map<string, Sent>();
    await publish(client(), partitions, 1, 100, sent);
    const stores = [await DedupStore.open(await tempDir()), await DedupStore.open(await tempDir())];
    const events: Timed[][] = [[], []];
    const members = [
      await member(name, stores[0]!, events[0]!, { startFrom: 'first' }),
      await member(name, stores[1]!, events[1]!, { startFrom: 'first' }),
    ];
    try {
      // The broker spreads the three partitions: one member holds one, the other two.
      await expect
        .poll(() => members.map((m) => m.activePartitions().length).sort(), { timeout: 30_000 })
        .toEqual([1, 2]);
      const single = members.findIndex((m) => m.activePartitions().length === 1);
      const other = 1 - single;
      const p = members[single]!.activePartitions()[0]!;
      await members[single]!.waitForOffset(p, sent.get(p)!.lastOffset);
      // The other member's copy of p (its only partition not held: standbyReplicas 1) follows it.
      // Twice: the other member may have held p before the broker spread the partitions, and a
      // copy no newer than its own state is not used; after 20 more messages it is newer.
      const copyKey = standbyKey(offsetKey(partitionNamespace(GROUP, p)));
      const copyReaches = async (offset: bigint): Promise<void> => {
        await expect
          .poll(
            async () => {
              const raw = await stores[other]!.db.get(copyKey);
              return raw === undefined ? undefined : decodeOffset(raw);
            },
            { timeout: 10_000, interval: 20 },
          )
          .toBe(offset);
      };
      await copyReaches(sent.get(p)!.lastOffset);
      await publish(client(), [p], 101, 20, sent);
      await copyReaches(sent.get(p)!.lastOffset);
      // The tail: 30 more messages committed by the holder (at most 30 entries, commitEvery 2).
      await publish(client(), [p], 121, 30, sent);
      await members[single]!.waitForOffset(p, sent.get(p)!.lastOffset);
      const history = await entriesOf(changelogStreamName(p, GROUP));
      // What the other member's own namespace holds of p (it may have held p before the rebalance).
      const ownRaw = await stores[other]!.db.get(offsetKey(partitionNamespace(GROUP, p)));
      const own = ownRaw === undefined ? 'nothing' : `offset ${decodeOffset(ownRaw)}`;
      const before = events[other]!.length;
      await members[single]!.close();
      await members[other]!.waitForOffset(p, sent.get(p)!.lastOffset);
      const taken = events[other]!.slice(before).find((e) => e.kind === 'assigned' && e.partition === p);
      expect(taken?.kind).toBe('assigned');
      const restored = taken?.kind === 'assigned' ? taken.restored : -1;
      const ms = taken?.kind === 'assigned' ? taken.ms : -1;
      console.log(
        `[standby] take-over of ${p} (own namespace: ${own}, input ${sent.get(p)!.lastOffset + 1n}): history ${history} entries, applied ${restored} from the standby copy, ` +
          `${ms} ms from the broker's activation to the first delivery asked for`,
      );
      console.log(standbyLines.join('\n'));
      expect(members[other]!.stats.standbyTakeOvers).toBe(1);
      expect(history).toBeGreaterThanOrEqual(20);
      expect(restored).toBeLessThanOrEqual(30);
      // Exact: the new holder continues from the adopted copy with the rest of the input.
      await publish(client(), partitions, 151, 20, sent);
      await expectFolds(members[other]!, sent);
    } finally {
      for (const m of members) await m.close();
      for (const s of stores) await s.close();
    }
  }, 60_000);

  it('a standby SIGKILLed while it tails, restarted on its store, then the holder killed: the take-over is exact', async () => {
    const name = await superStream('group-standby-kill');
    const partitions = await client().queryPartitions({ superStream: name });
    changelogs.push(...partitions.map((p) => `${p}.balance-projection.changelog`));
    const g = await startGroup({
      client,
      superStream: name,
      partitions,
      tempDir,
      env: () => ({ STANDBY_REPLICAS: '1', SNAPSHOT_EVERY: '0' }),
    });
    const sent = new Map<string, Sent>();
    await firstRound(g, sent);
    // Input keeps coming: the standby's copies are being tailed when it is killed.
    const publisher = (async () => {
      for (let round = 1; round < 6; round++) await publish(client(), g.partitions, 1 + round * 50, 50, sent);
    })();
    console.log(`[standby kill] group up, first round committed at ${Math.round(performance.now())}`);
    const held = holders(g.lines);
    const standby = [...held.values()].filter((m) => m === 'm0').length <= 1 ? 0 : 1;
    await new Promise((resolve) => setTimeout(resolve, 400));
    g.members[standby]!.child.kill('SIGKILL');
    expect((await g.members[standby]!.exited)[1]).toBe('SIGKILL');
    g.members[standby] = g.start(standby);
    await g.members[standby].ready;
    await publisher;
    console.log(`[standby kill] restarted at ${Math.round(performance.now())}`);
    await committedEverywhere(g, sent, 'every round committed');
    console.log(`[standby kill] all committed at ${Math.round(performance.now())}`);
    // The holder of the rest dies: the restarted standby takes every partition over.
    const holder = 1 - standby;
    g.members[holder]!.child.kill('SIGKILL');
    await g.members[holder]!.exited;
    const from = g.lines.length;
    await g.until(
      (all) => partitions.every((p) => holders(all).get(p) === `m${standby}`),
      'the restarted standby holding every partition',
      30_000,
    );
    g.members[holder] = g.start(holder);
    await g.members[holder].ready;
    const adopted = g.lines
      .slice(from)
      .filter((l) => String(l.info).startsWith('stream-dedup: taking the partition over'));
    const ignored = g.lines.slice(from).filter((l) => l.info === 'stream-dedup: standby copy not used');
    console.log(
      `[standby kill] take-overs after the holder's kill: ${adopted.length} from a standby copy, ${ignored.length} copies ignored; ` +
        g.lines
          .slice(from)
          .filter((l) => l.kind === 'assigned')
          .map(
            (l) =>
              `${String(l.partition).slice(name.length)}@${l.member} applied ${String(l.restored)} in ${String(l.ms)} ms`,
          )
          .join(', '),
    );
    await expectExactFolds(g, sent);
  }, 90_000);
});
