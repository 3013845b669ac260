/**
 * The memory measurements of bench:recover, each run by bench/recover.ts in a child process of its
 * own started with --expose-gc, so that one measurement's garbage and loaded code do not count in
 * another's and a forced GC leaves only what is live.
 *
 * - publisherMemory: a StreamDedupPublisher (outbox, the default maxInFlight 5 000) kept at the
 *   limit (every send awaits the oldest confirm once 5 000 are outstanding), RSS and heap sampled
 *   in steady state, and the live heap after a forced GC while 5 000 are still in flight.
 * - consumerMemory: a verifying consumer holding N scopes (window 1024): the consumer core over a
 *   real LevelDB store, fed N messages from N producers (no broker: the scopes, their trackers and
 *   the commits are the core's; a stream consumer adds only its connection). Live heap after a
 *   forced GC before and after, and again after TTL eviction forgot them all. The store is new, so
 *   the core's read of each new scope's state (one LevelDB get per scope, about 65 µs on this
 *   machine: 1 000 000 of them would take minutes) is answered "absent" without asking LevelDB;
 *   every commit is written to LevelDB as usual. bench/recover.ts times the real reads apart.
 *
 * V8 keeps a typed array's bytes outside its heap once they exceed 64 bytes (a window tracker's
 * 1024-bit ring and a message body are such): `heapUsed` misses them, `arrayBuffers` has them. The
 * per-scope and per-message figures count both.
 */
import { join } from 'node:path';
import { Level } from 'level';
import { VerifyingConsumerCore } from '../src/consumer/core.js';
import { identityHeaders } from '../src/identity/headers.js';
import { SCOPE_STATE_KEYS } from '../src/store/consumer-keys.js';
import { DedupStore, type KeyValueDb } from '../src/store/store.js';
import { StreamDedupPublisher } from '../src/stream.js';
import { CONNECTION } from './common.js';

/** One reading of process.memoryUsage(), in bytes. */
export interface MemoryReading {
  readonly rss: number;
  readonly heapUsed: number;
  readonly external: number;
  readonly arrayBuffers: number;
}

function reading(): MemoryReading {
  const { rss, heapUsed, external, arrayBuffers } = process.memoryUsage();
  return { rss, heapUsed, external, arrayBuffers };
}

/** Runs V8's full GC (the process was started with --expose-gc) twice: weak references need two. */
function collect(): void {
  const gc = (globalThis as { gc?: () => void }).gc;
  if (gc === undefined) throw new Error('run with node --expose-gc');
  gc();
  gc();
}

/** Live bytes: the JS heap plus the typed arrays' bytes outside it. */
const live = (m: MemoryReading): number => m.heapUsed + m.arrayBuffers;

export interface PublisherMemory {
  readonly maxInFlight: number;
  /** After open(), before the first send, after a forced GC. */
  readonly baseline: MemoryReading;
  /** Sampled every 100 ms over the steady state (after the warm-up), no forced GC: the largest. */
  readonly steadyMax: MemoryReading;
  /** The same samples' mean. */
  readonly steadyMean: MemoryReading;
  /** After a forced GC with `inFlightAtGc` messages outstanding. */
  readonly liveAtLimit: MemoryReading;
  readonly inFlightAtGc: number;
  /** (live at the limit − live at baseline) / messages in flight. */
  readonly bytesPerInFlightMessage: number;
  /** Messages confirmed per second over the whole run. */
  readonly msgsPerSec: number;
  readonly seconds: number;
}

/**
 * Sends `size`-byte messages (a new Buffer each, as an application's would be) for `seconds`,
 * never more than maxInFlight (5 000, the default) outstanding.
 */
export async function publisherMemory(
  stream: string,
  dir: string,
  size: number,
  seconds: number,
  warmupSeconds: number,
): Promise<PublisherMemory> {
  const maxInFlight = 5_000;
  const pub = await StreamDedupPublisher.open({
    connection: CONNECTION,
    stream,
    producerName: 'bench-memory-publisher',
    store: join(dir, 'publisher'),
    durability: 'outbox',
    maxInFlight,
  });
  collect();
  const baseline = reading();
  const samples: MemoryReading[] = [];
  const t0 = performance.now();
  const sampler = setInterval(() => {
    if (performance.now() - t0 >= warmupSeconds * 1000) samples.push(reading());
  }, 100);
  const ring: Array<Promise<unknown>> = new Array<Promise<unknown>>(maxInFlight);
  const end = t0 + seconds * 1000;
  let sent = 0;
  for (;;) {
    if (sent >= maxInFlight) await ring[sent % maxInFlight];
    ring[sent % maxInFlight] = pub.send(Buffer.alloc(size, 0x61));
    sent++;
    // Stop only at the limit: a confirm frame frees hundreds of slots at once, refilled one by one.
    if (pub.inFlight >= maxInFlight && performance.now() >= end) break;
  }
  clearInterval(sampler);
  const inFlightAtGc = pub.inFlight;
  collect();
  const liveAtLimit = reading();
  await Promise.all(ring);
  const elapsed = (performance.now() - t0) / 1000;
  await pub.close();
  if (samples.length === 0) throw new Error('no memory sample in the steady state');
  const field = (pick: (m: MemoryReading) => number, combine: (xs: number[]) => number): number =>
    combine(samples.map(pick));
  const max = (xs: number[]): number => Math.max(...xs);
  const mean = (xs: number[]): number => Math.round(xs.reduce((a, b) => a + b, 0) / xs.length);
  const summary = (combine: (xs: number[]) => number): MemoryReading => ({
    rss: field((m) => m.rss, combine),
    heapUsed: field((m) => m.heapUsed, combine),
    external: field((m) => m.external, combine),
    arrayBuffers: field((m) => m.arrayBuffers, combine),
  });
  return {
    maxInFlight,
    baseline,
    steadyMax: summary(max),
    steadyMean: summary(mean),
    liveAtLimit,
    inFlightAtGc,
    bytesPerInFlightMessage: Math.round((live(liveAtLimit) - live(baseline)) / inFlightAtGc),
    msgsPerSec: Math.round(sent / elapsed),
    seconds: elapsed,
  };
}

