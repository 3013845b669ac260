import { getEventListeners } from 'node:events';
import fc from 'fast-check';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { auditRecords, type AuditReport } from '../src/cli/audit.js';
import { DedupError } from '../src/errors.js';
import { checkHistory, formatReport } from '../src/history/checker.js';
import { DedupPublisherCore } from '../src/publisher/core.js';
import type { Durability, SendResult } from '../src/publisher/types.js';
import { identityHeaders, SKIP_HEADER } from '../src/identity/headers.js';
import { decodeScopeKey } from '../src/identity/scope-key.js';
import { DedupStore } from '../src/store/store.js';
import type { IdRange, PolicySpec } from '../src/verifier/index.js';
import { memoryDisk } from '../test/support/memory-store.js';
import type { StoredMessage } from '../test/support/model-broker.js';
import {
  ConsumerHarness,
  consumerPolicy,
  consumerStep,
  runStep,
  streamEntries,
  type ConsumerStep,
} from './support/consumer.js';
import { ProcessDisk } from './support/disk.js';
import { SimNetwork, type SimTransport } from './support/network.js';
import { ProducerHarness, type HeadersMode, type ProducerIdMode } from './support/producer.js';
import { assertProperty, checkWithin, IS_REPLAY } from './support/runs.js';
import { settle, turn } from './support/turns.js';

// A model-based test of the publisher (fc.commands + fc.asyncModelRun), one property per ID mode
// (auto, explicit, keyed), and a fourth for keyed IDs with a key retention of 1 to 4 IDs. The world: the model broker of docs/design.md §3 behind a fault-injecting
// network (support/network.ts: frames delayed until delivered, lost or left to land late after a
// cut, duplicated; confirms reordered, duplicated, lost; connects that complete after close()),
// and up to three crashable producer processes over memory-level disks that outlive them
// (support/producer.ts, support/disk.ts), whose stores may be lost or restored from a backup, and
// whose disks may fail one write (full for a moment: the publisher stops, the next life goes on).
// Each run draws the options a user can set: durability (one for every life, or one per life: a
// switch between opens of one store), onBrokerAhead, maxBatch, maxInFlight, closeTimeoutMs, and a
// transport that reports the broker's last ID or not (AMQP 0-9-1), and keyed, `keyRetention.maxKeys`
// (the default, or 1 to 8). The application sends with headers objects it reuses and mutates, with
// abort signals it fires while sends wait for room or later (keyed: repeats of recent keys under
// them too), replays its source (explicit IDs) or re-sends its keys (keyed) after every restart.
// With a key retention, a key may be in the stream as often as its sends published it; each that
// did was past the retention of every earlier copy, counted from the last ID at its call.
// The cores run on fake timers (setTimeout, setInterval, performance): `stall` lets confirms time out.
//
// Checked during the run: the wire (no more than maxInFlight IDs unconfirmed per life; every frame
// carries the caller's headers as they were at its send() call and one identity), connections
// closed after close(), a connection that stopped confirming replaced, unhandled rejections, and
// the harness's expectations of every send and open. After every run everything drains and the
// invariants of docs/design.md §7 are checked with src/history/checker.ts (every acknowledged message or
// key in the stream exactly once, under the ID it resolved with), adopting opens' promises are
// checked, then each stream is read by a crashing verifying consumer (support/consumer.ts).
//
// The seed is set globally by property-tests/setup.ts. To replay a shrunk run, pass the printed
// seed, path and replayPath: FC_SEED=… FC_PATH=… FC_REPLAY_PATH=… npx vitest run --project property
// property-tests/publisher-model.test.ts -t 'model - <mode>'. While debugging: MODEL_BUDGET_MS
// (wall-time budget per property, shrinking included), MODEL_VERBOSE=1 (every run fast-check
// tried), MODEL_TOLERATE (below).

/**
 * close() once resolved with sends that never settled (found by the race 'confirm vs close(): every
 * send has settled…' in races.test.ts, fixed since). false: the model fails on any such send. Set it
 * to true only while debugging such a fault, to count them and let the model look further.
 */
const TOLERATE_CLOSE_HANG = false;

/**
 * Known faults the model may be told to look past (MODEL_TOLERATE=a,b), only while debugging:
 * `outbox-burst`: no longer used — an open re-sends a recovered outbox at once whatever its size,
 * as documented, and the wire check allows it (support/producer.ts);
 * `write-after-close`: a closed core's store calls after close() resolved are not reported;
 * `keyed-late-frames`: keyed + reserve, a key may be in the stream twice when a frame of a life
 * that ended with frames on the way lands after the next open() forgot the key;
 * `keyed-restored-records`: a key whose record came back with a restored store may be answered
 * 'duplicate' without being in the stream.
 */
const TOLERATE = new Set((process.env.MODEL_TOLERATE ?? '').split(',').filter((t) => t !== ''));

/** The cores' confirm timeout (fake time); `stall` advances past it and two timeout checks. */
const CONFIRM_TIMEOUT_MS = 1_000;
const STALL_MS = CONFIRM_TIMEOUT_MS + 2 * Math.max(50, Math.min(1_000, CONFIRM_TIMEOUT_MS / 4)) + 1;

/** Producers a run may use: two names on one stream, and the first name again on another stream. */
const LAYOUT = [
  { stream: 'orders', producerName: 'a' },
  { stream: 'orders', producerName: 'b' },
  { stream: 'audit', producerName: 'a' },
] as const;

interface WorldConfig {
  readonly idMode: ProducerIdMode;
  readonly producers: number;
  /** One durability for every life, or one per life in turn (a switch between opens). */
  readonly durabilities: readonly Durability[];
  readonly onBrokerAhead: 'error' | 'adopt';
  readonly maxBatch: number;
  readonly maxInFlight: number;
  readonly closeTimeoutMs: number;
  /** The transport reports the broker's last publishing ID (stream protocol), or not (AMQP 0-9-1). */
  readonly reportsLastId: boolean;
  /**
   * Sub-entry batching (stream protocol only: with `reportsLastId`); 1 is off. One size for every
   * life, or one per life in turn (batching switched on or off between opens of one store).
   */
  readonly subEntrySizes: readonly number[];
  /**
   * The transport of life n (the last one for every later life): a store stream lives wrote with
   * sub-entry batches opened by AMQP 0-9-1 lives, whose acks come member by member (issue 32, item
   * 6). Not back to the stream protocol: the simulated broker's rule that a stream re-send keeps
   * its batches (noteEntry) does not know AMQP lives in between.
   */
  readonly transports: ReadonlyArray<'stream' | 'amqp'>;
  /**
   * Keyed: `keyRetention.maxKeys` (undefined: the default 100 000, never reached here). A small one
   * makes repeats past it publish again, and take a key over from a first send still waiting.
   */
  readonly keyRetentionMaxKeys: number | undefined;
}

/** Everything the model sees of one producer. */
interface ProducerView {
  running: boolean;
  opening: boolean;
  /** The core is connected (live connection, not reconnecting). */
  connected: boolean;
  /** Its last connection is live: frames and confirms still flow on it. */
  linked: boolean;
  held: boolean;
  closing: boolean;
  pendingConnect: boolean;
  /** Cut connections of this producer whose frames may still land. */
  zombies: number;
}

/** Everything the model sees of the world: what makes a command applicable. */
interface Model {
  brokerUp: boolean;
  zombies: number;
  /** Connects of closed lives that may still complete. */
  lateConnects: number;
  restorable: boolean;
  producers: ProducerView[];
}

/** Unhandled rejections, recorded for the run in progress (vitest would only report them at the end). */
const unhandled: unknown[] = [];
const onUnhandled = (reason: unknown): void => {
  unhandled.push(reason);
};

class World {
  readonly network = new SimNetwork();
  readonly producers: ProducerHarness[];
  /** Starts per producer: life n opens with durabilities[n % length]. */
  readonly #starts: number[];

