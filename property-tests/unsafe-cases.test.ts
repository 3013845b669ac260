import fc from 'fast-check';
import type { MemoryLevel } from 'memory-level';
import { describe, expect, it } from 'vitest';
import { VerifyingConsumerCore } from '../src/consumer/core.js';
import { DedupError } from '../src/errors.js';
import { identityHeaders } from '../src/identity/headers.js';
import { DedupPublisherCore } from '../src/publisher/core.js';
import { DedupStore } from '../src/store/store.js';
import type { PolicySpec } from '../src/verifier/index.js';
import { memoryDisk } from '../test/support/memory-store.js';
import { ModelBroker } from '../test/support/model-broker.js';
import { ConsumerHarness, streamEntries, type StreamEntry } from './support/consumer.js';
import { ProcessDisk } from './support/disk.js';
import { SimNetwork, type SimTransport } from './support/network.js';
import { ProducerHarness } from './support/producer.js';
import { assertProperty, checkWithin, expectCounterexample } from './support/runs.js';
import {
  checkProducer,
  drainByHand,
  drive,
  expectIncreasingWire,
  scheduledParts,
} from './support/scheduled.js';
import { settle, within } from './support/turns.js';

// docs/design.md §6, one describe per row. Each row first shows that fast-check FINDS and SHRINKS the loss
// (or duplicate) a plain highest-sequence policy causes — the counterexample is printed — and then
// that, in the same scenario, the library is safe or loud: a typed DedupError, a stale/gap/duplicate
// report, or window acceptance. The seed is set globally by property-tests/setup.ts.

const LIBRARY_RUNS = 200;

/** A publisher without the library: every confirm counts as success. Returns the IDs it thinks landed. */
function plainPublish(broker: ModelBroker, producerName: string, arrivals: readonly bigint[]): bigint[] {
  for (const id of arrivals) broker.publish('s', producerName, id, `${producerName}:${id}`);
  return [...arrivals]; // the broker confirms every one of them, stored or dropped
}

function storedIds(broker: ModelBroker, producerName: string): Set<bigint> {
  return new Set(
    broker
      .messages('s')
      .filter((m) => m.producerName === producerName)
      .map((m) => m.publishingId),
  );
}

/** IDs 1..n in the order given by sort keys (a stable sort: all-equal keys keep ID order). */
function order(n: number, keys: readonly number[]): bigint[] {
  return Array.from({ length: n }, (_, i) => ({ id: BigInt(i + 1), key: keys[i] ?? 0 }))
    .sort((a, b) => a.key - b.key)
    .map((x) => x.id);
}

/** Sends one message through a core and lets the model broker store and confirm it. */
async function sendThrough(
  network: SimNetwork,
  transport: SimTransport,
  core: DedupPublisherCore,
  body: string,
  publishingId?: bigint,
): Promise<{ ok: bigint } | { error: DedupError }> {
  const sending = core.send(Buffer.from(body), publishingId === undefined ? {} : { publishingId });
  sending.catch(() => undefined);
  await settle(() => network.activity);
  transport.connection?.deliver();
  transport.connection?.confirmAll();
  return sending.then(
    (r) => ({ ok: r.publishingId }),
    (err: unknown) => {
      if (err instanceof DedupError) return { error: err };
      throw err;
    },
  );
}

/** A store over one process's view of `disk` (a fresh in-memory disk unless given). */
function storeOn(disk = memoryDisk()): Promise<DedupStore> {
  return DedupStore.wrap(new ProcessDisk(disk));
}

async function openCore(
  network: SimNetwork,
  producerName: string,
  store: DedupStore,
  extra: Partial<Parameters<typeof DedupPublisherCore.open>[1]> = {},
): Promise<{ transport: SimTransport; core: DedupPublisherCore }> {
  const transport = network.transport('s', producerName);
  const core = await DedupPublisherCore.open(transport, {
    producerName,
    store,
    reconnect: { initialDelayMs: 1, maxDelayMs: 2 },
    closeTimeoutMs: 0,
    ...extra,
  });
  return { transport, core };
}

