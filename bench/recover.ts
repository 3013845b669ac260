/**
 * npm run bench:recover — what a restart costs, and what the publisher and the verifying consumer
 * hold in memory (issue #19):
 *
 * a. Publisher recovery. A child process (bench/recover-fill.ts) commits 100 000 messages of 100
 *    random bytes to a StreamDedupPublisher's outbox behind bench/publish-dropping-proxy.ts, which
 *    passes the handshake and drops every Publish frame: nothing reaches the broker, nothing is
 *    confirmed. The proxy reads the IDs of the frames it drops; a frame leaves only after its group
 *    commit is written (docs/design.md §4.2), so once ID 100 000 went by the child is SIGKILLed;
 *    then the store must hold exactly IDs 1..100 000 in its outbox (read with `inspect`'s engine)
 *    and the broker none of them. `StreamDedupPublisher.open()` on that store is timed until every
 *    recovered message is confirmed, against the raw rabbitmq-stream-js-client publishing 100 000
 *    messages of 100 B (named producer, every confirm awaited, as in bench:publish); both are timed
 *    from nothing connected. Each runs in a new process (a restarted service is one: the headline
 *    ratio), then again in that process on a second outbox or stream (warm JIT, as bench:publish
 *    measures after a warm-up). Every recovered stream must hold exactly 100 000 messages, IDs
 *    1..100 000 once each.
 * b. Verifying consumer open with 100 000 scopes in its store: a stream of one message from each of
 *    100 000 producers (raw client) is consumed by a StreamVerifyingConsumer, which writes the
 *    100 000 scopes; `open()` of that store is then timed in a new process until subscribed, with
 *    the default scopeTtlMs 0 and with a TTL (whose eviction scan reads every scope at open).
 * c. Memory (bench/recover-memory.ts, each in a process started with --expose-gc): a publisher at
 *    maxInFlight 5 000 in steady state; a verifying consumer holding 10 000 and 1 000 000 scopes
 *    (window 1024), with bytes per scope, and what TTL eviction leaves.
 *
 * The recovery and consumer-open cases run BENCH_ROUNDS times (default 3), interleaved with the raw
 * client; medians are reported, and a ratio is the median of the per-round ratios. Prints a table,
 * then one JSON line with every figure. Cleans up its streams and temporary folders; talks to the
 * broker on 127.0.0.1 only (whose publisher connections go to the host it advertises, localhost).
 *
 * Environment: BENCH_COUNT (100 000), BENCH_SCOPES (100 000), BENCH_ROUNDS (3),
 * BENCH_MEMORY_SCOPES ("10000,1000000"), BENCH_CPU_PROF=<folder> (CPU profiles of each recovering
 * process, main thread and tsx's loader thread, in <folder>/round-N).
 *
 * It imports the library's TypeScript sources (it needs internals: the consumer core, the store's
 * inspection), so it measures the working tree whether or not `npm run build` ran.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as delay } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import { inspectStore } from '../src/cli/inspect.js';
import { identityHeaders, readIdentity } from '../src/identity/headers.js';
import { DedupStore } from '../src/store/store.js';
import { readStreamToEnd, StreamDedupPublisher, StreamVerifyingConsumer } from '../src/stream.js';
import { withTimeout } from '../src/transport/util.js';
import { allConfirmed, CONNECTION, connectClient, measureInChild, median, uniqueName } from './common.js';
import { PublishDroppingProxy } from './publish-dropping-proxy.js';
import {
  consumerMemory,
  publisherMemory,
  type ConsumerMemory,
  type MemoryReading,
  type PublisherMemory,
} from './recover-memory.js';

const COUNT = Number(process.env.BENCH_COUNT ?? 100_000);
const SCOPES = Number(process.env.BENCH_SCOPES ?? 100_000);
const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 3);
const MEMORY_SCOPES = (process.env.BENCH_MEMORY_SCOPES ?? '10000,1000000').split(',').map(Number);
const CPU_PROF = process.env.BENCH_CPU_PROF;
const SIZE = 100;
/** The recovery's target: at most this many times the raw client's time. */
const TARGET = 2.0;
const PRODUCER = 'bench-recover';
const CONSUMER = 'bench-recover-consumer';
/** A TTL long enough that nothing is evicted: only the scan at open() is paid. */
const SCAN_TTL_MS = 86_400_000;

