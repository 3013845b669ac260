/**
 * npm run bench:publish — 100 000 messages of 100 B through the raw client (named publisher,
 * waiting for every confirm) and through StreamDedupPublisher in each mode, in the same run.
 * Prints a table and, as the last line, JSON with each case's msg/s and its ratio to raw (AMQP
 * cases: to raw amqplib publishing into a stream queue through a confirm channel).
 * Each case runs ROUNDS times, each time in a fresh process after a warm-up run, on a fresh
 * stream; the median rate is reported, and as the ratio the median of the per-round ratios. The raw client's loop
 * awaits each send() (its buffer); the dedup cases keep at most 5 000 sends outstanding (the default maxInFlight), each
 * awaiting the oldest confirm, the bounded pattern a producer with backpressure uses; one context
 * row issues all 100 000 at once.
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { connect as amqpConnect } from 'amqplib';
import { AmqpDedupPublisher } from 'stream-dedup/amqp';
import { connect as streamConnect } from 'rabbitmq-stream-js-client';
import {
  StreamDedupPublisher,
  SuperStreamDedupPublisher,
  type StreamDedupPublisherOptions,
  type SubEntryOptions,
} from 'stream-dedup/stream';
import type { Durability } from 'stream-dedup';
import {
  allConfirmed,
  CONNECTION,
  connectClient,
  measureInChild,
  median,
  report,
  uniqueName,
  type Row,
} from './common.js';
import { brokerStreamsDir, streamDisk } from './broker-files.js';
import { dbFloorThroughput, naiveThroughput, outboxExtras, relayThroughput } from './outbox.js';

const COUNT = Number(process.env.BENCH_COUNT ?? 100_000);
const SIZE = 100;
const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 7);
const body = Buffer.alloc(SIZE, 0x61);
const STAMPED_SIZE_BODY = Buffer.alloc(SIZE + 57, 0x61);
/** A body that, stamped, is as many bytes on the wire as the raw client's unstamped 100 B message. */
const UNSTAMPED_SIZE_BODY = Buffer.alloc(SIZE - 57, 0x61);
/** Sends outstanding at once in the dedup cases: the publisher's default maxInFlight. */
const WINDOW = 5_000;

/**
 * The live broker's stream folder (bench/broker-files.ts: scripts/rabbitmq.sh's running node, or
 * STREAM_DEDUP_BROKER_STREAMS; `off` leaves the row out), to report bytes on disk per message.
 * Found before any case runs: a folder that cannot be found throws instead of a silent empty row.
 */
const STREAM_FILES = await brokerStreamsDir();
/** The bytes of the last measured case's stream on the broker's disk (set before it is deleted). */
let diskBytes: number | undefined;

/** The size of a stream's segment and index files on the broker's disk (undefined: the row is off). */
async function streamBytesOnDisk(stream: string): Promise<number | undefined> {
  return STREAM_FILES === undefined
    ? undefined
    : (await streamDisk(STREAM_FILES, stream, CONNECTION.vhost)).bytes;
}

/** The raw client; with `stamped`, carrying the same two identity properties the library stamps. */
async function raw(stamped = false, payload: Buffer = body): Promise<number> {
  const client = await connectClient();
  const stream = uniqueName('bench-raw');
  await client.createStream({ stream, arguments: {} });
  try {
    const publisher = await client.declarePublisher({ stream, publisherRef: 'bench-raw' });
    const all = allConfirmed(publisher, COUNT);
    const t0 = performance.now();
    for (let i = 1; i <= COUNT; i++) {
      await publisher.send(
        payload,
        stamped
          ? { applicationProperties: { 'x-dedup-producer': 'bench-raw', 'x-dedup-id': String(i) } }
          : {},
      );
    }
    await publisher.flush();
    await all;
    const seconds = (performance.now() - t0) / 1000;
    await client.deletePublisher(publisher.extendedId);
    diskBytes = await streamBytesOnDisk(stream);
    return COUNT / seconds;
  } finally {
    await client.deleteStream({ stream });
    await client.close();
  }
}