describe('§6 in-flight reordering (parallel sends, several connections, retry of one message after later ones)', () => {
  it('§6 in-flight reordering - plain highest: fast-check finds and shrinks the earlier ID dropped after a later one (loss)', async () => {
    const counterexample = await expectCounterexample(
      '§6 in-flight reordering, plain highest',
      fc.property(
        fc.integer({ min: 1, max: 8 }),
        fc.array(fc.nat({ max: 7 }), { maxLength: 8 }),
        fc.option(fc.nat({ max: 7 }), { nil: undefined }),
        (n, keys, retried) => {
          const broker = new ModelBroker();
          // Parallel sends or several connections: frames arrive in any order. A retry: one frame was
          // lost and is sent again after the later ones landed.
          let arrivals = order(n, keys);
          if (retried !== undefined) {
            const r = BigInt((retried % n) + 1);
            arrivals = [...arrivals.filter((id) => id !== r), r];
          }
          plainPublish(broker, 'p', arrivals);
          const landed = storedIds(broker, 'p');
          return arrivals.every((id) => landed.has(id));
        },
      ),
    );
    const [n] = counterexample;
    expect(n).toBeGreaterThanOrEqual(2);
  });

  it('§6 in-flight reordering - library: parallel send() calls over cut connections whose late frames still land are all stored once, in ID order; each wire is in ID order', async () => {
    await checkWithin(
      '§6 in-flight reordering, library',
      fc.asyncProperty(
        fc.scheduler(),
        fc.integer({ min: 1, max: 8 }),
        fc.array(fc.boolean(), { minLength: 1, maxLength: 3 }),
        fc.integer({ min: 1, max: 3 }),
        async (s, sends, cuts, maxBatch) => {
          const network = new SimNetwork();
          const h = new ProducerHarness(
            network,
            { stream: 's', producerName: 'p', durability: 'outbox', idMode: 'auto', maxBatch },
            scheduledParts(s),
          );
          const err = await h.start();
          if (err !== undefined) throw err;
          const transport = h.life!.transport;
          h.send(sends); // all in parallel
          for (const [i, zombie] of cuts.entries()) {
            void s.schedule(Promise.resolve(), `cut #${i}`).then(() => {
              if (transport.connection?.state !== 'live') return;
              transport.cut(zombie);
              void s
                .schedule(transport.connectAttempt(), `network back #${i}`)
                .then(() => transport.acceptConnect());
            });
            void s.schedule(Promise.resolve(), `late frames of older connections land #${i}`).then(() => {
              while (network.zombies.length > 0) network.deliverZombie(0);
            });
          }
          await drive(s, () => network.activity + h.progress());
          await drainByHand(network, h, s);
          checkProducer(network, h);
          expectIncreasingWire(h.history[0]!.transport.connections);
        },
      ),
      { runs: LIBRARY_RUNS, timeLimitMs: 8_000 },
    );
  });

  it('§6 in-flight reordering - library: retrying one message with its ID after later ones landed is refused with DEDUP_ID_REGRESSION before it reaches the broker', async () => {
    await assertProperty(
      '§6 retry after later ones, library',
      fc.asyncProperty(fc.integer({ min: 2, max: 6 }), fc.nat(), async (n, pick) => {
        const network = new SimNetwork();
        const { transport, core } = await openCore(network, 'p', await storeOn(), {
          idMode: 'explicit',
        });
        for (let id = 1n; id <= BigInt(n); id++) {
          const r = await sendThrough(network, transport, core, `m${id}`, id);
          if (!('ok' in r)) throw r.error;
        }
        const retried = BigInt((pick % (n - 1)) + 1);
        const written = transport.connection!.written.length;
        const r = await sendThrough(network, transport, core, `m${retried} again`, retried);
        if (!('error' in r) || r.error.code !== 'DEDUP_ID_REGRESSION') {
          throw new Error(
            `retry of ${retried} after ${n}: ${JSON.stringify(r, (_, v: unknown) => (typeof v === 'bigint' ? String(v) : v))}`,
          );
        }
        expect(transport.connection!.written.length).toBe(written);
        await core.close();
      }),
      { numRuns: LIBRARY_RUNS },
    );
  });
});