// ---------------------------------------------------------------------------------------------
// Child processes: each measurement, selected by STREAM_DEDUP_BENCH_CASE.

interface RecoverTimes {
  /** open() alone: store, outbox load, connect, declare, reconcile. */
  readonly openMs: number;
  /** From the call to open() until every recovered message is confirmed. */
  readonly recoverMs: number;
  readonly closeMs: number;
  readonly resent: number;
  readonly confirmed: number;
  readonly localLastId: string;
  readonly brokerLastId: string | undefined;
}

/** Opens the publisher on the filled store and waits until the outbox is confirmed. */
async function recoverChild(stream: string, store: string): Promise<RecoverTimes> {
  const t0 = performance.now();
  const pub = await StreamDedupPublisher.open({
    connection: CONNECTION,
    stream,
    producerName: PRODUCER,
    store,
    durability: 'outbox',
  });
  const opened = performance.now();
  // The public API has no event for "everything confirmed" (close() waits for it, then closes):
  // poll the public counter every millisecond, which bounds the error at about 1 ms.
  const deadline = t0 + 120_000;
  while (pub.inFlight > 0) {
    if (pub.isClosed) throw new Error(`the publisher closed while recovering: ${String(await pub.closed())}`);
    if (performance.now() > deadline) throw new Error(`still ${pub.inFlight} in flight after 120 s`);
    await delay(1);
  }
  const done = performance.now();
  const { resent, localLastId, brokerLastId } = pub.openReport;
  const confirmed = pub.stats.confirmed;
  await pub.close();
  return {
    openMs: opened - t0,
    recoverMs: done - t0,
    closeMs: performance.now() - done,
    resent,
    confirmed,
    localLastId: localLastId.toString(),
    brokerLastId: brokerLastId?.toString(),
  };
}

interface RawTimes {
  /** From connect() until every confirm: what the recovery's time compares with. */
  readonly totalMs: number;
  /** From the first send until every confirm. */
  readonly publishMs: number;
}

/** The raw client, as bench/publish.ts runs it: a named producer, each send awaited, every confirm. */
async function rawChild(stream: string): Promise<RawTimes> {
  const body = Buffer.alloc(SIZE, 0x61);
  const t0 = performance.now();
  const client = await connectClient();
  try {
    const publisher = await client.declarePublisher({ stream, publisherRef: 'bench-raw' });
    const all = allConfirmed(publisher, COUNT);
    const t1 = performance.now();
    for (let i = 0; i < COUNT; i++) await publisher.send(body);
    await publisher.flush();
    await withTimeout(all, 120_000, "the raw client's confirms");
    const t2 = performance.now();
    await client.deletePublisher(publisher.extendedId);
    return { totalMs: t2 - t0, publishMs: t2 - t1 };
  } finally {
    await client.close();
  }
}

/** Times StreamVerifyingConsumer.open() on the filled store until it is subscribed. */
async function consumerOpenChild(
  stream: string,
  store: string,
  scopeTtlMs: number,
): Promise<{ openMs: number }> {
  const t0 = performance.now();
  const consumer = await StreamVerifyingConsumer.open({
    connection: CONNECTION,
    stream,
    consumerName: CONSUMER,
    store,
    scopeTtlMs,
    handler: () => undefined,
  });
  const openMs = performance.now() - t0;
  const applied = consumer.stats.new;
  await consumer.close();
  if (applied !== 0) throw new Error(`the reopened consumer applied ${applied} messages again`);
  return { openMs };
}

/** Runs `each` on every argument, in order: the first cold, the next ones warm. */
async function inOrder<T>(args: readonly string[], each: (a: string) => Promise<T>): Promise<T[]> {
  const results: T[] = [];
  for (const a of args) results.push(await each(a));
  return results;
}

/** Runs `each` on consecutive pairs of `args`, in order: the first cold, the next ones warm. */
async function pairs<T>(args: readonly string[], each: (a: string, b: string) => Promise<T>): Promise<T[]> {
  const results: T[] = [];
  for (let i = 0; i + 1 < args.length; i += 2) results.push(await each(args[i]!, args[i + 1]!));
  return results;
}

