// An effectively-once stream-to-super-stream processor: consume stream A (orders), transform each
// record, publish the result to a super stream routed by the record's customer (hash routing, as
// every RabbitMQ client routes), with publishingId = source offset + 1 in whichever partition.
//
// As in examples/stream-to-stream.ts the identity comes from the source, but here each partition
// has its own last ID, and one input feeds them all. Resuming after a crash:
//   a partition gets its records in input order and has accepted a prefix of them, so a record is
//   done iff its ID <= last(its partition); every ID <= m = min over partitions of last(p) is done:
//   re-read the input from offset m, and skip each record whose ID is <= its own partition's last.
// (Skipping is required: re-sending it would be refused with DEDUP_ID_REGRESSION. A partition that
// rarely gets records holds the minimum back: more is re-read and skipped, nothing is re-sent.)
//
// Durability, and the rule that the publish must be the only side effect of processing: as in
// examples/stream-to-stream.ts (`reserve` by default: the source is the durable copy).
//
//   npx tsx examples/stream-to-super-stream.ts <source> <super-stream> <store-folder> <count> [reserve|outbox]
// The super stream must exist (`rabbitmq-streams add_super_stream orders-out --partitions 3`).
// Source records are JSON `{"order": 17, "customer": "c-4"}`. Stops once the first <count> source
// records are published and confirmed.
import { connect, Offset } from 'rabbitmq-stream-js-client';
import { SuperStreamDedupPublisher } from 'stream-dedup/stream';

const [source, target, store, countText, durability = 'reserve'] = process.argv.slice(2);
if (
  source === undefined ||
  target === undefined ||
  store === undefined ||
  countText === undefined ||
  (durability !== 'reserve' && durability !== 'outbox')
) {
  console.error(
    'usage: stream-to-super-stream <source> <super-stream> <store-folder> <count> [reserve|outbox]',
  );
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

interface Order {
  order: number;
  customer: string;
}
const parse = (bytes: Uint8Array): Order => JSON.parse(Buffer.from(bytes).toString()) as Order;
/** The processing: the only side effect is the publish of its result. */
const transform = (input: Order): Buffer =>
  Buffer.from(JSON.stringify({ order: input.order, customer: input.customer, status: 'ACCEPTED' }));

const pub = await SuperStreamDedupPublisher.open({
  connection,
  superStream: target,
  producerName: `transform-${source}`,
  store,
  idMode: 'explicit',
  durability,
  routing: { kind: 'hash', key: (body) => parse(body).customer },
});
// Per partition, the last source offset + 1 it has accepted (stored by the broker, or in the
// outbox that open() re-sends). Read once, before anything new is sent.
const accepted = pub.lastPublishingIds;
const resumeAt = [...accepted.values()].reduce((a, b) => (a < b ? a : b));
console.log(
  JSON.stringify({
    ready: true,
    resumeAt: resumeAt.toString(),
    accepted: Object.fromEntries([...accepted].map(([p, id]) => [p, id.toString()])),
  }),
);

let skipped = 0;
let failure: Error | undefined;
const unconfirmed = new Set<Promise<unknown>>();

/** One source record: route it, skip it if its partition has it already, else publish it there. */
async function processRecord(offset: bigint, content: Buffer): Promise<void> {
  const publishingId = offset + 1n;
  const output = transform(parse(content));
  const partition = await pub.partitionFor(output);
  if (publishingId <= accepted.get(partition)!) {
    skipped++; // accepted by its partition before the crash
    return;
  }
  // Not awaited one by one: sends to a partition keep call order, so its IDs increase.
  const sent = pub.sendTo(partition, output, { publishingId });
  unconfirmed.add(sent);
  void sent.then(
    () => unconfirmed.delete(sent),
    (err: unknown) => (failure ??= err instanceof Error ? err : new Error('send failed', { cause: err })),
  );
}

const client = await connect(connection);
await new Promise<void>((resolve, reject) => {
  if (resumeAt >= count) {
    resolve();
    return;
  }
  // partitionFor() is asynchronous: one queue keeps the records in source order (the client may
  // deliver the next chunk while a handler is still waiting).
  let queue = Promise.resolve();
  void client
    .declareConsumer({ stream: source, offset: Offset.offset(resumeAt) }, (message) => {
      const offset = message.offset!;
      if (offset >= count) return;
      queue = queue.then(async () => {
        if (failure !== undefined) throw failure;
        await processRecord(offset, message.content);
        if (offset === count - 1n) resolve();
      });
      queue.catch(reject);
    })
    .catch(reject);
});
await Promise.all(unconfirmed); // rejects with the first failed send
await client.close();
await pub.close();
console.log(
  JSON.stringify({
    done: true,
    skipped,
    lastPublishingIds: Object.fromEntries([...pub.lastPublishingIds].map(([p, id]) => [p, id.toString()])),
  }),
);