describe('§6 two live producers under one name', () => {
  it('§6 two live producers under one name - plain highest: fast-check finds and shrinks the slower writer’s message dropped (loss)', async () => {
    await expectCounterexample(
      '§6 two live producers, plain highest',
      fc.property(fc.array(fc.constantFrom('A', 'B'), { minLength: 1, maxLength: 10 }), (turns) => {
        const broker = new ModelBroker();
        const next = { A: 0n, B: 0n };
        const confirmed: string[] = [];
        for (const who of turns) {
          const id = ++next[who];
          broker.publish('s', 'shared', id, `${who}:${id}`);
          confirmed.push(`${who}:${id}`);
        }
        const bodies = new Set(broker.messages('s').map((m) => m.body));
        return confirmed.every((b) => bodies.has(b));
      }),
    );
  });

  /** Two processes (two stores) open one name at the same broker ID, then take turns sending. */
  async function twoWriters(turns: readonly ('A' | 'B')[], watchIntervalMs: number) {
    const network = new SimNetwork();
    const writers = {
      A: await openCore(network, 'shared', await storeOn(), {
        watchIntervalMs,
      }),
      B: await openCore(network, 'shared', await storeOn(), {
        watchIntervalMs,
      }),
    };
    const acked = new Map<string, 'A' | 'B'>();
    for (const [i, who] of turns.entries()) {
      const w = writers[who];
      if (w.core.isClosed) continue;
      const r = await sendThrough(network, w.transport, w.core, `${who}#${i}`);
      if ('ok' in r) acked.set(`${who}#${i}`, who);
    }
    return { network, writers, acked };
  }

  it('§6 two live producers under one name - library: the same store refuses the second with DEDUP_STORE_LOCKED; a writer opening behind the broker gets DEDUP_SEQUENCE_REGRESSION; a running writer the broker passes stops with DEDUP_NAME_CONFLICT', async () => {
    await assertProperty(
      '§6 two live producers, library',
      fc.asyncProperty(
        fc.array(fc.constantFrom<'A' | 'B'>('A', 'B'), { minLength: 1, maxLength: 8 }),
        async (turns) => {
          // One store, one name: the second claim is refused.
          const store = await storeOn();
          const net0 = new SimNetwork();
          const first = await openCore(net0, 'shared', store);
          const second = await openCore(net0, 'shared', store).catch((e: unknown) => e);
          expect(second).toMatchObject({ code: 'DEDUP_STORE_LOCKED' });
          await first.core.close();

          // Two stores at the same broker ID, taking turns; the watch runs every 2 ms.
          const { network, writers } = await twoWriters(turns, 2);
          const brokerLast = network.broker.lastId('s', 'shared');
          for (const w of Object.values(writers)) {
            if (w.core.lastPublishingId < brokerLast) {
              // Behind the broker: the watch stops it, loudly.
              const closedWith = await within(w.core.closed(), 5_000, 'name-conflict watch');
              expect(closedWith?.code).toBe('DEDUP_NAME_CONFLICT');
            }
          }
          // A third process opening the name with an empty store is refused.
          if (brokerLast > 0n) {
            const late = await openCore(network, 'shared', await storeOn()).catch((e: unknown) => e);
            expect(late).toMatchObject({ code: 'DEDUP_SEQUENCE_REGRESSION' });
          }
          for (const w of Object.values(writers)) await w.core.close();
        },
      ),
      { numRuns: 100 },
    );
  });

  it('§6 two live producers under one name - library limit: fast-check finds the silent loss when both writers stay level with the broker (the name-conflict check only sees a writer that passes ours)', async () => {
    // The same scenario, checked without timers: after the turns every writer reconnects, which
    // compares the broker's last ID with its own exactly as the watch does.
    const counterexample = await expectCounterexample(
      '§6 two live producers, library blind spot',
      fc.asyncProperty(
        fc.array(fc.constantFrom<'A' | 'B'>('A', 'B'), { minLength: 1, maxLength: 8 }),
        async (turns) => {
          const { network, writers, acked } = await twoWriters(turns, 0);
          const reported = new Set<'A' | 'B'>();
          for (const [who, w] of Object.entries(writers) as Array<['A' | 'B', (typeof writers)['A']]>) {
            w.transport.cut(false);
            await within(Promise.race([w.transport.connectAttempt(), w.core.closed()]), 5_000, 'reconnect');
            w.transport.acceptConnect();
            await settle(() => network.activity);
            if (w.core.isClosed && (await w.core.closed())?.code === 'DEDUP_NAME_CONFLICT') reported.add(who);
            await w.core.close();
          }
          const bodies = new Set(network.broker.messages('s').map((m) => m.body));
          const silentlyLost = [...acked].filter(([label, who]) => !bodies.has(label) && !reported.has(who));
          return silentlyLost.length === 0;
        },
      ),
      300,
    );
    expect(counterexample[0].length).toBeGreaterThanOrEqual(2);
  });
});