const CHILD_CASE = process.env.STREAM_DEDUP_BENCH_CASE;
if (CHILD_CASE !== undefined) {
  const args = process.argv.slice(2);
  const [a = '', b = '', c = ''] = args;
  const result: unknown =
    CHILD_CASE === 'recover'
      ? await pairs(args, recoverChild)
      : CHILD_CASE === 'raw'
        ? await inOrder(args, rawChild)
        : CHILD_CASE === 'consumer-open'
          ? await consumerOpenChild(a, b, Number(c))
          : CHILD_CASE === 'publisher-memory'
            ? await publisherMemory(a, b, SIZE, 3, 1)
            : CHILD_CASE === 'consumer-memory'
              ? await consumerMemory(Number(a), b)
              : undefined;
  if (result === undefined) throw new Error(`no case ${CHILD_CASE}`);
  process.stdout.write(`${JSON.stringify(result)}\n`);
  process.exit(0);
}

// ---------------------------------------------------------------------------------------------
// The parent: set-up, checks and clean-up around the children.

const streams = new Set<string>();
const dirs = new Set<string>();
/** The outbox-filling child while it runs: killed first if this process is interrupted. */
let filling: ChildProcess | undefined;
/** Aborted when this process is interrupted: kills the measuring child, and nothing new is made. */
const interrupted = new AbortController();

/** One measurement: this script again in a new process, as the child `kind` (see above). */
function measure<T>(kind: string, args: readonly string[], nodeFlags: readonly string[] = []): Promise<T> {
  interrupted.signal.throwIfAborted();
  return measureInChild<T>(
    import.meta.url,
    args,
    { STREAM_DEDUP_BENCH_CASE: kind },
    {
      nodeFlags,
      signal: interrupted.signal,
    },
  );
}

async function newStream(prefix: string): Promise<string> {
  interrupted.signal.throwIfAborted();
  // uniqueName() is per process and millisecond: two streams made in one millisecond need more.
  const stream = `${uniqueName(prefix)}-${streams.size}`;
  const client = await connectClient();
  try {
    await client.createStream({ stream, arguments: {} });
  } finally {
    await client.close();
  }
  streams.add(stream);
  return stream;
}

async function newDir(prefix: string): Promise<string> {
  interrupted.signal.throwIfAborted();
  const dir = await mkdtemp(join(tmpdir(), prefix));
  dirs.add(dir);
  return dir;
}

async function cleanUp(): Promise<void> {
  const client = await connectClient();
  try {
    for (const stream of streams) await client.deleteStream({ stream }).catch(() => undefined);
  } finally {
    await client.close();
  }
  for (const dir of dirs) await rm(dir, { recursive: true, force: true });
}

/**
 * Runs bench/recover-fill.ts through a publish-dropping proxy until the proxy saw every ID leave,
 * SIGKILLs it, and checks that the store's outbox holds exactly IDs 1..COUNT.
 */
async function fillOutbox(stream: string, store: string): Promise<{ fillMs: number }> {
  const proxy = await PublishDroppingProxy.start(CONNECTION.hostname, CONNECTION.port);
  const t0 = performance.now();
  const child = spawn(
    process.execPath,
    [
      ...process.execArgv,
      fileURLToPath(new URL('./recover-fill.ts', import.meta.url)),
      String(proxy.port),
      stream,
      store,
      PRODUCER,
      String(COUNT),
      String(SIZE),
    ],
    { stdio: ['ignore', 'ignore', 'pipe'] },
  );
  filling = child;
  let stderr = '';
  child.stderr.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
  const exited = once(child, 'exit');
  try {
    await Promise.race([
      proxy.waitForId(BigInt(COUNT), 60_000),
      exited.then(([code]) => {
        throw new Error(`recover-fill exited (${String(code)}) before sending everything:\n${stderr}`);
      }),
    ]);
  } finally {
    child.kill('SIGKILL');
    await exited.catch(() => undefined);
    filling = undefined;
    await proxy.close();
  }
  const fillMs = performance.now() - t0;
  if (proxy.entries !== COUNT) throw new Error(`the proxy dropped ${proxy.entries} entries, not ${COUNT}`);
  // What `stream-dedup inspect <store>` prints, read through its engine.
  const opened = await DedupStore.open(store);
  try {
    const { producers } = await inspectStore(opened);
    const p = producers.find((x) => x.target === stream && x.producerName === PRODUCER);
    if (
      producers.length !== 1 ||
      p === undefined ||
      p.outboxMessages !== COUNT ||
      p.outboxFirstId !== 1n ||
      p.outboxLastId !== BigInt(COUNT) ||
      p.lastId !== BigInt(COUNT)
    ) {
      throw new Error(`the outbox does not hold IDs 1..${COUNT}: ${JSON.stringify(producers, bigintJson)}`);
    }
  } finally {
    await opened.close();
  }
  // And the broker has none of them.
  const client = await connectClient();
  try {
    const publisher = await client.declarePublisher({ stream, publisherRef: PRODUCER });
    const last = await publisher.getLastPublishingId();
    await client.deletePublisher(publisher.extendedId);
    if (last !== 0n) throw new Error(`the broker already has ID ${last} of ${PRODUCER}`);
  } finally {
    await client.close();
  }
  return { fillMs };
}

