// A producer "crashes" with messages still unconfirmed; the next open() re-sends them with their
// original IDs, and the broker's deduplication keeps one copy of each.
//   npx tsx examples/restart-recovery.ts
import { mkdtemp } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { DedupStore } from 'stream-dedup';
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

// What a crash right after a group commit leaves: two more messages in the outbox, never sent.
// (The publisher writes exactly this record before sending; here we write it by hand.)
const store = await DedupStore.open(path);
const state = store.claimProducer(stream, 'billing');
await state.commit({
  meta: { idMode: 'auto', lastId: 5n, reservedUpTo: 0n },
  segment: [4n, 5n].map((id) => ({
    publishingId: id,
    body: Buffer.from(`invoice ${id}`),
    headers: undefined,
  })),
});
state.release();
await store.close();

// Second life: open() reconciles with the broker (it has 3, the store 5) and re-sends 4 and 5.
const second = await StreamDedupPublisher.open({ connection, stream, producerName: 'billing', store: path });
console.log('second life: open report', second.openReport);
await second.send(Buffer.from('invoice 6'));
await second.close();

const bodies = (await readStreamToEnd(connection, stream)).map((r) => r.body.toString());
console.log('stream:', bodies.join(' | '));
if (bodies.length !== 6) throw new Error(`expected 6 messages, found ${bodies.length}`);
