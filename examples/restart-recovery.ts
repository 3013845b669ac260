// A producer stops with messages still unconfirmed; the next open() re-sends them with their
// original IDs, and the broker's deduplication keeps one copy of each.
//   npx tsx examples/restart-recovery.ts
import { mkdtemp } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { isDedupError } from 'stream-dedup';
import { connect } from 'rabbitmq-stream-js-client';
import { StreamDedupPublisher, readStreamToEnd } from 'stream-dedup/stream';

const connection = {
  hostname: process.env.RABBITMQ_HOST ?? '127.0.0.1',
  port: Number(process.env.RABBITMQ_STREAM_PORT ?? 5552),
  // Credentials from the environment (the test broker's defaults otherwise), never in code.
  username: process.env.RABBITMQ_USER ?? 'guest',
  password: process.env.RABBITMQ_PASSWORD ?? 'guest',
};
const stream = `example-recovery-${Date.now()}`;
const path = join(await mkdtemp(join(tmpdir(), 'example-')), 'store');

// First life: three messages are sent and confirmed.
const first = await StreamDedupPublisher.open({
  connection,
  stream,
  createStream: true,
  producerName: 'billing',
  store: path,
});
await Promise.all([1, 2, 3].map((n) => first.send(Buffer.from(`invoice ${n}`))));
console.log('first life: last id', first.lastPublishingId);
await first.close();

// Second life: it stops before two accepted messages reach the broker. close() without waiting
// (`closeTimeoutMs: 0`) writes them to the outbox unsent, which is what a crash right after their
// group commit leaves; their send() rejects with DEDUP_PUBLISHER_CLOSED ("stays in the outbox").
const second = await StreamDedupPublisher.open({
  connection,
  stream,
  producerName: 'billing',
  store: path,
  closeTimeoutMs: 0,
});
const unsent = [4, 5].map((n) => second.send(Buffer.from(`invoice ${n}`)).catch((err: unknown) => err));
await second.close();
for (const outcome of await Promise.all(unsent)) {
  if (!isDedupError(outcome, 'DEDUP_PUBLISHER_CLOSED')) throw new Error(`unexpected: ${String(outcome)}`);
}
console.log('second life: stopped with 2 messages in the outbox');

// Third life: open() reconciles with the broker (it has 3, the store 5) and re-sends 4 and 5.
const third = await StreamDedupPublisher.open({ connection, stream, producerName: 'billing', store: path });
console.log('third life: open report', third.openReport);
await third.send(Buffer.from('invoice 6'));
await third.close();

const bodies = (await readStreamToEnd(connection, stream)).map((r) => r.body.toString());
console.log('stream:', bodies.join(' | '));
if (bodies.length !== 6) throw new Error(`expected 6 messages, found ${bodies.length}`);

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
