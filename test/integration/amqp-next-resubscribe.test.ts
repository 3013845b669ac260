/**
 * A verifying consumer with `startFrom: 'next'` that loses its connection before its first
 * commit drops its uncommitted batch and subscribes again at 'next' (committed offset undefined):
 * the dropped batch's messages and those written while it was away never took effect (hostile
 * review B, finding 1). Now it subscribes again at the first offset delivered. Real broker (127.0.0.1:5672), AMQP 0-9-1 consumer through a FaultProxy; own queue, deleted after.
 */
import amqp from 'amqplib';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { AmqpDedupPublisher, AmqpVerifyingConsumer } from '../../src/amqp.js';
import { AMQP_URL, BROKER, uniqueName } from '../support/broker.js';
import { FaultProxy } from '../support/proxy.js';
import { useTempDir } from '../support/tmp.js';
import { DedupStore } from '../../src/store/store.js';
import { effectKeyPrefix } from '../../src/store/consumer-keys.js';

let proxy: FaultProxy;
beforeAll(async () => {
  proxy = await FaultProxy.start(BROKER.host, BROKER.amqpPort);
});
afterAll(async () => {
  await proxy.close();
});
const tempDir = useTempDir();
const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

describe('AMQP consumer, startFrom next, and a lost connection before the first commit', () => {
  it('every message published after the consumer subscribed takes effect exactly once', async () => {
    const queue = uniqueName('revb-next');
    const pub = await AmqpDedupPublisher.open({
      url: AMQP_URL,
      queue,
      declareQueue: true,
      producerName: 'revb-next-producer',
      store: join(await tempDir(), 'producer'),
    });
    const applied = new Map<string, number>();
    const consumerStore = join(await tempDir(), 'consumer');
    const consumer = await AmqpVerifyingConsumer.open({
      url: `amqp://${BROKER.username}:${BROKER.password}@127.0.0.1:${proxy.port}`,
      queue,
      consumerName: 'revb-next-consumer',
      store: consumerStore,
      startFrom: 'next',
      commitLingerMs: 60_000,
      reconnect: { initialDelayMs: 20, maxDelayMs: 100 },
      handler: async (message, tx) => {
        const key = `applied:${message.body.toString()}`;
        const n = Number((await tx.get(key))?.toString() ?? '0') + 1;
        tx.put(key, Buffer.from(String(n)));
        applied.set(message.body.toString(), (applied.get(message.body.toString()) ?? 0) + 1);
      },
    });
    try {
      for (const m of ['m1', 'm2', 'm3']) await pub.send(Buffer.from(m));
      await vi.waitFor(() => expect([...applied.keys()].sort()).toEqual(['m1', 'm2', 'm3']), {
        timeout: 5_000,
      });
      // The connection drops; new connections are refused while three more are published.
      proxy.refuse(true);
      proxy.cut();
      for (const m of ['m4', 'm5', 'm6']) await pub.send(Buffer.from(m));
      await sleep(300);
      proxy.refuse(false);
      // Resubscribed (m7, sent after the reconnect, arrives): the consumer is live again.
      await sleep(1_500);
      await pub.send(Buffer.from('m7'));
      await vi.waitFor(() => expect(applied.has('m7')).toBe(true), { timeout: 5_000 });
      await consumer.close();
      // The effects as committed (what a restart would see): each message exactly once.
      const effects: Record<string, string | undefined> = {};
      const store = await DedupStore.open(consumerStore);
      for (const m of ['m1', 'm2', 'm3', 'm4', 'm5', 'm6', 'm7']) {
        const v = await store.db.get(`${effectKeyPrefix('revb-next-consumer')}applied:${m}`);
        effects[m] = v === undefined ? undefined : Buffer.from(v).toString();
      }
      await store.close();
      // m1..m6 each applied once (before the fix m4..m6 never came, and m1..m3's effects were
      // dropped with the batch at the loss and never applied again).
      expect({ handled: [...applied.keys()].sort(), effects }).toEqual({
        handled: ['m1', 'm2', 'm3', 'm4', 'm5', 'm6', 'm7'],
        effects: { m1: '1', m2: '1', m3: '1', m4: '1', m5: '1', m6: '1', m7: '1' },
      });
    } finally {
      await consumer.close().catch(() => undefined);
      await pub.close().catch(() => undefined);
      const conn = await amqp.connect(AMQP_URL);
      const ch = await conn.createChannel();
      await ch.deleteQueue(queue).catch(() => undefined);
      await conn.close().catch(() => undefined);
    }
  }, 60_000);
});
