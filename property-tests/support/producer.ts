import { DedupError, type DedupErrorCode } from '../../src/errors.js';
import { ID_HEADER, PRODUCER_HEADER } from '../../src/identity/headers.js';
import { DedupPublisherCore } from '../../src/publisher/core.js';
import type {
  DedupPublisherOptions,
  Durability,
  SendOptions,
  SendResult,
} from '../../src/publisher/types.js';
import { DedupStore } from '../../src/store/store.js';
import { memoryDisk } from '../../test/support/memory-store.js';
import {
  ProcessDisk,
  restoreDisk,
  snapshotDisk,
  type DiskSnapshot,
  type ProcessDiskOptions,
} from './disk.js';
import type { ConnectionHooks, SimNetwork, SimTransport } from './network.js';
import { realDelay, within } from './turns.js';

/**
 * Wall-clock bound of the model's liveness waits (a close, a reconnect): the cores run on fake
 * time, so these only catch a hang. 2 s was exceeded once by a healthy close on a 2-core machine
 * at load 10 (the whole property project beside an integration run): a hang still fails, later.
 */
const WALL_LIMIT_MS = 10_000;

/** How a producer's publishing IDs are chosen. */
export type ProducerIdMode = 'auto' | 'explicit' | 'keyed';

/** One logical producer: a name on a stream, and how it publishes. */
export interface ProducerSpec {
  readonly stream: string;
  readonly producerName: string;
  /** The durability of every life, unless `start()` is given another (a switch between opens). */
  readonly durability: Durability;
  readonly idMode: ProducerIdMode;
  readonly maxBatch?: number;
  readonly maxInFlight?: number;
  /** @defaultValue 0 (close rejects what is unconfirmed at once) */
  readonly closeTimeoutMs?: number;
  readonly onBrokerAhead?: 'error' | 'adopt';
  /** @defaultValue 30 000 (a test advancing fake timers makes confirms time out) */
  readonly confirmTimeoutMs?: number;
  /** Whether the transport reports the broker's last publishing ID (AMQP 0-9-1 cannot). @defaultValue true */
  readonly reportsLastId?: boolean;
  /** The stream transport's `subEntry.size` (1: off). @defaultValue 1 */
  readonly subEntrySize?: number;
  /**
   * Check on the wire that no more than maxInFlight IDs of one life are unconfirmed at once
   * ({@link SimTransport.violations}). @defaultValue false
   */
  readonly checkInFlightOnWire?: boolean;
  /**
   * Allow the messages an open recovers from the outbox on the wire on top of maxInFlight (a model
   * that tolerates that known fault while it looks further). @defaultValue false
   */
  readonly tolerateOutboxBurst?: boolean;
  /** Do not report a closed core's store calls after `close()` resolved (debugging only). @defaultValue false */
  readonly tolerateWriteAfterClose?: boolean;
  /**
   * Keyed mode, reserve durability: let a key be in the stream twice when the life that first sent
   * it ended with its frames still on the way (crash, close) — a frame landing after the next
   * open() forgot the key (debugging only). @defaultValue false
   */
  readonly tolerateKeyedLateFrames?: boolean;
  /**
   * Keyed mode: a key whose record came back with a restored store may be answered 'duplicate'
   * without being in the stream (debugging only). @defaultValue false
   */
  readonly tolerateKeyedRestoredRecords?: boolean;
  /**
   * Keyed mode: `keyRetention.maxKeys` (the age limit is a year: fake time never reaches it). A
   * repeat past it is published again. @defaultValue the library's (100 000)
   */
  readonly keyRetentionMaxKeys?: number;
}

/** What a send passes as headers: none, a fresh object, or one object shared and mutated between sends. */
export type HeadersMode = 'none' | 'own' | 'shared';

/** Options of one process life. */
export interface StartOptions {
  readonly disk?: ProcessDiskOptions;
  readonly hooks?: ConnectionHooks;
  /** This life's durability (default: the spec's). */
  readonly durability?: Durability;
  /** This life's sub-entry batch size (default: the spec's). */
  readonly subEntrySize?: number;
  /** The disk holds every batch from the start (open's own writes included) until released. */
  readonly slowDisk?: boolean;
  /**
   * This life goes over AMQP 0-9-1: no last ID from the broker, no sub-entries, every member of a
   * batch an earlier life recorded re-sent and acked alone (default: the spec's transport).
   */
  readonly amqp?: boolean;
}

/** Options of a {@link ProducerHarness}. */
export interface HarnessOptions {
  readonly disk?: ProcessDiskOptions;
  readonly hooks?: ConnectionHooks;
  /**
   * Advances the cores' clock by `ms` (fake timers), so that a waiting reconnect's back-off ends.
   * Without it the harness waits in wall time.
   */
  readonly advance?: (ms: number) => void;
}

/** One process life of a producer. */
export interface ProducerLife {
  readonly index: number;
  readonly disk: ProcessDisk;
  readonly transport: SimTransport;
  readonly core: DedupPublisherCore;
  readonly durability: Durability;
  /** Sends of this life whose promise has not settled. */
  unsettled: number;
  /** Set by a crash: nothing this life's core does afterwards is seen by anyone. */
  crashed: boolean;
  /** Set once `close()` was called in this life. */
  closing: boolean;
  /** Resolves when this life's `close()` has. */
  closed?: Promise<void>;
  /** Set once `close()` resolved. */
  closeResolved: boolean;
  /** Set once the core's `closed()` resolved (after close(), or a fatal error). */
  coreClosed: boolean;
  /** Sends still unsettled when `close()` resolved (-1 before). */
  unsettledAtClose: number;
  /** No `send()` yet in this life (an application replays its source first). */
  fresh: boolean;
  /** Send calls made in this life (the last one's number). */
  calls: number;
  /** The number of this life's last call that sent a new message (not a replay, retry or repeat). */
  lastNew: number;
  /** Abort controllers of this life's sends that have not settled. */
  readonly controllers: Set<AbortController>;
  /** A store write of this life was made to fail: the publisher may stop, and the process exits. */
  diskFull: boolean;
  /** That write failed: the publisher stops (or closes) on its own; nothing of it is expected now. */
  stopping: boolean;
}