/** How a dedup case differs from the plain one: every field optional. */
interface DedupCase {
  /** fsync every commit. */
  readonly sync?: boolean;
  /** Auto numbering, explicit IDs (1, 2, 3, … given by the caller) or a distinct key per message. */
  readonly ids?: 'auto' | 'explicit' | 'keyed';
  readonly payload?: Buffer;
  /** Every send issued before the first confirm, instead of at most WINDOW outstanding. */
  readonly allAtOnce?: boolean;
  /** keyRetention.maxKeys. */
  readonly maxKeys?: number;
  /** Sub-entry batching. */
  readonly subEntry?: SubEntryOptions;
  /** maxInFlight (and the sends outstanding at once) and maxBatch, when not the defaults. */
  readonly maxInFlight?: number;
  readonly maxBatch?: number;
}

async function dedup(
  durability: Durability,
  {
    sync = false,
    ids = 'auto',
    payload = body,
    allAtOnce = false,
    maxKeys,
    subEntry,
    maxInFlight = WINDOW,
    maxBatch,
  }: DedupCase = {},
): Promise<number> {
  const dir = await mkdtemp(join(tmpdir(), 'bench-dedup-'));
  const stream = uniqueName(`bench-${durability}`);
  const client = await connectClient();
  await client.createStream({ stream, arguments: {} });
  try {
    const pub = await StreamDedupPublisher.open({
      connection: CONNECTION,
      stream,
      producerName: 'bench-dedup',
      store: join(dir, 'store'),
      durability,
      sync,
      idMode: ids,
      ...(maxKeys === undefined ? {} : { keyRetention: { maxKeys } }),
      ...(subEntry === undefined ? {} : { subEntry }),
      maxInFlight,
      ...(maxBatch === undefined ? {} : { maxBatch }),
      // The case's durability and idMode as given (the bench never runs keyed with 'reserve').
    } as StreamDedupPublisherOptions);
    const keys = ids === 'keyed' ? Array.from({ length: COUNT }, (_, i) => `order-${i}`) : [];
    const t0 = performance.now();
    const send = (i: number): Promise<unknown> =>
      ids === 'explicit'
        ? pub.send(payload, { publishingId: BigInt(i + 1) })
        : ids === 'keyed'
          ? pub.send(payload, { key: keys[i]! })
          : pub.send(payload);
    if (allAtOnce) {
      const sends: Promise<unknown>[] = new Array<Promise<unknown>>(COUNT);
      for (let i = 0; i < COUNT; i++) sends[i] = send(i);
      await Promise.all(sends);
    } else {
      // At most maxInFlight sends outstanding: each waits for the oldest confirm first, as the raw
      // client's loop awaits each send.
      const ring: Array<Promise<unknown>> = new Array<Promise<unknown>>(maxInFlight);
      for (let i = 0; i < COUNT; i++) {
        if (i >= maxInFlight) await ring[i % maxInFlight];
        ring[i % maxInFlight] = send(i);
      }
      await Promise.all(ring.filter((p) => p !== undefined));
    }
    const seconds = (performance.now() - t0) / 1000;
    await pub.close();
    diskBytes = await streamBytesOnDisk(stream);
    return COUNT / seconds;
  } finally {
    await client.deleteStream({ stream });
    await client.close();
    await rm(dir, { recursive: true, force: true });
  }
}

/**
 * The bound of the sub-entry cases (issue 39): the raw client publishing the same batches of
 * `size` messages through an unnamed publisher (`sendSubEntries`: no reference, so no dedup on the
 * broker, no store here), at most `window` messages unconfirmed, as the dedup case's maxInFlight.
 */
