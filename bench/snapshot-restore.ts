/**
 * Restore time of a group partition with an empty store (issue 37): a changelog whose history of
 * H entries writes a state of 10 000 keys, restored entry after entry (today's restore) and from a
 * snapshot written by the real SnapshotWriter after entry H - 101 (then 100 more entries).
 *
 *   node --import tsx bench/snapshot-restore.ts [H ...]   (default 10000 100000)
 *
 * Entries are published in bulk, so chunks hold many entries (a member's own appends make about
 * one per chunk): the figures favour today's restore.
 */
import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import type { Client } from 'rabbitmq-stream-js-client';
import { encodeEntry, encodeGenesis, entryId, GENESIS_ID } from '../src/group/changelog-entry.js';
import { ChangelogWriter } from '../src/group/changelog-writer.js';
import { changelogProducerName, partitionNamespace } from '../src/group/consumer.js';
import { restorePartition, type RestoreOptions } from '../src/group/restore.js';
import { snapshotProducerName } from '../src/group/snapshot-entry.js';
import { restoreWithSnapshots } from '../src/group/snapshot-restore.js';
import { SnapshotWriter } from '../src/group/snapshot-writer.js';
import { ID_HEADER, PRODUCER_HEADER } from '../src/identity/headers.js';
import { effectKeyPrefix, encodeOffset, offsetKey } from '../src/store/consumer-keys.js';
import { DedupStore } from '../src/store/store.js';
import { silentLogger } from '../src/telemetry/logger.js';
import { connectStreamClient } from '../src/transport/stream-probe.js';

const CONNECTION = { hostname: '127.0.0.1', port: 5552, username: 'guest', password: 'guest', vhost: '/' };
const GROUP = 'bench';
const KEYS = 10_000;
const ENTRY = changelogProducerName(GROUP);
const SNAP = snapshotProducerName(ENTRY);

function entry(namespace: string, last: number): Buffer {
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

async function publish(
  client: Client,
  stream: string,
  namespace: string,
  from: number,
  to: number,
  genesis: boolean,
) {
  const publisher = await client.declarePublisher({ stream, publisherRef: ENTRY });
  let confirmed = 0;
  let total = 0;
  let done = (): void => undefined;
  publisher.on('publish_confirm', (_e, ids) => {
    confirmed += ids.length;
    if (confirmed >= total) done();
  });
  const send = (id: bigint, body: Buffer) => {
    total++;
    return publisher.basicSend(id, body, {
      applicationProperties: { [PRODUCER_HEADER]: ENTRY, [ID_HEADER]: id.toString() },
    });
  };
  if (genesis) await send(GENESIS_ID, encodeGenesis(0n));
  for (let o = from; o < to; o++) await send(entryId(BigInt(o)), entry(namespace, o));
  const all = new Promise<void>((resolve) => (done = resolve));
  await publisher.flush();
  if (confirmed < total) await all;
  await publisher.close();
}

async function timed(label: string, run: () => Promise<{ read: number; applied: number; offset?: bigint }>) {
  const started = performance.now();
  const report = await run();
  const ms = performance.now() - started;
  console.log(
    `${label}: ${ms.toFixed(0)} ms, read ${report.read}, applied ${report.applied}, offset ${report.offset}`,
  );
  return ms;
}

async function main(): Promise<void> {
  const sizes = process.argv.slice(2).map(Number);
  const client = await connectStreamClient(CONNECTION, 10_000);
  for (const history of sizes.length > 0 ? sizes : [10_000, 100_000]) {
    const partition = `bench-snapshot-${history}-${Date.now()}`;
    const changelog = `${partition}.${GROUP}.changelog`;
    const namespace = partitionNamespace(GROUP, partition);
    await client.createStream({ stream: changelog, arguments: {} });
    const dir = await mkdtemp(path.join(os.tmpdir(), 'bench-snapshot-'));
    try {
      const x = history - 101;
      await publish(client, changelog, namespace, 0, x + 1, true);
      // The member's store at x: what the entries 0..x wrote.
      const source = await DedupStore.open(path.join(dir, 'source'));
      const ops = [];
      for (let o = Math.max(0, x - KEYS + 1); o <= x; o++)
        ops.push({
          type: 'put' as const,
          key: `${effectKeyPrefix(namespace)}k${o % KEYS}`,
          value: Buffer.from(`value-${o}`),
        });
      ops.push({ type: 'put' as const, key: offsetKey(namespace), value: encodeOffset(BigInt(x)) });
      await source.db.batch(ops);
      const appender = new ChangelogWriter({
        stream: changelog,
        producerName: SNAP,
        connection: CONNECTION,
        connectTimeoutMs: 10_000,
        appendTimeoutMs: 30_000,
        reconnect: { initialDelayMs: 100, maxDelayMs: 1_000 },
        logger: silentLogger,
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
      const started = performance.now();
      const outcome = await writer.write(client, () => true);
      console.log(
        `history ${history}: snapshot ${JSON.stringify(outcome, (_k, v: unknown) => (typeof v === 'bigint' ? v.toString() : v))} in ${(performance.now() - started).toFixed(0)} ms`,
      );
      await appender.close();
      await source.close();
      await publish(client, changelog, namespace, x + 1, history, false);
      const options = async (name: string): Promise<RestoreOptions> => ({
        db: (await DedupStore.open(path.join(dir, name))).db,
        sync: false,
        namespace,
        changelog,
        producerName: ENTRY,
        client,
        stallMs: 5_000,
        timeoutMs: 600_000,
        isCurrent: () => true,
      });
      for (let run = 0; run < Number(process.env.RUNS ?? 3); run++) {
        await timed(`history ${history} run ${run}: whole changelog`, async () =>
          restorePartition({ ...(await options(`full-${run}`)), snapshotProducer: SNAP }),
        );
        await timed(`history ${history} run ${run}: from snapshot`, async () =>
          restoreWithSnapshots(
            await options(`snap-${run}`),
            { reference: SNAP, producerName: SNAP },
            () => undefined,
          ),
        );
      }
    } finally {
      await client.deleteStream({ stream: changelog }).catch(() => undefined);
      await rm(dir, { recursive: true, force: true });
    }
  }
  await client.close();
}

await main();