/** A process life between `start()` and the end of its `open()`. */
interface Opening {
  disk: ProcessDisk | undefined;
  transport: SimTransport | undefined;
  crashed: boolean;
}

/** One `send()` call of the application. */
interface SendCall {
  /** The logical message: its label (auto, explicit), or its key (keyed). */
  readonly label: string;
  readonly body: string;
  readonly publishingId?: bigint | undefined;
  readonly key?: string | undefined;
  readonly headers?: Record<string, string | number> | undefined;
  readonly controller?: AbortController | undefined;
  readonly kind: 'new' | 'replay' | 'retry' | 'repeat';
}

/** A year: a key retention's age limit that fake time never reaches. */
const YEAR_MS = 365 * 24 * 3_600_000;

/** What the application knows of an aborted explicit-ID send. */
interface AbortInfo {
  readonly life: number;
  /** The send call's number in its life. */
  readonly call: number;
  /** It certainly waited for room when it was aborted (parked at send(), aborted in the same tick). */
  readonly waited: boolean;
}

/** One resolved send. */
export interface Ack {
  readonly label: string;
  readonly publishingId: bigint;
  readonly outcome: SendResult['outcome'];
}

/** A message of a store's outbox at an adopting `open()`: it must reach the stream above `above`. */
export interface AdoptObligation {
  readonly label: string;
  readonly above: bigint;
}

/** Header names the library reserves for its own stamps and declarations. */
const RESERVED_PREFIX = 'x-dedup-';

/** The headers as a frame must carry them: the caller's names and values, order aside. */
function canonical(headers: Readonly<Record<string, string | number>> | undefined): string {
  if (headers === undefined) return '[]';
  return JSON.stringify(Object.entries(headers).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)));
}

/**
 * A crashable producer process over a memory-level "disk" that outlives it. Each life opens a
 * {@link DedupPublisherCore} over a fresh {@link ProcessDisk} and {@link SimTransport}; a crash
 * abandons the core without closing it (its disk and transport go dead, so it can neither write
 * nor hear confirms). Records the history the checker needs: every label attempted, every label
 * whose `send()` resolved (with the ID it resolved with), and every unexpected rejection.
 *
 * The application behind it: with explicit IDs it numbers messages from a source and, first thing
 * in every life, replays what was not confirmed, with the same IDs; with domain keys it re-sends
 * every key not confirmed, first thing in every life, and repeats keys at will. It may pass abort
 * signals, and headers objects it reuses and mutates between sends.
 */
export class ProducerHarness {
  readonly spec: ProducerSpec;
  readonly disk = memoryDisk();
  life: ProducerLife | undefined;
  lives = 0;
  /** Every life, in order. */
  readonly history: ProducerLife[] = [];
  /** Labels (keys in keyed mode) of every send attempted. */
  readonly attempted = new Set<string>();
  /** Label → the publishing ID its last resolved `send()` gave. */
  readonly acknowledged = new Map<string, bigint>();
  /** Every resolved send, in order. */
  readonly acks: Ack[] = [];
  /**
   * Keyed: each call by its body (unique per call, so each copy in the stream maps to its call):
   * the core's last ID at the call (what its retention counted from), and whether it certainly
   * never left (aborted in the tick it was made, waiting for room, no repeat waiting on it).
   */
  readonly keyedCalls = new Map<string, { readonly lastAtCall: bigint; neverWritten: boolean }>();
  /**
   * Explicit-mode labels replayed after a crash and refused with `DEDUP_ID_REGRESSION`: they must
   * end up in the stream. In outbox durability their ID is at or below the store's last ID, so the
   * outbox holds them; in reserve durability it is at or below the broker's last ID, and a broker
   * stores one producer's IDs in the order they were sent, so it holds them.
   */
  readonly mustBePresent = new Set<string>();
  /** Explicit mode: the ID the application's source gave each label. */
  readonly explicitIds = new Map<string, bigint>();
  /** Labels the application gave up on (an aborted explicit ID refused on re-send): no promise. */
  readonly givenUp = new Set<string>();
  /** Labels that may be in the stream more than once: re-sent under new IDs by an adopting open, or keys whose record a restored store lost. */
  readonly mayDuplicate = new Set<string>();
  /** Keys whose record a restored store lost: a `duplicate` outcome may name another copy's ID. */
  readonly looseIds = new Set<string>();
  /** Keys that may be missing although acknowledged (see {@link ProducerSpec.tolerateKeyedRestoredRecords}). */
  readonly mayBeLost = new Set<string>();
  /** Outbox messages an adopting `open()` promised to re-send above the broker's ID. */
  readonly adoptObligations: AdoptObligation[] = [];
  /** Body → its headers at the `send()` call, as every frame carrying the body must show them. */
  readonly expectedHeaders = new Map<string, string>();
  readonly violations: string[] = [];
  readonly rejections = new Map<DedupErrorCode | 'other', number>();
  /** Label → the code its last `send()` was rejected with (seen by a living process). */
  readonly rejected = new Map<string, DedupErrorCode | 'other'>();
  /** Refusals at open() the model expects, by code (counted). */
  readonly expectedRefusals = new Map<string, number>();
  /** Opens that went through `onBrokerAhead: 'adopt'` with a broker ahead. */
  adoptions = 0;
  /** Of those, opens whose outbox held more messages than maxBatch (one store write must take them all). */
  largeAdoptions = 0;
  /** Backups of the disk (`backup()`), oldest first, with the store's last ID and outbox size then. */
  readonly backups: Array<{
    readonly snapshot: DiskSnapshot;
    readonly localLast: bigint;
    readonly outbox: number;
  }> = [];
  /**
   * Backups below this index are superseded: taken before the store was last replaced, with a
   * process started on the replacement since. That store may have assigned the same IDs to other
   * messages (a lost store's successor adopts the broker's last ID); restoring such a backup makes
   * two histories for one name, which the broker's single last ID cannot always tell apart (README,
   * "Where highest sequence wins is unsafe"; demonstrated in test/publisher/unsafe-restore.test.ts).
   */
  #backupFloor = 0;
  /** Index in `backups` where the current store began (its last replacement). */
  #storeBegan = 0;
  /** A process was started on the current store since it replaced the previous one. */
  #startedOnStore = false;
  /**
   * Bumped when the store is lost or restored: the sub-entry batches a store recorded are rebuilt
   * by the lives on that store only (docs/design.md §5 lists what a replaced store does).
   */
  #storeEpoch = 0;
  /** Settled sends (progress detection). */
  settled = 0;
  /** The life being opened, until its `open()` settles. */
  opening: Opening | undefined;
  /** Settles when the last `beginStart()` has (never, if that process crashed while opening). */
  opened: Promise<DedupError | undefined> = Promise.resolve(undefined);
  readonly #network: SimNetwork;
  readonly #diskOptions: ProcessDiskOptions;
  readonly #hooks: ConnectionHooks;
  readonly #advance: (ms: number) => void;
  readonly #labelLife = new Map<string, number>();
  readonly #headerSnapshots = new Map<string, Record<string, string | number>>();
  readonly #abortInfo = new Map<string, AbortInfo>();
  /** Keyed mode: every key, in creation order. */
  readonly #keys: string[] = [];
  #nextLabel = 0;
  #nextBody = 0;
  #source = 0n;