async function rawSubEntries(size = 100, window = 10_000): Promise<number> {
  const client = await connectClient();
  const stream = uniqueName('bench-raw-sub');
  await client.createStream({ stream, arguments: {} });
  try {
    const publisher = await client.declarePublisher({ stream });
    const batches = Math.ceil(COUNT / size);
    const messages = Array.from({ length: size }, () => ({ content: body }));
    let confirmed = 0;
    let wake = (): void => undefined;
    publisher.on('publish_confirm', (err, ids) => {
      if (err !== null) throw new Error(`publish error ${err}`);
      confirmed += ids.length; // one confirm per batch
      wake();
    });
    const maxBatches = Math.max(1, Math.floor(window / size));
    const t0 = performance.now();
    for (let b = 0; b < batches; b++) {
      while (b - confirmed >= maxBatches) await new Promise<void>((resolve) => (wake = resolve));
      await publisher.sendSubEntries(messages);
    }
    while (confirmed < batches) await new Promise<void>((resolve) => (wake = resolve));
    const seconds = (performance.now() - t0) / 1000;
    await client.deletePublisher(publisher.extendedId);
    return (batches * size) / seconds;
  } finally {
    await client.deleteStream({ stream });
    await client.close();
  }
}

/** Partitions of the super-stream cases. */
const PARTITIONS = 3;
/** The routing keys of the super-stream cases: one per message, spread over the partitions by hash. */
const routingKeys = (): string[] => Array.from({ length: COUNT }, (_, i) => `order-${i}`);

/**
 * The raw client's super stream publisher (hash routing on the message id), every message
 * confirmed: its partition publishers are declared lazily and confirms heard on the client.
 */
async function rawSuper(): Promise<number> {
  const superStream = uniqueName('bench-raw-super');
  let confirmed = 0;
  let done!: () => void;
  const all = new Promise<void>((resolve) => (done = resolve));
  const client = await streamConnect({
    ...CONNECTION,
    addressResolver: { enabled: false },
    listeners: {
      publish_confirm: ({ publishingIds }) => {
        confirmed += publishingIds.length;
        if (confirmed >= COUNT) done();
      },
    },
  });
  await client.createSuperStream({ streamName: superStream, arguments: {} }, undefined, PARTITIONS);
  try {
    const publisher = await client.declareSuperStreamPublisher(
      { superStream, publisherRef: 'bench-raw-super', routingStrategy: 'hash' },
      (_content, opts) => opts.messageProperties?.messageId,
    );
    const keys = routingKeys();
    const t0 = performance.now();
    for (let i = 0; i < COUNT; i++)
      await publisher.send(body, { messageProperties: { messageId: keys[i]! } });
    await all;
    const seconds = (performance.now() - t0) / 1000;
    await publisher.close();
    return COUNT / seconds;
  } finally {
    await client.deleteSuperStream({ streamName: superStream });
    await client.close();
  }
}

/** SuperStreamDedupPublisher, outbox, hash routing on a header: at most WINDOW sends outstanding. */
async function dedupSuper(): Promise<number> {
  const dir = await mkdtemp(join(tmpdir(), 'bench-dedup-super-'));
  const superStream = uniqueName('bench-dedup-super');
  const client = await connectClient();
  await client.createSuperStream({ streamName: superStream, arguments: {} }, undefined, PARTITIONS);
  try {
    const pub = await SuperStreamDedupPublisher.open({
      connection: CONNECTION,
      superStream,
      producerName: 'bench-dedup-super',
      store: join(dir, 'store'),
      routing: { kind: 'hash', key: (_body, headers) => String(headers?.k) },
    });
    const keys = routingKeys();
    const t0 = performance.now();
    const ring: Array<Promise<unknown>> = new Array<Promise<unknown>>(WINDOW);
    for (let i = 0; i < COUNT; i++) {
      if (i >= WINDOW) await ring[i % WINDOW];
      ring[i % WINDOW] = pub.send(body, { headers: { k: keys[i]! } });
    }
    await Promise.all(ring.filter((p) => p !== undefined));
    const seconds = (performance.now() - t0) / 1000;
    await pub.close();
    return COUNT / seconds;
  } finally {
    await client.deleteSuperStream({ streamName: superStream });
    await client.close();
    await rm(dir, { recursive: true, force: true });
  }
}