/** A copy of a memory-level disk: a backup. */
async function backup(disk: MemoryLevel<string, Uint8Array>): Promise<MemoryLevel<string, Uint8Array>> {
  const copy = memoryDisk();
  await copy.open();
  const ops: Array<{ type: 'put'; key: string; value: Uint8Array }> = [];
  if (disk.status === 'open')
    for await (const [key, value] of disk.iterator()) ops.push({ type: 'put', key, value });
  await copy.batch(ops);
  return copy;
}

describe('§6 local store lost or restored from a backup', () => {
  it('§6 store lost or restored - plain highest: fast-check finds and shrinks the new messages at or below the broker’s ID dropped (loss)', async () => {
    await expectCounterexample(
      '§6 store restored, plain highest',
      fc.property(
        fc.integer({ min: 1, max: 6 }),
        fc.nat({ max: 6 }),
        fc.integer({ min: 1, max: 6 }),
        (before, backupAt, after) => {
          const broker = new ModelBroker();
          plainPublish(
            broker,
            'p',
            Array.from({ length: before }, (_, i) => BigInt(i + 1)),
          );
          // The counter is restored from a backup taken after `backupAt` messages (0: store lost).
          const restored = BigInt(Math.min(backupAt, before));
          const ids = Array.from({ length: after }, (_, i) => restored + BigInt(i + 1));
          const bodies = new Set(broker.messages('s').map((m) => m.body));
          plainPublish(broker, 'p', ids);
          const now = broker.messages('s').filter((m) => !bodies.has(m.body));
          return now.length === ids.length; // every confirmed new message was stored
        },
      ),
    );
  });

  it('§6 store lost or restored - library: open() refuses with DEDUP_SEQUENCE_REGRESSION when the broker is ahead, or (onBrokerAhead adopt) continues above it; no resolved send is lost', async () => {
    await assertProperty(
      '§6 store restored, library',
      fc.asyncProperty(
        fc.integer({ min: 1, max: 6 }),
        fc.nat({ max: 6 }),
        fc.nat({ max: 3 }),
        fc.integer({ min: 1, max: 4 }),
        fc.constantFrom<'error' | 'adopt'>('error', 'adopt'),
        async (before, backupAt, unconfirmed, after, onBrokerAhead) => {
          const network = new SimNetwork();
          const disk = memoryDisk();
          const first = await openCore(network, 'p', await storeOn(disk));
          const at = Math.min(backupAt, before);
          let snapshot = await backup(disk); // at 0: as good as a lost store
          for (let i = 1; i <= before; i++) {
            const r = await sendThrough(network, first.transport, first.core, `old${i}`);
            if (!('ok' in r)) throw r.error;
            if (i === at) snapshot = await backup(disk);
          }
          // A few more sends reach the outbox (and the broker) without their confirms.
          for (let i = 1; i <= unconfirmed; i++)
            void first.core.send(Buffer.from(`late${i}`)).catch(() => undefined);
          await settle(() => network.activity);
          first.transport.connection?.deliver();
          first.transport.kill(false); // the machine is lost; the store is restored from the backup
          const brokerLast = network.broker.lastId('s', 'p');
          const opened = await openCore(network, 'p', await storeOn(snapshot), {
            onBrokerAhead,
          }).catch((e: unknown) => e);
          const local = BigInt(at);
          if (brokerLast > local && onBrokerAhead === 'error') {
            expect(opened).toMatchObject({ code: 'DEDUP_SEQUENCE_REGRESSION' });
            return;
          }
          if (opened instanceof Error) throw opened;
          const { transport, core } = opened as Awaited<ReturnType<typeof openCore>>;
          const acked: string[] = [];
          for (let i = 1; i <= after; i++) {
            const r = await sendThrough(network, transport, core, `new${i}`);
            if (!('ok' in r)) throw r.error;
            if (r.ok <= brokerLast)
              throw new Error(`new${i} got id ${r.ok}, not above the broker's ${brokerLast}`);
            acked.push(`new${i}`);
          }
          await core.close();
          const bodies = new Set(network.broker.messages('s').map((m) => m.body));
          for (const label of acked) if (!bodies.has(label)) throw new Error(`${label} resolved but lost`);
        },
      ),
      { numRuns: LIBRARY_RUNS },
    );
  });
});