export interface ConsumerMemory {
  readonly scopes: number;
  readonly window: number;
  /** After open and a warm-up of 1 000 messages of one producer (one scope), after a forced GC. */
  readonly baseline: MemoryReading;
  /** With `scopes` more scopes in memory, committed, after a forced GC. */
  readonly withScopes: MemoryReading;
  /** (live with scopes − live at baseline) / scopes; live = heapUsed + arrayBuffers. */
  readonly bytesPerScope: number;
  /** The heap part alone: (heapUsed with scopes − heapUsed at baseline) / scopes. */
  readonly heapBytesPerScope: number;
  /** After TTL eviction forgot every scope (store and memory), after a forced GC. */
  readonly afterEviction: MemoryReading;
  readonly evicted: number;
  /** (live after eviction − live at baseline) / scopes: what eviction leaves behind per scope. */
  readonly bytesPerScopeAfterEviction: number;
  /** Messages per second while the scopes were created (reads answered from memory, commits to LevelDB). */
  readonly fillPerSec: number;
}

/**
 * A new LevelDB store in `path` whose reads of scope states answer "absent" without asking
 * LevelDB, which is the truth until something is written: the scopes a consumer fills it with are
 * each read once, before their first write, and then kept in memory (no TTL passes meanwhile).
 */
async function freshScopeStore(path: string): Promise<DedupStore> {
  const level = new Level<string, Uint8Array>(path, { keyEncoding: 'utf8', valueEncoding: 'view' });
  await level.open();
  const db = level as unknown as KeyValueDb;
  const scopeTag = SCOPE_STATE_KEYS.gte;
  return DedupStore.wrap({
    get status() {
      return db.status;
    },
    open: () => db.open(),
    close: () => db.close(),
    get: (key) => (key.startsWith(scopeTag) ? Promise.resolve(undefined) : db.get(key)),
    batch: (ops, options) => db.batch(ops, options),
    iterator: (options) => db.iterator(options),
  });
}

/** A verifying consumer core (window 1024) on a new LevelDB store under `dir`, fed `scopes` producers. */
export async function consumerMemory(scopes: number, dir: string): Promise<ConsumerMemory> {
  const window = 1024;
  // A TTL so that evictIdle() can run below; it changes nothing while the scopes are in use.
  const ttlMs = 3_600_000;
  const store = await freshScopeStore(join(dir, 'consumer'));
  const core = await VerifyingConsumerCore.open({
    consumerName: 'bench-memory-consumer',
    store,
    handler: () => undefined,
    policy: { kind: 'window', size: window },
    scopeTtlMs: ttlMs,
  });
  const body = Buffer.alloc(100, 0x61);
  let offset = 0n;
  const feed = async (count: number, identity: (i: number) => Record<string, string>): Promise<void> => {
    for (let i = 0; i < count; i++) {
      const processing = core.process({
        offset: offset++,
        content: body,
        applicationProperties: identity(i),
      });
      if (processing !== undefined) await processing;
    }
    await core.flush();
  };
  await feed(1_000, (i) => identityHeaders('bench-warm-up', BigInt(i + 1)));
  collect();
  const baseline = reading();
  const t0 = performance.now();
  await feed(scopes, (i) => identityHeaders(`bench-producer-${i}`, 1n));
  const fillPerSec = Math.round(scopes / ((performance.now() - t0) / 1000));
  if (core.stats.new !== 1_000 + scopes)
    throw new Error(`expected ${1_000 + scopes} new, got ${core.stats.new}`);
  collect();
  const withScopes = reading();
  // As the hourly eviction would find them once idle past the TTL.
  const evicted = await core.evictIdle(Date.now() + 2 * ttlMs);
  collect();
  const afterEviction = reading();
  await core.close();
  await store.close();
  return {
    scopes,
    window,
    baseline,
    withScopes,
    bytesPerScope: Math.round((live(withScopes) - live(baseline)) / scopes),
    heapBytesPerScope: Math.round((withScopes.heapUsed - baseline.heapUsed) / scopes),
    afterEviction,
    evicted,
    bytesPerScopeAfterEviction: Math.round((live(afterEviction) - live(baseline)) / scopes),
    fillPerSec,
  };
}