const AMQP_URL = `amqp://${CONNECTION.username}:${CONNECTION.password}@${CONNECTION.hostname}:${process.env.RABBITMQ_AMQP_PORT ?? 5672}`;

/** Raw amqplib: a confirm channel into a stream queue, every publish confirmed. */
async function rawAmqp(): Promise<number> {
  const model = await amqpConnect(AMQP_URL);
  const channel = await model.createConfirmChannel();
  const queue = uniqueName('bench-amqp-raw');
  await channel.assertQueue(queue, { durable: true, arguments: { 'x-queue-type': 'stream' } });
  try {
    const t0 = performance.now();
    const confirms: Promise<void>[] = new Array<Promise<void>>(COUNT);
    for (let i = 0; i < COUNT; i++) {
      confirms[i] = new Promise<void>((resolve, reject) => {
        const ok = channel.sendToQueue(queue, body, { persistent: true }, (err: unknown) =>
          err === null || err === undefined ? resolve() : reject(new Error('nack')),
        );
        void ok;
      });
    }
    await Promise.all(confirms);
    return COUNT / ((performance.now() - t0) / 1000);
  } finally {
    await channel.deleteQueue(queue);
    await model.close();
  }
}

async function dedupAmqp(): Promise<number> {
  const dir = await mkdtemp(join(tmpdir(), 'bench-dedup-amqp-'));
  const queue = uniqueName('bench-amqp-dedup');
  try {
    const pub = await AmqpDedupPublisher.open({
      url: AMQP_URL,
      queue,
      declareQueue: true,
      producerName: 'bench-dedup-amqp',
      store: join(dir, 'store'),
    });
    const t0 = performance.now();
    const sends: Promise<unknown>[] = new Array<Promise<unknown>>(COUNT);
    for (let i = 0; i < COUNT; i++) sends[i] = pub.send(body);
    await Promise.all(sends);
    const seconds = (performance.now() - t0) / 1000;
    await pub.close();
    return COUNT / seconds;
  } finally {
    const model = await amqpConnect(AMQP_URL);
    const channel = await model.createChannel();
    await channel.deleteQueue(queue);
    await model.close();
    await rm(dir, { recursive: true, force: true });
  }
}

