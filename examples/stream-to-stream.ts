// An effectively-once stream-to-stream processor: consume stream A, transform each message,
// publish the result to stream B with publishingId = source offset + 1.
//
// The identity comes from the source, not from the publisher: after a crash the processor
// re-reads A from where B's producer stopped and re-creates the same outputs with the same IDs,
// so the broker drops every output it already stored. This holds only while the publish is the
// ONLY side effect of processing (docs/design.md §2): anything else the processor does (a database write,
// an e-mail) would happen again after a crash.
//
// Durability: the source stream already holds every input, so the publisher need not keep a copy
// of its outputs: with `reserve` (the default here) the store keeps only the ID mode and the
// reserved IDs, and after a crash `lastPublishingId` is the broker's last ID for this producer —
// what was sent but never stored is re-created from the source under the same IDs. Pass `outbox`
// to keep the outputs in LevelDB as well (needed when the source cannot be re-read).
//
//   npx tsx examples/stream-to-stream.ts <source> <target> <store-folder> <count> [reserve|outbox]
// Stops once the first <count> source messages are published and confirmed.
import { connect, Offset } from 'rabbitmq-stream-js-client';
import { StreamDedupPublisher } from 'stream-dedup/stream';

const [source, target, store, countText, durability = 'reserve'] = process.argv.slice(2);
if (
  source === undefined ||
  target === undefined ||
  store === undefined ||
  countText === undefined ||
  (durability !== 'reserve' && durability !== 'outbox')
) {
  console.error('usage: stream-to-stream <source> <target> <store-folder> <count> [reserve|outbox]');
  process.exit(2);
}
const count = BigInt(countText);
const connection = {
  hostname: process.env.RABBITMQ_HOST ?? '127.0.0.1',
  port: Number(process.env.RABBITMQ_STREAM_PORT ?? 5552),
  username: process.env.RABBITMQ_USER ?? 'guest',
  password: process.env.RABBITMQ_PASSWORD ?? 'guest',
  vhost: '/',
};

const pub = await StreamDedupPublisher.open({
  connection,
  stream: target,
  createStream: true,
  producerName: `transform-${source}`,
  store,
  idMode: 'explicit',
  durability,
});
// The last source offset + 1 already taken care of (stored by the broker with `reserve`; stored by
// the broker or in the outbox, which open() re-sends, with `outbox`): resume right after it.
const resumeAt = pub.lastPublishingId;
console.log(JSON.stringify({ ready: true, resumeAt: resumeAt.toString() }));

let failure: Error | undefined;
let last: Promise<unknown> = Promise.resolve();
const client = await connect(connection);
await new Promise<void>((resolve, reject) => {
  if (resumeAt >= count) {
    resolve();
    return;
  }
  void client
    .declareConsumer({ stream: source, offset: Offset.offset(resumeAt) }, (message) => {
      const offset = message.offset!;
      if (offset >= count || failure !== undefined) return;
      const output = Buffer.from(message.content.toString().toUpperCase());
      // Not awaited one by one: send() keeps call order, and the ID order is the source order.
      last = pub.send(output, { publishingId: offset + 1n }).catch((err: unknown) => {
        failure = err instanceof Error ? err : new Error('send failed', { cause: err });
        reject(failure);
      });
      if (offset === count - 1n) resolve();
    })
    .catch(reject);
});
await last;
await client.close();
await pub.close();
if (failure !== undefined) throw failure;
console.log(JSON.stringify({ done: true, lastPublishingId: pub.lastPublishingId.toString() }));