/** The stream holds exactly COUNT messages of PRODUCER, IDs 1..COUNT once each. */
async function checkRecoveredStream(stream: string): Promise<void> {
  const records = await readStreamToEnd(CONNECTION, stream);
  const seen = new Set<bigint>();
  for (const r of records) {
    const identity = readIdentity(r.applicationProperties);
    if (identity.kind !== 'ok' || identity.identity.producerName !== PRODUCER) {
      throw new Error(
        `message at offset ${r.offset} is not ${PRODUCER}'s: ${JSON.stringify(identity, bigintJson)}`,
      );
    }
    const id = identity.identity.publishingId;
    if (id < 1n || id > BigInt(COUNT) || seen.has(id)) throw new Error(`unexpected or repeated ID ${id}`);
    if (r.body.length !== SIZE) throw new Error(`ID ${id} has a body of ${r.body.length} bytes`);
    seen.add(id);
  }
  if (records.length !== COUNT || seen.size !== COUNT) {
    throw new Error(`the stream holds ${records.length} messages (${seen.size} distinct IDs), not ${COUNT}`);
  }
}

function bigintJson(_key: string, value: unknown): unknown {
  return typeof value === 'bigint' ? value.toString() : value;
}

interface RecoveryRound {
  readonly fillMs: number;
  /** The raw client in a new process, then again in the same process (warm). */
  readonly raw: { readonly cold: RawTimes; readonly warm: RawTimes };
  /** The recovery in a new process, then another outbox's in the same process (warm). */
  readonly recover: { readonly cold: RecoverTimes; readonly warm: RecoverTimes };
}

async function recoveryRound(round: number): Promise<RecoveryRound> {
  const rawStreams = [await newStream('bench-recover-raw'), await newStream('bench-recover-raw')];
  const [rawCold, rawWarm] = await measure<RawTimes[]>('raw', rawStreams);
  const outboxes: string[] = [];
  let fillMs = 0;
  for (let i = 0; i < 2; i++) {
    const stream = await newStream('bench-recover');
    const store = join(await newDir('bench-recover-'), 'store');
    fillMs += (await fillOutbox(stream, store)).fillMs;
    outboxes.push(stream, store);
  }
  // The main thread's profile, and tsx's loader thread's beside it.
  const prof =
    CPU_PROF === undefined ? [] : ['--cpu-prof', `--cpu-prof-dir=${join(CPU_PROF, `round-${round}`)}`];
  const [cold, warm] = await measure<RecoverTimes[]>('recover', outboxes, prof);
  for (const r of [cold!, warm!]) {
    if (r.resent !== COUNT || r.confirmed !== COUNT) {
      throw new Error(`open() re-sent ${r.resent} and confirmed ${r.confirmed}, not ${COUNT}`);
    }
  }
  await checkRecoveredStream(outboxes[0]!);
  await checkRecoveredStream(outboxes[2]!);
  return {
    fillMs: fillMs / 2,
    raw: { cold: rawCold!, warm: rawWarm! },
    recover: { cold: cold!, warm: warm! },
  };
}

interface ConsumerFill {
  readonly publishMs: number;
  /** The verifying consumer's first pass: every message a new scope (one LevelDB read each). */
  readonly consumeMs: number;
}