const cases: Array<{ name: string; run: () => Promise<number>; target?: number; baseline?: string }> = [
  { name: 'raw client (named, confirms)', run: () => raw() },
  // Context, no target: the client's own encoder with the two identity properties.
  { name: 'raw client + 2 stamped properties', run: () => raw(true) },
  // Context, no target: the broker's cost grows with bytes. A stamped 100 B message is about 162
  // bytes on the wire (57 bytes of identity); this is the raw client sending that many bytes.
  { name: 'raw client, 157 B bodies', run: () => raw(false, STAMPED_SIZE_BODY) },
  { name: 'dedup outbox', run: () => dedup('outbox'), target: 0.85 },
  // Context, no target: the other way round, a 43 B body whose stamped message is as many bytes
  // as the raw client's 100 B one; it shows what the library costs when the bytes are equal.
  { name: 'dedup outbox, 43 B bodies', run: () => dedup('outbox', { payload: UNSTAMPED_SIZE_BODY }) },
  // Context, no target: all 100 000 sends issued before the first confirm (100 000 promises alive,
  // 90 000 of them queued behind maxInFlight): the cost of that calling pattern.
  { name: 'dedup outbox, all sends at once', run: () => dedup('outbox', { allAtOnce: true }) },
  { name: 'dedup outbox + fsync', run: () => dedup('outbox', { sync: true }), target: 0.6 },
  // Sub-entry batches of 100 (docs/design.md §10): many messages per entry, each still stamped
  // and settled on its own; the ratio is per message, to the raw client sending one per entry.
  // With batches a message costs the broker less, and more in flight keep it busy: maxInFlight
  // 10 000 and maxBatch 5 000, the settings the README gives for sub-entries (the defaults: the
  // context row after these).
  {
    name: 'dedup outbox, sub-entries of 100',
    run: () => dedup('outbox', { subEntry: { size: 100 }, maxInFlight: 10_000, maxBatch: 5_000 }),
    target: 2.5,
  },
  // The bound of the row above (issue 39): the raw client sending the same batches of 100 through
  // an unnamed publisher, no dedup, no store; the sub-entry row's own ratio to it is the next row.
  { name: 'raw client, unnamed, sub-entries of 100', run: () => rawSubEntries() },
  {
    name: 'dedup outbox, sub-entries of 100 (to raw sub-entries)',
    run: () => dedup('outbox', { subEntry: { size: 100 }, maxInFlight: 10_000, maxBatch: 5_000 }),
    target: 0.8,
    baseline: 'raw client, unnamed, sub-entries of 100',
  },
  // Context, no target: the same, gzip-compressed (fewer bytes on the broker's disk, more CPU here).
  {
    name: 'dedup outbox, sub-entries of 100, gzip',
    run: () =>
      dedup('outbox', { subEntry: { size: 100, compression: 'gzip' }, maxInFlight: 10_000, maxBatch: 5_000 }),
  },
  // Context, no target: sub-entries with the default maxInFlight (5 000) and maxBatch (2 000).
  {
    name: 'dedup outbox, sub-entries of 100, default in-flight',
    run: () => dedup('outbox', { subEntry: { size: 100 } }),
  },
  { name: 'dedup reserve', run: () => dedup('reserve'), target: 0.95 },
  // Explicit IDs with `reserve`, the durability for a source that can be re-read (a stream-to-stream
  // processor re-reads its source from the broker's last ID: examples/stream-to-stream.ts).
  { name: 'dedup reserve, explicit ids', run: () => dedup('reserve', { ids: 'explicit' }), target: 0.95 },
  // Context, no target: explicit IDs with an outbox (a source that cannot be re-read) cost what
  // the outbox costs; compare with the `dedup outbox` row, whose target is 0.85.
  { name: 'dedup outbox, explicit ids', run: () => dedup('outbox', { ids: 'explicit' }) },
  { name: 'dedup outbox, keyed sends', run: () => dedup('outbox', { ids: 'keyed' }), target: 0.7 },
  // Context, no target: the steady state past the retention (keyRetention.maxKeys 10 000), where
  // every commit also forgets the oldest keys.
  {
    name: 'dedup outbox, keyed sends, 10 000 kept',
    run: () => dedup('outbox', { ids: 'keyed', maxKeys: 10_000 }),
  },
  { name: 'raw super stream publisher, 3 partitions', run: rawSuper },
  {
    name: 'dedup super stream outbox, 3 partitions',
    run: dedupSuper,
    target: 1.0,
    baseline: 'raw super stream publisher, 3 partitions',
  },
  // Issue 35 (needs PostgreSQL): the transactional outbox relay from a table pre-filled with COUNT
  // rows of the same 100 B bodies, against the raw client; the at-least-once relay as context.
  {
    name: 'outbox relay (PostgreSQL), pre-filled rows',
    run: () => relayThroughput(COUNT, body),
    target: 0.8,
  },
  { name: 'at-least-once relay (SKIP LOCKED), pre-filled rows', run: () => naiveThroughput(COUNT, body) },
  // The bound on both: PostgreSQL alone reading and deleting the same rows, nothing published.
  {
    name: 'relay floor: PostgreSQL alone reads and deletes the rows, nothing published',
    run: () => dbFloorThroughput(COUNT, body),
  },
  { name: 'raw amqplib confirm channel', run: rawAmqp },
  { name: 'dedup amqp outbox', run: dedupAmqp, target: 0.9, baseline: 'raw amqplib confirm channel' },
];

