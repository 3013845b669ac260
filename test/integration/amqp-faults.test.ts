import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AmqpDedupPublisher, AmqpVerifyingConsumer } from '../../src/amqp.js';
import { BROKER, uniqueName } from '../support/broker.js';
import { FaultProxy } from '../support/proxy.js';
import { connectClient, readAll } from '../support/stream.js';
import { useTempDir } from '../support/tmp.js';

let proxy: FaultProxy;
beforeAll(async () => {
  proxy = await FaultProxy.start(BROKER.host, BROKER.amqpPort);
});
afterAll(async () => {
  await proxy.close();
});
const tempDir = useTempDir();

// amqplib emits 'error' events that kill the process when unhandled; a dropped socket must mean a
// reconnect and a re-send, never a crash and never a lost message.
describe('amqp 0-9-1 - dropped connections', () => {
  it('a broker that stops reading: close() returns within closeTimeoutMs plus its bounded teardown, and the messages land from the outbox (issue 32, item 7)', async () => {
    const queue = uniqueName('amqp-undrained');
    const viaProxy = `amqp://${BROKER.username}:${BROKER.password}@127.0.0.1:${proxy.port}`;
    const options = {
      url: viaProxy,
      queue,
      declareQueue: true,
      producerName: 'amqp-undrained-producer',
      store: join(await tempDir(), 'producer'),
      connectTimeoutMs: 1_000,
    };
    const pub = await AmqpDedupPublisher.open({ ...options, closeTimeoutMs: 200, confirmTimeoutMs: 60_000 });
    await pub.send(Buffer.from('m-0'));
    proxy.pause(true);
    // 32 MiB: more than the loopback socket buffers hold, so the publisher waits for 'drain'.
    const big = Buffer.alloc(256 * 1024, 1);
    const sends = Array.from({ length: 128 }, (_, i) =>
      pub.send(Buffer.concat([Buffer.from(`m-${i + 1}|`), big])),
    );
    for (const s of sends) s.catch(() => undefined);
    while (pub.stats.sent < 129) await new Promise((r) => setImmediate(r));
    const started = performance.now();
    let limit: NodeJS.Timeout | undefined;
    const outcome = await Promise.race([
      pub.close().then(() => 'closed'),
      new Promise(
        (resolve) => (limit = setTimeout(() => resolve('close() still waiting after 30 s'), 30_000)),
      ),
    ]);
    clearTimeout(limit);
    const ms = performance.now() - started;
    console.log(`[amqp undrained] close() returned in ${Math.round(ms)} ms`);
    expect(outcome).toBe('closed');
    expect(ms).toBeLessThan(7_000);
    proxy.pause(false);
    proxy.cut();
    const again = await AmqpDedupPublisher.open(options);
    const resolved = (await Promise.allSettled(sends)).filter((r) => r.status === 'fulfilled').length;
    expect(again.openReport.resent + resolved).toBeGreaterThanOrEqual(128);
    await again.close();
  }, 60_000);

  it('publisher and consumer survive cut sockets: every send resolves and takes effect exactly once', async () => {
    const queue = uniqueName('amqp-cut');
    const viaProxy = `amqp://${BROKER.username}:${BROKER.password}@127.0.0.1:${proxy.port}`;
    const pub = await AmqpDedupPublisher.open({
      url: viaProxy,
      queue,
      declareQueue: true,
      producerName: 'amqp-cut-producer',
      store: join(await tempDir(), 'producer'),
      reconnect: { initialDelayMs: 20, maxDelayMs: 100 },
      connectTimeoutMs: 1_000,
    });
    const labels = Array.from({ length: 20_000 }, (_, i) => `m-${i + 1}`);
    let resolved = 0;
    const results = await Promise.allSettled(
      labels.map((label) =>
        pub.send(Buffer.from(label)).then((r) => {
          if (++resolved === 5_000 || resolved === 12_000) proxy.cut();
          return r;
        }),
      ),
    );
    expect(results.filter((r) => r.status === 'rejected')).toEqual([]);
    await pub.close();

    // The stream may hold copies (AMQP 0-9-1 is never deduplicated by the broker); read it through
    // the stream protocol to know where it ends (readAll appends an end marker after it).
    const client = await connectClient();
    const stream = await readAll(client, queue);
    await client.close();
    const copies = stream.length - new Set(stream.map((m) => m.content.toString())).size;

    let handlerCalls = 0;
    let doubleApplied = 0;
    const logged: string[] = [];
    const record = (_obj: object, msg?: string): void => void logged.push(msg ?? '');
    const consumer = await AmqpVerifyingConsumer.open({
      logger: { debug: record, info: record, warn: record, error: record },
      url: viaProxy,
      queue,
      consumerName: 'amqp-cut-effects',
      store: join(await tempDir(), 'consumer'),
      prefetch: 200,
      reconnect: { initialDelayMs: 20, maxDelayMs: 100 },
      handler: async (message, tx) => {
        if (++handlerCalls === 5_000) proxy.cut(); // uncommitted work is dropped and redelivered
        const key = `applied:${message.body.toString()}`;
        if ((await tx.get(key)) !== undefined) doubleApplied++;
        tx.put(key, '1');
        const n = Number(Buffer.from((await tx.get('count')) ?? Buffer.from('0')).toString());
        tx.put('count', String(n + 1));
      },
    });
    await consumer.waitForOffset(BigInt(stream.length)); // the end marker's offset
    const applied = Number(Buffer.from((await consumer.readEffect('count'))!).toString());
    const missing: string[] = [];
    for (const label of labels)
      if ((await consumer.readEffect(`applied:${label}`)) === undefined) missing.push(label);
    await consumer.close();
    console.log(
      `[amqp cut] stream=${stream.length} copies=${copies} handler calls=${handlerCalls} applied=${applied} ` +
        `duplicates dropped=${consumer.stats.duplicate}`,
    );
    expect(missing).toEqual([]);
    expect(doubleApplied).toBe(0);
    expect(applied).toBe(labels.length);
    expect(handlerCalls).toBeGreaterThanOrEqual(labels.length);
    // The cut is logged, and so is every subscription (the first and the one after the cut).
    expect(logged.filter((m) => m.includes('lost its subscription')).length).toBeGreaterThanOrEqual(1);
    expect(logged.filter((m) => m.includes('consumer subscribed')).length).toBeGreaterThanOrEqual(2);
  });
});
