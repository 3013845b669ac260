import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import type { Client } from 'rabbitmq-stream-js-client';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { checkHistory, formatReport } from '../../src/testing.js';
import { readIdentity } from '../../src/identity/headers.js';
import { BROKER, uniqueName } from '../support/broker.js';
import { connectClient, readAll } from '../support/stream.js';
import { useTempDir } from '../support/tmp.js';

const root = fileURLToPath(new URL('../../', import.meta.url));
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
  await client.close();
});
const tempDir = useTempDir();

async function runProcessor(args: string[], killAfterMs?: number): Promise<'killed' | 'done'> {
  const child = spawn(process.execPath, ['--import', 'tsx', 'examples/stream-to-stream.ts', ...args], {
    cwd: root,
    env: { ...process.env, RABBITMQ_STREAM_PORT: String(BROKER.streamPort) },
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  const exited = once(child, 'exit') as Promise<[number | null, NodeJS.Signals | null]>;
  for await (const line of createInterface({ input: child.stdout })) {
    if (line.startsWith('{"ready"') && killAfterMs !== undefined)
      setTimeout(() => child.kill('SIGKILL'), killAfterMs);
  }
  const [code, signal] = await exited;
  if (signal === 'SIGKILL') return 'killed';
  if (code !== 0) throw new Error(`processor exited with ${code}`);
  return 'done';
}

describe('example stream-to-stream: publishingId = source offset + 1', () => {
  // reserve: the broker's last ID is where the source resumes; outbox: the outbox is re-sent first.
  it.each(['reserve', 'outbox'])(
    '%s: SIGKILLed at random at least 10 times, stream B ends with exactly one output per input, in order',
    async (durability) => {
      const source = uniqueName('s2s-a');
      const target = uniqueName('s2s-b');
      const count = 20_000;
      await client.createStream({ stream: source, arguments: {} });
      const publisher = await client.declarePublisher({ stream: source });
      let confirmed = 0;
      const all = new Promise<void>((resolve) =>
        publisher.on('publish_confirm', (_e, ids) => {
          confirmed += ids.length;
          if (confirmed >= count) resolve();
        }),
      );
      for (let i = 0; i < count; i++) await publisher.send(Buffer.from(`m-${i}`));
      await publisher.flush();
      await all;
      await publisher.close();

      const store = join(await tempDir(), 'store');
      const args = [source, target, store, String(count), durability];
      let kills = 0;
      for (let attempt = 0; attempt < 40 && kills < 10; attempt++) {
        if ((await runProcessor(args, 20 + Math.random() * 200)) === 'killed') kills++;
      }
      expect(kills).toBe(10);
      expect(await runProcessor(args)).toBe('done');

      const outputs = await readAll(client, target);
      const expected = Array.from({ length: count }, (_, i) => `M-${i}`);
      const observed = outputs.map((m) => {
        const r = readIdentity(m.applicationProperties);
        return {
          label: m.content.toString(),
          producerName: r.kind === 'ok' ? r.identity.producerName : undefined,
          publishingId: r.kind === 'ok' ? r.identity.publishingId : undefined,
        };
      });
      const report = checkHistory({ attempted: expected, acknowledged: expected, observed });
      console.log(
        `[stream-to-stream ${durability}] kills=${kills} outputs=${outputs.length} ${formatReport(report)}`,
      );
      expect(report.lost).toEqual([]);
      expect(report.duplicated).toEqual([]);
      expect(report.unexpected).toEqual([]);
      expect(report.orderViolations).toEqual([]);
      // Output i carries publishing ID i + 1: identity came from the source offset.
      expect(observed.every((o, i) => o.publishingId === BigInt(i + 1))).toBe(true);
    },
    600_000,
  );
});
