/**
 * Warm standby take-over (issue 37, docs/design.md §12.3), for `bench:verify`
 * (`STREAM_DEDUP_BENCH_ONLY=standby` runs it alone):
 *
 * A one-partition super stream holding 2 × `keys` messages; member A (the partition's holder, it
 * subscribed first) folds them into a state of `keys` keys (message at offset o puts `k<o % keys>`),
 * committing every 1 000 messages, snapshots off; member B (`standbyReplicas: 1`) tails the
 * partition's changelog into its standby copy until the copy reaches A's last commit. Then 1 000
 * more messages (one entry) are committed by A, and A closes at once: the copy may be one tail step
 * (250 ms) behind. The figure is B's `assigned` event's `ms`, from the broker's activation of B to
 * its first delivery asked for (the take-over's own clock, as consumer-group-standby reads it), with
 * the entries it applied after the copy (`restored`). B must report one standby take-over and
 * reach the last offset with the whole state, else the run throws (a row that silently measured a
 * cold restore would be worse than none). Each run in a fresh process.
 *
 *   node --import tsx bench/standby.ts [keys] [runs]      (10000 3)
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { changelogStreamName, partitionNamespace } from '../src/group/consumer.js';
import { standbyKey } from '../src/group/standby-copy.js';
import { decodeOffset, offsetKey } from '../src/store/consumer-keys.js';
import { DedupStore } from '../src/store/store.js';
import { silentLogger } from '../src/telemetry/logger.js';
import { SuperStreamVerifyingConsumer, type AssignmentEvent } from '../src/stream.js';
import { CONNECTION, connectClient, measureInChild, publishStamped, uniqueName } from './common.js';

export interface StandbyTakeover {
  readonly keys: number;
  /** Messages the partition held at the take-over. */
  readonly messages: number;
  /** From the broker's activation of the standby member to its first delivery asked for (ms). */
  readonly ms: number;
  /** Changelog entries the take-over applied after the standby copy. */
  readonly restored: number;
  /** Where the copy was when the holder closed, and the holder's last commit (offsets). */
  readonly copyAt: number;
  readonly lastOffset: number;
  /** The 1-minute load average when the holder closed. */
  readonly load: number;
}

const COMMIT_EVERY = 1_000;
const TAIL = 1_000;
/** Every wait of a run is bounded by this (ms): a hung run throws instead of hanging the bench. */
const WAIT_MS = 120_000;

async function until<T>(what: string, poll: () => Promise<T | undefined>): Promise<T> {
  const deadline = performance.now() + WAIT_MS;
  for (;;) {
    const value = await poll();
    if (value !== undefined) return value;
    if (performance.now() > deadline) throw new Error(`standby bench: ${what} not within ${WAIT_MS} ms`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

function within<T>(what: string, promise: Promise<T>): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`standby bench: ${what} not within ${WAIT_MS} ms`)), WAIT_MS);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

