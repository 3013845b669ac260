import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { DedupError } from '../src/errors.js';
import { checkHistory, formatReport } from '../src/history/checker.js';
import { DedupPublisherCore } from '../src/publisher/core.js';
import type { Durability } from '../src/publisher/types.js';
import { DedupStore } from '../src/store/store.js';
import type { PolicySpec } from '../src/verifier/index.js';
import { memoryDisk } from '../test/support/memory-store.js';
import {
  ConsumerHarness,
  consumerPolicy,
  consumerStep,
  runStep,
  streamEntries,
  type ConsumerStep,
} from './support/consumer.js';
import { ProcessDisk } from './support/disk.js';
import { SimNetwork } from './support/network.js';
import { ProducerHarness, type ProducerSpec } from './support/producer.js';
import { assertProperty, checkWithin } from './support/runs.js';
import { settle } from './support/turns.js';

// A model-based test of the publisher (fc.commands + fc.asyncModelRun). The world: the model broker
// of DESIGN §3 behind a fault-injecting network (support/network.ts: frames delayed until delivered,
// lost or left to land late after a cut, duplicated; confirms reordered, duplicated, lost), and up
// to three crashable producer processes over memory-level disks that outlive them
// (support/producer.ts, support/disk.ts). After every run everything drains and the invariants of
// DESIGN §7 are checked with src/history/checker.ts, then each stream is read by a crashing
// verifying consumer (support/consumer.ts).
//
// The seed is set globally by property-tests/setup.ts. To replay a shrunk run, pass the printed
// seed, path and replayPath: FC_SEED=… FC_PATH=… FC_REPLAY_PATH=… npx vitest run --project property
// property-tests/publisher-model.test.ts -t 'model -'

/**
 * close() once resolved with sends that never settled (found by the race 'confirm vs close(): every
 * send has settled…' in races.test.ts, fixed since). false: the model fails on any such send. Set it
 * to true only while debugging such a fault, to count them and let the model look further.
 */
const TOLERATE_CLOSE_HANG = false;

/** Producers a run may use: two names on one stream, and the first name again on another stream. */
const LAYOUT = [
  { stream: 'orders', producerName: 'a' },
  { stream: 'orders', producerName: 'b' },
  { stream: 'audit', producerName: 'a' },
] as const;

interface WorldConfig {
  readonly producers: number;
  readonly durability: Durability;
  readonly idMode: 'auto' | 'explicit';
  readonly maxBatch: number;
  readonly maxInFlight: number;
  readonly closeTimeoutMs: number;
}

/** Everything the model sees of the world: what makes a command applicable. */
interface Model {
  brokerUp: boolean;
  zombies: number;
  producers: Array<{ running: boolean; connected: boolean; held: boolean; closing: boolean }>;
}

class World {
  readonly network = new SimNetwork();
  readonly producers: ProducerHarness[];

  constructor(readonly config: WorldConfig) {
    this.producers = LAYOUT.slice(0, config.producers).map(
      (p) =>
        new ProducerHarness(this.network, {
          ...p,
          durability: config.durability,
          idMode: config.idMode,
          maxBatch: config.maxBatch,
          maxInFlight: config.maxInFlight,
          closeTimeoutMs: config.closeTimeoutMs,
        } satisfies ProducerSpec),
    );
  }

  producer(p: number): ProducerHarness {
    return this.producers[p % this.producers.length]!;
  }

  settle(): Promise<void> {
    return settle(() => this.network.activity + this.producers.reduce((n, p) => n + p.progress(), 0));
  }

  observe(m: Model): void {
    m.brokerUp = this.network.brokerUp;
    m.zombies = this.network.zombies.length;
    m.producers = this.producers.map((p) => ({
      running: p.isRunning,
      connected: p.isConnected,
      held: p.life?.disk.isHolding ?? false,
      closing: p.life?.closing ?? false,
    }));
  }
}

/** A command: a precondition on the model, an action on the world, then the world settles. */
class Step implements fc.AsyncCommand<Model, World> {
  constructor(
    readonly label: string,
    readonly can: (m: Readonly<Model>) => boolean,
    readonly act: (w: World) => unknown,
  ) {}

  check(m: Readonly<Model>): boolean {
    return this.can(m);
  }

  async run(m: Model, w: World): Promise<void> {
    await this.act(w);
    await w.settle();
    w.observe(m);
  }

  toString(): string {
    return this.label;
  }
}

const at = (m: Readonly<Model>, p: number) => m.producers[p % m.producers.length]!;
const producer = fc.nat({ max: 2 });

