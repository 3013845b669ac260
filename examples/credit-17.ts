// docs/design.md §5's worked example: event credit-17 adds 10 to a balance projection. The stream holds
// the event twice (a producer retried it); the verifying consumer applies it once, because the
// balance and the verifier state commit in one LevelDB batch.
//   npx tsx examples/credit-17.ts
import { mkdtemp } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { connect } from 'rabbitmq-stream-js-client';
import { identityHeaders } from 'stream-dedup';
import { StreamVerifyingConsumer } from 'stream-dedup/stream';

const connection = {
  hostname: process.env.RABBITMQ_HOST ?? '127.0.0.1',
  port: Number(process.env.RABBITMQ_STREAM_PORT ?? 5552),
};
const stream = `example-credit-${Date.now()}`;

// Write credit-16, credit-17, credit-17 again (a retried publish the broker did not deduplicate:
// an unnamed publisher, as AMQP 0-9-1 publishers are), and credit-18.
const client = await connect({
  ...connection,
  username: process.env.RABBITMQ_USER ?? 'guest',
  password: process.env.RABBITMQ_PASSWORD ?? 'guest',
  vhost: '/',
});
await client.createStream({ stream, arguments: {} });
const publisher = await client.declarePublisher({ stream });
for (const [n, amount] of [
  [16, 5],
  [17, 10],
  [17, 10],
  [18, 1],
] as const) {
  await publisher.send(Buffer.from(String(amount)), {
    applicationProperties: identityHeaders('ledger', BigInt(n)),
  });
}
await publisher.flush();
await client.close();

const consumer = await StreamVerifyingConsumer.open({
  connection,
  stream,
  consumerName: 'balance-projection',
  store: join(await mkdtemp(join(tmpdir(), 'example-')), 'store'),
  handler: async (message, tx) => {
    const balance = Number(Buffer.from((await tx.get('balance')) ?? Buffer.from('0')).toString());
    tx.put('balance', String(balance + Number(message.body.toString())));
  },
  onEvent: (event) =>
    console.log('verifier:', event.kind, 'publishingId' in event ? `credit-${event.publishingId}` : ''),
});
await consumer.waitForOffset(3n);
const balance = Buffer.from((await consumer.readEffect('balance'))!).toString();
console.log(`balance ${balance} (credit-17 applied once: 5 + 10 + 1 = 16)`);
await consumer.close();
if (balance !== '16') throw new Error(`balance ${balance}, expected 16`);

// An example deletes what it made (an application keeps its stream, of course).
const admin = await connect({
  ...connection,
  username: process.env.RABBITMQ_USER ?? 'guest',
  password: process.env.RABBITMQ_PASSWORD ?? 'guest',
  vhost: '/',
});
await admin.deleteStream({ stream });
await admin.close();
console.log(`deleted stream ${stream}`);