  constructor(network: SimNetwork, spec: ProducerSpec, options: HarnessOptions = {}) {
    this.#network = network;
    this.spec = spec;
    this.#diskOptions = options.disk ?? {};
    this.#hooks = options.hooks ?? {};
    this.#advance = options.advance ?? (() => undefined);
  }

  get isRunning(): boolean {
    return this.life !== undefined;
  }

  get isOpening(): boolean {
    return this.opening !== undefined;
  }

  /** The core is connected: its connection is live and it is not reconnecting (waiting in `connect()`). */
  get isConnected(): boolean {
    return this.isLinked && this.life?.transport.hasPendingConnect !== true;
  }

  /** The life's last connection is live (frames and confirms can still flow on it). */
  get isLinked(): boolean {
    return this.life?.transport.connection?.state === 'live';
  }

  /** Progress counter for `settle()`. */
  progress(): number {
    return (this.life?.disk.calls ?? 0) + (this.opening?.disk?.calls ?? 0) + this.settled;
  }

  /** The logical message a stored body belongs to (keyed bodies are `key#call`). */
  labelOf(body: string): string {
    if (this.spec.idMode !== 'keyed') return body;
    const i = body.lastIndexOf('#');
    return i < 0 ? body : body.slice(0, i);
  }

  options(
    store: DedupStore,
    durability: Durability = this.spec.durability,
    onBrokerAhead = this.spec.onBrokerAhead ?? 'error',
  ): DedupPublisherOptions {
    return {
      producerName: this.spec.producerName,
      store,
      durability,
      idMode: this.spec.idMode,
      maxBatch: this.spec.maxBatch ?? 2_000,
      maxInFlight: this.spec.maxInFlight ?? 10_000,
      closeTimeoutMs: this.spec.closeTimeoutMs ?? 0,
      onBrokerAhead,
      confirmTimeoutMs: this.spec.confirmTimeoutMs ?? 30_000,
      reconnect: { initialDelayMs: 1, maxDelayMs: 2 },
      ...(this.spec.keyRetentionMaxKeys === undefined
        ? {}
        : { keyRetention: { maxKeys: this.spec.keyRetentionMaxKeys, maxAgeMs: YEAR_MS } }),
    };
  }

  /**
   * Starts a process life and waits for its `open()`. While the broker is down `open()` must fail
   * with `DEDUP_BROKER_UNREACHABLE` and the producer stays down; any other failure is returned.
   */
  start(overrides: StartOptions = {}): Promise<DedupError | undefined> {
    return this.beginStart(overrides);
  }