describe('§6 IDs taken from a non-monotonic source (DB sequences committed out of order, clocks)', () => {
  it('§6 non-monotonic ID source - plain highest: fast-check finds and shrinks the late commit dropped (loss)', async () => {
    await expectCounterexample(
      '§6 non-monotonic source, plain highest',
      fc.property(
        fc.integer({ min: 1, max: 8 }),
        fc.array(fc.nat({ max: 7 }), { maxLength: 8 }),
        (n, keys) => {
          const broker = new ModelBroker();
          const commitOrder = order(n, keys);
          plainPublish(broker, 'p', commitOrder);
          const landed = storedIds(broker, 'p');
          return commitOrder.every((id) => landed.has(id));
        },
      ),
    );
  });

  it('§6 non-monotonic ID source - library (explicit ids): every id below one already accepted is refused with DEDUP_ID_REGRESSION and never reaches the broker; every other one is stored', async () => {
    await assertProperty(
      '§6 non-monotonic source, library',
      fc.asyncProperty(
        fc.integer({ min: 1, max: 8 }),
        fc.array(fc.nat({ max: 7 }), { maxLength: 8 }),
        async (n, keys) => {
          const network = new SimNetwork();
          const { transport, core } = await openCore(network, 'p', await storeOn(), {
            idMode: 'explicit',
          });
          let highest = 0n;
          const accepted: bigint[] = [];
          for (const id of order(n, keys)) {
            const r = await sendThrough(network, transport, core, `row${id}`, id);
            if (id > highest) {
              if (!('ok' in r)) throw r.error;
              accepted.push(id);
              highest = id;
            } else if (!('error' in r) || r.error.code !== 'DEDUP_ID_REGRESSION') {
              throw new Error(`id ${id} after ${highest} was not refused with DEDUP_ID_REGRESSION`);
            }
          }
          await core.close();
          expect(transport.connections.flatMap((c) => c.written.map((m) => m.publishingId))).toEqual(
            accepted,
          );
          expect([...storedIds(network.broker, 'p')]).toEqual(accepted);
        },
      ),
      { numRuns: LIBRARY_RUNS },
    );
  });
});

/** Arrivals at a consumer: IDs 1..n shuffled within `spread`, plus redelivered copies. */
const reorderedArrivals = fc
  .record({
    n: fc.integer({ min: 1, max: 12 }),
    swaps: fc.array(fc.tuple(fc.nat(), fc.integer({ min: 1, max: 6 })), { maxLength: 8 }),
    redelivered: fc.array(fc.tuple(fc.nat(), fc.nat({ max: 8 })), { maxLength: 4 }),
  })
  .map(({ n, swaps, redelivered }) => {
    const ids = Array.from({ length: n }, (_, i) => BigInt(i + 1));
    for (const [at, distance] of swaps) {
      const i = at % n;
      const j = Math.min(n - 1, i + distance);
      [ids[i], ids[j]] = [ids[j]!, ids[i]!];
    }
    for (const [at, later] of redelivered) {
      const i = at % ids.length;
      ids.splice(Math.min(ids.length, i + 1 + later), 0, ids[i]!);
    }
    return ids;
  });

/** How far an ID arrives behind the highest before it. */
function reorderDistance(ids: readonly bigint[]): bigint {
  let max = 0n;
  let distance = 0n;
  const seen = new Set<bigint>();
  for (const id of ids) {
    if (!seen.has(id) && max - id > distance) distance = max - id;
    seen.add(id);
    if (id > max) max = id;
  }
  return distance;
}