  constructor(
    readonly config: WorldConfig,
    advance: (ms: number) => void,
  ) {
    this.producers = LAYOUT.slice(0, config.producers).map(
      (p) =>
        new ProducerHarness(
          this.network,
          {
            ...p,
            durability: config.durabilities[0]!,
            idMode: config.idMode,
            maxBatch: config.maxBatch,
            maxInFlight: config.maxInFlight,
            closeTimeoutMs: config.closeTimeoutMs,
            onBrokerAhead: config.onBrokerAhead,
            confirmTimeoutMs: CONFIRM_TIMEOUT_MS,
            reportsLastId: config.reportsLastId,
            subEntrySize: config.subEntrySizes[0]!,
            checkInFlightOnWire: true,
            tolerateOutboxBurst: TOLERATE.has('outbox-burst'),
            tolerateWriteAfterClose: TOLERATE.has('write-after-close'),
            tolerateKeyedLateFrames: TOLERATE.has('keyed-late-frames'),
            tolerateKeyedRestoredRecords: TOLERATE.has('keyed-restored-records'),
            ...(config.keyRetentionMaxKeys === undefined
              ? {}
              : { keyRetentionMaxKeys: config.keyRetentionMaxKeys }),
          },
          { advance },
        ),
    );
    this.#starts = this.producers.map(() => 0);
  }

  producer(p: number): ProducerHarness {
    return this.producers[p % this.producers.length]!;
  }

  /** Starts a life of producer `p` (its open may go on after this returns, on a slow disk). */
  start(p: number, slowDisk = false): Promise<DedupError | undefined> {
    const i = p % this.producers.length;
    const n = this.#starts[i]!;
    this.#starts[i] = n + 1;
    const durability = this.config.durabilities[n % this.config.durabilities.length]!;
    const subEntrySize = this.config.subEntrySizes[n % this.config.subEntrySizes.length]!;
    const transports = this.config.transports;
    const amqp = transports[Math.min(n, transports.length - 1)] === 'amqp';
    return this.producers[i]!.beginStart({ durability, subEntrySize, slowDisk, amqp });
  }

  settle(): Promise<void> {
    return settle(() => this.network.activity + this.producers.reduce((n, p) => n + p.progress(), 0));
  }

  observe(m: Model): void {
    m.brokerUp = this.network.brokerUp;
    m.zombies = this.network.zombies.length;
    m.lateConnects = this.producers.reduce(
      (n, p) => n + p.history.filter((l) => l.closeResolved && l.transport.hasPendingConnect).length,
      0,
    );
    // A restored backup is safe only where every life can ask the broker for its last ID.
    m.restorable = this.config.reportsLastId && !this.config.transports.includes('amqp');
    m.producers = this.producers.map((p) => ({
      running: p.isRunning,
      opening: p.isOpening,
      connected: p.isConnected,
      linked: p.isLinked,
      held: p.currentDisk?.isHolding ?? false,
      closing: p.life?.closing ?? false,
      pendingConnect: p.life?.transport.hasPendingConnect ?? false,
      zombies: this.network.zombies.filter(
        (z) => z.owner?.target === p.spec.stream && z.owner.producerName === p.spec.producerName,
      ).length,
    }));
  }

  /** Fails the run at the first violation the harnesses or the wire recorded (shrinks faster). */
  failFast(): void {
    if (unhandled.length > 0) throw new Error(`unhandled rejection: ${show(unhandled[0])}`);
    for (const p of this.producers) {
      const first =
        p.violations[0] ??
        p.history.flatMap((l) => l.transport.violations.map((v) => `life ${l.index}: ${v}`))[0];
      if (first !== undefined) throw new Error(`${p.spec.stream}/${p.spec.producerName}: ${first}`);
    }
  }

  /**
   * Nothing is delivered or confirmed for longer than the confirm timeout and two timeout checks
   * (fake time). A connection with messages the client saw no confirm for must be given up: the
   * core reconnects (docs/design.md: a connection that stops confirming is treated as lost) — whoever's
   * messages they are (callers that already got DEDUP_CONFIRM_TIMEOUT, messages from the outbox).
   */
  async stall(advance: (ms: number) => void): Promise<void> {
    const before = this.producers.map((p) => {
      const life = p.life;
      const c = life?.transport.connection;
      // close() stops the confirm-timeout checks (once it stopped waiting): no replacement then.
      if (life === undefined || c?.state !== 'live' || life.coreClosed || life.closing || life.stopping)
        return undefined;
      const written = new Set(c.written.map((f) => f.publishingId));
      const waiting = [...life.transport.unconfirmed].filter((id) => written.has(id));
      return { life, c, waiting };
    });
    advance(STALL_MS);
    await this.settle();
    advance(5); // the reconnect's back-off
    await this.settle();
    for (const [i, b] of before.entries()) {
      if (b === undefined || b.waiting.length === 0) continue;
      const { life, c } = b;
      if (life.crashed || life.coreClosed || life.closing || life.stopping) continue;
      const still = b.waiting.filter((id) => life.transport.unconfirmed.has(id));
      if (still.length === 0) continue;
      if (life.transport.connection === c && c.state === 'live' && !life.transport.hasPendingConnect) {
        this.producers[i]!.violations.push(
          `connection ${c.id} confirmed none of ids ${still.join(',')} for ${STALL_MS} ms and was not replaced`,
        );
      }
    }
  }
}

function show(x: unknown): string {
  return x instanceof Error ? (x.stack ?? x.message) : String(x);
}

/**
 * A command: a precondition on the model, an action on the world, then the world settles. After
 * each send command the producer's disk is backed up (as a periodic backup would catch it, often
 * with messages in the outbox): `restoreBackup` picks one of these.
 */
class Step implements fc.AsyncCommand<Model, World> {
  constructor(
    readonly label: string,
    readonly can: (m: Readonly<Model>) => boolean,
    readonly act: (w: World) => unknown,
    /** Sends of this producer: its disk is backed up once they settle (a periodic backup). */
    readonly backs?: number,
  ) {}

  check(m: Readonly<Model>): boolean {
    return this.can(m);
  }

  async run(m: Model, w: World): Promise<void> {
    await this.act(w);
    await w.settle();
    if (this.backs !== undefined) await w.producer(this.backs).backup();
    w.observe(m);
    w.failFast();
  }

  toString(): string {
    return this.label;
  }
}

const at = (m: Readonly<Model>, p: number) => m.producers[p % m.producers.length]!;
const producer = fc.nat({ max: 2 });
const headersMode = fc.constantFrom<HeadersMode>('none', 'none', 'own', 'shared', 'shared');
const showHeaders = (h: HeadersMode) => (h === 'none' ? '' : `, ${h} headers`);

