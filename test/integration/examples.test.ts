import { execFile, spawn } from 'node:child_process';
import { once } from 'node:events';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { beforeAll, describe, expect, it } from 'vitest';
import { BROKER } from '../support/broker.js';
import { readAll, useClient } from '../support/stream.js';

const client = useClient();

const run = promisify(execFile);
const root = fileURLToPath(new URL('../../', import.meta.url));

// The examples import the package by name, as users do: build it first.
beforeAll(async () => {
  await run(process.execPath, ['node_modules/typescript/bin/tsc', '-p', 'tsconfig.build.json'], {
    cwd: root,
  });
}, 120_000);

/** Checks that an example deleted the stream it made: it prints `deleted stream <name>` last. */
async function expectDeletedItsStream(out: string): Promise<void> {
  const name = /^deleted stream (\S+)$/m.exec(out)?.[1];
  expect(name, 'the example names the stream it deleted').toBeDefined();
  const [metadata] = await client().queryMetadata({ streams: [name!] });
  expect(metadata?.responseCode, `stream ${name} is gone (2: does not exist)`).toBe(2);
}

async function example(name: string): Promise<string> {
  const { stdout } = await run(process.execPath, ['--import', 'tsx', `examples/${name}.ts`], {
    cwd: root,
    env: {
      ...process.env,
      RABBITMQ_STREAM_PORT: String(BROKER.streamPort),
      RABBITMQ_AMQP_PORT: String(BROKER.amqpPort),
    },
    timeout: 60_000,
  });
  return stdout;
}

describe('examples run against the real broker', () => {
  it('basic-publisher: ids 1..3, read back with their identity', async () => {
    const out = await example('basic-publisher');
    expect(out).toContain('published ids 1, 2, 3');
    expect(out).toContain('order 3 from orders-svc#3');
    await expectDeletedItsStream(out);
  });

  it('restart-recovery: the outbox is re-sent with original ids and the stream holds each invoice once', async () => {
    const out = await example('restart-recovery');
    expect(out).toContain('resent: 2');
    expect(out).toContain('stream: invoice 1 | invoice 2 | invoice 3 | invoice 4 | invoice 5 | invoice 6');
    await expectDeletedItsStream(out);
  });

  it('prometheus: the scraped page has the library metrics with the package version', async () => {
    process.env.PROMETHEUS_PORT = String(20_000 + (process.pid % 20_000));
    const out = await example('prometheus');
    delete process.env.PROMETHEUS_PORT;
    expect(out).toMatch(
      /^stream_dedup_verifier_outcomes_total\{consumer="projection",outcome="new",.*\} 100$/m,
    );
    expect(out).toMatch(/^stream_dedup_publisher_confirm_latency_count\{producer="orders-svc",.*\} 100$/m);
    expect(out).not.toContain('otel_scope_version="0.1.0"');
    await expectDeletedItsStream(out);
  });

  it('credit-17: the duplicate is recognised and the balance is 16', async () => {
    const out = await example('credit-17');
    expect(out).toContain('verifier: duplicate credit-17');
    expect(out).toContain('balance 16');
    await expectDeletedItsStream(out);
  });

  it('postgres: credit-17 twice in the stream, the SQL balance counts it once (16)', async () => {
    const out = await example('postgres');
    expect(out).toContain('verifier: duplicate credit-17');
    expect(out).toContain('balance 16');
  });

  it('postgres-outbox: orders and their events commit together; the rolled-back order publishes nothing', async () => {
    const out = await example('postgres-outbox');
    expect(out).toContain('rolled back: order 3: a total must be positive');
    expect(out).toMatch(/stream: \{"type":"order-placed","id":1,.*\(orders-svc#1\)/);
    expect(out).toMatch(/stream: \{"type":"order-placed","id":4,.*\(orders-svc#3\)/);
    expect(out).toContain('orders: 3, events: 3');
    await expectDeletedItsStream(out);
  });

  it('amqp: five orders applied once over AMQP 0-9-1', async () => {
    const out = await example('amqp');
    expect(out).toContain('applied: order 1, order 2, order 3, order 4, order 5');
    await expectDeletedItsStream(out);
  });

  it('out-of-order: highest loses the late message where the window applies it', async () => {
    const out = await example('out-of-order');
    expect(out).toContain('highest applied [1, 2, 4, 5, 9]');
    expect(out).toContain('window  applied [1, 2, 4, 3, 5, 9, 6]; 3: duplicate');
  });

  it('graceful-shutdown: SIGTERM mid-run closes publisher and consumer, no send rejected, each confirmed send in the stream once', async () => {
    const child = spawn(process.execPath, ['--import', 'tsx', 'examples/graceful-shutdown.ts'], {
      cwd: root,
      env: { ...process.env, RABBITMQ_STREAM_PORT: String(BROKER.streamPort) },
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    const exited = once(child, 'exit') as Promise<[number | null]>;
    let stream = '';
    let last: { stopped?: string; closeMs?: number; confirmed?: number; rejected?: number; failed?: number } =
      {};
    for await (const line of createInterface({ input: child.stdout })) {
      const msg = JSON.parse(line) as typeof last & { ready?: boolean; stream?: string; sent?: number };
      if (msg.ready === true) stream = msg.stream!;
      // Stop once it is busy: 10 000 sent.
      if (msg.sent === 10_000) child.kill('SIGTERM');
      last = msg;
    }
    const [code] = await exited;
    expect(last).toMatchObject({ stopped: 'SIGTERM', rejected: 0, failed: 0 });
    expect(code).toBe(0);
    console.log(
      `graceful-shutdown: close took ${last.closeMs} ms, ${last.confirmed} confirmed, ${last.rejected} rejected`,
    );
    const bodies = (await readAll(client(), stream)).map((m) => m.content.toString());
    expect(new Set(bodies).size).toBe(bodies.length);
    expect(bodies.length).toBe(last.confirmed);
    // The example is stopped by a signal and the stream read back here: the test deletes it.
    await client().deleteStream({ stream });
  });
});