describe('§6 AMQP 0-9-1 redelivery/requeue or several consumers feeding one verifier', () => {
  it('§6 redelivery or several consumers - plain highest: fast-check finds and shrinks a reordered arrival below the watermark dropped silently (loss at the consumer)', async () => {
    await expectCounterexample(
      '§6 reordered arrivals, plain highest',
      fc.property(reorderedArrivals, (arrivals) => {
        let highest = 0n;
        const applied = new Set<bigint>();
        for (const id of arrivals) {
          if (id > highest) {
            applied.add(id);
            highest = id;
          } // else: silently dropped as "already seen"
        }
        return new Set(arrivals).size === applied.size;
      }),
    );
  });

  it('§6 redelivery or several consumers - library: a window verifier applies each message exactly once when reordering stays within W, and reports every message it does not apply as stale (highest included)', async () => {
    await assertProperty(
      '§6 reordered arrivals, library',
      fc.asyncProperty(
        reorderedArrivals,
        fc.oneof(
          fc.constant<PolicySpec>({ kind: 'highest' }),
          fc.integer({ min: 1, max: 16 }).map((size): PolicySpec => ({ kind: 'window', size })),
        ),
        async (arrivals, policy) => {
          // Offsets are arrival positions: the verifier, not the offset, must tell repeats apart.
          const entries: StreamEntry[] = arrivals.map((id, i) => ({
            offset: BigInt(i),
            label: `p/${id}`,
            headers: identityHeaders('p', id),
          }));
          const h = new ConsumerHarness(entries, { policy, commit: 'message' });
          const log = await h.finish();
          const applied = new Map<string, number>();
          for (const label of log) applied.set(label, (applied.get(label) ?? 0) + 1);
          const stale = new Set(h.events.flatMap((e) => (e.kind === 'stale' ? [`p/${e.publishingId}`] : [])));
          for (const id of new Set(arrivals)) {
            const label = `p/${id}`;
            const n = applied.get(label) ?? 0;
            if (n > 1) throw new Error(`${label} took effect ${n} times`);
            if (n === 0 && !stale.has(label)) throw new Error(`${label} neither applied nor reported stale`);
          }
          const size = policy.kind === 'window' ? BigInt(policy.size) : 1n;
          if (reorderDistance(arrivals) < size) expect(applied.size).toBe(new Set(arrivals).size);
        },
      ),
      { numRuns: LIBRARY_RUNS },
    );
  });
});

describe('§6 more than 255 producer names on one stream', () => {
  it('§6 more than 255 producer names - plain highest: fast-check finds and shrinks (to exactly 256 names and a segment roll) a retry stored twice after osiris forgot its name (duplicate)', async () => {
    const [others, rolled] = await expectCounterexample(
      '§6 more than 255 names, plain highest',
      fc.property(fc.nat({ max: 400 }), fc.boolean(), (others, roll) => {
        const broker = new ModelBroker({ maxProducerNames: 255 });
        broker.publish('s', 'p', 1n, 'm1'); // stored; its confirm is lost
        for (let i = 0; i < others; i++) broker.publish('s', `other-${i}`, 1n, `other-${i}`);
        if (roll) broker.rollSegment('s');
        broker.publish('s', 'p', 1n, 'm1'); // the retry
        return broker.messages('s').filter((m) => m.body === 'm1').length === 1;
      }),
    );
    expect([others, rolled]).toEqual([255, true]);
  });

  it('§6 more than 255 producer names - library: the publisher’s retry is stored twice, and the verifying consumer applies it once and reports the copy as a duplicate', async () => {
    await assertProperty(
      '§6 more than 255 names, library',
      fc.asyncProperty(
        fc.nat({ max: 300 }),
        fc.boolean(),
        fc.constantFrom<PolicySpec>({ kind: 'highest' }, { kind: 'window', size: 1_024 }),
        async (others, roll, policy) => {
          const network = new SimNetwork(new ModelBroker({ maxProducerNames: 255 }));
          const h = new ProducerHarness(network, {
            stream: 's',
            producerName: 'p',
            durability: 'outbox',
            idMode: 'auto',
          });
          const err = await h.start();
          if (err !== undefined) throw err;
          h.send(1);
          await settle(() => network.activity + h.progress());
          h.life!.transport.connection!.deliver(); // stored…
          h.life!.transport.cut(false); // …but the confirm is lost with the connection
          for (let i = 0; i < others; i++) network.broker.publish('s', `other-${i}`, 1n, `other-${i}`);
          if (roll) network.broker.rollSegment('s');
          await h.reconnect(); // the core re-sends the unconfirmed message with its original ID
          await drainByHand(network, h);
          const copies = network.broker.messages('s').filter((m) => m.body === 's/p/1').length;
          expect(copies).toBe(others >= 255 && roll ? 2 : 1);
          const consumer = new ConsumerHarness(streamEntries(network.broker.messages('s')), {
            policy,
            commit: 'batch',
          });
          const log = await consumer.finish();
          expect(log.filter((l) => l === 's/p/1')).toHaveLength(1);
          const reports = consumer.events.filter(
            (e) =>
              (e.kind === 'duplicate' || e.kind === 'stale') &&
              e.publishingId === 1n &&
              e.scope.endsWith('1:p'),
          );
          expect(reports).toHaveLength(copies - 1);
        },
      ),
      { numRuns: 60 },
    );
  });
});

