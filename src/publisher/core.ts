import { DedupError } from '../errors.js';
import { MAX_PUBLISHING_ID } from '../identity/publishing-id.js';
import type { Headers, IdMode, ProducerMeta } from '../store/codec.js';
import { DedupStore, type LoadedProducer, type ProducerState } from '../store/store.js';
import type { Logger } from '../telemetry/logger.js';
import { observePublisher, type PublisherCounters } from '../telemetry/metrics.js';
import { Backoff, sleep } from '../util/backoff.js';
import { Entry, type Segment } from './entry.js';
import { forgetUnstoredKeys, KeyedIds, type StoredKeySegments } from './keyed.js';
import { headersSize, idOf, validateHeaders } from './message.js';
import { resolvePublisherOptions, type ResolvedPublisherOptions } from './options.js';
import type { PendingQueue } from './pending.js';
import { assertSameIdMode, reconcile, type ReconcilePlan } from './reconcile.js';
import { SendQueue } from './send-queue.js';
import { SkipDeclaration } from './skip.js';
import type {
  DedupPublisherOptions,
  Durability,
  OpenReport,
  PublishTransport,
  SendOptions,
  SendResult,
} from './types.js';

type State = 'open' | 'reconnecting' | 'closing' | 'closed';

/** What a group commit of automatic or explicit IDs writes for keys: nothing. */
const NO_KEYS = Object.freeze({ keys: undefined, deleteKeySegments: Object.freeze([]) });

/** `send()` without options: one shared empty object instead of a new one per call. */
const NO_OPTIONS: SendOptions = Object.freeze({});

// A promise's settlers, taken by one shared executor: `new Promise((resolve, reject) => ...)` with
// a closure allocates the closure and its context for every send. Read them right after `new Promise`.
let capturedResolve: ((result: SendResult) => void) | undefined;
let capturedReject: ((error: Error) => void) | undefined;
function captureSettlers(resolve: (result: SendResult) => void, reject: (error: Error) => void): void {
  capturedResolve = resolve;
  capturedReject = reject;
}

/**
 * The transport-agnostic dedup publisher: it assigns and persists publishing IDs, keeps the
 * outbox, reconciles with the broker on open and after every reconnect, applies backpressure and
 * settles `send()` on confirm. Transports (stream protocol, AMQP 0-9-1) wrap it.
 *
 * @internal Applications use `StreamDedupPublisher` or `AmqpDedupPublisher`.
 */
export class DedupPublisherCore {
  readonly producerName: string;
  readonly durability: Durability;
  readonly idMode: IdMode;
  readonly report: OpenReport;
  /** Counters since open (also reported as OpenTelemetry metrics). */
  readonly counters: PublisherCounters = {
    sent: 0,
    confirmed: 0,
    resent: 0,
    keyDuplicates: 0,
    reconnects: 0,
  };
  readonly #log: Logger;
  #unobserve: () => void = () => undefined;

  readonly #transport: PublishTransport;
  /** Room the identity stamps take in a message (name, a 20-digit ID, AMQP overhead). */
  readonly #stampBytes: number;
  readonly #state: ProducerState;
  readonly #ownedStore: DedupStore | undefined;
  readonly #opts: ResolvedPublisherOptions;

  #status: State = 'open';
  /** Set by `close()`: new sends are refused while accepted ones drain. */
  #closeRequested = false;
  #fatal: DedupError | undefined;
  /** Highest ID handed out (written to the store before it leaves in outbox mode). */
  #lastAssigned: bigint;
  /** Highest ID durable in the store (meta.lastId). */
  #lastDurable: bigint;
  #reservedUpTo: bigint;
  /** The messages between send() and the confirm: parked, batched, committing, pending. */
  readonly #queue: SendQueue;
  /** Written and sent, unconfirmed (the queue's last stage). */
  readonly #pending: PendingQueue<Entry>;
  #segmentsToDelete: bigint[] = [];
  /** Keyed mode: the key index, its store segments and retention. */
  readonly #keyed: KeyedIds | undefined;
  #pruneTimer: NodeJS.Timeout | undefined;
  #pumping = false;
  #pumpScheduled = false;
  #resendAll = false;
  #epoch = 0;
  #timer: NodeJS.Timeout | undefined;
  #watchTimer: NodeJS.Timeout | undefined;
  #reconnectWake: (() => void) | undefined;
  /** A skip declared at open, until the message declaring it is confirmed. */
  readonly #skip: SkipDeclaration;
  /** The lowest ID of the unconfirmed messages a fatal error let go (the store's lastId stays below it). */
  #droppedFrom: bigint | undefined;
  /** The highest ID written in an outbox commit, ever (meta.outboxHigh). */
  #outboxHigh = 0n;
  /** The reconnect loop while one runs: close() waits for it before closing the transport. */
  #reconnectLoop: Promise<void> | undefined;
  #closing: Promise<void> | undefined;
  readonly #closedPromise: Promise<DedupError | undefined>;
  #resolveClosed!: (value: DedupError | undefined) => void;
  readonly #idle: Array<() => void> = [];

