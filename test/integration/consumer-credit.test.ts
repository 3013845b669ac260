import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { identityHeaders } from '../../src/identity/headers.js';
import { DedupStore } from '../../src/store/store.js';
import { BROKER, uniqueName } from '../support/broker.js';
import { readAll, useClient } from '../support/stream.js';
import { useTempDir } from '../support/tmp.js';

const fixture = fileURLToPath(new URL('../fixtures/ledger-consumer.ts', import.meta.url));
const client = useClient();
const tempDir = useTempDir();

interface Credit {
  producer: string;
  id: bigint;
  amount: number;
}

/**
 * Writes credit events into the stream through an unnamed publisher (no broker dedup), the way a
 * retrying AMQP 0-9-1 producer would leave them: about one in eight repeated as a second copy, and
 * neighbours swapped (reordering well inside the window).
 */
async function writeLedger(stream: string, events: number): Promise<{ expected: number; total: number }> {
  const credits: Credit[] = [];
  for (let i = 1; i <= events; i++) {
    credits.push({ producer: i % 3 === 0 ? 'teller-b' : 'teller-a', id: BigInt(i), amount: (i % 7) + 1 });
  }
  const expected = credits.reduce((sum, c) => sum + c.amount, 0);
  const wire: Credit[] = [];
  for (let i = 0; i < credits.length; i++) {
    wire.push(credits[i]!);
    if (i % 8 === 5) wire.push(credits[i - 3]!); // a late duplicate copy
  }
  for (let i = 0; i + 1 < wire.length; i += 10) [wire[i], wire[i + 1]] = [wire[i + 1]!, wire[i]!];
  const publisher = await client().declarePublisher({ stream });
  let confirmed = 0;
  const all = new Promise<void>((resolve) =>
    publisher.on('publish_confirm', (_e, ids) => {
      confirmed += ids.length;
      if (confirmed >= wire.length) resolve();
    }),
  );
  for (const c of wire) {
    await publisher.send(Buffer.from(JSON.stringify({ amount: c.amount })), {
      applicationProperties: identityHeaders(c.producer, c.id),
    });
  }
  await publisher.flush();
  await all;
  await publisher.close();
  return { expected, total: wire.length };
}

async function runConsumer(
  stream: string,
  store: string,
  target: bigint,
  env: Record<string, string>,
  killAfterMs?: number,
): Promise<'killed' | 'done'> {
  const child = spawn(process.execPath, ['--import', 'tsx', fixture, stream, store, String(target)], {
    env: { ...process.env, ...env, RABBITMQ_STREAM_PORT: String(BROKER.streamPort) },
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  const exited = once(child, 'exit') as Promise<[number | null, NodeJS.Signals | null]>;
  for await (const line of createInterface({ input: child.stdout })) {
    if (line === 'ready' && killAfterMs !== undefined) setTimeout(() => child.kill('SIGKILL'), killAfterMs);
  }
  const [code, signal] = await exited;
  if (signal === 'SIGKILL') return 'killed';
  if (code !== 0) throw new Error(`consumer exited with ${code}`);
  return 'done';
}

/** The committed balance and offset, read from the store while no consumer runs. */
async function committed(store: string): Promise<{ balance: number; offset: bigint | undefined }> {
  const s = await DedupStore.open(store);
  try {
    const raw = await s.db.get('u:18:balance-projectionbalance');
    const off = await s.db.get('c:18:balance-projection/offset');
    return {
      balance: raw === undefined ? 0 : Number(Buffer.from(raw).toString()),
      offset: off === undefined ? undefined : Buffer.from(off).readBigUInt64BE(),
    };
  } finally {
    await s.close();
  }
}

describe('verifying consumer - the credit-17 example under SIGKILL', () => {
  it('the balance is exactly right after every restart: killed before commit, after commit, and at random', async () => {
    const stream = uniqueName('ledger');
    await client().createStream({ stream, arguments: {} });
    const { expected, total } = await writeLedger(stream, 30_000);
    const messages = await readAll(client(), stream);
    expect(messages.length).toBe(total);
    const lastOffset = messages.at(-1)!.offset!;
    const amountsUpTo = (offset: bigint): number => {
      // The balance a correct consumer has after committing everything up to `offset`.
      const seen = new Set<string>();
      let sum = 0;
      for (const m of messages) {
        if (m.offset! > offset) break;
        const key = `${String(m.applicationProperties?.['x-dedup-producer'])}/${String(m.applicationProperties?.['x-dedup-id'])}`;
        if (seen.has(key)) continue;
        seen.add(key);
        sum += (JSON.parse(m.content.toString()) as { amount: number }).amount;
      }
      return sum;
    };
    const store = join(await tempDir(), 'store');
    const outcomes: string[] = [];
    const check = async (): Promise<void> => {
      const c = await committed(store);
      expect(c.balance).toBe(c.offset === undefined ? 0 : amountsUpTo(c.offset));
    };
    outcomes.push(await runConsumer(stream, store, lastOffset, { CRASH: 'before-commit', CRASH_AT: '3' }));
    await check();
    outcomes.push(await runConsumer(stream, store, lastOffset, { CRASH: 'after-commit', CRASH_AT: '4' }));
    await check();
    let randomKills = 0;
    for (let i = 0; i < 12 && randomKills < 6; i++) {
      const outcome = await runConsumer(stream, store, lastOffset, {}, 20 + Math.random() * 120);
      outcomes.push(outcome);
      if (outcome === 'killed') randomKills++;
      await check();
    }
    expect(randomKills).toBeGreaterThanOrEqual(3);
    outcomes.push(await runConsumer(stream, store, lastOffset, {}));
    expect(outcomes.slice(0, 2)).toEqual(['killed', 'killed']);
    expect(outcomes.at(-1)).toBe('done');
    const final = await committed(store);
    // readAll's end marker (no identity: rejected, not applied) may be committed after it.
    expect(final.offset! >= lastOffset).toBe(true);
    expect(final.balance).toBe(expected);
    console.log(
      `[credit-17] runs=${outcomes.length} outcomes=${outcomes.join(',')} balance=${final.balance} expected=${expected}`,
    );
  }, 300_000);
});