/** A stream of one message from each of SCOPES producers, consumed once into `store`. */
async function fillConsumerStore(stream: string, store: string): Promise<ConsumerFill> {
  const t0 = performance.now();
  const client = await connectClient();
  try {
    // No publisherRef: one raw publisher writes every producer's stamps (the broker does not dedup).
    const publisher = await client.declarePublisher({ stream });
    const all = allConfirmed(publisher, SCOPES);
    const body = Buffer.alloc(SIZE, 0x61);
    for (let i = 0; i < SCOPES; i++) {
      await publisher.send(body, { applicationProperties: identityHeaders(`bench-scope-${i}`, 1n) });
    }
    await publisher.flush();
    await withTimeout(all, 120_000, "the confirms of the scopes' messages");
    await client.deletePublisher(publisher.extendedId);
  } finally {
    await client.close();
  }
  const t1 = performance.now();
  const consumer = await StreamVerifyingConsumer.open({
    connection: CONNECTION,
    stream,
    consumerName: CONSUMER,
    store,
    handler: () => undefined,
  });
  try {
    await withTimeout(consumer.waitForOffset(BigInt(SCOPES - 1)), 300_000, "consuming the scopes' stream");
    if (consumer.stats.new !== SCOPES)
      throw new Error(`the consumer applied ${consumer.stats.new}, not ${SCOPES}`);
  } finally {
    await consumer.close();
  }
  const t2 = performance.now();
  const opened = await DedupStore.open(store);
  try {
    const { scopes, consumers } = await inspectStore(opened);
    if (scopes.length !== SCOPES || consumers[0]?.committedOffset !== BigInt(SCOPES - 1)) {
      throw new Error(`the consumer store holds ${scopes.length} scopes, not ${SCOPES}`);
    }
  } finally {
    await opened.close();
  }
  return { publishMs: t1 - t0, consumeMs: t2 - t1 };
}

// ---------------------------------------------------------------------------------------------

const mb = (bytes: number): string => `${(bytes / 1_048_576).toFixed(1)} MB`;
const ms = (x: number): string => `${x.toFixed(0)} ms`;
const memoryText = (m: MemoryReading): string =>
  `RSS ${mb(m.rss)}, heap ${mb(m.heapUsed)}, arrayBuffers ${mb(m.arrayBuffers)}`;

// Interrupted (Ctrl-C, a timeout's SIGTERM): the streams and folders made so far go too.
for (const signal of ['SIGINT', 'SIGTERM'] as const) {
  process.once(signal, () => {
    interrupted.abort();
    filling?.kill('SIGKILL');
    void cleanUp().finally(() => process.exit(130));
  });
}