/** Every command with its weight (how often it is generated relative to the others). */
function weighted(
  idMode: ProducerIdMode,
  advance: (ms: number) => void,
  smallRetention = false,
): Array<[number, fc.Arbitrary<Step>]> {
  // A small key retention's model sends abortable batches and repeats three times as often.
  const focus = smallRetention ? 3 : 1;
  const all: Array<[number, fc.Arbitrary<Step>]> = [
    [
      5,
      fc.tuple(producer, fc.integer({ min: 1, max: 6 }), fc.integer({ min: 1, max: 3 }), headersMode).map(
        ([p, n, gap, headers]) =>
          new Step(
            `send(p${p}, ${n}${idMode === 'explicit' ? `, gap ${gap}` : ''}${showHeaders(headers)})`,
            (m) => at(m, p).running,
            (w) => w.producer(p).send(n, gap, headers),
            p,
          ),
      ),
    ],
    [
      2 * focus,
      fc
        .tuple(
          producer,
          fc.integer({ min: 1, max: 4 }),
          fc.boolean(),
          fc.boolean(),
          headersMode,
          fc.boolean(),
        )
        .map(
          ([p, n, now, repeats, headers, retry]) =>
            new Step(
              `sendAbortable(p${p}, ${n}, ${now ? 'aborted at once' : 'aborted later'}${
                idMode === 'keyed' && repeats ? ', each key repeated without a signal' : ''
              }${idMode === 'keyed' && retry ? ', then the key before them again, with a signal' : ''}${showHeaders(headers)})`,
              (m) => at(m, p).running,
              (w) => w.producer(p).sendAbortable(n, 1, now, repeats, headers, retry),
              p,
            ),
        ),
    ],
    [
      1,
      producer.map(
        (p) =>
          new Step(
            `abortAll(p${p})`,
            (m) => at(m, p).running,
            (w) => w.producer(p).abortAll(),
          ),
      ),
    ],
    [
      5,
      fc.tuple(producer, fc.integer({ min: 1, max: 6 })).map(
        ([p, n]) =>
          new Step(
            `deliver(p${p}, ${n})`,
            (m) => at(m, p).linked,
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
            (m) => at(m, p).linked,
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
            (m) => at(m, p).linked,
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
            (m) => at(m, p).linked,
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
            (m) => at(m, p).linked,
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
            (m) => at(m, p).linked,
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
      producer.map(
        (p) =>
          new Step(
            `refuseConnect(p${p})`,
            (m) => at(m, p).pendingConnect,
            (w) => w.producer(p).life?.transport.refuseConnect(),
          ),
      ),
    ],
    [
      1,
      producer.map(
        (p) =>
          new Step(
            `connecting(p${p})`,
            (m) =>
              at(m, p).running &&
              !at(m, p).connected &&
              !at(m, p).pendingConnect &&
              !(at(m, p).closing && at(m, p).held),
            (w) => w.producer(p).connecting(),
          ),
      ),
    ],
    [
      1,
      fc.boolean().map(
        (refuse) =>
          new Step(
            `lateConnects(${refuse ? 'refused' : 'established'})`,
            (m) => m.lateConnects > 0 && (refuse || m.brokerUp),
            (w) => w.producers.forEach((p) => p.lateConnects(refuse)),
          ),
      ),
    ],
    [
      1,
      fc.constant(
        new Step(
          `stall(${STALL_MS} ms)`,
          (m) => m.producers.some((p) => p.running),
          (w) => w.stall(advance),
        ),
      ),
    ],
    [
      1,
      producer.map(
        (p) =>
          new Step(
            `diskFull(p${p}: its next store write fails)`,
            (m) => at(m, p).running && !at(m, p).closing,
            (w) => w.producer(p).diskFull(),
          ),
      ),
    ],
    [
      1,
      fc.tuple(producer, fc.boolean(), fc.nat({ max: 2 })).map(
        ([p, zombie, applyHeld]) =>
          new Step(
            `crash(p${p}${zombie ? ', frames linger' : ''}, ${applyHeld} held commits reach the disk)`,
            (m) => at(m, p).running || at(m, p).opening,
            (w) => w.producer(p).crash(zombie, applyHeld),
          ),
      ),
    ],
    [
      3,
      fc.tuple(producer, fc.boolean()).map(
        ([p, slowDisk]) =>
          new Step(
            `restart(p${p}${slowDisk ? ', slow disk' : ''})`,
            (m) => !at(m, p).running && !at(m, p).opening,
            (w) => void w.start(p, slowDisk),
          ),
      ),
    ],
    [
      1,
      fc.tuple(producer, fc.boolean()).map(
        ([p, stop]) =>
          new Step(
            // A paused broker or a full window: a publish waits for a 'drain' that does not come
            // (issue 32, item 7); close() must return all the same (checked in drain()).
            `${stop ? 'stopDraining' : 'resumeDraining'}(p${p})`,
            (m) => at(m, p).linked,
            (w) => {
              const t = w.producer(p).life?.transport;
              if (t === undefined) return;
              if (stop) t.drainStopped = true;
              else t.resumeDraining();
            },
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
            (w) => w.producer(p).currentDisk?.release(n),
          ),
      ),
    ],
    [
      2,
      fc.tuple(producer, fc.option(fc.nat(), { freq: 4 })).map(
        ([p, backup]) =>
          new Step(
            backup === null ? `loseStore(p${p})` : `restoreBackup(p${p}, #${backup})`,
            // Late frames of earlier lives would land on IDs a restored store hands out again: that
            // loss is the broker's rule, not detectable by anyone (docs/design.md §6); they land first here.
            (m) => m.restorable && !at(m, p).running && !at(m, p).opening && at(m, p).zombies === 0,
            (w) =>
              w.producer(p).restore((backup === null ? undefined : w.producer(p).pickBackup(backup)) ?? []),
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
  if (idMode === 'keyed') {
    all.push([
      3 * focus,
      // Keys counted from the oldest, or from the newest (an application retries recent keys most:
      // those still waiting for room, which a repeat past a small retention takes over).
      fc
        .tuple(
          producer,
          fc.oneof(fc.nat(), fc.integer({ min: -4, max: -1 })),
          fc.integer({ min: 1, max: 4 }),
          fc.boolean(),
        )
        .map(
          ([p, i, n, abortable]) =>
            new Step(
              `repeat(p${p}, keys from #${i}${i < 0 ? ' (from the newest)' : ''}, ${n}${abortable ? ', each with a signal abortAll aborts' : ''})`,
              (m) => at(m, p).running,
              (w) => w.producer(p).repeat(i, n, abortable),
            ),
        ),
    ]);
  }
  if (idMode === 'explicit') {
    all.push([
      2,
      producer.map(
        (p) =>
          new Step(
            `retryAborted(p${p})`,
            (m) => at(m, p).running,
            (w) => w.producer(p).retryAborted(),
          ),
      ),
    ]);
  }
  return all;
}

function commandsFor(
  idMode: ProducerIdMode,
  advance: (ms: number) => void,
  smallRetention = false,
): Array<fc.Arbitrary<Step>> {
  return weighted(idMode, advance, smallRetention).flatMap(([w, arb]) =>
    Array.from({ length: w }, () => arb),
  );
}

/**
 * Brings every producer back and lets everything drain: late frames of cut connections land first
 * (the adversarial order), held commits reach the disk, late connects of closed lives complete,
 * closing producers finish closing and are started again, until every producer runs, connected,
 * with nothing in flight; then all close.
 */
/** Closes that began with a publish waiting for a socket that stopped draining (all models). */
let undrainedCloses = 0;

async function drain(w: World): Promise<void> {
  // A closing life whose socket stopped draining: its close() returns once closeTimeoutMs has
  // passed, within a bounded number of turns, whatever the socket does (issue 32, item 7). Time
  // passes once for all of them (other producers' reconnects must not pass giveUpAfterMs).
  const undrained = w.producers.filter((p) => p.life?.closing === true && p.life.transport.drainStopped);
  if (undrained.length > 0) advance(w.config.closeTimeoutMs + 1);
  undrainedCloses += undrained.filter((p) => p.life!.transport.waitingForDrain > 0).length;
  for (const p of undrained) {
    const life = p.life!;
    for (let i = 0; !life.closeResolved; i++) {
      if (i > 50) {
        throw new Error(
          `${p.spec.producerName}: close() not returned ${w.config.closeTimeoutMs} ms (fake) and 50 turns after it began, with a socket that stopped draining (${life.transport.waitingForDrain} publishes waiting)`,
        );
      }
      advance(1);
      await p.currentDisk?.release();
      // A reconnect under way when close() began is bounded by connectTimeoutMs: it times out.
      life.transport.refuseConnect();
      await w.settle();
    }
  }
  // The sockets of the lives still running drain again.
  for (const p of w.producers) p.life?.transport.resumeDraining();
  w.network.startBroker();
  while (w.network.zombies.length > 0) w.network.deliverZombie(0);
  for (const p of w.producers) await p.currentDisk?.release();
  await w.settle();
  for (const p of w.producers) p.lateConnects();
  await w.settle();
  w.failFast();
  for (let round = 0; ; round++) {
    // Time passes: a core waiting out a reconnect back-off (after a refused connect, or a confirm
    // stall while its old connection still looks live) asks to connect again.
    advance(3);
    for (const [i, p] of w.producers.entries()) {
      if (p.life?.stopping === true) {
        // Stopped by a failed store write: its close waits for confirms at most closeTimeoutMs,
        // then the process exits (the life ends) and the next round starts a new one.
        advance(w.config.closeTimeoutMs + 1);
        await p.currentDisk?.release();
        p.life?.transport.acceptConnect();
      } else if (p.isOpening) {
        await p.currentDisk?.release();
      } else if (!p.isRunning) {
        const err = await w.start(i);
        if (err !== undefined) throw err;
      } else if (!p.isConnected) {
        await p.reconnect();
      }
    }
    await w.settle();
    let moved = 0;
    for (const p of w.producers) {
      await p.currentDisk?.release();
      const c = p.life?.transport.connection;
      if (c !== undefined) moved += c.deliver() + c.confirmAll();
    }
    await w.settle();
    w.failFast();
    const idle = w.producers.every(
      (p) => p.life !== undefined && !p.life.closing && p.life.core.inFlight === 0,
    );
    if (moved === 0 && idle) break;
    if (round > 200) throw new Error('the producers did not drain');
  }
  for (const p of w.producers) {
    const unsettled = p.life?.unsettled ?? 0;
    if (unsettled > 0) throw new Error(`${p.spec.producerName}: ${unsettled} sends never settled`);
    const life = p.life;
    if (life === undefined) continue;
    p.beginClose();
    // close() may wait for a reconnect under way: time passes, and the network answers it.
    for (let i = 0; !life.closeResolved; i++) {
      if (i > 200) throw new Error(`${p.spec.producerName}: close() never resolved`);
      advance(3);
      life.transport.acceptConnect();
      await w.settle();
    }
  }
  for (const p of w.producers) p.lateConnects();
  await w.settle();
}

/** The invariants of docs/design.md §7 for the producer side, per stream, with the history checker. */
async function checkProducers(w: World, totals: Totals): Promise<void> {
  if (w.network.entryViolations.length > 0) {
    throw new Error(`sub-entry batches: ${w.network.entryViolations.join('\n')}`);
  }
  for (const p of w.producers) {
    const problems = p.problems();
    if (problems.length > 0)
      throw new Error(`${p.spec.stream}/${p.spec.producerName}: ${problems.join('\n')}`);
  }
  for (const stream of new Set(w.producers.map((p) => p.spec.stream))) {
    const mine = w.producers.filter((p) => p.spec.stream === stream);
    const byName = new Map(mine.map((p) => [p.spec.producerName, p]));
    const stored = w.network.broker.messages(stream).map((m) => ({
      ...m,
      label: byName.get(m.producerName)?.labelOf(m.body) ?? m.body,
    }));
    const report = checkHistory({
      attempted: mine.flatMap((p) => [...p.attempted]),
      acknowledged: mine.flatMap((p) => [...p.acknowledged.keys(), ...p.mustBePresent]),
      observed: stored.map((m) => ({
        label: m.label,
        producerName: m.producerName,
        publishingId: m.publishingId,
      })),
    });
    // Copies an adopting open makes on purpose (README: onBrokerAhead), and keys a lost or
    // restored store forgot, may be in the stream twice; nothing else may.
    const mayDuplicate = new Set(mine.flatMap((p) => [...p.mayDuplicate]));
    // AMQP 0-9-1 publishes are never deduplicated by the broker (README): where AMQP lives re-send an
    // outbox, a copy (and the out-of-order ID it stamps) is expected; a loss never is.
    const amqp = w.config.transports.includes('amqp');
    // With a key retention a repeat past it is published again: a key may be in the stream more
    // than once. Whether each copy was entitled to be is checked below, copy by copy.
    const retention = w.config.keyRetentionMaxKeys;
    const duplicated = amqp
      ? []
      : report.duplicated.filter((l) => !mayDuplicate.has(l) && retention === undefined);
    const copies = new Set(report.duplicated);
    const order = report.orderViolations.filter((v) => !amqp || !copies.has(v.label));
    const mayBeLost = new Set(mine.flatMap((p) => [...p.mayBeLost]));
    const lost = report.lost.filter((l) => !mayBeLost.has(l));
    if (lost.length + report.unexpected.length + order.length + duplicated.length > 0) {
      throw new Error(
        `stream ${stream}: ${formatReport(report)}${duplicated.length > 0 ? ` (duplicated, not allowed: ${duplicated.join(', ')})` : ''}`,
      );
    }
    for (const p of mine) {
      const ids = new Map<string, bigint[]>();
      for (const m of stored) {
        if (m.producerName !== p.spec.producerName) continue;
        ids.set(m.label, [...(ids.get(m.label) ?? []), m.publishingId]);
      }
      // A resolved send told the application an ID: the stream holds the message under that ID.
      for (const ack of p.acks) {
        const found = ids.get(ack.label) ?? [];
        if (!found.includes(ack.publishingId) && !p.looseIds.has(ack.label) && !p.mayBeLost.has(ack.label)) {
          throw new Error(
            `${ack.label} resolved (${ack.outcome}) as ${ack.publishingId}, stored as ${found.join(', ') || 'nothing'}`,
          );
        }
      }
      // Keyed: each copy of a key in the stream is its own call's (bodies are unique per call). A call
      // that never left (aborted while it waited for room) has no copy; a later copy's call was past
      // the retention of every earlier copy, counted from the last ID at that call. IDs only move
      // down once handed out (aborts renumber waiting sends), so an earlier copy's ID in the stream
      // is at most its ID then: last ID at the call - that ID < maxKeys means it was inside.
      if (w.config.idMode === 'keyed') {
        const maxKeys = BigInt(retention ?? 100_000);
        const copiesOf = new Map<string, Array<{ readonly id: bigint; readonly body: string }>>();
        for (const m of stored) {
          if (m.producerName !== p.spec.producerName || mayDuplicate.has(m.label)) continue;
          copiesOf.set(m.label, [...(copiesOf.get(m.label) ?? []), { id: m.publishingId, body: m.body }]);
        }
        for (const [label, copies] of copiesOf) {
          copies.sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
          if (copies.length > 1) totals.republishedKeys++;
          for (const [n, copy] of copies.entries()) {
            const call = p.keyedCalls.get(copy.body);
            if (call === undefined) throw new Error(`${copy.body} (${label}) is in the stream, from no call`);
            if (call.neverWritten) {
              throw new Error(
                `${copy.body} is in the stream as ${copy.id}, though its send was aborted while it waited for room (never written)`,
              );
            }
            const inside = copies.slice(0, n).find((e) => call.lastAtCall - e.id < maxKeys);
            if (inside !== undefined) {
              throw new Error(
                `${label} published again as ${copy.id}, while its copy ${inside.id} was inside the retention ` +
                  `(maxKeys ${maxKeys}, last ID ${call.lastAtCall} at the call): it should have been a duplicate ` +
                  `(stored as ${copies.map((c) => c.id).join(', ')})`,
              );
            }
          }
        }
      }
      // An adopting open re-sends its outbox under new IDs above the broker's: every message of it.
      for (const { label, above } of p.adoptObligations) {
        if (!(ids.get(label) ?? []).some((id) => id > above)) {
          throw new Error(
            `${label} was in the outbox when open() adopted the broker's ${above}, and is not in the stream above it ` +
              `(stored as ${(ids.get(label) ?? []).join(', ') || 'nothing'})`,
          );
        }
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

/** docs/design.md §7 for the consumer side: each stream read by a crashing verifying consumer. */
async function checkConsumers(w: World, policy: ConsumerPlan, totals: Totals): Promise<void> {
  for (const stream of new Set(w.producers.map((p) => p.spec.stream))) {
    // Each stored message is one distinct message, even the copies an adopting open made on purpose.
    const messages = w.network.broker
      .messages(stream)
      .map((m) => ({ ...m, body: `${m.body}@${m.producerName}/${m.publishingId}` }));
    const h = new ConsumerHarness(streamEntries(messages), {
      policy: policy.policy,
      commit: policy.commit,
      commitEvery: policy.commitEvery,
    });
    await h.start();
    for (const step of policy.steps) await runStep(h, step);
    const report = h.check(await h.finish());
    if (!report.ok) throw new Error(`consumer of ${stream}: ${formatReport(report)}`);
    await checkHoles(w, stream, messages, h, policy, totals);
  }
}

/** `stream-dedup audit`'s analysis of stored messages (every sample kept). */
function auditStored(messages: readonly StoredMessage[]): AuditReport {
  return auditRecords(
    messages.map((m, i) => ({
      offset: BigInt(i),
      applicationProperties: m.headers ?? identityHeaders(m.producerName, m.publishingId),
    })),
    { maxSamples: Number.MAX_SAFE_INTEGER },
  );
}

/** The producer of each gap event (reported or confirmed), with the range as text. */
function gapEvents(h: ConsumerHarness): Array<{ producer: string; range: IdRange; confirmed: boolean }> {
  return h.events.flatMap((e) =>
    e.kind === 'gap'
      ? [{ producer: decodeScopeKey(e.scope).producer, range: e.range, confirmed: e.confirmed }]
      : [],
  );
}

const showRange = (r: IdRange): string => `${r.from}..${r.to}`;

/**
 * Skips vs loss (issue 16), for automatic and keyed IDs (explicit IDs' holes are the source's).
 * Nothing is lost from the stream in this world, so neither the audit nor the verifying consumer
 * that read the stream may report a gap: every hole is a declared skip. Then one stored message is
 * removed (not a producer's first or last: nobody can see those go, and not one inside a range a
 * later message declares skipped): the audit and a verifying consumer must both report a gap
 * holding its ID.
 */
async function checkHoles(
  w: World,
  stream: string,
  messages: readonly StoredMessage[],
  h: ConsumerHarness,
  plan: ConsumerPlan,
  totals: Totals,
): Promise<void> {
  if (w.config.idMode === 'explicit') return;
  const audit = auditStored(messages);
  const exact = new Set<string>();
  for (const pa of audit.producers) {
    totals.skippedIds += Number(pa.skippedIds);
    totals.skipRanges += pa.skippedRanges.length;
    totals.contradictions += pa.contradictions;
    if (pa.gaps > 0) {
      throw new Error(
        `audit of ${stream}: producer ${pa.producerName} has undeclared holes ${pa.gapRanges.map(showRange).join(', ')} ` +
          `(declared skips ${pa.skippedRanges.map(showRange).join(', ') || 'none'}) where nothing was lost`,
      );
    }
    // A message from a dead life that landed inside a range declared later (a contradiction) was
    // jumped over before the declaration arrived: the verifier may have called that a gap then.
    if (pa.contradictions === 0) exact.add(pa.producerName);
  }
  const spurious = gapEvents(h).filter((g) => exact.has(g.producer));
  if (spurious.length > 0) {
    throw new Error(
      `consumer of ${stream}: gap ${showRange(spurious[0]!.range)} (${spurious[0]!.confirmed ? 'confirmed' : 'reported'}) ` +
        `for producer ${spurious[0]!.producer}, whose holes are all declared skips`,
    );
  }

  // A planted hole: one message removed.
  const contradicted = new Set(
    audit.producers.flatMap((pa) =>
      pa.contradictionSamples.map((c) => `${pa.producerName}/${c.publishingId}`),
    ),
  );
  const bounds = new Map(audit.producers.map((pa) => [pa.producerName, pa]));
  const counts = new Map<string, number>();
  for (const m of messages)
    counts.set(
      `${m.producerName}/${m.publishingId}`,
      (counts.get(`${m.producerName}/${m.publishingId}`) ?? 0) + 1,
    );
  const declaredLater = (m: StoredMessage, at: number): boolean =>
    messages.slice(at + 1).some((later) => {
      if (later.producerName !== m.producerName) return false;
      const from = later.headers?.[SKIP_HEADER];
      return from !== undefined && BigInt(from) <= m.publishingId && m.publishingId < later.publishingId;
    });
  const eligible = messages.flatMap((m, at) => {
    const pa = bounds.get(m.producerName);
    const key = `${m.producerName}/${m.publishingId}`;
    if (pa === undefined || m.publishingId === pa.firstId || m.publishingId === pa.lastId) return [];
    if (counts.get(key) !== 1 || contradicted.has(key) || declaredLater(m, at)) return [];
    return [at];
  });
  if (eligible.length === 0) return;
  const at = eligible[plan.victim % eligible.length]!;
  const victim = messages[at]!;
  const damaged = messages.filter((_, i) => i !== at);
  const holds = (r: IdRange) => r.from <= victim.publishingId && victim.publishingId <= r.to;
  const pa = auditStored(damaged).producers.find((p) => p.producerName === victim.producerName)!;
  if (!pa.gapRanges.some(holds)) {
    throw new Error(
      `audit of ${stream} without ${victim.producerName}/${victim.publishingId}: no gap holds it ` +
        `(gaps ${pa.gapRanges.map(showRange).join(', ') || 'none'}, skips ${pa.skippedRanges.map(showRange).join(', ') || 'none'})`,
    );
  }
  const again = new ConsumerHarness(streamEntries(damaged), { policy: plan.policy, commit: 'message' });
  await again.finish();
  if (!gapEvents(again).some((g) => g.producer === victim.producerName && holds(g.range))) {
    throw new Error(
      `consumer of ${stream} without ${victim.producerName}/${victim.publishingId}: no gap event holds it ` +
        `(${JSON.stringify(gapEvents(again).map((g) => `${g.producer} ${showRange(g.range)}`))})`,
    );
  }
  totals.plantedHoles++;
}

interface ConsumerPlan {
  readonly policy: PolicySpec;
  readonly commit: 'message' | 'batch';
  readonly commitEvery: number;
  readonly steps: readonly ConsumerStep[];
  /** Which eligible stored message the planted-hole check removes. */
  readonly victim: number;
}

const durability = fc.constantFrom<Durability>('outbox', 'reserve');

/**
 * The options of a run. `smallRetention` (keyed): one producer, outbox lives, a key retention of 1
 * to 4 IDs and 1 to 3 sends in flight, so sends wait for room while repeats pass their keys'
 * retention: a repeat takes a key over from a first send still waiting, and an abort gives it back.
 * The defect a review found in 6e07f54 needs five such steps in a row: with its fix reverted this
 * model fails in 8 of 8 seeds within 14 to 503 runs (the broad keyed model, with small retentions
 * then, needed 75 to 2 700).
 */
function worldConfig(idMode: ProducerIdMode, smallRetention = false): fc.Arbitrary<WorldConfig> {
  if (smallRetention) {
    return fc
      .tuple(worldConfig(idMode), fc.integer({ min: 1, max: 4 }), fc.integer({ min: 1, max: 3 }))
      .map(([c, maxKeys, maxInFlight]) => ({
        ...c,
        producers: 1,
        durabilities: ['outbox'],
        maxInFlight,
        keyRetentionMaxKeys: maxKeys,
      }));
  }
  return (
    fc
      .record({
        idMode: fc.constant(idMode),
        producers: fc.integer({ min: 1, max: 3 }),
        durabilities: fc.oneof(
          { weight: 2, arbitrary: durability.map((d) => [d]) },
          // A switch between opens of one store: life n opens with the n-th (in turn).
          { weight: 1, arbitrary: fc.array(durability, { minLength: 2, maxLength: 5 }) },
        ),
        onBrokerAhead: fc.constantFrom<'error' | 'adopt'>('error', 'adopt'),
        maxBatch: fc.oneof({ weight: 2, arbitrary: fc.integer({ min: 1, max: 3 }) }, fc.constant(2_000)),
        // Small: sends park (aborts while waiting); 5-10 with maxBatch 1-3: outboxes larger than a batch.
        maxInFlight: fc.oneof(
          fc.integer({ min: 1, max: 4 }),
          fc.integer({ min: 5, max: 10 }),
          fc.constant(10_000),
        ),
        // 0: close() rejects what is unconfirmed at once; 60 s: it waits for the confirms.
        closeTimeoutMs: fc.constantFrom(0, 60_000),
        reportsLastId: fc.oneof(
          { weight: 6, arbitrary: fc.constant(true) },
          { weight: 1, arbitrary: fc.constant(false) },
        ),
        // Sub-entry batches of 2-4 (the stream transport only: the AMQP one has none).
        subEntrySizes: fc.oneof(
          { weight: 2, arbitrary: fc.constant([1]) },
          { weight: 2, arbitrary: fc.integer({ min: 2, max: 4 }).map((n) => [n]) },
          { weight: 1, arbitrary: fc.array(fc.constantFrom(1, 2, 3), { minLength: 2, maxLength: 4 }) },
        ),
        // Stream lives only, or 1-3 stream lives and then AMQP 0-9-1 ones.
        transports: fc.oneof(
          { weight: 3, arbitrary: fc.constant<Array<'stream' | 'amqp'>>(['stream']) },
          {
            weight: 1,
            arbitrary: fc
              .integer({ min: 1, max: 3 })
              .map((k) => [...Array.from({ length: k }, () => 'stream' as const), 'amqp' as const]),
          },
        ),
        // The default (100 000, never reached here): small ones are the smallRetention model's.
        keyRetentionMaxKeys: fc.constant(undefined),
      })
      // AMQP lives with automatic IDs only: the simulated broker deduplicates every publish, where a
      // real one never deduplicates AMQP 0-9-1 (an explicit or keyed ID reused there is a copy in
      // reality, a loss here).
      .map((c) =>
        c.reportsLastId && idMode === 'auto'
          ? c
          : { ...c, subEntrySizes: c.reportsLastId ? c.subEntrySizes : [1], transports: ['stream'] },
      )
  );
}

const consumerPlan: fc.Arbitrary<ConsumerPlan> = fc.record({
  policy: consumerPolicy,
  commit: fc.constantFrom<'message' | 'batch'>('message', 'batch'),
  commitEvery: fc.integer({ min: 1, max: 5 }),
  steps: fc.array(consumerStep, { maxLength: 12 }),
  victim: fc.nat(),
});

/** What each model property prints after its runs. */
interface Totals {
  runs: number;
  attempted: number;
  acknowledged: number;
  lives: number;
  hungByClose: number;
  adoptions: number;
  largeAdoptions: number;
  refusals: number;
  rejections: Map<string, number>;
  /** Declared-skipped IDs missing from the streams, their ranges, and contradicted declarations. */
  skippedIds: number;
  skipRanges: number;
  contradictions: number;
  /** Runs where a removed message was found by both the audit and a verifying consumer. */
  plantedHoles: number;
  /** Keyed, with a small retention: keys in the stream more than once (published again past it). */
  republishedKeys: number;
  /** Lives whose store write failed (diskFull): the publisher stopped, the next life went on. */
  failedWrites: number;
}

const FAKE = ['setTimeout', 'clearTimeout', 'setInterval', 'clearInterval', 'performance'] as const;
const advance = (ms: number): void => {
  vi.advanceTimersByTime(ms);
};

/** One run: the world under the commands, drained, then checked. */
let generation = 0;

async function runModel(
  config: WorldConfig,
  cmds: Iterable<fc.AsyncCommand<Model, World>>,
  plan: ConsumerPlan,
  totals: Totals,
) {
  // A run the time budget interrupted may still be going: it must not take the next run's clock.
  const mine = ++generation;
  unhandled.length = 0;
  vi.useFakeTimers({ toFake: [...FAKE] });
  let world: World;
  try {
    world = new World(config, advance);
    for (const [i] of world.producers.entries()) {
      const err = await world.start(i);
      if (err !== undefined) throw err;
    }
    const model: Model = { brokerUp: true, zombies: 0, lateConnects: 0, restorable: false, producers: [] };
    world.observe(model);
    world.failFast();
    await fc.asyncModelRun(() => ({ model, real: world }), cmds);
    await drain(world);
    world.failFast();
    await checkProducers(world, totals);
  } finally {
    // Timers of abandoned (crashed) cores go with the fake clock.
    if (mine === generation) vi.useRealTimers();
  }
  await checkConsumers(world, plan, totals);
  await settle(() => 0);
  if (unhandled.length > 0) throw new Error(`unhandled rejection: ${show(unhandled[0])}`);
  totals.runs++;
  for (const p of world.producers) {
    totals.attempted += p.attempted.size;
    totals.acknowledged += p.acknowledged.size;
    totals.lives += p.lives;
    totals.adoptions += p.adoptions;
    totals.largeAdoptions += p.largeAdoptions;
    for (const n of p.expectedRefusals.values()) totals.refusals += n;
    for (const [code, n] of p.rejections) totals.rejections.set(code, (totals.rejections.get(code) ?? 0) + n);
    for (const life of p.history) {
      if (life.stopping) totals.failedWrites++;
      if (life.unsettledAtClose > 0 && !TOLERATE_CLOSE_HANG) {
        throw new Error(
          `${p.spec.producerName}: close() resolved with ${life.unsettledAtClose} sends unsettled`,
        );
      }
      totals.hungByClose += Math.max(0, life.unsettledAtClose);
    }
  }
}

const DESCRIPTIONS: Record<ProducerIdMode, string> = {
  auto: 'every resolved send is in the stream exactly once, under its ID, in ID order',
  explicit:
    'every resolved send is in the stream exactly once under its own ID; the source resumes at lastPublishingId; an aborted ID that never left may be sent again',
  keyed:
    'every key whose send resolved (published or duplicate) is in the stream exactly once, under the ID it resolved with; a key re-sent after a crash is published',
};

/** Wall-time budget per model property (checkWithin fails below MODEL_RUNS runs). */
const BUDGET_MS = Number(process.env.MODEL_BUDGET_MS ?? 45_000);

describe('publisher model (docs/design.md §3 broker, §7 invariants)', () => {
  if (process.env.MODEL_VERBOSE !== undefined)
    fc.configureGlobal({ ...fc.readConfigureGlobal(), verbose: 2 });
  beforeAll(() => {
    process.on('unhandledRejection', onUnhandled);
  });
  afterAll(() => {
    process.off('unhandledRejection', onUnhandled);
  });

  const variants = [
    { idMode: 'auto', smallRetention: false },
    { idMode: 'explicit', smallRetention: false },
    { idMode: 'keyed', smallRetention: false },
    { idMode: 'keyed', smallRetention: true },
  ] as const;
  for (const { idMode, smallRetention } of variants) {
    const name = `${idMode}${smallRetention ? ', small key retention' : ''}`;
    const description = smallRetention
      ? 'a key is in the stream once per send that was past the retention of its earlier copies at its call (counted from the last ID then, whatever aborts and crashes take back later), never from a send aborted while it waited'
      : DESCRIPTIONS[idMode];
    const durabilities = smallRetention ? '' : ', restarts with another durability';
    it(`model - ${name}: ${description}; and it takes effect once at a crashing verifying consumer, under crashes (also during open)${durabilities}, lost and restored stores, broker restarts, cuts, loss, duplication, delay, confirm reordering and stalls, aborted sends and reused headers`, async () => {
      const totals: Totals = {
        runs: 0,
        attempted: 0,
        acknowledged: 0,
        lives: 0,
        hungByClose: 0,
        adoptions: 0,
        largeAdoptions: 0,
        refusals: 0,
        rejections: new Map(),
        skippedIds: 0,
        skipRanges: 0,
        contradictions: 0,
        plantedHoles: 0,
        republishedKeys: 0,
        failedWrites: 0,
      };
      const details = await checkWithin(
        `publisher model, ${name}`,
        fc.asyncProperty(
          worldConfig(idMode, smallRetention),
          fc.commands(commandsFor(idMode, advance, smallRetention), {
            maxCommands: 200,
            size: 'max',
            replayPath: process.env.FC_REPLAY_PATH,
          }),
          consumerPlan,
          (config, cmds, plan) => runModel(config, cmds, plan, totals),
        ),
        { timeLimitMs: BUDGET_MS },
      );
      expect(details.failed).toBe(false);
      const per = (n: number) => (n / Math.max(1, totals.runs)).toFixed(1);
      console.log(
        `[publisher model, ${name}] per run: ${per(totals.attempted)} ${idMode === 'keyed' ? 'keys' : 'messages'}, ` +
          `${per(totals.acknowledged)} resolved, ${per(totals.lives)} process lives; ${totals.adoptions} adopting opens ` +
          `(${totals.largeAdoptions} with an outbox larger than maxBatch), ` +
          `${totals.refusals} expected refusals at open; rejections ${JSON.stringify(Object.fromEntries(totals.rejections))}; ` +
          `${totals.hungByClose} sends left unsettled by a close() in all; ` +
          `${totals.skipRanges} declared skips missing from the streams (${totals.skippedIds} IDs), ` +
          `${totals.contradictions} contradicted; a planted hole found by audit and verifier in ${totals.plantedHoles} runs; ` +
          `${undrainedCloses} closes with a publish waiting for drain so far; ${totals.failedWrites} lives stopped by a failed store write` +
          (idMode === 'keyed'
            ? `; ${totals.republishedKeys} keys published again past a small retention`
            : ''),
      );
      if (!IS_REPLAY && idMode !== 'explicit') {
        // The skip and hole checks must not pass for want of cases (reserve + a crash declares a
        // skip; keyed IDs need an outbox, so only automatic IDs skip).
        expect(totals.plantedHoles, 'runs with a planted hole').toBeGreaterThan(totals.runs / 4);
        if (idMode === 'auto')
          expect(totals.skipRanges, 'declared skips missing from the streams').toBeGreaterThan(20);
        // A failed store write must happen, or the diskFull dimension checks nothing.
        expect(totals.failedWrites, 'lives stopped by a failed store write').toBeGreaterThan(
          totals.runs / 20,
        );
        // The retention check must not pass for want of repeats past it.
        if (smallRetention)
          expect(totals.republishedKeys, 'keys published again past the retention').toBeGreaterThan(
            totals.runs,
          );
      }
    });
  }

  it('publisher - explicit ids in reserve durability: after a restart the next id from the source is accepted (docs/design.md §4.4: refuse only ids not above the last accepted one)', async () => {
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

describe('publisher time and settlement bounds (issue 32)', () => {
  it('close - with a socket that stops draining, close() and a fatal error settle within closeTimeoutMs (fake time) and a bounded number of turns; unconfirmed messages stay in the outbox', async () => {
    let stuck = 0;
    let undrained = 0;
    await assertProperty(
      'close bound',
      fc.asyncProperty(
        fc.integer({ min: 1, max: 8 }),
        fc.constantFrom(0, 50, 1_000),
        fc.integer({ min: 1, max: 12 }),
        fc.nat({ max: 12 }),
        fc.nat({ max: 12 }),
        fc.constantFrom<'close' | 'fatal'>('close', 'fatal'),
        fc.constantFrom<Durability>('outbox', 'reserve'),
        // The socket drains again before the close (the ordinary path, for contrast), or never.
        fc.boolean(),
        async (maxInFlight, closeTimeoutMs, n, stopAfter, acked, how, durability, resumes) => {
          vi.useFakeTimers({ toFake: [...FAKE] });
          try {
            const network = new SimNetwork();
            const disk = memoryDisk();
            const open = async () => {
              const transport = network.transport('orders', 'p');
              transport.connectPolicy = 'immediate';
              const core = await DedupPublisherCore.open(transport, {
                producerName: 'p',
                store: await DedupStore.wrap(new ProcessDisk(disk)),
                durability,
                maxInFlight,
                closeTimeoutMs,
                // The fatal error: the watch finds the broker above this producer's IDs.
                watchIntervalMs: how === 'fatal' ? 100 : 0,
              });
              return { transport, core };
            };
            const first = await open();
            const sends = Array.from({ length: n }, (_, i) => {
              // The socket stops draining after `stopAfter` sends were handed over.
              if (i === stopAfter) first.transport.drainStopped = true;
              const sent = first.core.send(Buffer.from(`m${i}`));
              sent.catch(() => undefined);
              return sent;
            });
            if (stopAfter >= n) first.transport.drainStopped = true;
            await settle(() => network.activity);
            // Some frames still reach the broker and are acked; the rest wait in the socket.
            first.transport.connection?.deliver(acked);
            first.transport.connection?.confirmAll();
            await settle(() => network.activity);
            if (resumes) {
              first.transport.resumeDraining();
              await settle(() => network.activity);
            }
            if (first.transport.waitingForDrain > 0) undrained++;
            let settled = false;
            if (how === 'close') void first.core.close().then(() => (settled = true));
            else {
              network.broker.publish('orders', 'p', 1n << 40n, 'intruder');
              vi.advanceTimersByTime(100);
              void first.core.closed().then(() => (settled = true));
            }
            // Fake time past closeTimeoutMs, then counted turns: no wall-clock wait.
            vi.advanceTimersByTime(closeTimeoutMs + 1);
            for (let t = 0; t < 50 && !settled; t++) {
              await turn();
              vi.advanceTimersByTime(1);
            }
            if (!settled) {
              stuck++;
              throw new Error(
                `${how === 'close' ? 'close()' : 'the fatal error'} not settled ${closeTimeoutMs + 50} ms (fake) and 50 turns later; ` +
                  `${first.transport.waitingForDrain} publishes waiting for drain`,
              );
            }
            if (!first.transport.isClosed) throw new Error('settled with the transport open');
            const resolved = (await Promise.allSettled(sends)).flatMap((r) =>
              r.status === 'fulfilled' ? [r.value.publishingId] : [],
            );
            // The next life (the broker's last ID adopted after the intruder) re-sends the outbox.
            const stored = (): Set<bigint> =>
              new Set(
                network.broker
                  .messages('orders')
                  .flatMap((m) => (m.body === 'intruder' ? [] : [m.publishingId])),
              );
            for (const id of resolved)
              if (!stored().has(id)) throw new Error(`resolved ${id} is not in the stream`);
            if (how === 'close' && durability === 'outbox') {
              const second = await open();
              for (let round = 0; round < 200 && second.core.inFlight > 0; round++) {
                await settle(() => network.activity);
                second.transport.connection?.deliver();
                second.transport.connection?.confirmAll();
              }
              await second.core.close();
              const bodies = new Set(network.broker.messages('orders').map((m) => m.body));
              const lost = sends.map((_, i) => `m${i}`).filter((b) => !bodies.has(b));
              if (lost.length > 0) throw new Error(`not in the outbox after close(): ${lost.join(',')}`);
            }
          } finally {
            vi.useRealTimers();
          }
        },
      ),
      { numRuns: 300 },
    );
    console.log(`[close bound] ${undrained} runs closed with a publish waiting for drain; ${stuck} stuck`);
    expect(undrained, 'runs with a publish waiting for drain').toBeGreaterThan(50);
  });

  it('settlement - an outbox written with sub-entry batches and re-sent over AMQP 0-9-1 (acks per member, the channel dying anywhere): no member settles before its own ack, and nothing is lost', async () => {
    let settledTotal = 0;
    let cuts = 0;
    await assertProperty(
      'per-member acks',
      fc.asyncProperty(
        fc.integer({ min: 2, max: 4 }),
        fc.integer({ min: 1, max: 10 }),
        fc.nat({ max: 10 }),
        fc.integer({ min: 0, max: 3 }),
        fc.array(
          fc.oneof(
            { weight: 3, arbitrary: fc.record({ deliver: fc.integer({ min: 1, max: 3 }) }) },
            { weight: 3, arbitrary: fc.record({ ack: fc.nat() }) },
            { weight: 1, arbitrary: fc.record({ cut: fc.boolean() }) },
          ),
          { maxLength: 16 },
        ),
        fc.boolean(),
        async (subEntrySize, n, delivered1, newSends, steps, cutAtEnd) => {
          const network = new SimNetwork();
          const disk = memoryDisk();
          const open = async (options: Parameters<SimNetwork['transport']>[3]) => {
            const transport = network.transport('orders', 'p', {}, options);
            const core = await DedupPublisherCore.open(transport, {
              producerName: 'p',
              store: await DedupStore.wrap(new ProcessDisk(disk)),
              closeTimeoutMs: 0,
              reconnect: { initialDelayMs: 1, maxDelayMs: 1 },
            });
            return { transport, core };
          };
          // Life 1 (stream, sub-entry batches): n sends in one group commit, a prefix read by the
          // broker, nothing confirmed; closed: the outbox holds the batches.
          const first = await open({ subEntrySize });
          const sent1 = Array.from({ length: n }, (_, i) => first.core.send(Buffer.from(`a${i}`)));
          for (const p of sent1) p.catch(() => undefined);
          await settle(() => network.activity);
          first.transport.connection?.deliver(delivered1);
          await first.core.close();
          // Life 2 (AMQP 0-9-1): re-sends each member alone; acks arrive one by one; the channel dies.
          const second = await open({ reportsLastId: false, carriesBatches: false });
          const sent2 = Array.from({ length: newSends }, (_, i) => second.core.send(Buffer.from(`b${i}`)));
          for (const p of sent2) p.catch(() => undefined);
          await settle(() => network.activity);
          const initial = second.core.inFlight;
          const acked = (): number =>
            new Set(second.transport.connections.flatMap((c) => c.confirmed.map(String))).size;
          const check = (): void => {
            const settled = initial - second.core.inFlight;
            if (settled > acked()) {
              throw new Error(
                `${settled} messages settled on ${acked()} acks (${second.core.inFlight} in flight)`,
              );
            }
          };
          for (const step of steps) {
            const c = second.transport.connection;
            if ('deliver' in step) c?.deliver(step.deliver);
            else if ('ack' in step) c?.confirm(step.ack);
            else if (c?.state === 'live') {
              // The channel dies (its frames lost, or left to land late); the core reconnects.
              cuts++;
              second.transport.cut(step.cut);
              await second.transport.connectAttempt();
              second.transport.acceptConnect();
            }
            await settle(() => network.activity);
            check();
          }
          if (cutAtEnd) second.transport.cut(false);
          settledTotal += initial - second.core.inFlight;
          await second.core.close();
          // Life 3 (stream) re-sends whatever is left; everything drains.
          const third = await open({});
          for (let round = 0; round < 200 && third.core.inFlight > 0; round++) {
            await settle(() => network.activity);
            third.transport.connection?.deliver();
            third.transport.connection?.confirmAll();
          }
          await third.core.close();
          network.startBroker();
          for (let z = 0; z < 20; z++) network.deliverZombie(0);
          const stored = new Set(network.broker.messages('orders').map((m) => m.body));
          const missing = [...sent1.keys()].map((i) => `a${i}`).filter((b) => !stored.has(b));
          missing.push(...[...sent2.keys()].map((i) => `b${i}`).filter((b) => !stored.has(b)));
          if (missing.length > 0) throw new Error(`lost: ${missing.join(',')}`);
        },
      ),
      { numRuns: 300 },
    );
    console.log(`[per-member acks] ${settledTotal} settlements in life 2, ${cuts} channels cut`);
  });

  it('cap - the sub-entry cap lowered or raised between two lives: no batch leaves above the cap of the life that sends it (an outbox cut under a higher cap is refused at open(), before connecting), and nothing is lost once a life opens with a cap its outbox fits', async () => {
    let refused = 0;
    let resumed = 0;
    await assertProperty(
      'cap between lives',
      fc.asyncProperty(
        fc.integer({ min: 2, max: 5 }),
        fc.array(fc.nat({ max: 40 }), { minLength: 1, maxLength: 12 }),
        fc.integer({ min: 1, max: 1_000 }),
        fc.integer({ min: 1, max: 1_000 }),
        fc.nat({ max: 12 }),
        async (subEntrySize, sizes, cap1, cap2, delivered1) => {
          const network = new SimNetwork();
          const disk = memoryDisk();
          const open = async (maxBatchBytes: number) => {
            const transport = network.transport('orders', 'p', {}, { subEntrySize, maxBatchBytes });
            transport.connectPolicy = 'immediate';
            try {
              const core = await DedupPublisherCore.open(transport, {
                producerName: 'p',
                store: await DedupStore.wrap(new ProcessDisk(disk)),
                closeTimeoutMs: 0,
                reconnect: { initialDelayMs: 1, maxDelayMs: 1 },
              });
              return { transport, core };
            } catch (err) {
              return { transport, err };
            }
          };
          const drain = async (life: { transport: SimTransport; core: DedupPublisherCore }) => {
            for (let round = 0; round < 200 && life.core.inFlight > 0; round++) {
              await settle(() => network.activity);
              life.transport.connection?.deliver();
              life.transport.connection?.confirmAll();
            }
            await life.core.close();
            expect(life.transport.violations).toEqual([]);
          };
          // Life 1 under cap1: one group commit cut into batches, a prefix read by the broker, nothing confirmed.
          const first = await open(cap1);
          if (first.core === undefined) throw first.err;
          const bodies = sizes.map((n, i) => `${i}:`.padEnd(n + 2, 'x'));
          for (const b of bodies) first.core.send(Buffer.from(b)).catch(() => undefined);
          await settle(() => network.activity);
          first.transport.connection?.deliver(delivered1);
          await first.core.close();
          expect(first.transport.violations).toEqual([]);
          // Life 2 under cap2: refused before connecting, or everything re-sent within cap2.
          const second = await open(cap2);
          if (second.core === undefined) {
            refused++;
            expect(second.err).toBeInstanceOf(DedupError);
            expect((second.err as DedupError).code).toBe('DEDUP_UNSAFE_OPTIONS');
            expect(second.transport.connects).toBe(0);
            // The operator raises the cap back for one life.
            const raised = await open(cap1);
            if (raised.core === undefined) throw raised.err;
            await drain(raised);
          } else {
            resumed++;
            await drain(second);
          }
          // The outbox is empty: a life under cap2 opens.
          const third = await open(cap2);
          if (third.core === undefined) throw third.err;
          await drain(third);
          network.startBroker();
          for (let z = 0; z < 20; z++) network.deliverZombie(0);
          const stored = network.broker.messages('orders').map((m) => m.body);
          expect([...new Set(stored)].sort()).toEqual([...bodies].sort());
          expect(stored.length).toBe(bodies.length);
        },
      ),
      { numRuns: 300 },
    );
    console.log(`[cap between lives] ${refused} opens refused, ${resumed} resumed`);
  });

  it('time - aborting k of n parked sends costs O(n + k) queue operations (counted, not timed), with one shared signal or one signal per send, sends in between; one listener per signal, and the survivors take consecutive IDs in send order', async () => {
    // Counted: every parked entry the send queue visits or moves (SendQueue.work). A splice and a
    // renumbering per abort (the code before issue 32, item 9) costs about k·n/2, and so does a
    // compaction per abort when each send has its own signal (AbortSignal.timeout per send).
    let largest = 0;
    let ownAborts = 0;
    /** Runs that left aborted sends in the queue (the case F3 is about). */
    let lazyRuns = 0;
    await assertProperty(
      'abort cost',
      fc.asyncProperty(
        fc.integer({ min: 1, max: 4 }),
        // Per send: which signal it waits on (0: none, 1: the shared aborted one, 2: another that
        // is never aborted, 3: its own, aborted on its own).
        fc.array(fc.constantFrom(0, 1, 1, 1, 2, 3, 3, 3), { minLength: 1, maxLength: 400, size: 'max' }),
        fc.constantFrom<ProducerIdMode>('auto', 'keyed'),
        // The order of the own-signal aborts, and after which of them a new send (no signal) comes.
        fc.array(fc.nat(), { maxLength: 400 }),
        fc.array(fc.boolean(), { maxLength: 400 }),
        // Where among the own-signal aborts the shared signal aborts.
        fc.nat(),
        async (maxInFlight, signals, idMode, order, sendAfter, sharedAt) => {
          const network = new SimNetwork();
          const transport = network.transport('orders', 'p');
          transport.connectPolicy = 'immediate';
          const core = await DedupPublisherCore.open(transport, {
            producerName: 'p',
            store: await DedupStore.wrap(new ProcessDisk(memoryDisk())),
            maxInFlight,
            idMode,
          });
          const aborted = new AbortController();
          const other = new AbortController();
          const own: AbortController[] = [];
          const bodies: string[] = [];
          const sends: Promise<SendResult>[] = [];
          const send = (name: string, signal: AbortSignal | undefined): void => {
            const sent = core.send(
              Buffer.from(name),
              idMode === 'keyed' ? { key: `k-${name}`, signal } : { signal },
            );
            sent.catch(() => undefined);
            bodies.push(name);
            sends.push(sent);
          };
          signals.forEach((s, i) => {
            let signal: AbortSignal | undefined;
            if (s === 1) signal = aborted.signal;
            else if (s === 2) signal = other.signal;
            else if (s === 3) own.push(new AbortController());
            send(`m${i}`, s === 3 ? own[own.length - 1]!.signal : signal);
          });
          const listeners = getEventListeners(aborted.signal, 'abort').length;
          if (signals.includes(1) && listeners !== 1) throw new Error(`${listeners} listeners on one signal`);
          let parked = Math.max(0, signals.length - maxInFlight);
          const k = signals.filter((s) => s === 1 || s === 3).length;
          const ownOrder = own
            .map((c, i) => ({ c, key: order[i] ?? i }))
            .sort((a, b) => a.key - b.key)
            .map((x) => x.c);
          const before = core.queueWork;
          const sharedTurn = sharedAt % (ownOrder.length + 1);
          for (let j = 0; j <= ownOrder.length; j++) {
            if (j === sharedTurn) {
              aborted.abort();
              await Promise.resolve();
            }
            if (j === ownOrder.length) break;
            ownOrder[j]!.abort();
            ownAborts++;
            await Promise.resolve();
            if (sendAfter[j] === true) {
              send(`l${j}`, undefined);
              parked++;
            }
          }
          const work = core.queueWork - before;
          largest = Math.max(largest, work);
          if (work > parked + k)
            throw new Error(`${work} queue operations to abort ${k} of ${parked} parked sends`);
          // Aborted sends left in the queue (lazy deletion) hold no body nor headers (review A, F3).
          const left = core.abortedParked();
          if (left.entries > 0) lazyRuns++;
          expect(left.bytes).toBe(0);
          // Everything else goes out; the stream holds IDs 1..m without a hole, in send order.
          for (let round = 0; round < 1_000; round++) {
            await settle(() => network.activity);
            if (core.inFlight === 0) break;
            transport.connection!.deliver();
            transport.connection!.confirmAll();
          }
          const results = await Promise.allSettled(sends);
          const stored = network.broker.messages('orders');
          await core.close();
          expect(stored.map((m) => m.publishingId)).toEqual(stored.map((_, i) => BigInt(i + 1)));
          const resolved = results.flatMap((r, i) =>
            r.status === 'fulfilled' ? [{ id: r.value.publishingId, body: bodies[i]! }] : [],
          );
          // Each resolved send's ID holds its own body, and the stream keeps the order of the sends.
          for (const { id, body } of resolved) expect(stored[Number(id) - 1]?.body).toBe(body);
          const positions = stored.map((m) => bodies.indexOf(m.body));
          expect(positions).toEqual([...positions].sort((a, b) => a - b));
        },
      ),
      { numRuns: 200 },
    );
    console.log(
      `[abort cost] largest count ${largest}, ${ownAborts} own-signal aborts, ${lazyRuns} runs left aborted sends parked`,
    );
  });
});