/** Every command with its weight (how often it is generated relative to the others). */
const weighted: Array<[number, fc.Arbitrary<Step>]> = [
  [
    5,
    fc.tuple(producer, fc.integer({ min: 1, max: 6 }), fc.integer({ min: 1, max: 3 })).map(
      ([p, n, gap]) =>
        new Step(
          `send(p${p}, ${n}, gap ${gap})`,
          (m) => at(m, p).running,
          (w) => w.producer(p).send(n, gap),
        ),
    ),
  ],
  [
    5,
    fc.tuple(producer, fc.integer({ min: 1, max: 6 })).map(
      ([p, n]) =>
        new Step(
          `deliver(p${p}, ${n})`,
          (m) => at(m, p).connected,
          (w) => w.producer(p).life?.transport.connection?.deliver(n),
        ),
    ),
  ],
  [
    4,
    fc.tuple(producer, fc.nat(), fc.integer({ min: 1, max: 3 })).map(
      ([p, i, n]) =>
        new Step(
          `confirm(p${p}, #${i}, ${n})`,
          (m) => at(m, p).connected,
          (w) => w.producer(p).life?.transport.connection?.confirm(i, n),
        ),
    ),
  ],
  [
    2,
    fc.tuple(producer, fc.boolean()).map(
      ([p, reverse]) =>
        new Step(
          `confirmAll(p${p}${reverse ? ', reversed' : ''})`,
          (m) => at(m, p).connected,
          (w) => w.producer(p).life?.transport.connection?.confirmAll(reverse),
        ),
    ),
  ],
  [
    1,
    producer.map(
      (p) =>
        new Step(
          `duplicateMessage(p${p})`,
          (m) => at(m, p).connected,
          (w) => w.producer(p).life?.transport.connection?.duplicateLast(),
        ),
    ),
  ],
  [
    1,
    fc.tuple(producer, fc.nat()).map(
      ([p, i]) =>
        new Step(
          `duplicateConfirm(p${p}, #${i})`,
          (m) => at(m, p).connected,
          (w) => w.producer(p).life?.transport.connection?.duplicateConfirm(i),
        ),
    ),
  ],
  [
    2,
    fc.tuple(producer, fc.boolean()).map(
      ([p, zombie]) =>
        new Step(
          `cut(p${p}${zombie ? ', frames linger' : ''})`,
          (m) => at(m, p).connected,
          (w) => w.producer(p).life?.transport.cut(zombie),
        ),
    ),
  ],
  [
    3,
    producer.map(
      (p) =>
        new Step(
          `reconnect(p${p})`,
          // A closing core with a held disk may neither reconnect nor finish closing yet.
          (m) =>
            m.brokerUp && at(m, p).running && !at(m, p).connected && !(at(m, p).closing && at(m, p).held),
          (w) => w.producer(p).reconnect(),
        ),
    ),
  ],
  [
    1,
    fc.tuple(producer, fc.boolean(), fc.nat({ max: 2 })).map(
      ([p, zombie, applyHeld]) =>
        new Step(
          `crash(p${p}${zombie ? ', frames linger' : ''}, ${applyHeld} held commits reach the disk)`,
          (m) => at(m, p).running,
          (w) => w.producer(p).crash(zombie, applyHeld),
        ),
    ),
  ],
  [
    3,
    producer.map(
      (p) =>
        new Step(
          `restart(p${p})`,
          (m) => !at(m, p).running,
          (w) => w.producer(p).start(),
        ),
    ),
  ],
  [
    1,
    producer.map(
      (p) =>
        new Step(
          `close(p${p})`,
          (m) => at(m, p).running && !at(m, p).closing,
          (w) => w.producer(p).beginClose(),
        ),
    ),
  ],
  [
    1,
    producer.map(
      (p) =>
        new Step(
          `holdDisk(p${p})`,
          (m) => at(m, p).running && !at(m, p).held,
          (w) => w.producer(p).life?.disk.hold(),
        ),
    ),
  ],
  [
    2,
    fc.tuple(producer, fc.integer({ min: 1, max: 2 })).map(
      ([p, n]) =>
        new Step(
          `releaseDisk(p${p}, ${n})`,
          (m) => at(m, p).held,
          (w) => w.producer(p).life?.disk.release(n),
        ),
    ),
  ],
  [
    1,
    fc.constant(
      new Step(
        'brokerRestart',
        (m) => m.brokerUp,
        (w) => w.network.stopBroker(),
      ),
    ),
  ],
  [
    2,
    fc.constant(
      new Step(
        'brokerUp',
        (m) => !m.brokerUp,
        (w) => w.network.startBroker(),
      ),
    ),
  ],
  [
    2,
    fc.tuple(fc.nat(), fc.integer({ min: 1, max: 4 })).map(
      ([i, n]) =>
        new Step(
          `lateFrames(#${i}, ${n})`,
          (m) => m.zombies > 0 && m.brokerUp,
          (w) => w.network.deliverZombie(i, n),
        ),
    ),
  ],
];
const commands = weighted.flatMap(([w, arb]) => Array.from({ length: w }, () => arb));