  private constructor(
    transport: PublishTransport,
    state: ProducerState,
    ownedStore: DedupStore | undefined,
    opts: ResolvedPublisherOptions,
    plan: ReconcilePlan,
    report: OpenReport,
  ) {
    this.producerName = opts.producerName;
    this.durability = opts.durability;
    this.idMode = opts.idMode;
    this.#transport = transport;
    // Name and ID stamps, AMQP overhead, and a skip declaration on the rare message that has one.
    this.#stampBytes = Buffer.byteLength(opts.producerName) + 104;
    this.#log = opts.logger;
    this.#keyed = opts.idMode === 'keyed' ? new KeyedIds(opts.keyRetention) : undefined;
    this.#state = state;
    this.#ownedStore = ownedStore;
    this.#lastAssigned = plan.start;
    this.#lastDurable = plan.start;
    this.#reservedUpTo = plan.reservedUpTo;
    this.#outboxHigh = plan.outboxHigh;
    // A skip is written with the first commit, which comes before the first new ID leaves.
    this.#skip = new SkipDeclaration(plan.skipFrom);
    this.report = report;
    this.#opts = opts;
    this.#queue = new SendQueue(opts.maxInFlight);
    this.#pending = this.#queue.pending;
    this.#closedPromise = new Promise((resolve) => (this.#resolveClosed = resolve));
  }

  /**
   * Opens the store, claims the producer, connects, reconciles local and broker IDs and queues
   * the outbox for re-sending before any new message. Options are checked before any I/O.
   */
  static async open(
    transport: PublishTransport,
    options: DedupPublisherOptions,
  ): Promise<DedupPublisherCore> {
    const opts = resolvePublisherOptions(options);
    const ownedStore =
      typeof opts.store === 'string' ? await DedupStore.open(opts.store, { sync: opts.sync }) : undefined;
    const store = ownedStore ?? (opts.store as DedupStore);
    let state: ProducerState | undefined;
    // The core must exist before connecting: confirms for re-sent messages go to it.
    const handlersTarget: { core?: DedupPublisherCore } = {};
    try {
      state = store.claimProducer(transport.target, opts.producerName);
      const loaded = await state.load();
      assertSameIdMode(loaded.meta, opts.idMode, opts.producerName);
      let brokerLast: bigint | undefined;
      try {
        brokerLast = await transport.connect({
          confirmed: (ids) => {
            if (handlersTarget.core !== undefined) handlersTarget.core.#onConfirmed(ids);
          },
          disconnected: (err) => {
            if (handlersTarget.core !== undefined) handlersTarget.core.#onDisconnected(err, 0);
          },
        });
      } catch (err) {
        throw asDedupError(
          err,
          'DEDUP_BROKER_UNREACHABLE',
          `cannot connect to the broker for "${transport.target}"`,
        );
      }
      const outbox = loaded.segments.flatMap((s) => s.entries);
      const plan = reconcile({
        producerName: opts.producerName,
        target: transport.target,
        idMode: opts.idMode,
        durability: opts.durability,
        onBrokerAhead: opts.onBrokerAhead,
        meta: loaded.meta,
        outboxSize: outbox.length,
        outboxLast: outbox.length > 0 ? outbox[outbox.length - 1]!.publishingId : 0n,
        brokerLast,
      });
      let keySegments: StoredKeySegments = opts.idMode === 'keyed' ? await state.loadKeySegments() : [];
      if (plan.forgetKeysAbove !== undefined) {
        keySegments = await storeWrite(forgetUnstoredKeys(state, keySegments, plan.forgetKeysAbove, outbox));
      }
      const adopt = plan.kind === 'adopt';
      const publisher = new DedupPublisherCore(transport, state, ownedStore, opts, plan, {
        localLastId: plan.localLast,
        brokerLastId: brokerLast,
        resent: adopt ? 0 : outbox.length,
        reassigned: adopt ? outbox.length : 0,
      });
      handlersTarget.core = publisher;
      publisher.#keyed?.load(keySegments);
      if (adopt) await publisher.#reassign(loaded.segments);
      else publisher.#recover(loaded.segments);
      publisher.#startTimers();
      publisher.#schedulePump();
      return publisher;
    } catch (err) {
      // A core may exist already (adopting, a disconnect heard during open): stop its reconnect
      // loop before closing the transport, or a late reconnect would hold the name.
      const created = handlersTarget.core;
      if (created !== undefined) {
        created.#status = 'closing';
        created.#reconnectWake?.();
        await created.#reconnectLoop;
      }
      state?.release();
      await transport.close();
      await ownedStore?.close();
      throw err;
    }
  }

