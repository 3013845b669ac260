// An AMQP 0-9-1 publisher into a stream queue, and a verifying consumer over AMQP 0-9-1.
// The broker does not deduplicate AMQP 0-9-1; the consumer does.
//   npx tsx examples/amqp.ts
import { mkdtemp } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import amqp from 'amqplib';
import { AmqpDedupPublisher, AmqpVerifyingConsumer } from 'stream-dedup/amqp';

// Credentials from the environment (the test broker's defaults otherwise), never in code.
const user = encodeURIComponent(process.env.RABBITMQ_USER ?? 'guest');
const password = encodeURIComponent(process.env.RABBITMQ_PASSWORD ?? 'guest');
const url = `amqp://${user}:${password}@${process.env.RABBITMQ_HOST ?? '127.0.0.1'}:${process.env.RABBITMQ_AMQP_PORT ?? 5672}`;
const queue = `example-amqp-${Date.now()}`;
const dir = await mkdtemp(join(tmpdir(), 'example-'));

const pub = await AmqpDedupPublisher.open({
  url,
  queue,
  declareQueue: true,
  producerName: 'orders-amqp',
  store: join(dir, 'p'),
});
for (let i = 1; i <= 5; i++) await pub.send(Buffer.from(`order ${i}`));
await pub.close();

const orders: string[] = [];
const consumer = await AmqpVerifyingConsumer.open({
  url,
  queue,
  consumerName: 'order-projection',
  store: join(dir, 'c'),
  handler: (message, tx) => {
    orders.push(message.body.toString());
    tx.put(`order:${message.identity?.publishingId}`, message.body);
  },
});
await consumer.waitForOffset(4n);
await consumer.close();
console.log('applied:', orders.join(', '));
if (orders.length !== 5) throw new Error(`expected 5 orders, got ${orders.length}`);

// An example deletes what it made (an application keeps its stream, of course).
const admin = await amqp.connect(url);
const channel = await admin.createChannel();
await channel.deleteQueue(queue);
await admin.close();
console.log(`deleted stream ${queue}`);