describe('§6 verifier state evicted (TTL) or reset', () => {
  it('§6 verifier state evicted or reset - plain highest: fast-check finds and shrinks a late repeat processed again after eviction (duplicate)', async () => {
    const [idleMs] = await expectCounterexample(
      '§6 verifier state evicted, plain highest',
      fc.property(fc.nat({ max: 5_000 }), (idleMs) => {
        const ttlMs = 1_000;
        const highest = new Map<string, { id: bigint; lastSeenMs: number }>();
        let applied = 0;
        const deliver = (id: bigint, now: number) => {
          const s = highest.get('p');
          if (s === undefined || id > s.id) {
            applied++;
            highest.set('p', { id, lastSeenMs: now });
          }
        };
        deliver(1n, 0);
        for (const [k, s] of highest) if (idleMs - s.lastSeenMs > ttlMs) highest.delete(k);
        deliver(1n, idleMs); // the late repeat
        return applied === 1;
      }),
    );
    expect(idleMs).toBe(1_001);
  });

  it('§6 verifier state evicted or reset - library (documented, scopeTtlMs): a repeat after its scope was evicted (which evictIdle reports) or its state reset takes effect again; before that it is a duplicate', async () => {
    await assertProperty(
      '§6 verifier state evicted, library',
      fc.asyncProperty(
        fc.oneof(fc.nat({ max: 500 }), fc.integer({ min: 1_500, max: 100_000 })),
        fc.boolean(),
        async (idleMs, reset) => {
          const disk = memoryDisk();
          const ttlMs = 1_000;
          const open = async () => {
            const applied: string[] = [];
            const core = await VerifyingConsumerCore.open({
              consumerName: 'balance-projection',
              store: await storeOn(disk),
              scopeTtlMs: ttlMs,
              commit: 'message',
              handler: (m) => {
                applied.push(m.body.toString());
              },
            });
            return { core, applied };
          };
          const message = (offset: bigint) => ({
            offset,
            content: Buffer.from('credit-17'),
            applicationProperties: identityHeaders('p', 17n),
          });
          const first = await open();
          await first.core.process(message(0n));
          const evicted = await first.core.evictIdle(Date.now() + idleMs);
          await first.core.close();
          if (reset) {
            // The verifier state is lost (a restored or wiped store), the offset survives.
            const keys: string[] = [];
            for await (const key of disk.keys({ gte: 'v:', lt: 'v;' })) keys.push(key);
            await disk.batch(keys.map((key) => ({ type: 'del' as const, key })));
          }
          const second = await open();
          await second.core.process(message(1n)); // the late repeat, at a new offset
          await second.core.close();
          const forgotten = idleMs > ttlMs || reset;
          expect(evicted).toBe(idleMs > ttlMs ? 1 : 0);
          expect([...first.applied, ...second.applied]).toEqual(
            forgotten ? ['credit-17', 'credit-17'] : ['credit-17'],
          );
        },
      ),
      { numRuns: LIBRARY_RUNS },
    );
  });
});
