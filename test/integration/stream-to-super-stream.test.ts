import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import type { Client } from 'rabbitmq-stream-js-client';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { checkHistory, formatReport } from '../../src/testing.js';
import { readIdentity } from '../../src/identity/headers.js';
import { BROKER, uniqueName } from '../support/broker.js';
import { connectClient, readAll } from '../support/stream.js';
import { jsClientRouter } from '../support/superstream.js';

const root = fileURLToPath(new URL('../../', import.meta.url));
const superStreams: string[] = [];
const streams: string[] = [];
// Not useTempDir(): its afterEach would remove the folder of the other test, still running.
const folders: string[] = [];
let client: Client;
beforeAll(async () => {
  client = await connectClient();
  // The example imports the package by name: build it.
  const tsc = spawn(process.execPath, ['node_modules/typescript/bin/tsc', '-p', 'tsconfig.build.json'], {
    cwd: root,
  });
  const [code] = (await once(tsc, 'exit')) as [number];
  expect(code).toBe(0);
}, 120_000);
afterAll(async () => {
  for (const name of superStreams)
    await client.deleteSuperStream({ streamName: name }).catch(() => undefined);
  for (const name of streams) await client.deleteStream({ stream: name }).catch(() => undefined);
  await Promise.all(folders.map((f) => rm(f, { recursive: true, force: true })));
  await client.close();
});

/** What the example prints once open: where the input resumes, and each partition's last ID. */
interface Ready {
  resumeAt: string;
  accepted: Record<string, string>;
}

async function runProcessor(
  args: string[],
  killAfterMs?: number,
): Promise<{ end: 'killed' | 'done'; ready: Ready | undefined }> {
  const child = spawn(process.execPath, ['--import', 'tsx', 'examples/stream-to-super-stream.ts', ...args], {
    cwd: root,
    env: { ...process.env, RABBITMQ_STREAM_PORT: String(BROKER.streamPort) },
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  const exited = once(child, 'exit') as Promise<[number | null, NodeJS.Signals | null]>;
  let ready: Ready | undefined;
  for await (const line of createInterface({ input: child.stdout })) {
    if (!line.startsWith('{"ready"')) continue;
    ready = JSON.parse(line) as Ready;
    if (killAfterMs !== undefined) setTimeout(() => child.kill('SIGKILL'), killAfterMs);
  }
  const [code, signal] = await exited;
  if (signal === 'SIGKILL') return { end: 'killed', ready };
  if (code !== 0) throw new Error(`processor exited with ${code}`);
  return { end: 'done', ready };
}

const CUSTOMERS = 40;
const customerOf = (i: number): string => `c-${(i * 7) % CUSTOMERS}`;

describe('example stream-to-super-stream: publishingId = source offset + 1 in the partition of the customer', () => {
  // The two run at the same time (a processor each): half the wall time on two cores.
  it.concurrent.each(['reserve', 'outbox'])(
    '%s: SIGKILLed at random at least 10 times, each input once in its partition, IDs increasing per partition',
    async (durability) => {
      const started = Date.now();
      const source = uniqueName('s2ss-in');
      const target = uniqueName('s2ss-out');
      const count = 15_000;
      await client.createStream({ stream: source, arguments: {} });
      await client.createSuperStream({ streamName: target, arguments: {} }, undefined, 3);
      streams.push(source);
      superStreams.push(target);
      const publisher = await client.declarePublisher({ stream: source });
      let confirmed = 0;
      const all = new Promise<void>((resolve) =>
        publisher.on('publish_confirm', (_e, ids) => {
          confirmed += ids.length;
          if (confirmed >= count) resolve();
        }),
      );
      for (let i = 0; i < count; i++) {
        await publisher.send(Buffer.from(JSON.stringify({ order: i, customer: customerOf(i) })));
      }
      await publisher.flush();
      await all;
      await publisher.close();
      const partitions = await client.queryPartitions({ superStream: target });
      expect(partitions).toHaveLength(3);

      const folder = await mkdtemp(join(tmpdir(), 'stream-dedup-test-'));
      folders.push(folder);
      const store = join(folder, 'store');
      const args = [source, target, store, String(count), durability];
      let kills = 0;
      let runs = 0;
      // Restarts that found the partitions at different positions: the input resumed at the
      // lowest and records of the partitions ahead were skipped.
      let uneven = 0;
      for (let attempt = 0; attempt < 40 && kills < 10; attempt++) {
        // From the moment open() returned (its re-sends under way) to well into the run.
        const run = await runProcessor(args, Math.random() * 250);
        runs++;
        if (run.end === 'killed') kills++;
        if (new Set(Object.values(run.ready?.accepted ?? {})).size > 1) uneven++;
      }
      expect(kills).toBe(10);
      const last = await runProcessor(args);
      expect(last.end).toBe('done');
      if (new Set(Object.values(last.ready?.accepted ?? {})).size > 1) uneven++;

      const route = await jsClientRouter(client, target);
      const partitionOf = new Map<string, string>();
      for (let c = 0; c < CUSTOMERS; c++) partitionOf.set(`c-${c}`, await route(`c-${c}`));
      const observed: Array<{
        label: string;
        producerName: string | undefined;
        publishingId: bigint | undefined;
      }> = [];
      const perPartition: number[] = [];
      for (const partition of partitions) {
        const records = await readAll(client, partition);
        perPartition.push(records.length);
        for (const m of records) {
          const out = JSON.parse(m.content.toString()) as { order: number; customer: string; status: string };
          const r = readIdentity(m.applicationProperties);
          expect(out.status).toBe('ACCEPTED');
          expect(partitionOf.get(out.customer), `order ${out.order}`).toBe(partition);
          // The identity came from the source: output of input offset i carries ID i + 1.
          expect(r.kind === 'ok' ? r.identity.publishingId : undefined).toBe(BigInt(out.order + 1));
          observed.push({
            label: `order-${out.order}`,
            // IDs increase per partition: each partition is its own producer for the check.
            producerName: r.kind === 'ok' ? `${r.identity.producerName}@${partition}` : undefined,
            publishingId: r.kind === 'ok' ? r.identity.publishingId : undefined,
          });
        }
      }
      const expected = Array.from({ length: count }, (_, i) => `order-${i}`);
      const report = checkHistory({ attempted: expected, acknowledged: expected, observed });
      console.log(
        `[stream-to-super-stream ${durability}] runs=${runs + 1} kills=${kills} uneven-restarts=${uneven} ` +
          `outputs=${observed.length} per-partition=${perPartition.join('/')} ${formatReport(report)} ` +
          `in ${((Date.now() - started) / 1000).toFixed(1)} s`,
      );
      expect(report.lost).toEqual([]);
      expect(report.duplicated).toEqual([]);
      expect(report.unexpected).toEqual([]);
      expect(report.orderViolations).toEqual([]);
      expect(observed).toHaveLength(count);
      expect(uneven).toBeGreaterThan(0);
    },
    120_000,
  );
});