/**
 * Brings every producer back and lets everything drain: late frames of cut connections land first
 * (the adversarial order), held commits reach the disk, closing producers finish closing and are
 * started again, until every producer runs, connected, with nothing in flight; then all close.
 */
async function drain(w: World): Promise<void> {
  w.network.startBroker();
  while (w.network.zombies.length > 0) w.network.deliverZombie(0);
  for (const p of w.producers) await p.life?.disk.release();
  await w.settle();
  for (let round = 0; ; round++) {
    for (const p of w.producers) {
      if (!p.isRunning) {
        const err = await p.start();
        if (err !== undefined) throw err;
      } else if (!p.isConnected) {
        await p.reconnect();
      }
    }
    await w.settle();
    let moved = 0;
    for (const p of w.producers) {
      const c = p.life?.transport.connection;
      if (c !== undefined) moved += c.deliver() + c.confirmAll();
    }
    await w.settle();
    const idle = w.producers.every(
      (p) => p.life !== undefined && !p.life.closing && p.life.core.inFlight === 0,
    );
    if (moved === 0 && idle) break;
    if (round > 200) throw new Error('the producers did not drain');
  }
  for (const p of w.producers) {
    const unsettled = p.life?.unsettled ?? 0;
    if (unsettled > 0) throw new Error(`${p.spec.producerName}: ${unsettled} sends never settled`);
    await p.close();
  }
}

/** The invariants of DESIGN §7 for the producer side, per stream, with the history checker. */
async function checkProducers(w: World): Promise<void> {
  for (const p of w.producers) {
    const problems = p.problems();
    if (problems.length > 0)
      throw new Error(`${p.spec.stream}/${p.spec.producerName}: ${problems.join('\n')}`);
  }
  for (const stream of new Set(w.producers.map((p) => p.spec.stream))) {
    const mine = w.producers.filter((p) => p.spec.stream === stream);
    const stored = w.network.broker.messages(stream);
    const report = checkHistory({
      attempted: mine.flatMap((p) => [...p.attempted]),
      acknowledged: mine.flatMap((p) => [...p.acknowledged.keys(), ...p.mustBePresent]),
      observed: stored.map((m) => ({
        label: m.body,
        producerName: m.producerName,
        publishingId: m.publishingId,
      })),
    });
    if (!report.ok) throw new Error(`stream ${stream}: ${formatReport(report)}`);
    // A resolved send told the application an ID: the stream holds the message under that ID.
    const idOf = new Map(stored.map((m) => [m.body, m.publishingId]));
    for (const p of mine) {
      for (const [label, id] of p.acknowledged) {
        if (idOf.get(label) !== id)
          throw new Error(`${label} resolved as ${id}, stored as ${idOf.get(label)}`);
      }
    }
  }
  // After a full drain and close the outbox is empty: nothing would be re-sent by the next open().
  for (const p of w.producers) {
    const store = await DedupStore.wrap(new ProcessDisk(p.disk));
    const state = store.claimProducer(p.spec.stream, p.spec.producerName);
    const { segments } = await state.load();
    state.release();
    if (segments.length > 0) {
      throw new Error(`${p.spec.producerName}: ${segments.length} outbox segments left after a full drain`);
    }
  }
}

/** DESIGN §7 for the consumer side: each stream read by a crashing verifying consumer. */
async function checkConsumers(w: World, policy: ConsumerPlan): Promise<void> {
  for (const stream of new Set(w.producers.map((p) => p.spec.stream))) {
    const h = new ConsumerHarness(streamEntries(w.network.broker.messages(stream)), {
      policy: policy.policy,
      commit: policy.commit,
      commitEvery: policy.commitEvery,
    });
    await h.start();
    for (const step of policy.steps) await runStep(h, step);
    const report = h.check(await h.finish());
    if (!report.ok) throw new Error(`consumer of ${stream}: ${formatReport(report)}`);
  }
}

interface ConsumerPlan {
  readonly policy: PolicySpec;
  readonly commit: 'message' | 'batch';
  readonly commitEvery: number;
  readonly steps: readonly ConsumerStep[];
}

const worldConfig: fc.Arbitrary<WorldConfig> = fc.record({
  producers: fc.integer({ min: 1, max: 3 }),
  durability: fc.constantFrom<Durability>('outbox', 'reserve'),
  idMode: fc.constantFrom<'auto' | 'explicit'>('auto', 'explicit'),
  maxBatch: fc.oneof(fc.integer({ min: 1, max: 4 }), fc.constant(2_000)),
  maxInFlight: fc.oneof(fc.integer({ min: 1, max: 6 }), fc.constant(10_000)),
  // 0: close() rejects what is unconfirmed at once; 60 s: it waits for the confirms (no timer fires).
  closeTimeoutMs: fc.constantFrom(0, 60_000),
});