  /**
   * Adopting: the outbox's old IDs are at or below the broker's, so its messages go out again as
   * new messages above it. The old segments go in the same store write as the new ones, whatever
   * maxBatch is: a crash between two writes would lose the messages whose old segment is gone and
   * new one not yet written.
   */
  async #reassign(segments: LoadedProducer['segments']): Promise<void> {
    const reassigned: Entry[] = [];
    for (const s of segments) {
      for (const e of s.entries) {
        const entry = this.#accept(e.body, e.headers, undefined, e.key);
        if (entry instanceof Error) throw entry;
        reassigned.push(entry);
      }
    }
    if (reassigned.length === 0) return;
    this.#segmentsToDelete.push(...segments.map((s) => s.firstId));
    await storeWrite(this.#commit(reassigned, true));
    for (const e of reassigned) this.#pending.push(e);
    this.#resendAll = true;
  }

  /** Resuming: the outbox is re-sent with its own IDs, before anything new. */
  #recover(segments: LoadedProducer['segments']): void {
    for (const s of segments) {
      const segment: Segment = { firstId: s.firstId, remaining: s.entries.length };
      for (const e of s.entries) {
        const entry = new Entry(e.publishingId, e.body, e.headers, e.key);
        entry.segment = segment;
        const record = e.key === undefined ? undefined : this.#keyed?.get(e.key);
        if (record !== undefined && record.publishingId === e.publishingId) {
          record.inFlight = entry;
          entry.keyRecord = record;
        }
        this.#pending.push(entry);
      }
    }
    this.#resendAll = this.#pending.size > 0;
  }

  /** The last publishing ID handed out (0n before the first). */
  get lastPublishingId(): bigint {
    return this.#lastAssigned;
  }

  /** Keyed mode: keys in the in-memory index (retained, or accepted and not yet committed). @internal */
  get keysInMemory(): number {
    return this.#keyed?.size ?? 0;
  }

  /** Messages accepted and not yet confirmed. */
  get inFlight(): number {
    return this.#queue.inFlight;
  }

  /** True after `close()` or a fatal error. */
  get isClosed(): boolean {
    return this.#closeRequested || this.#status === 'closed';
  }

  /** Resolves when the publisher has closed: with the error that closed it, or `undefined` after `close()`. */
  closed(): Promise<DedupError | undefined> {
    return this.#closedPromise;
  }

  /** See `StreamDedupPublisher.send`. */
  send(body: Uint8Array, options: SendOptions = NO_OPTIONS): Promise<SendResult> {
    if (!(body instanceof Uint8Array)) {
      throw new TypeError(`body must be a Buffer or Uint8Array, got ${body === null ? 'null' : typeof body}`);
    }
    const headers = validateHeaders(options.headers);
    if (this.#fatal !== undefined) return Promise.reject(this.#fatal);
    if (this.#closeRequested || this.#status === 'closed') {
      return Promise.reject(
        new DedupError(
          'DEDUP_PUBLISHER_CLOSED',
          `publisher "${this.producerName}" is closed; nothing was sent`,
        ),
      );
    }
    const size = body.length + (headers === undefined ? 0 : headersSize(headers)) + this.#stampBytes;
    if (size > this.#transport.maxMessageBytes) {
      throw new RangeError(
        `message of about ${size} bytes exceeds the broker's limit of ${this.#transport.maxMessageBytes} bytes`,
      );
    }
    const signal = options.signal;
    if (signal?.aborted) return Promise.reject(abortError(signal));
    const id = idOf(options, this.idMode, this.#lastAssigned, this.producerName);
    if (typeof id === 'string') return this.#sendKeyed(body, headers, id, signal);
    if (id instanceof DedupError) return Promise.reject(id);
    return this.#submit(body, headers, id, undefined, signal);
  }

  /**
   * A keyed send: a key published before (and still retained) resolves with its original ID and
   * `outcome: 'duplicate'`, publishing nothing (once confirmed, if it is still in flight); a new
   * key is published under the next ID, and its record is written in the same group commit as
   * the message. The index is in memory: no read on the hot path.
   */
  #sendKeyed(
    body: Uint8Array,
    headers: Headers | undefined,
    key: string,
    signal: AbortSignal | undefined,
  ): Promise<SendResult> {
    const known = this.#keyed!.get(key);
    if (known !== undefined && this.#keyed!.retained(known, this.#lastAssigned)) {
      this.counters.keyDuplicates++;
      const inFlight = known.inFlight;
      if (inFlight !== undefined) {
        return new Promise<SendResult>((resolve, reject) => {
          ((inFlight.extra ??= {}).keyWaiters ??= []).push({
            resolve: (publishingId) => resolve({ publishingId, outcome: 'duplicate' }),
            reject,
          });
        });
      }
      return Promise.resolve({ publishingId: known.publishingId, outcome: 'duplicate' });
    }
    return this.#submit(body, headers, undefined, key, signal);
  }

  /** Keyed mode: drops keys past the retention; their deletes ride the next commit. */
  #pruneKeys(): void {
    if (this.#keyed?.prune(this.#lastAssigned) === true) this.#schedulePump();
  }

  /** A send of a message: its ID, its promise, its place in the queue. */
  #submit(
    body: Uint8Array,
    headers: Headers | undefined,
    explicitId: bigint | undefined,
    key: string | undefined,
    signal: AbortSignal | undefined,
  ): Promise<SendResult> {
    const prevAssigned = this.#lastAssigned;
    const entry = this.#accept(body, headers, explicitId, key);
    if (entry instanceof Error) return Promise.reject(entry);
    // One shared executor: no closure per send (see `captureSettlers`).
    const promise = new Promise<SendResult>(captureSettlers);
    entry.resolve = capturedResolve;
    entry.reject = capturedReject;
    if (signal !== undefined) {
      const onAbort = (): void => this.#abort(entry);
      entry.extra = { signal, onAbort, prevAssigned };
      signal.addEventListener('abort', onAbort, { once: true });
    }
    this.#enqueue(entry);
    return promise;
  }

  /** Assigns the ID (the next one, or the caller's) and, for a key, its record in the index. */
  #accept(
    body: Uint8Array,
    headers: Headers | undefined,
    explicitId: bigint | undefined,
    key: string | undefined,
  ): Entry | RangeError {
    const publishingId = explicitId ?? this.#lastAssigned + 1n;
    if (publishingId > MAX_PUBLISHING_ID) {
      return new RangeError(`publishing IDs of producer "${this.producerName}" are exhausted (2^64 - 1)`);
    }
    this.#lastAssigned = publishingId;
    if (explicitId === undefined) headers = this.#skip.stamp(publishingId, headers);
    const entry = new Entry(publishingId, body, headers, key);
    if (key !== undefined) this.#keyed!.add(key, entry);
    return entry;
  }

  /** Queues an accepted message for the next group commit, or parks it while there is no room. */
  #enqueue(entry: Entry): void {
    if (this.#queue.add(entry)) this.#schedulePump();
  }

  #abort(entry: Entry): void {
    const extra = entry.extra!;
    const error = abortError(extra.signal!);
    const i = this.#queue.parkedIndex(entry);
    // Still waiting for room, and nobody else waits for it (repeats of its key that passed no
    // signal): it never reaches the store or the wire, and its key is free again. When its ID is
    // the last handed out, the next send gets it (explicit IDs: the caller may send it again).
    if (i >= 0 && (extra.keyWaiters?.length ?? 0) === 0) {
      this.#queue.unpark(i);
      this.#keyed?.forget(entry, error);
      if (this.idMode === 'explicit') {
        // The caller's IDs: only the last can be handed back (an earlier one is below later IDs).
        if (entry.publishingId === this.#lastAssigned && extra.prevAssigned !== undefined) {
          this.#lastAssigned = extra.prevAssigned;
        }
      } else {
        // Automatic and keyed IDs of sends still waiting are unwritten, unsent and unseen by any
        // caller: the later ones move down, so an abort leaves no hole in the stream.
        this.#renumberFrom(i, entry);
      }
    }
    // Otherwise the message may be published anyway; only the caller stops waiting.
    this.#settle(entry, error);
  }

  /** Closes the hole an aborted parked entry leaves at position `i` (it was taken out). */
  #renumberFrom(i: number, aborted: Entry): void {
    let id = aborted.publishingId;
    for (let j = i, e = this.#queue.parkedAt(j); e !== undefined; e = this.#queue.parkedAt(++j)) {
      const next = e.publishingId;
      e.publishingId = id;
      if (e.keyRecord !== undefined && e.keyRecord.inFlight === e) e.keyRecord.publishingId = id;
      id = next;
    }
    this.#lastAssigned = id - 1n;
    // A skip it declared moves to the entry that now has its ID, or waits for the next send.
    this.#skip.moved(aborted.publishingId, this.#queue.parkedAt(i));
  }

  #settle(entry: Entry, outcome: Error | SendResult): void {
    const { resolve, reject } = entry;
    entry.resolve = undefined;
    entry.reject = undefined;
    const extra = entry.extra;
    if (extra?.onAbort !== undefined) {
      extra.signal?.removeEventListener('abort', extra.onAbort);
      extra.onAbort = undefined;
    }
    if (outcome instanceof Error) reject?.(outcome);
    else resolve?.(outcome);
  }

  #schedulePump(): void {
    if (this.#pumping || this.#pumpScheduled) return;
    this.#pumpScheduled = true;
    // setImmediate, not a microtask: sends made in the same tick join one group commit.
    setImmediate(() => {
      this.#pumpScheduled = false;
      void this.#pump();
    });
  }

  /**
   * The only place that writes the store and hands messages to the transport, one step at a
   * time, so that the wire sees IDs in increasing order.
   */
  async #pump(): Promise<void> {
    if (this.#pumping) return;
    this.#pumping = true;
    let batch: Entry[] = [];
    try {
      for (;;) {
        // Once close() stopped waiting, nothing is written or sent: close() writes what is left,
        // and after it nothing may touch the store (a shared store may hold a newer life's state).
        if (this.#fatal !== undefined || this.#status === 'closing' || this.#status === 'closed') break;
        if (this.#resendAll && this.#status !== 'reconnecting') {
          this.#resendAll = false;
          const all = [...this.#pending.values()];
          this.counters.resent += all.length;
          await this.#publish(all);
          continue;
        }
        if (
          !this.#queue.hasBatch &&
          this.#segmentsToDelete.length === 0 &&
          !(this.#keyed?.hasDeletes ?? false) &&
          !this.#skip.metaDirty
        ) {
          break;
        }
        batch = this.#queue.beginCommit(this.#opts.maxBatch);
        try {
          await this.#commit(batch);
        } catch (err) {
          this.#queue.endCommit(batch, false);
          this.#fail(asDedupError(err, 'DEDUP_STORE_CORRUPT', 'writing the store failed'), batch);
          break;
        }
        this.#queue.endCommit(batch, true);
        // After a reconnect the whole pending set (this batch included) goes out first, in ID
        // order: publishing this batch ahead of older re-sends would make the broker drop them.
        // A publisher closing meanwhile keeps the batch in the outbox and sends nothing more.
        if (batch.length > 0 && this.#status === 'open' && !this.#resendAll) await this.#publish(batch);
        batch = [];
        this.#refill();
      }
    } catch (err) {
      // Nothing here may reject unhandled (the pump runs from a timer): a broken invariant stops
      // the publisher with an error its callers see; the outbox keeps what it holds.
      this.#queue.endCommit(batch, false);
      this.#fail(
        new DedupError(
          'DEDUP_PUBLISHER_CLOSED',
          `publisher "${this.producerName}" stopped on an internal error (please report it): ${
            err instanceof Error ? err.message : String(err)
          }`,
          { cause: err },
        ),
        batch,
      );
    } finally {
      this.#pumping = false;
      for (const wake of this.#idle.splice(0)) wake();
    }
  }

  /**
   * Writes one group commit. `asOutbox` writes the batch as an outbox segment whatever the
   * durability (the messages `open()` re-assigns: their old segments go in the same write).
   */
  async #commit(batch: readonly Entry[], asOutbox = this.durability === 'outbox'): Promise<void> {
    this.#keyed?.prune(this.#lastAssigned);
    const deleteSegments = this.#segmentsToDelete;
    this.#segmentsToDelete = [];
    const { keys, deleteKeySegments } = this.#keyed?.takeCommit(batch) ?? NO_KEYS;
    const last = batch.length > 0 ? batch[batch.length - 1]!.publishingId : this.#lastDurable;
    if (asOutbox) {
      let segment: Segment | undefined;
      if (batch.length > 0) {
        segment = { firstId: batch[0]!.publishingId, remaining: batch.length };
        for (const e of batch) e.segment = segment;
      }
      if (last > this.#outboxHigh) this.#outboxHigh = last;
      const meta: ProducerMeta = {
        idMode: this.idMode,
        lastId: last,
        reservedUpTo: this.#reservedUpTo,
        skipFrom: this.#skip.persisted,
        outboxHigh: this.#outboxHigh,
      };
      this.#skip.metaDirty = false;
      await this.#state.commit({ meta, segment: batch, deleteSegments, keys, deleteKeySegments });
      this.#lastDurable = last;
    } else if (
      last > this.#reservedUpTo ||
      deleteSegments.length > 0 ||
      deleteKeySegments.length > 0 ||
      (keys !== undefined && keys.length > 0) ||
      this.#skip.metaDirty
    ) {
      // Reserve a block past the batch before any of it leaves, so a restart skips it all. With
      // explicit IDs nothing is skipped (the caller chooses the IDs, and resumes after the broker's
      // last one): the block is the ceiling that open() checks the broker against, and an ID above
      // it takes a new one. One write per block rather than per batch: a LevelDB round trip in
      // every batch held up the pump (explicit IDs ran at 0.92 of the raw client where automatic
      // IDs ran at 1.02, in one bench:publish run; 0.98-1.05 with blocks).
      const reservedUpTo =
        last > this.#reservedUpTo ? last + BigInt(this.#opts.reserveBlock) : this.#reservedUpTo;
      const capped = reservedUpTo > MAX_PUBLISHING_ID ? MAX_PUBLISHING_ID : reservedUpTo;
      // Automatic IDs record the last ID below every unconfirmed or unsent one: where the broker
      // cannot tell its last ID (AMQP 0-9-1) the next life declares its skip from just above it,
      // so that a message lost on the wire at a crash falls inside the declared range.
      let lowest = this.#pending.first?.publishingId ?? batch[0]?.publishingId;
      if (this.#droppedFrom !== undefined && (lowest === undefined || this.#droppedFrom < lowest)) {
        lowest = this.#droppedFrom; // a fatal error let go of unconfirmed messages from here
      }
      const lastId = this.idMode === 'explicit' || lowest === undefined || lowest > last ? last : lowest - 1n;
      this.#skip.metaDirty = false;
      await this.#state.commit({
        meta: {
          idMode: this.idMode,
          lastId,
          reservedUpTo: capped,
          skipFrom: this.#skip.persisted,
          outboxHigh: this.#outboxHigh,
        },
        deleteSegments,
        keys,
        deleteKeySegments,
      });
      this.#reservedUpTo = capped;
      this.#lastDurable = last;
    }
  }

  async #publish(entries: readonly Entry[]): Promise<void> {
    if (entries.length === 0) return;
    const epoch = this.#epoch;
    // Whole milliseconds (at least 1): a small integer, not a number boxed in every entry.
    const now = Math.ceil(performance.now()) || 1;
    for (const e of entries) e.sentAt = now;
    this.counters.sent += entries.length;
    try {
      // Entries are OutgoingMessages already: the transport stamps the identity itself.
      await this.#transport.publish(entries);
    } catch (err) {
      this.#onDisconnected(err instanceof Error ? err : new Error(String(err)), epoch);
    }
  }

  /** Moves parked sends into the batch while there is room. */
  #refill(): void {
    if (this.#queue.refill()) this.#schedulePump();
  }

  #onConfirmed(ids: readonly bigint[]): void {
    for (const id of ids) {
      const e = this.#pending.take(id);
      if (e === undefined) continue;
      if (e.segment !== undefined && --e.segment.remaining === 0)
        this.#segmentsToDelete.push(e.segment.firstId);
      if (e.key !== undefined) KeyedIds.settled(e, id);
      this.#skip.confirmed(id);
      this.counters.confirmed++;
      this.#settle(e, { publishingId: id, outcome: 'published' });
    }
    this.#refill();
    if (this.#segmentsToDelete.length > 0 || this.#skip.metaDirty) this.#schedulePump();
    if (this.inFlight === 0) for (const wake of this.#idle.splice(0)) wake();
  }

  #onDisconnected(error: Error, epoch: number): void {
    if (epoch !== this.#epoch || this.#status !== 'open' || this.#fatal !== undefined) return;
    this.#status = 'reconnecting';
    this.#epoch++;
    this.#log.warn(
      { producer: this.producerName, target: this.#transport.target, err: error },
      'stream-dedup: connection lost; reconnecting',
    );
    this.#reconnectLoop = this.#reconnect(error);
  }

  async #reconnect(_cause: Error): Promise<void> {
    const started = performance.now();
    const backoff = new Backoff(this.#opts.reconnect);
    while (this.#status === 'reconnecting') {
      await sleep(backoff.next(), (wake) => (this.#reconnectWake = wake));
      this.#reconnectWake = undefined;
      if (this.#status !== 'reconnecting') return;
      const epoch = this.#epoch;
      try {
        const brokerLast = await this.#transport.connect({
          // Confirms from any connection count: the broker stored (or had) those IDs.
          confirmed: (ids) => this.#onConfirmed(ids),
          disconnected: (err) => this.#onDisconnected(err, epoch),
        });
        // Closing meanwhile: close() closes this connection once this loop has returned.
        if (this.#status !== 'reconnecting') return;
        if (brokerLast !== undefined && brokerLast > this.#ownCeiling()) {
          this.#fail(this.#nameConflict(brokerLast));
          return;
        }
        // Everything unconfirmed goes out again, in ID order, with its original ID; the broker drops
        // (and confirms) what it already stored.
        this.#status = 'open';
        this.#resendAll = true;
        this.counters.reconnects++;
        this.#log.info(
          {
            producer: this.producerName,
            target: this.#transport.target,
            brokerLastId: brokerLast?.toString(),
            resend: this.#pending.size,
          },
          'stream-dedup: reconnected; re-sending unconfirmed messages',
        );
        this.#schedulePump();
        return;
      } catch (err) {
        if (performance.now() - started > this.#opts.reconnect.giveUpAfterMs) {
          // Whatever the last attempt failed at (connecting, or declaring the producer, as on a
          // shared client whose connection is gone), giving up is one condition with one code.
          this.#fail(
            new DedupError(
              'DEDUP_BROKER_UNREACHABLE',
              `no connection to the broker for ${Math.round(this.#opts.reconnect.giveUpAfterMs / 1000)} s; ` +
                `${this.inFlight} unconfirmed messages stay in the outbox for the next open(). ` +
                `Last attempt: ${err instanceof Error ? err.message : String(err)}`,
              { cause: err },
            ),
          );
          return;
        }
      }
    }
  }

  /**
   * The highest ID this producer may have used: what it handed out, or the block an earlier life
   * reserved. Explicit IDs in reserve durability resume at the broker's last ID, and frames a dead
   * process left on the way can land after that (up to its reserved ceiling): not another writer.
   */
  #ownCeiling(): bigint {
    return this.#lastAssigned > this.#reservedUpTo ? this.#lastAssigned : this.#reservedUpTo;
  }

  #nameConflict(brokerLast: bigint): DedupError {
    return new DedupError(
      'DEDUP_NAME_CONFLICT',
      `the broker's last publishing ID for producer "${this.producerName}" on "${this.#transport.target}" is ${brokerLast}, ` +
        `above the ${this.#ownCeiling()} this publisher handed out or reserved: another writer publishes under this name, and the ` +
        `broker drops whichever of the two is behind. Stopped; unconfirmed messages stay in the outbox.`,
    );
  }

  #startTimers(): void {
    this.#unobserve = observePublisher(this.counters, this.producerName, this.#transport.target);
    this.#log.info(
      {
        producer: this.producerName,
        target: this.#transport.target,
        localLastId: this.report.localLastId.toString(),
        brokerLastId: this.report.brokerLastId?.toString(),
        resent: this.report.resent,
        reassigned: this.report.reassigned,
      },
      'stream-dedup: publisher open',
    );
    const interval = Math.max(50, Math.min(1_000, Math.floor(this.#opts.confirmTimeoutMs / 4)));
    this.#timer = setInterval(() => this.#checkTimeouts(), interval);
    this.#timer.unref();
    if (this.idMode === 'keyed') {
      // Keys past the retention leave memory and the store: on open, then every minute.
      this.#pruneKeys();
      this.#pruneTimer = setInterval(() => this.#pruneKeys(), 60_000);
      this.#pruneTimer.unref();
    }
    if (this.#opts.watchIntervalMs > 0) {
      this.#watchTimer = setInterval(() => void this.#watch(), this.#opts.watchIntervalMs);
      this.#watchTimer.unref();
    }
  }

  #checkTimeouts(): void {
    if (this.#status !== 'open') return;
    const deadline = performance.now() - this.#opts.confirmTimeoutMs;
    let expired = 0;
    for (const e of this.#pending.values()) {
      if (e.sentAt === 0 || e.sentAt > deadline) break;
      // Every stalled message counts, also those recovered from the outbox and those whose caller
      // was already told: a connection that stops confirming only them must be replaced too.
      expired++;
      if (e.reject === undefined) continue;
      this.#settle(
        e,
        new DedupError(
          'DEDUP_CONFIRM_TIMEOUT',
          `publishing ID ${e.publishingId} of producer "${this.producerName}" was not confirmed within ` +
            `${this.#opts.confirmTimeoutMs} ms. It stays in the outbox and is re-sent with the same ID; ` +
            `do not send it again yourself (a new send gets a new ID).`,
        ),
      );
    }
    // A connection that stops confirming is treated as lost: reconnect and re-send.
    if (expired > 0) {
      this.#log.warn({ producer: this.producerName, expired }, 'stream-dedup: confirms timed out');
      this.#onDisconnected(new Error('confirm timeout'), this.#epoch);
    }
  }

  async #watch(): Promise<void> {
    if (this.#status !== 'open') return;
    try {
      const brokerLast = await this.#transport.queryLastId();
      if (brokerLast !== undefined && brokerLast > this.#ownCeiling() && this.#status === 'open') {
        this.#fail(this.#nameConflict(brokerLast));
      }
    } catch {
      // A failed query is the reconnect logic's business, not the watch's.
    }
  }

  /** Stops for good: every waiting send rejects with `error`; the outbox keeps unconfirmed messages. */
  #fail(error: DedupError, extra: readonly Entry[] = []): void {
    if (this.#fatal !== undefined) return;
    this.#fatal = error;
    this.#log.error(
      { producer: this.producerName, target: this.#transport.target, err: error },
      'stream-dedup: publisher stopped',
    );
    for (const e of [
      ...extra,
      ...this.#queue.takeParked(),
      ...this.#queue.takeBatch(),
      ...this.#pending.values(),
    ]) {
      if (this.#droppedFrom === undefined || e.publishingId < this.#droppedFrom)
        this.#droppedFrom = e.publishingId;
      KeyedIds.settled(e, error);
      this.#settle(e, error);
    }
    this.#pending.clear();
    void this.close();
  }

  /**
   * Waits (up to `closeTimeoutMs`) for outstanding confirms, frees the name on the broker,
   * releases the store. Sends still unconfirmed then reject with `DEDUP_PUBLISHER_CLOSED` and stay
   * in the outbox. Idempotent.
   */
  close(): Promise<void> {
    this.#closing ??= this.#doClose();
    return this.#closing;
  }

  async #doClose(): Promise<void> {
    this.#closeRequested = true;
    const deadline = performance.now() + this.#opts.closeTimeoutMs;
    if (this.#fatal === undefined) {
      // Let accepted sends finish (reconnecting if need be): parked ones move on as confirms free room.
      while (this.inFlight > 0 && performance.now() < deadline && this.#fatal === undefined) {
        await new Promise<void>((resolve) => {
          const t = setTimeout(resolve, Math.max(1, deadline - performance.now()));
          this.#idle.push(() => {
            clearTimeout(t);
            resolve();
          });
        });
      }
    }
    this.#status = 'closing';
    this.#reconnectWake?.();
    clearInterval(this.#timer);
    clearInterval(this.#watchTimer);
    clearInterval(this.#pruneTimer);
    this.#unobserve();
    // A group commit being written finishes first: its messages are then in the outbox.
    while (this.#pumping) await new Promise<void>((resolve) => this.#idle.push(resolve));
    const unwritten = new DedupError(
      'DEDUP_PUBLISHER_CLOSED',
      `publisher "${this.producerName}" closed before this message was written or sent: nothing was sent, ` +
        `and nothing will re-send it`,
    );
    const unconfirmed = new DedupError(
      'DEDUP_PUBLISHER_CLOSED',
      this.durability === 'outbox'
        ? `publisher "${this.producerName}" closed before the broker confirmed this message; it stays in the ` +
            `outbox and is re-sent with its ID by the next open() of this producer`
        : `publisher "${this.producerName}" closed before the broker confirmed this message; with reserve ` +
            `durability it is not re-sent: it may or may not be in the stream`,
    );
    let unsent = [...this.#queue.takeBatch(), ...this.#queue.takeParked()];
    if (unsent.length > 0 && this.durability === 'outbox' && this.#fatal === undefined) {
      // Accepted sends are not dropped: one last group commit puts them in the outbox, and the
      // next open() sends them.
      try {
        await this.#commit(unsent);
        this.#queue.endCommit(unsent, true);
        unsent = [];
      } catch {
        // Not written: they are reported as never sent.
      }
    }
    for (const e of unsent) {
      const error = this.#fatal ?? unwritten;
      this.#keyed?.forget(e, error);
      this.#settle(e, error);
    }
    for (const e of this.#pending.values()) {
      const error = this.#fatal ?? unconfirmed;
      KeyedIds.settled(e, error);
      this.#settle(e, error);
    }
    // Delete segments confirmed since the last commit (a reserve life that recovered an outbox has
    // them too), so the next open re-sends less; and forget a skip whose declaration was confirmed.
    if (this.#segmentsToDelete.length > 0 || this.#skip.metaDirty) {
      await this.#commit([]).catch(() => undefined);
    }
    // A reconnect attempt in progress may still open a connection: let it finish, then close it.
    await this.#reconnectLoop;
    await this.#transport.close();
    this.#state.release();
    await this.#ownedStore?.close();
    this.#status = 'closed';
    this.#resolveClosed(this.#fatal);
  }
}

/** A store write during open(): its failure as the typed error the publisher reports for one. */
async function storeWrite<T>(write: Promise<T>): Promise<T> {
  try {
    return await write;
  } catch (err) {
    throw asDedupError(err, 'DEDUP_STORE_CORRUPT', 'writing the store failed');
  }
}

function abortError(signal: AbortSignal): DedupError {
  return new DedupError('DEDUP_ABORTED', 'the wait was aborted; the message may still be published', {
    cause: signal.reason,
  });
}

function asDedupError(err: unknown, code: DedupError['code'], message: string): DedupError {
  if (err instanceof DedupError) return err;
  const detail = err instanceof Error ? err.message : String(err);
  return new DedupError(code, `${message}: ${detail}`, { cause: err });
}