try {
  // a. Recovery, interleaved with the raw client.
  const rounds: RecoveryRound[] = [];
  for (let round = 0; round < ROUNDS; round++) rounds.push(await recoveryRound(round));
  const figures = (kind: 'cold' | 'warm') => {
    const ratios = rounds.map((r) => r.recover[kind].recoverMs / r.raw[kind].totalMs);
    const of = (pick: (r: RecoveryRound) => number): number => Math.round(median(rounds.map(pick)));
    return {
      ratio: Number(median(ratios).toFixed(3)),
      ratioToRawPublishOnly: Number(
        median(rounds.map((r) => r.recover[kind].recoverMs / r.raw[kind].publishMs)).toFixed(3),
      ),
      recoverMs: of((r) => r.recover[kind].recoverMs),
      openMs: of((r) => r.recover[kind].openMs),
      rawMs: of((r) => r.raw[kind].totalMs),
      rawPublishMs: of((r) => r.raw[kind].publishMs),
      perRound: rounds.map((r) => ({
        recoverMs: Math.round(r.recover[kind].recoverMs),
        openMs: Math.round(r.recover[kind].openMs),
        rawMs: Math.round(r.raw[kind].totalMs),
        rawPublishMs: Math.round(r.raw[kind].publishMs),
        ratio: Number((r.recover[kind].recoverMs / r.raw[kind].totalMs).toFixed(3)),
      })),
    };
  };
  const cold = figures('cold');
  const warm = figures('warm');

  // b. Consumer open with SCOPES scopes.
  const consumerStream = await newStream('bench-recover-scopes');
  const consumerStore = join(await newDir('bench-recover-consumer-'), 'store');
  const consumerFill = await fillConsumerStore(consumerStream, consumerStore);
  const opens: number[] = [];
  const scanOpens: number[] = [];
  for (let round = 0; round < ROUNDS; round++) {
    for (const [ttl, into] of [
      [0, opens],
      [SCAN_TTL_MS, scanOpens],
    ] as const) {
      const { openMs } = await measure<{ openMs: number }>('consumer-open', [
        consumerStream,
        consumerStore,
        String(ttl),
      ]);
      into.push(openMs);
    }
  }

  // c. Memory, each in a process with --expose-gc.
  const memoryStream = await newStream('bench-recover-memory');
  const publisher = await measure<PublisherMemory>(
    'publisher-memory',
    [memoryStream, await newDir('bench-recover-memory-')],
    ['--expose-gc'],
  );
  const consumers: ConsumerMemory[] = [];
  for (const n of MEMORY_SCOPES) {
    consumers.push(
      await measure<ConsumerMemory>(
        'consumer-memory',
        [String(n), await newDir('bench-recover-memory-')],
        ['--expose-gc'],
      ),
    );
  }

  // The table.
  const verdict = (ratio: number): string => `${ratio.toFixed(2)} ${ratio <= TARGET ? '≤' : '>'} ${TARGET}`;
  const rows: Array<[string, string]> = [];
  for (const [kind, f] of [
    ['new process', cold],
    ['warm process', warm],
  ] as const) {
    rows.push(
      [`${kind}: raw client, ${COUNT} × ${SIZE} B, connect → all confirmed`, ms(f.rawMs)],
      ['  of which first send → all confirmed', ms(f.rawPublishMs)],
      [`${kind}: recovery, open() → ${COUNT} re-sent and confirmed`, ms(f.recoverMs)],
      ['  of which open() alone', ms(f.openMs)],
      [
        `${kind}: recovery / raw (target ≤ ${TARGET})`,
        `${verdict(f.ratio)}  [${f.perRound.map((r) => r.ratio.toFixed(2)).join(', ')}]`,
      ],
      ['  recovery / raw first send → confirmed', f.ratioToRawPublishOnly.toFixed(2)],
    );
  }
  rows.push(
    [`consumer open(), ${SCOPES} scopes in store`, `${ms(median(opens))}  [${opens.map(ms).join(', ')}]`],
    [
      `consumer open(), ${SCOPES} scopes, scopeTtlMs set (scan)`,
      `${ms(median(scanOpens))}  [${scanOpens.map(ms).join(', ')}]`,
    ],
    [
      `  (filling it: verifying consumer, ${SCOPES} new producers)`,
      `${ms(consumerFill.consumeMs)} (${Math.round(SCOPES / (consumerFill.consumeMs / 1000))} msg/s)`,
    ],
    [
      `publisher at maxInFlight ${publisher.maxInFlight}, steady state (max)`,
      memoryText(publisher.steadyMax),
    ],
    [`  live after GC, ${publisher.inFlightAtGc} in flight`, memoryText(publisher.liveAtLimit)],
    ['  live per in-flight message', `${publisher.bytesPerInFlightMessage} B`],
  );
  for (const c of consumers) {
    rows.push(
      [`verifying consumer, ${c.scopes} scopes (window ${c.window}), after GC`, memoryText(c.withScopes)],
      [
        '  bytes per scope (heap + arrayBuffers; heap alone)',
        `${c.bytesPerScope} B; ${c.heapBytesPerScope} B`,
      ],
      [
        `  after TTL eviction of ${c.evicted} scopes`,
        `${memoryText(c.afterEviction)}; ${c.bytesPerScopeAfterEviction} B/scope left`,
      ],
    );
  }
  const width = Math.max(...rows.map(([name]) => name.length));
  for (const [name, value] of rows) console.log(`${name.padEnd(width)}  ${value}`);
  console.log(
    JSON.stringify({
      bench: 'recover',
      messages: COUNT,
      bytes: SIZE,
      rounds: ROUNDS,
      recovery: { target: TARGET, cold, warm, fillMs: rounds.map((r) => Math.round(r.fillMs)) },
      consumerOpen: {
        scopes: SCOPES,
        openMs: Math.round(median(opens)),
        openWithTtlScanMs: Math.round(median(scanOpens)),
        perRound: { openMs: opens.map(Math.round), openWithTtlScanMs: scanOpens.map(Math.round) },
        fillConsumeMs: Math.round(consumerFill.consumeMs),
      },
      memory: { publisher, consumers },
    }),
  );
} catch (err) {
  // Interrupted: the signal's handler cleans up and exits; the aborted measurement says nothing new.
  if (!interrupted.signal.aborted) throw err;
} finally {
  await cleanUp();
}