const consumerPlan: fc.Arbitrary<ConsumerPlan> = fc.record({
  policy: consumerPolicy,
  commit: fc.constantFrom<'message' | 'batch'>('message', 'batch'),
  commitEvery: fc.integer({ min: 1, max: 5 }),
  steps: fc.array(consumerStep, { maxLength: 12 }),
});

describe('publisher model (DESIGN §3 broker, §7 invariants)', () => {
  const totals = { runs: 0, attempted: 0, acknowledged: 0, lives: 0, hungByClose: 0 };

  it('model - every resolved send is in the stream exactly once, in ID order, and takes effect once at a crashing verifying consumer, under crashes, restarts, broker restarts, cuts, loss, duplication, delay and confirm reordering', async () => {
    const details = await checkWithin(
      'publisher model',
      fc.asyncProperty(
        worldConfig,
        fc.commands(commands, { maxCommands: 200, size: 'max', replayPath: process.env.FC_REPLAY_PATH }),
        consumerPlan,
        async (config, cmds, plan) => {
          const world = new World(config);
          for (const p of world.producers) {
            const err = await p.start();
            if (err !== undefined) throw err;
          }
          const model: Model = { brokerUp: true, zombies: 0, producers: [] };
          world.observe(model);
          await fc.asyncModelRun(() => ({ model, real: world }), cmds);
          await drain(world);
          await checkProducers(world);
          await checkConsumers(world, plan);
          totals.runs++;
          for (const p of world.producers) {
            totals.attempted += p.attempted.size;
            totals.acknowledged += p.acknowledged.size;
            totals.lives += p.lives;
            for (const life of p.history) {
              if (life.unsettledAtClose > 0 && !TOLERATE_CLOSE_HANG) {
                throw new Error(
                  `${p.spec.producerName}: close() resolved with ${life.unsettledAtClose} sends unsettled`,
                );
              }
              totals.hungByClose += Math.max(0, life.unsettledAtClose);
            }
          }
        },
      ),
      { timeLimitMs: 25_000 },
    );
    expect(details.failed).toBe(false);
    const per = (n: number) => (n / Math.max(1, totals.runs)).toFixed(1);
    console.log(
      `[publisher model] per run: ${per(totals.attempted)} sends, ${per(totals.acknowledged)} resolved, ` +
        `${per(totals.lives)} process lives; ${totals.hungByClose} sends left unsettled by a close() in all`,
    );
  });

  it('publisher - explicit ids in reserve durability: after a restart the next id from the source is accepted (DESIGN §4.4: refuse only ids not above the last accepted one)', async () => {
    // The application numbers messages from its source (idMode 'explicit'), every send confirmed,
    // then closes gracefully and reopens: its next source id is above everything it ever sent.
    await assertProperty(
      'explicit ids in reserve durability',
      fc.asyncProperty(
        fc.integer({ min: 1, max: 20 }),
        fc.integer({ min: 1, max: 3 }),
        fc.integer({ min: 1, max: 50 }),
        async (sent, gap, reserveBlock) => {
          const network = new SimNetwork();
          const disk = memoryDisk();
          const open = async () => {
            const transport = network.transport('orders', 'src');
            transport.connectPolicy = 'immediate';
            const core = await DedupPublisherCore.open(transport, {
              producerName: 'src',
              store: await DedupStore.wrap(new ProcessDisk(disk)),
              durability: 'reserve',
              idMode: 'explicit',
              reserveBlock,
            });
            return { transport, core };
          };
          let source = 0n;
          const first = await open();
          for (let i = 0; i < sent; i++) {
            source += BigInt(gap);
            const sending = first.core.send(Buffer.from(`m${source}`), { publishingId: source });
            await settle(() => network.activity);
            first.transport.connection!.deliver();
            first.transport.connection!.confirmAll();
            await sending;
          }
          await first.core.close();
          const second = await open();
          source += BigInt(gap);
          const next = second.core.send(Buffer.from(`m${source}`), { publishingId: source });
          next.catch(() => undefined);
          await settle(() => network.activity);
          second.transport.connection?.deliver();
          second.transport.connection?.confirmAll();
          const outcome = await next.then(
            (r) => `published ${r.publishingId}`,
            (err: unknown) => (err instanceof DedupError ? `${err.code}: ${err.message}` : String(err)),
          );
          await second.core.close();
          if (outcome !== `published ${source}`) throw new Error(`next source id ${source}: ${outcome}`);
        },
      ),
      { numRuns: 200 },
    );
  });
});