/** One take-over in this process: see the file comment. */
async function standbyTakeover(keys: number): Promise<StandbyTakeover> {
  const client = await connectClient();
  const dir = await mkdtemp(join(tmpdir(), 'bench-standby-'));
  const superStream = uniqueName('bench-standby');
  const consumerName = 'bench-standby';
  await client.createSuperStream({ streamName: superStream, arguments: {} }, undefined, 1);
  const [partition] = (await client.queryPartitions({ superStream })) as [string];
  const namespace = partitionNamespace(consumerName, partition);
  const stores: DedupStore[] = [];
  const members: SuperStreamVerifyingConsumer[] = [];
  const member = async (name: string, onAssignment?: (e: AssignmentEvent) => void) => {
    const store = await DedupStore.open(join(dir, name));
    stores.push(store);
    const m = await SuperStreamVerifyingConsumer.open({
      connection: CONNECTION,
      superStream,
      consumerName,
      store,
      startFrom: 'first',
      commitEvery: COMMIT_EVERY,
      snapshotEveryEntries: 0,
      snapshotEveryBytes: 0,
      standbyReplicas: 1,
      logger: silentLogger,
      handler: (message, tx) => tx.put(`k${message.offset % BigInt(keys)}`, String(message.offset)),
      ...(onAssignment === undefined ? {} : { onAssignment }),
    });
    members.push(m);
    return { m, store };
  };
  const publish = (count: number, producer: string) =>
    publishStamped(count, { stream: partition, producerName: producer, store: join(dir, producer) });
  try {
    await publish(2 * keys, 'source-1');
    const a = await member('a');
    await within('A subscribed', a.m.waitForOffset(partition, BigInt(2 * keys - 1)));
    if (!a.m.activePartitions().includes(partition)) throw new Error('member A does not hold the partition');
    let assigned = (_e: AssignmentEvent & { kind: 'assigned' }): void => undefined;
    const takenOver = new Promise<AssignmentEvent & { kind: 'assigned' }>((resolve) => (assigned = resolve));
    const b = await member('b', (e) => {
      if (e.kind === 'assigned' && e.partition === partition) assigned(e);
    });
    const copyOffset = async (): Promise<bigint | undefined> => {
      const raw = await b.store.db.get(standbyKey(offsetKey(namespace)));
      return raw === undefined ? undefined : decodeOffset(raw);
    };
    await until('the standby copy at the holder', async () =>
      (await copyOffset()) === BigInt(2 * keys - 1) ? true : undefined,
    );
    await publish(TAIL, 'source-2');
    const last = BigInt(2 * keys + TAIL - 1);
    await within('A committed the tail', a.m.waitForOffset(partition, last));
    const copyAt = (await copyOffset()) ?? -1n;
    const load = loadavg()[0]!;
    await a.m.close();
    const event = await within('the take-over', takenOver);
    await within('B reached the last offset', b.m.waitForOffset(partition, last));
    if (b.m.stats.standbyTakeOvers !== 1)
      throw new Error(`not a standby take-over (standbyTakeOvers ${b.m.stats.standbyTakeOvers})`);
    const missing: string[] = [];
    for (let k = 0; k < keys; k++)
      if ((await b.m.readEffect(partition, `k${k}`)) === undefined) missing.push(`k${k}`);
    if (missing.length > 0)
      throw new Error(`the new holder misses ${missing.length} keys (${missing[0]}, …)`);
    return {
      keys,
      messages: 2 * keys + TAIL,
      ms: event.ms,
      restored: event.restored,
      copyAt: Number(copyAt),
      lastOffset: Number(last),
      load,
    };
  } finally {
    for (const m of members) await m.close();
    for (const s of stores) await s.close();
    await client.deleteSuperStream({ streamName: superStream }).catch(() => undefined);
    await client
      .deleteStream({ stream: changelogStreamName(partition, consumerName) })
      .catch(() => undefined);
    await client.close();
    await rm(dir, { recursive: true, force: true });
  }
}

/** `runs` standby take-overs at a state of `keys` keys, each in a fresh process. */
export async function measureStandbyTakeover(keys = 10_000, runs = 3): Promise<StandbyTakeover[]> {
  const results: StandbyTakeover[] = [];
  for (let run = 0; run < runs; run++)
    results.push(
      await measureInChild<StandbyTakeover>(import.meta.url, [String(keys)], {
        STREAM_DEDUP_BENCH_STANDBY: '1',
      }),
    );
  return results;
}

if (process.env.STREAM_DEDUP_BENCH_STANDBY === '1') {
  process.stdout.write(`${JSON.stringify(await standbyTakeover(Number(process.argv[2])))}\n`);
  process.exit(0);
} else if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const results = await measureStandbyTakeover(
    Number(process.argv[2] ?? 10_000),
    Number(process.argv[3] ?? 3),
  );
  for (const r of results) console.log(JSON.stringify(r));
}