  /**
   * Starts a process life; the returned promise settles when its `open()` does (never, if the
   * process crashes while opening). Refusals the model expects are answered as an operator would:
   * `DEDUP_SEQUENCE_REGRESSION` after the store was lost or restored → reopen with
   * `onBrokerAhead: 'adopt'`; `DEDUP_UNSAFE_OPTIONS` for reserve durability on a transport that
   * cannot report the broker's last ID → reopen with `durability: 'outbox'`.
   */
  beginStart(overrides: StartOptions = {}): Promise<DedupError | undefined> {
    if (this.life !== undefined || this.opening !== undefined) throw new Error('already running');
    const opening: Opening = { disk: undefined, transport: undefined, crashed: false };
    this.opening = opening;
    this.#startedOnStore = true;
    const done = this.#open(overrides, opening).then(
      (result) => {
        if (this.opening === opening) this.opening = undefined;
        this.settled++;
        return result;
      },
      (err: unknown) => {
        if (this.opening === opening) this.opening = undefined;
        this.settled++;
        this.violations.push(`open: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}`);
        return undefined;
      },
    );
    this.opened = done;
    return done;
  }

  /** What the store and the broker hold before an open (read as an operator's tool would). */
  async #inspect(): Promise<{
    localLast: bigint;
    outbox: string[];
    brokerLast: bigint;
    explicitMax: bigint;
  }> {
    const store = await DedupStore.wrap(new ProcessDisk(this.disk));
    const state = store.claimProducer(this.spec.stream, this.spec.producerName);
    try {
      const { meta, segments } = await state.load();
      const localLast =
        meta === undefined ? 0n : meta.lastId > meta.reservedUpTo ? meta.lastId : meta.reservedUpTo;
      const entries = segments.flatMap((s) => s.entries);
      return {
        localLast,
        outbox: entries.map((e) => this.labelOf(Buffer.from(e.body).toString())),
        brokerLast: this.#network.broker.lastId(this.spec.stream, this.spec.producerName),
        explicitMax: entries.reduce((m, e) => (e.publishingId > m ? e.publishingId : m), 0n),
      };
    } finally {
      state.release();
    }
  }

  async #open(o: StartOptions, opening: Opening): Promise<DedupError | undefined> {
    const amqp = o.amqp === true;
    const reportsLastId = !amqp && (this.spec.reportsLastId ?? true);
    let durability = o.durability ?? this.spec.durability;
    const subEntrySize = amqp ? 1 : (o.subEntrySize ?? this.spec.subEntrySize ?? 1);
    let onBrokerAhead = this.spec.onBrokerAhead ?? 'error';
    for (let attempt = 0; ; attempt++) {
      // Refusals in turn: unsafe options, the broker ahead, an explicit outbox to start over.
      if (attempt > 3) throw new Error('open() refused four times');
      const pre = await this.#inspect();
      if (opening.crashed) return undefined;
      const brokerAhead = reportsLastId && pre.brokerLast > pre.localLast;
      // Refused at open() with DEDUP_UNSAFE_OPTIONS: keyed IDs without an outbox on any transport;
      // explicit IDs without an outbox where the broker cannot report its last ID.
      // Sub-entry batches with explicit IDs without an outbox, too (docs/design.md §10).
      const unsafe =
        durability === 'reserve' &&
        (this.spec.idMode === 'keyed' ||
          (this.spec.idMode === 'explicit' && (!reportsLastId || subEntrySize > 1)));
      const disk = new ProcessDisk(this.disk, o.disk ?? this.#diskOptions);
      if (o.slowDisk === true) disk.hold();
      const transport = this.#network.transport(
        this.spec.stream,
        this.spec.producerName,
        o.hooks ?? this.#hooks,
        {
          reportsLastId,
          subEntrySize,
          carriesBatches: !amqp,
          storeEpoch: this.#storeEpoch,
          // maxInFlight bounds sends; an open re-sends the outbox it recovers at once, whatever
          // its size (close() commits every waiting send to it), as the README says.
          maxUnconfirmed:
            this.spec.checkInFlightOnWire === true
              ? (this.spec.maxInFlight ?? 10_000) + pre.outbox.length
              : Number.POSITIVE_INFINITY,
        },
      );
      opening.disk = disk;
      opening.transport = transport;
      // Explicit IDs in the outbox cannot take new IDs (the source means those for other records):
      // open() refuses to adopt them.
      const explicitOutbox = this.spec.idMode === 'explicit' && pre.outbox.length > 0;
      if (brokerAhead && onBrokerAhead === 'adopt' && !unsafe && !explicitOutbox) {
        // The outbox goes out again under new IDs above the broker's, whatever happens to this open.
        this.adoptions++;
        if (pre.outbox.length > (this.spec.maxBatch ?? 2_000)) this.largeAdoptions++;
        for (const label of pre.outbox) {
          this.mayDuplicate.add(label);
          this.adoptObligations.push({ label, above: pre.brokerLast });
        }
      }
      const store = await DedupStore.wrap(disk);
      let core: DedupPublisherCore;
      try {
        core = await DedupPublisherCore.open(transport, this.options(store, durability, onBrokerAhead));
      } catch (err) {
        if (opening.crashed) return undefined;
        if (!(err instanceof DedupError)) throw err;
        const code: string = err.code;
        const count = (c: string) => this.expectedRefusals.set(c, (this.expectedRefusals.get(c) ?? 0) + 1);
        if (code === 'DEDUP_BROKER_UNREACHABLE' && !this.#network.brokerUp) return err;
        if (code === 'DEDUP_UNSAFE_OPTIONS' && unsafe) {
          count(code);
          durability = 'outbox'; // the operator picks the durability this transport can make safe
          continue;
        }
        if (code === 'DEDUP_SEQUENCE_REGRESSION' && brokerAhead && onBrokerAhead === 'error' && !unsafe) {
          count(code);
          onBrokerAhead = 'adopt'; // the operator has checked: the store was lost or restored
          continue;
        }
        if (
          code === 'DEDUP_SEQUENCE_REGRESSION' &&
          brokerAhead &&
          onBrokerAhead === 'adopt' &&
          explicitOutbox
        ) {
          count(`${code} (explicit outbox)`);
          // The operator starts the store over; the source replays what it has not seen confirmed.
          await this.#replaceStore([]);
          this.#startedOnStore = true; // this process goes on to open the new store
          continue;
        }
        this.violations.push(
          `open (${durability}, onBrokerAhead ${onBrokerAhead}, store ${pre.localLast}, broker ${pre.brokerLast}): ` +
            `${code} ${err.message}`,
        );
        return err;
      }
      if (opening.crashed) return undefined; // a dead process learns nothing
      if (unsafe) {
        this.violations.push(
          `open() accepted idMode '${this.spec.idMode}' with durability 'reserve'${
            this.spec.idMode === 'keyed' ? '' : " on a transport that cannot report the broker's last ID"
          }`,
        );
      }
      if (brokerAhead && onBrokerAhead === 'error') {
        this.violations.push(
          `open() accepted a broker ahead of the store (${pre.brokerLast} > ${pre.localLast}) with onBrokerAhead 'error'`,
        );
      }
      if (this.spec.idMode === 'explicit') this.#checkResume(core, pre, brokerAhead);
      this.#begin(core, disk, transport, durability);
      return undefined;
    }
  }

  /**
   * Explicit IDs: `lastPublishingId` after open is where the source resumes. It is never below the
   * broker's last ID (the source would re-send IDs the broker drops), and never above the highest ID
   * the source ever gave (it would skip records: the reserved ceiling is not a resume point) —
   * unless an adopting open re-sent the outbox under new IDs above the broker's.
   */
  #checkResume(
    core: DedupPublisherCore,
    pre: { brokerLast: bigint; explicitMax: bigint },
    brokerAhead: boolean,
  ): void {
    const resume = core.lastPublishingId;
    const reported = core.report.brokerLastId;
    if (!brokerAhead) {
      if (reported !== undefined && resume < pre.brokerLast) {
        this.violations.push(
          `explicit ids: lastPublishingId ${resume} after open is below the broker's ${pre.brokerLast}`,
        );
      }
      if (resume > this.#source) {
        this.violations.push(
          `explicit ids: lastPublishingId ${resume} after open is above every id the source gave (${this.#source}); ` +
            `the source would skip records`,
        );
      }
    }
    if (resume > this.#source) this.#source = resume;
  }

  #begin(core: DedupPublisherCore, disk: ProcessDisk, transport: SimTransport, durability: Durability): void {
    this.lives++;
    const life: ProducerLife = {
      index: this.lives,
      disk,
      transport,
      core,
      durability,
      unsettled: 0,
      crashed: false,
      closing: false,
      closeResolved: false,
      coreClosed: false,
      unsettledAtClose: -1,
      fresh: true,
      calls: 0,
      lastNew: 0,
      controllers: new Set(),
      diskFull: false,
      stopping: false,
    };
    void core.closed().then((err) => {
      life.coreClosed = true;
      this.settled++;
      // Nothing in this world is a reason to stop for good (no other writer, the broker comes back).
      if (err !== undefined && !life.crashed) {
        // A failed store write is: the publisher stops, and the process exits once it has closed
        // (the application starts the next life).
        if (life.diskFull && err.code.startsWith('DEDUP_STORE')) {
          if (this.life === life) this.life = undefined;
          return;
        }
        this.violations.push(`life ${life.index} closed itself: ${err.code} ${err.message}`);
      }
    });
    this.life = life;
    this.history.push(life);
    // On startup the application first re-sends what it had not seen confirmed.
    this.replay();
  }

  /** A new label (auto, explicit) or key (keyed). */
  #newLabel(): string {
    const n = ++this.#nextLabel;
    return this.spec.idMode === 'keyed'
      ? `${this.spec.stream}/${this.spec.producerName}/k${n}`
      : `${this.spec.stream}/${this.spec.producerName}/${n}`;
  }

  /** A call's body: the label, or in keyed mode `key#call` (each keyed call carries its own body). */
  #bodyFor(label: string): string {
    return this.spec.idMode === 'keyed' ? `${label}#${++this.#nextBody}` : label;
  }

  /** Headers for the `i`-th send of a command; a shared object is mutated before each send. */
  #headersFor(mode: HeadersMode, i: number, shared: Record<string, string | number>) {
    if (mode === 'none') return undefined;
    if (mode === 'own') return { kind: 'own', n: i + 1 };
    shared.seq = i + 1;
    if (i % 2 === 0) shared.tag = `t${i}`;
    else delete shared.tag;
    return shared;
  }

  /** After the last send of a command returned, the application keeps writing to its shared object. */
  #scribble(shared: Record<string, string | number>): void {
    shared.seq = 999;
    shared.late = 'after send()';
    shared[ID_HEADER] = '424242';
    shared[PRODUCER_HEADER] = 'forged';
  }

  /**
   * Sends `count` new messages (labels unique across lives; keyed: new keys); explicit IDs step by
   * `gap`. `headers`: none, a fresh object per send, or one object mutated between the sends.
   */
  send(count: number, gap = 1, headers: HeadersMode = 'none'): void {
    const shared: Record<string, string | number> = { app: 'shared' };
    for (let i = 0; i < count; i++) {
      const label = this.#newLabel();
      this.#send(this.#newCall(label, gap, this.#headersFor(headers, i, shared), 'new'));
    }
    if (headers === 'shared') this.#scribble(shared);
  }

  #newCall(
    label: string,
    gap: number,
    headers: Record<string, string | number> | undefined,
    kind: SendCall['kind'],
    controller?: AbortController,
  ): SendCall {
    this.attempted.add(label);
    if (this.spec.idMode === 'keyed') this.#keys.push(label);
    let publishingId: bigint | undefined;
    if (this.spec.idMode === 'explicit') {
      this.#source += BigInt(Math.max(1, gap));
      publishingId = this.#source;
      this.explicitIds.set(label, publishingId);
    }
    if (headers !== undefined) this.#headerSnapshots.set(label, { ...headers });
    return {
      label,
      body: this.#bodyFor(label),
      publishingId,
      key: this.spec.idMode === 'keyed' ? label : undefined,
      headers,
      controller,
      kind,
    };
  }

  /**
   * Sends `count` new messages, each with its own abort signal; `abortNow` aborts them all in the
   * same tick (those that waited for room then never reach the store or the wire). Keyed: each key
   * is repeated at once without a signal (`withRepeats`): the repeat waits on the first send, and
   * must be published even if the first sender gives up. Keyed, `retryBefore`: then the key sent
   * last before them again, under a signal of its own aborted with theirs (a request with a deadline
   * that also retries a recent key: past a small retention it takes the key over from a first send
   * still waiting, and the abort gives it back).
   */
  sendAbortable(
    count: number,
    gap: number,
    abortNow: boolean,
    withRepeats: boolean,
    headers: HeadersMode,
    retryBefore = false,
  ): void {
    const life = this.life;
    if (life === undefined) return;
    const before = this.#keys[this.#keys.length - 1];
    const full = (): boolean => life.core.inFlight >= (this.spec.maxInFlight ?? 10_000);
    /** Bodies of this command's calls that waited for room when made. */
    const parked: string[] = [];
    const shared: Record<string, string | number> = { app: 'shared' };
    const controllers: AbortController[] = [];
    const labels: Array<{ label: string; waited: boolean; call: number }> = [];
    for (let i = 0; i < count; i++) {
      const label = this.#newLabel();
      const controller = new AbortController();
      // It waits for room if the core is full when it arrives; aborted in this tick, it still waits.
      const waited = full();
      const call = this.#newCall(label, gap, this.#headersFor(headers, i, shared), 'new', controller);
      this.#send(call);
      if (waited) parked.push(call.body);
      controllers.push(controller);
      labels.push({ label, waited, call: life.calls });
    }
    if (withRepeats && this.spec.idMode === 'keyed') {
      for (const { label } of labels) this.#send(this.#repeatCall(label));
    }
    if (retryBefore && before !== undefined && this.spec.idMode === 'keyed') {
      const controller = new AbortController();
      const waited = full();
      const call = this.#repeatCall(before, controller);
      this.#send(call);
      controllers.push(controller);
      // Inside the retention it waits on the first send instead, never written itself either way.
      if (waited) parked.push(call.body);
    }
    if (headers === 'shared') this.#scribble(shared);
    for (const { label, waited, call } of labels) {
      this.#abortInfo.set(label, { life: life.index, call, waited: waited && abortNow });
    }
    if (abortNow) for (const c of controllers) c.abort(new Error('the application gave up'));
    // Aborted while they waited for room, with no repeat waiting on them: never written, never sent.
    if (abortNow && !withRepeats) {
      for (const b of parked) {
        const info = this.keyedCalls.get(b);
        if (info !== undefined) info.neverWritten = true;
      }
    }
  }

  /** Aborts every signal of this life's sends that have not settled. */
  abortAll(): number {
    const life = this.life;
    if (life === undefined) return 0;
    const all = [...life.controllers];
    for (const c of all) c.abort(new Error('the application gave up'));
    return all.length;
  }

  /**
   * Keyed: re-sends `count` known keys from `index` on (acknowledged or not; a negative index
   * counts from the newest key), without a signal or each with its own (`abortable`:
   * {@link abortAll} may abort them, a repeat that took its key over from a send still waiting
   * included).
   */
  repeat(index: number, count: number, abortable = false): void {
    if (this.spec.idMode !== 'keyed' || this.#keys.length === 0 || this.life === undefined) return;
    const n = this.#keys.length;
    const from = index < 0 ? Math.max(0, n + index) : index;
    for (let i = 0; i < count && i < n; i++) {
      const key = this.#keys[(from + i) % n]!;
      this.#send(this.#repeatCall(key, abortable ? new AbortController() : undefined));
    }
  }

  #repeatCall(key: string, controller?: AbortController): SendCall {
    return { label: key, body: this.#bodyFor(key), key, kind: 'repeat', controller };
  }

  /**
   * Explicit IDs: re-sends, with its ID, this life's aborted send whose ID is the highest the source
   * gave (the others: the application gives up on them). When it certainly waited for room (never
   * written or sent) and was the last one accepted, the library rolls its last accepted ID back:
   * the re-send must be accepted. Otherwise a `DEDUP_ID_REGRESSION` is fine, and the application
   * gives up on the label.
   */
  retryAborted(): number {
    const life = this.life;
    if (life === undefined || this.spec.idMode !== 'explicit') return 0;
    const labels = [...this.#abortInfo.entries()]
      .filter(
        ([label, info]) =>
          info.life === life.index &&
          this.rejected.get(label) === 'DEDUP_ABORTED' &&
          !this.acknowledged.has(label) &&
          !this.givenUp.has(label),
      )
      .map(([label]) => label)
      .filter((label) => this.#mayResend(label));
    for (const label of labels) this.#send(this.#retryCall(label, 'retry'));
    return labels.length;
  }

  /**
   * Explicit IDs: an aborted send may be sent again only while its ID is the highest the source
   * ever gave. Below a higher ID that was sent, it would be a retry after later IDs (docs/design.md §6:
   * refused, or — across a crash, where a frame with the higher ID may still land — dropped by the
   * broker): the application gives up on it instead.
   */
  #mayResend(label: string): boolean {
    if (!this.#abortInfo.has(label)) return true;
    if (this.explicitIds.get(label) === this.#source) return true;
    this.givenUp.add(label);
    return false;
  }

  #retryCall(label: string, kind: 'retry' | 'replay'): SendCall {
    const snapshot = this.#headerSnapshots.get(label);
    return {
      label,
      body: this.#bodyFor(label),
      publishingId: this.explicitIds.get(label),
      key: this.spec.idMode === 'keyed' ? label : undefined,
      headers: snapshot === undefined ? undefined : { ...snapshot },
      kind,
    };
  }

  /**
   * First thing in every life (`start()` calls it), the application re-sends what it had not seen
   * confirmed. Explicit IDs: the messages of earlier lives whose `send()` never resolved, in ID
   * order and with their original IDs. A replay refused with `DEDUP_ID_REGRESSION` must be in the
   * stream (unless its send was once aborted: then it may never have been written): every earlier
   * life replayed before sending anything new, so in outbox durability an ID at or below the
   * store's last one was committed (and the outbox re-sends it); in reserve durability the refusal
   * means it is at or below the broker's last ID. Keyed: every key not confirmed, as a new send.
   */
  replay(): number {
    const life = this.life;
    if (life === undefined || !life.fresh) return 0;
    if (this.spec.idMode === 'explicit') {
      const labels = [...this.explicitIds.entries()]
        .filter(
          ([label]) =>
            !this.acknowledged.has(label) &&
            !this.mustBePresent.has(label) &&
            !this.givenUp.has(label) &&
            this.#labelLife.get(label) !== life.index &&
            this.#mayResend(label),
        )
        .sort((a, b) => (a[1] < b[1] ? -1 : a[1] > b[1] ? 1 : 0));
      for (const [label] of labels) this.#send(this.#retryCall(label, 'replay'));
      return labels.length;
    }
    if (this.spec.idMode === 'keyed') {
      const keys = this.#keys.filter((k) => !this.acknowledged.has(k));
      for (const key of new Set(keys)) this.#send(this.#repeatCall(key));
      return keys.length;
    }
    return 0;
  }

  #send(call: SendCall): void {
    const life = this.life;
    if (life === undefined) throw new Error('not running');
    life.fresh = false;
    life.calls++;
    if (call.kind === 'new') life.lastNew = life.calls;
    this.#labelLife.set(call.label, life.index);
    this.rejected.delete(call.label);
    this.expectedHeaders.set(call.body, canonical(call.headers));
    const options: SendOptions = {
      ...(call.headers === undefined ? {} : { headers: call.headers }),
      ...(call.publishingId === undefined ? {} : { publishingId: call.publishingId }),
      ...(call.key === undefined ? {} : { key: call.key }),
      ...(call.controller === undefined ? {} : { signal: call.controller.signal }),
    };
    if (call.key !== undefined) {
      this.keyedCalls.set(call.body, { lastAtCall: life.core.lastPublishingId, neverWritten: false });
    }
    let sending: Promise<SendResult>;
    try {
      sending = life.core.send(Buffer.from(call.body), options);
    } catch (err) {
      this.violations.push(`${call.label}: send() threw ${err instanceof Error ? err.message : String(err)}`);
      return;
    }
    life.unsettled++;
    if (call.controller !== undefined) life.controllers.add(call.controller);
    sending.then(
      (result) => {
        life.unsettled--;
        this.settled++;
        if (call.controller !== undefined) life.controllers.delete(call.controller);
        if (life.crashed) return; // a dead process learns nothing
        if (call.publishingId !== undefined && result.publishingId !== call.publishingId) {
          this.violations.push(
            `${call.label} resolved with id ${result.publishingId}, sent with ${call.publishingId}`,
          );
        }
        if (result.outcome === 'duplicate' && this.spec.idMode !== 'keyed') {
          this.violations.push(`${call.label} resolved as a duplicate outside keyed mode`);
        }
        this.acknowledged.set(call.label, result.publishingId);
        this.acks.push({
          label: call.label,
          publishingId: result.publishingId,
          outcome: result.outcome,
        });
      },
      (err: unknown) => {
        life.unsettled--;
        this.settled++;
        if (call.controller !== undefined) life.controllers.delete(call.controller);
        if (life.crashed) return;
        const code = err instanceof DedupError ? err.code : 'other';
        this.rejections.set(code, (this.rejections.get(code) ?? 0) + 1);
        this.rejected.set(call.label, code);
        const internal = err instanceof Error && err.message.includes('internal error');
        // The store write failed (diskFull): what was not confirmed is the next life's to send.
        if (life.diskFull && (code.startsWith('DEDUP_STORE') || code === 'DEDUP_PUBLISHER_CLOSED')) return;
        if (code === 'DEDUP_PUBLISHER_CLOSED' && life.closing && !internal) return;
        // The message stays in the outbox (or was sent) and goes out again: not the caller's to retry.
        if (code === 'DEDUP_CONFIRM_TIMEOUT') return;
        if (code === 'DEDUP_ABORTED' && call.controller?.signal.aborted === true) return;
        if (code === 'DEDUP_ID_REGRESSION' && call.kind === 'retry') {
          const info = this.#abortInfo.get(call.label);
          if (info !== undefined && info.waited && info.life === life.index && info.call === life.lastNew) {
            this.violations.push(
              `${call.label}: id ${call.publishingId} was aborted while it waited for room (never written or sent) and was the ` +
                `last accepted; re-sending it was refused: ${err instanceof Error ? err.message : String(err)}`,
            );
            return;
          }
          this.givenUp.add(call.label);
          return;
        }
        if (code === 'DEDUP_ID_REGRESSION' && call.kind === 'replay') {
          if (this.#abortInfo.has(call.label)) this.givenUp.add(call.label);
          else this.mustBePresent.add(call.label);
          return;
        }
        this.violations.push(
          `${call.label} (${call.kind}${call.controller === undefined ? '' : ', with a signal'}) rejected: ${
            err instanceof Error ? `${code} ${err.message}` : String(err)
          }`,
        );
      },
    );
  }

  /** Waits until this life's core is in `connect()`; false when it closed instead. */
  async untilConnecting(life: ProducerLife): Promise<boolean> {
    // Date.now: wall time even under fake timers (which fake setTimeout, setInterval and performance).
    const deadline = Date.now() + WALL_LIMIT_MS;
    for (;;) {
      if (life.transport.hasPendingConnect) return true;
      if (life.coreClosed || life.crashed || life.closeResolved || life.stopping) return false;
      if (Date.now() > deadline) throw new Error(`${this.spec.producerName}: the core never reconnected`);
      this.#advance(1);
      await within(
        Promise.race([life.transport.connectAttempt(), life.core.closed(), realDelay(1)]),
        WALL_LIMIT_MS,
        `${this.spec.producerName} reconnect`,
      );
    }
  }

  /** Lets a waiting reconnect through, once the core is in `connect()`. */
  async reconnect(): Promise<void> {
    const life = this.life;
    if (life === undefined || this.isConnected) return;
    // A core that is closing or failed may never ask: then its close ends the wait.
    if (await this.untilConnecting(life)) life.transport.acceptConnect();
  }

  /** Lets the core's reconnect start its `connect()` (which the network then leaves pending). */
  async connecting(): Promise<void> {
    const life = this.life;
    if (life === undefined || this.isConnected) return;
    await this.untilConnecting(life);
  }

  /**
   * Connects that closed lives started before closing complete now (late), or fail (`refuse`);
   * returns how many.
   */
  lateConnects(refuse = false): number {
    let n = 0;
    for (const life of this.history) {
      if (!life.closeResolved || life.crashed || !life.transport.hasPendingConnect) continue;
      if (refuse) life.transport.refuseConnect();
      else if (this.#network.brokerUp) life.transport.acceptConnect();
      else continue;
      n++;
    }
    return n;
  }

  /**
   * The process dies (SIGKILL): the first `applyHeld` held commits reached the disk, the rest did
   * not; the frames it wrote may still reach the broker (`zombie`). The core is abandoned, not
   * closed. A process still in `open()` dies there.
   */
  /**
   * The disk is full for a moment: the life's next store write fails, applied not at all. The
   * publisher stops with a store error (its waiting sends told so) and the process exits once it
   * closed; close()'s own clean-up write may succeed.
   */
  diskFull(): void {
    const life = this.life;
    if (life === undefined || life.closing) return;
    life.diskFull = true;
    life.disk.failNext(() => (life.stopping = true));
  }

  async crash(zombie: boolean, applyHeld = 0): Promise<void> {
    const opening = this.opening;
    if (opening !== undefined) {
      this.opening = undefined;
      opening.crashed = true;
      opening.transport?.kill(zombie);
      await opening.disk?.crash(applyHeld);
      return;
    }
    const life = this.life;
    if (life === undefined) return;
    this.life = undefined;
    life.crashed = true;
    this.#framesMayLinger(life);
    life.transport.kill(zombie);
    await life.disk.crash(applyHeld);
  }

  /** See {@link ProducerSpec.tolerateKeyedLateFrames}. */
  #framesMayLinger(life: ProducerLife): void {
    if (this.spec.tolerateKeyedLateFrames !== true || life.durability !== 'reserve') return;
    for (const key of this.#keys) if (!this.acknowledged.has(key)) this.mayDuplicate.add(key);
  }

  /** The disk of the life running or opening. */
  get currentDisk(): ProcessDisk | undefined {
    return this.life?.disk ?? this.opening?.disk;
  }

  /** A backup of the disk, as it is now. */
  async backup(): Promise<void> {
    const snapshot = await snapshotDisk(this.disk);
    const { localLast, outbox } = await this.#inspect();
    this.backups.push({ snapshot, localLast, outbox: outbox.length });
  }

  /**
   * The `pick`-th backup, among those with an outbox that the broker has since moved past if there
   * are any (a backup older than what the broker holds: open() must adopt, or refuse), else among
   * all; undefined without backups.
   */
  pickBackup(pick: number): DiskSnapshot | undefined {
    const brokerLast = this.#network.broker.lastId(this.spec.stream, this.spec.producerName);
    // The floor a replacement now would set: backups of a store that a process has since
    // replaced and written on are superseded.
    const current = this.backups.slice(this.#startedOnStore ? this.#storeBegan : this.#backupFloor);
    const behind = current.filter((b) => b.outbox > 0 && b.localLast < brokerLast);
    const from = behind.length > 0 ? behind : current;
    return from.length === 0 ? undefined : from[pick % from.length]!.snapshot;
  }

  /**
   * The store is lost (`snapshot` empty) or restored from a backup, while the producer is down. Keys
   * recorded since are forgotten: a repeat may be published again. Promises of adopting opens
   * are void (their outbox is gone).
   */
  async restore(snapshot: DiskSnapshot): Promise<void> {
    if (this.life !== undefined || this.opening !== undefined) throw new Error('restore while running');
    await this.#replaceStore(snapshot);
  }

  async #replaceStore(snapshot: DiskSnapshot): Promise<void> {
    await restoreDisk(this.disk, snapshot);
    this.#storeEpoch++;
    if (this.#startedOnStore) this.#backupFloor = this.#storeBegan;
    this.#storeBegan = this.backups.length;
    this.#startedOnStore = false;
    // Replays refused because the (now replaced) store held them promise nothing any more: the
    // application replays them in the next life, against the store it has now.
    this.mustBePresent.clear();
    if (this.spec.idMode === 'keyed') {
      for (const key of this.#keys) {
        this.mayDuplicate.add(key);
        this.looseIds.add(key);
        if (this.spec.tolerateKeyedRestoredRecords === true) this.mayBeLost.add(key);
      }
    }
    this.adoptObligations.length = 0;
  }

  /**
   * Starts a graceful `close()`; the life ends when it resolves, and from then on the closed core
   * must not touch its disk again. Other events (confirms, cuts, crashes) may happen meanwhile.
   */
  beginClose(): void {
    const life = this.life;
    if (life === undefined || life.closing) return;
    life.closing = true;
    this.#framesMayLinger(life);
    life.closed = life.core.close().then(() => {
      life.disk.sealed = true;
      life.closeResolved = true;
      life.unsettledAtClose = life.unsettled;
      if (this.life === life) this.life = undefined;
      this.settled++;
    });
  }

  /** A graceful `close()`, awaited. */
  async close(): Promise<void> {
    const life = this.life;
    if (life === undefined) return;
    this.beginClose();
    await within(life.closed!, WALL_LIMIT_MS, `${this.spec.producerName} close`);
  }

  /**
   * Violations: the harness's, a closed core that touched its disk after `close()` resolved, the
   * wire's (more than maxInFlight unconfirmed), frames whose headers are not the caller's at its
   * `send()` call or carry a second identity, and connections left open after `close()`.
   */
  problems(): string[] {
    const out = [...this.violations];
    for (const life of this.history) {
      if (life.disk.afterSeal.length > 0 && this.spec.tolerateWriteAfterClose !== true)
        out.push(`write after close: ${life.disk.afterSeal.join('; ')}`);
      out.push(...life.transport.violations.map((v) => `life ${life.index}: ${v}`));
      if (life.closeResolved && !life.crashed && life.transport.leakedConnection !== undefined) {
        out.push(
          `life ${life.index}: connection ${life.transport.leakedConnection.id} still open after close() resolved`,
        );
      }
      for (const c of life.transport.connections) {
        for (const frame of c.written) {
          const ids = frame.headers.filter(([k]) => k === ID_HEADER).length;
          const names = frame.headers.filter(([k]) => k === PRODUCER_HEADER).length;
          // The caller's headers: what follows the two stamps, without the library's own `x-dedup-`
          // declarations (a caller cannot pass those: send() refuses reserved names).
          const caller = Object.fromEntries(
            frame.headers.slice(2).filter(([k]) => !k.startsWith(RESERVED_PREFIX)),
          );
          const expected = this.expectedHeaders.get(frame.body);
          if (ids !== 1 || names !== 1) {
            out.push(
              `frame ${frame.body} (id ${frame.publishingId}) carries ${ids} ${ID_HEADER} and ${names} ${PRODUCER_HEADER} headers`,
            );
          } else if (expected !== undefined && canonical(caller) !== expected) {
            out.push(
              `frame ${frame.body} (id ${frame.publishingId}) carries headers ${canonical(caller)}, sent with ${expected}`,
            );
          }
        }
      }
    }
    return out;
  }
}
