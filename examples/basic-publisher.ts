// Publish a few messages with a durable, named producer and read them back with their identity.
//   npx tsx examples/basic-publisher.ts        (broker: scripts/rabbitmq.sh up)
import { mkdtemp } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { readIdentity } from 'stream-dedup';
import { connect } from 'rabbitmq-stream-js-client';
import { StreamDedupPublisher, readStreamToEnd } from 'stream-dedup/stream';

const connection = {
  hostname: process.env.RABBITMQ_HOST ?? '127.0.0.1',
  port: Number(process.env.RABBITMQ_STREAM_PORT ?? 5552),
  // Credentials from the environment (the test broker's defaults otherwise), never in code.
  username: process.env.RABBITMQ_USER ?? 'guest',
  password: process.env.RABBITMQ_PASSWORD ?? 'guest',
};
const stream = `example-basic-${Date.now()}`;
const store = join(await mkdtemp(join(tmpdir(), 'example-')), 'store');

await using pub = await StreamDedupPublisher.open({
  connection,
  stream,
  createStream: true,
  producerName: 'orders-svc',
  store,
});
const results = await Promise.all(
  ['order 1', 'order 2', 'order 3'].map((text) =>
    pub.send(Buffer.from(text), { headers: { type: 'created' } }),
  ),
);
console.log('published ids', results.map((r) => r.publishingId).join(', '));
await pub.close();

for (const record of await readStreamToEnd(connection, stream)) {
  const id = readIdentity(record.applicationProperties);
  if (id.kind !== 'ok') throw new Error(`unexpected message without identity at ${record.offset}`);
  console.log(
    `offset ${record.offset}: ${record.body.toString()} from ${id.identity.producerName}#${id.identity.publishingId}`,
  );
}

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