/** What a case's ratio compares with: its own baseline, raw amqplib for AMQP cases, else the raw client. */
function baselineOf(c: { readonly name: string; readonly baseline?: string }): string {
  return c.baseline ?? (c.name.includes('amqp') ? 'raw amqplib confirm channel' : cases[0]!.name);
}

// Each measurement runs in a fresh process after a warm-up run of the same case, as JMH forks per
// benchmark (in one process the raw client's and the library's paths share the client's call
// sites, and each case would run with the JIT state the others left). Rounds interleave the cases
// so drift on a shared machine hits them alike.
const CHILD_CASE = process.env.STREAM_DEDUP_BENCH_CASE;
if (CHILD_CASE !== undefined) {
  const c = cases.find((x) => x.name === CHILD_CASE);
  if (c === undefined) throw new Error(`no case ${CHILD_CASE}`);
  await c.run();
  const rate = await c.run();
  process.stdout.write(`${JSON.stringify({ rate, diskBytes })}\n`);
  process.exit(0);
}
// BENCH_CASES=super,raw client (named: comma-separated parts of case names) runs only those cases;
// a case's baseline runs with it.
const only = process.env.BENCH_CASES?.split(',').map((part) => part.trim());
const chosen = cases.filter(
  (c, i, all) =>
    only === undefined ||
    only.some((part) => c.name.includes(part)) ||
    all.some((d) => only.some((part) => d.name.includes(part)) && baselineOf(d) === c.name),
);
const results = new Map<string, number[]>();
/** Bytes of each case's stream on the broker's disk, per message (the last round's). */
const bytesPerMessage: Record<string, number> = {};
for (let round = 0; round < ROUNDS; round++) {
  for (const c of chosen) {
    const { rate, diskBytes: bytes } = await measureInChild<{ rate: number; diskBytes?: number }>(
      import.meta.url,
      [],
      { STREAM_DEDUP_BENCH_CASE: c.name },
    );
    const r = results.get(c.name) ?? [];
    r.push(rate);
    results.set(c.name, r);
    if (bytes !== undefined) bytesPerMessage[c.name] = Number((bytes / COUNT).toFixed(1));
  }
}
// A case's ratio is the median over rounds of (case ÷ its baseline in the same round): the two ran
// within seconds of each other, so drift between rounds (the broker's state, the page cache's
// writeback) cancels; the rate column is the case's own median.
const rows: Row[] = chosen.map((c) => {
  const rates = results.get(c.name)!;
  const base = results.get(baselineOf(c)) ?? rates;
  const ratio = median(rates.map((rate, round) => rate / base[round]!));
  return {
    name: c.name,
    msgsPerSec: median(rates),
    ratio,
    ...(c.target === undefined ? {} : { target: c.target }),
  };
});
// The outbox's latency (1 000 and 10 000 committed rows/s) and duplicates after 20 SIGKILLs of each
// relay, once per run, when the outbox cases ran.
const outbox = chosen.some((c) => c.name.includes('relay')) ? await outboxExtras() : undefined;
for (const [name, bytes] of Object.entries(bytesPerMessage))
  console.log(`on disk: ${name}: ${bytes} B/message`);
report('publish', rows, {
  bytesPerMessageOnDisk: bytesPerMessage,
  ...(outbox === undefined ? {} : { outbox }),
  messages: COUNT,
  bytes: SIZE,
  rounds: ROUNDS,
  ratio: 'median over rounds of case / baseline in the same round',
  perRound: Object.fromEntries([...results].map(([name, rates]) => [name, rates.map(Math.round)])),
});
