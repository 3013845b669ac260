/**
 * The publisher's life (docs/design.md §4): open, send, the pump that writes each group commit
 * before its messages leave, confirms, lost connections, fatal errors and close. Each part that
 * is an idea of its own lives beside it: startup, reconcile, commit, send-queue, keyed, skip,
 * reconnect, watchdog, shutdown, errors, send-aborts, confirms.
 *
 * Over the ~600 lines the layout asks for (issue 38), on purpose: what is left is one state
 * machine — the status, the last assigned and highest confirmed IDs, the pump's flags, the epoch
 * that makes a disconnect heard from an older connection ignored — read and written by send, the
 * pump, confirms, a lost connection and close. Each of those is short; split across files they
 * would pass that private state around by setters (as send-aborts.ts does for the one field it
 * needs), and the invariants of docs/design.md §7 would no longer be checkable in one place.
 */
import type { DedupError } from '../errors.js';
import { MAX_PUBLISHING_ID } from '../identity/publishing-id.js';
import type { Headers, IdMode } from '../store/codec.js';
import { DedupStore, type LoadedProducer, type ProducerState } from '../store/store.js';
import type { Logger } from '../telemetry/logger.js';
import { histogramRecorder, observePublisher, type PublisherCounters } from '../telemetry/metrics.js';
import { GroupCommitter } from './commit.js';
import { Entry } from './entry.js';
import {
  abortError,
  asDedupError,
  closedError,
  internalError,
  InvariantError,
  nameConflictError,
  storeWrite,
  unreachableError,
} from './errors.js';
import { takeConfirmed } from './confirms.js';
import { KeyedIds } from './keyed.js';
import { assertBody, assertFits, idOf, stampBytesOf, validateHeaders, withoutSkip } from './message.js';
import { assertSubEntriesSafe, resolvePublisherOptions, type ResolvedPublisherOptions } from './options.js';
import type { PendingQueue } from './pending.js';
import { logBrokerBehind, Reconnector } from './reconnect.js';
import { SendAborts } from './send-aborts.js';
import { SendQueue } from './send-queue.js';
import { SkipDeclaration } from './skip.js';
import { letGoAll, settleAtClose } from './shutdown.js';
import { batcherFor } from './sub-entries.js';
import { Watchdog } from './watchdog.js';
import { logOpen, recoveredEntries, startUp, type Startup } from './startup.js';
import type {
  DedupPublisherOptions,
  Durability,
  OpenReport,
  PublishTransport,
  SendOptions,
  SendResult,
  TransportHandlers,
} from './types.js';

type State = 'open' | 'reconnecting' | 'closing' | 'closed';

/** `send()` without options: one shared empty object instead of a new one per call. */
const NO_OPTIONS: SendOptions = Object.freeze({});

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
  /** `send()` goes through a `send` span (the `tracing` option). */
  readonly tracing: boolean;
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
  /** Records a confirm's latency (the `stream_dedup.publisher.confirm_latency` histogram); set at start. */
  #confirmLatency: (ms: number) => void = () => undefined;

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
  /** Highest ID the broker confirmed in this life: its last ID for the name never goes below it, unless it lost data. */
  #highestConfirmed = 0n;
  /** The messages between send() and the confirm: parked, batched, committing, pending. */
  readonly #queue: SendQueue;
  /** Written and sent, unconfirmed (the queue's last stage). */
  readonly #pending: PendingQueue<Entry>;
  /** Writes each group commit: meta, outbox segment, keys, deletes. */
  readonly #commits: GroupCommitter;
  /** Keyed mode: the key index, its store segments and retention. */
  readonly #keyed: KeyedIds | undefined;
  /** A skip declared at open, until the message declaring it is confirmed. */
  readonly #skip: SkipDeclaration;
  #pumping = false;
  #pumpScheduled = false;
  /** Sends waiting on a caller's signal: a parked one is withdrawn when it aborts. */
  readonly #aborts: SendAborts;
  #resendAll = false;
  /** Bumped on every lost connection: a disconnect heard from an older connection is ignored. */
  #epoch = 0;
  readonly #reconnector: Reconnector;
  readonly #watchdog: Watchdog;
  #closing: Promise<void> | undefined;
  /**
   * Resolved once close() stops waiting for confirms: a publish still waiting on the transport (a
   * socket that does not drain: a paused broker, a full window) is then no longer awaited. Only
   * closing the transport would end that wait, and close() does that after the pump returned.
   */
  readonly #halted: Promise<void>;
  #halt!: () => void;
  readonly #closedPromise: Promise<DedupError | undefined>;
  #resolveClosed!: (value: DedupError | undefined) => void;
  readonly #idle: Array<() => void> = [];
  readonly #failureListeners: Array<(error: DedupError) => void> = [];

  private constructor(
    transport: PublishTransport,
    state: ProducerState,
    ownedStore: DedupStore | undefined,
    opts: ResolvedPublisherOptions,
    startup: Startup,
  ) {
    this.producerName = opts.producerName;
    this.durability = opts.durability;
    this.idMode = opts.idMode;
    this.report = startup.report;
    this.tracing = opts.tracing;
    this.#transport = transport;
    // Name and ID stamps, AMQP overhead, and a skip declaration on the rare message that has one.
    this.#stampBytes = stampBytesOf(opts.producerName);
    this.#log = opts.logger;
    this.#state = state;
    this.#ownedStore = ownedStore;
    this.#opts = opts;
    this.#lastAssigned = startup.plan.start;
    this.#keyed = opts.idMode === 'keyed' ? new KeyedIds(opts.keyRetention) : undefined;
    this.#keyed?.load(startup.keySegments);
    // A skip is written with the first commit, which comes before the first new ID leaves.
    this.#skip = new SkipDeclaration(startup.plan.skipFrom);
    const skip = this.#skip;
    this.#queue = new SendQueue(opts.maxInFlight, {
      renumber: opts.idMode !== 'explicit',
      lastAssigned: () => this.#lastAssigned,
      // A skip an aborted send declared moves to the entry that now has its ID, or waits for the next send.
      moved: (abortedId, heir) => skip.moved(abortedId, heir),
    });
    this.#pending = this.#queue.pending;
    this.#aborts = new SendAborts({
      idMode: opts.idMode,
      queue: this.#queue,
      keyed: this.#keyed,
      lastAssigned: () => this.#lastAssigned,
      setLastAssigned: (id) => (this.#lastAssigned = id),
    });
    this.#commits = new GroupCommitter(
      state,
      opts,
      startup.plan,
      this.#skip,
      this.#keyed,
      this.#pending,
      // IDs an earlier reserve life may have on the wire go alone (docs/design.md §10).
      batcherFor(transport, this.#stampBytes, startup.plan.reservedUpTo),
    );
    this.#reconnector = new Reconnector(transport, opts.reconnect, {
      stillReconnecting: () => this.#status === 'reconnecting',
      handlers: () => this.#handlers(this.#epoch),
      connected: (brokerLast) => this.#reconnected(brokerLast),
      refused: (error) => this.#fail(error),
      gaveUp: (err) => this.#fail(unreachableError(opts.reconnect.giveUpAfterMs, this.inFlight, err)),
    });
    this.#watchdog = new Watchdog(opts, this.#pending, {
      active: () => this.#status === 'open',
      // A connection that stops confirming is treated as lost: reconnect and re-send.
      stalled: (expired) => {
        const target = transport.target;
        this.#log.warn({ producer: this.producerName, target, expired }, 'stream-dedup: confirms timed out');
        this.#onDisconnected(new Error('confirm timeout'), this.#epoch);
      },
      pruneKeys: this.#keyed === undefined ? undefined : () => this.#pruneKeys(),
      queryLastId: () => transport.queryLastId(),
      ceiling: () => this.#ownCeiling(),
      conflict: (brokerLast) => this.#fail(this.#nameConflict(brokerLast)),
    });
    this.#closedPromise = new Promise((resolve) => (this.#resolveClosed = resolve));
    this.#halted = new Promise((resolve) => (this.#halt = resolve));
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
    assertSubEntriesSafe(opts, transport.subEntrySize ?? 1);
    const ownedStore =
      typeof opts.store === 'string' ? await DedupStore.open(opts.store, { sync: opts.sync }) : undefined;
    const store = ownedStore ?? (opts.store as DedupStore);
    let state: ProducerState | undefined;
    // The handlers reach the core once it exists: nothing is sent before, so no confirm is missed.
    // A connection lost before then is kept and handed to the core as soon as it exists: dropped,
    // the publisher would believe itself connected until the confirm watchdog noticed.
    let core: DedupPublisherCore | undefined;
    let lostBeforeCore: Error | undefined;
    try {
      state = store.claimProducer(transport.target, opts.producerName);
      const startup = await startUp(state, transport, opts, {
        confirmed: (ids) => {
          if (core !== undefined) core.#onConfirmed(ids);
        },
        disconnected: (err) => {
          if (core !== undefined) core.#onDisconnected(err, 0);
          else lostBeforeCore ??= err;
        },
      });
      core = new DedupPublisherCore(transport, state, ownedStore, opts, startup);
      if (lostBeforeCore !== undefined) core.#onDisconnected(lostBeforeCore, 0);
      if (startup.plan.kind === 'adopt') await core.#reassign(startup.segments);
      else core.#recover(startup.segments);
      core.#start();
      return core;
    } catch (err) {
      // A core may exist already (adopting, a disconnect heard during open): stop its reconnect
      // loop before closing the transport, or a late reconnect would hold the name.
      if (core !== undefined) {
        core.#status = 'closing';
        await core.#reconnector.stop();
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
        const entry = this.#accept(e.body, withoutSkip(e.headers), undefined, e.key);
        if (entry instanceof Error) throw entry;
        reassigned.push(entry);
      }
    }
    if (reassigned.length === 0) return;
    this.#commits.replaceSegments(segments.map((s) => s.firstId));
    await storeWrite(this.#commits.write(reassigned, true));
    for (const e of reassigned) this.#pending.push(e);
    this.#resendAll = true;
  }

  /** Resuming: the outbox is re-sent with its own IDs, before anything new. */
  #recover(segments: LoadedProducer['segments']): void {
    const carriesBatches = this.#transport.carriesBatches === true;
    for (const e of recoveredEntries(segments, this.#keyed, carriesBatches)) this.#pending.push(e);
    this.#resendAll = this.#pending.size > 0;
  }

  /** The stream (or AMQP queue) it publishes to. */
  get target(): string {
    return this.#transport.target;
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

  /** Parked entries the send queue visited or moved (the abort property counts them). @internal */
  get queueWork(): number {
    return this.#queue.work;
  }

  /** Aborted sends still in the send queue and the bytes they hold (the abort property checks 0). @internal */
  abortedParked(): { entries: number; bytes: number } {
    return this.#queue.abortedParked();
  }

  /** True after `close()` or a fatal error. */
  get isClosed(): boolean {
    return this.#closeRequested || this.#status === 'closed';
  }

  /**
   * Calls `listener` once, at the moment a fatal error stops the publisher (before it has closed):
   * a publisher made of several cores stops the others at once.
   */
  onFailure(listener: (error: DedupError) => void): void {
    this.#failureListeners.push(listener);
  }

  /** Resolves when the publisher has closed: with the error that closed it, or `undefined` after `close()`. */
  closed(): Promise<DedupError | undefined> {
    return this.#closedPromise;
  }

  /** See `StreamDedupPublisher.send`. */
  send(body: Uint8Array, options: SendOptions = NO_OPTIONS): Promise<SendResult> {
    assertBody(body);
    const headers = validateHeaders(options.headers);
    if (this.#fatal !== undefined) return Promise.reject(this.#fatal);
    if (this.#closeRequested || this.#status === 'closed')
      return Promise.reject(closedError(this.producerName));
    assertFits(body, headers, this.#stampBytes, this.#transport.maxMessageBytes);
    const signal = options.signal;
    if (signal?.aborted) return Promise.reject(abortError(signal));
    // When every parked send was aborted, they are taken out before a new ID (a skip declaration
    // one of them carried goes to this send).
    this.#queue.beforeAssign();
    const id = idOf(options, this.idMode, this.#lastAssigned, this.producerName);
    if (typeof id === 'string') {
      // A key published before (and still retained) publishes nothing: see KeyedIds.duplicate.
      const duplicate = this.#keyed!.duplicate(id, this.#lastAssigned);
      if (duplicate !== undefined) {
        this.counters.keyDuplicates++;
        return duplicate;
      }
      return this.#submit(body, headers, undefined, id, signal);
    }
    if (id instanceof Error) return Promise.reject(id);
    return this.#submit(body, headers, id, undefined, signal);
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
    const promise = entry.promise();
    if (signal !== undefined) this.#aborts.join(entry, signal, prevAssigned);
    if (this.#queue.add(entry)) this.#schedulePump();
    return promise;
  }

  /**
   * Assigns the ID (the next one, or the caller's) and, for a key, its record in the index; the
   * first automatic ID after a skip carries the declaration.
   */
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
        if (!this.#queue.hasBatch && !this.#commits.hasWork) break;
        batch = this.#queue.beginCommit(this.#opts.maxBatch);
        try {
          await this.#commits.write(batch);
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
        if (this.#queue.refill()) this.#schedulePump();
      }
    } catch (err) {
      // Nothing here may reject unhandled (the pump runs from a timer): a broken invariant stops
      // the publisher with an error its callers see; the outbox keeps what it holds.
      this.#queue.endCommit(batch, false);
      this.#fail(internalError(this.producerName, err), batch);
    } finally {
      this.#pumping = false;
      for (const wake of this.#idle.splice(0)) wake();
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
      // Entries are OutgoingMessages already: the transport stamps the identity itself. A publish
      // that waits for the socket is raced with close(): its messages are pending (in the outbox),
      // and the transport's close ends the wait (the rejection then goes nowhere).
      const sending = this.#transport.publish(entries);
      sending.catch(() => undefined);
      await Promise.race([sending, this.#halted]);
    } catch (err) {
      if (err instanceof InvariantError) this.#fail(internalError(this.producerName, err));
      else this.#onDisconnected(err instanceof Error ? err : new Error(String(err)), epoch);
    }
  }

  /** Handlers for a connection made at `epoch`. Confirms from any connection count: the broker stored (or had) those IDs. */
  #handlers(epoch: number): TransportHandlers {
    return {
      confirmed: (ids) => this.#onConfirmed(ids),
      disconnected: (err) => this.#onDisconnected(err, epoch),
    };
  }

  #onConfirmed(ids: readonly bigint[]): void {
    const now = performance.now();
    takeConfirmed(this.#pending, ids, (e) => {
      // sentAt is rounded up to whole milliseconds: a confirm within one ms would be negative.
      if (e.sentAt > 0) this.#confirmLatency(Math.max(0, now - e.sentAt));
      this.#settleConfirmed(e);
    });
    if (this.#queue.refill() || this.#commits.hasConfirmWork) this.#schedulePump();
    if (this.inFlight === 0) for (const wake of this.#idle.splice(0)) wake();
  }

  #settleConfirmed(e: Entry): void {
    const id = e.publishingId;
    if (id > this.#highestConfirmed) this.#highestConfirmed = id;
    this.#commits.confirmed(e);
    if (e.key !== undefined) this.#keyed?.settled(e, id);
    this.#skip.confirmed(id);
    this.counters.confirmed++;
    e.settle({ publishingId: id, outcome: 'published' });
  }

  #onDisconnected(error: Error, epoch: number): void {
    if (epoch !== this.#epoch || this.#status !== 'open' || this.#fatal !== undefined) return;
    this.#status = 'reconnecting';
    this.#epoch++;
    this.#log.warn(
      { producer: this.producerName, target: this.#transport.target, err: error },
      'stream-dedup: connection lost; reconnecting',
    );
    this.#reconnector.start();
  }

  #reconnected(brokerLast: bigint | undefined): void {
    if (brokerLast !== undefined && brokerLast > this.#ownCeiling()) {
      this.#fail(this.#nameConflict(brokerLast));
      return;
    }
    if (brokerLast !== undefined && brokerLast < this.#highestConfirmed) {
      logBrokerBehind(
        this.#log,
        this.producerName,
        this.#transport.target,
        brokerLast,
        this.#highestConfirmed,
      );
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
  }

  /**
   * The highest ID this producer may have used: what it handed out, or the block an earlier life
   * reserved. Explicit IDs in reserve durability resume at the broker's last ID, and frames a dead
   * process left on the way can land after that (up to its reserved ceiling): not another writer.
   */
  #ownCeiling(): bigint {
    const reserved = this.#commits.reservedUpTo;
    return this.#lastAssigned > reserved ? this.#lastAssigned : reserved;
  }

  #nameConflict(brokerLast: bigint): DedupError {
    return nameConflictError(this.producerName, this.#transport.target, brokerLast, this.#ownCeiling());
  }

  /** After open: metrics, the log line, the timers, and the first pump (re-sends go first). */
  #start(): void {
    const target = this.#transport.target;
    this.#unobserve = observePublisher(this.counters, this.producerName, target, () => ({
      inFlight: this.inFlight,
      outbox: this.#pending.size,
      parked: this.#queue.parked,
    }));
    this.#confirmLatency = histogramRecorder('confirmLatency', { producer: this.producerName, target });
    logOpen(this.#log, this.producerName, this.#transport.target, this.report);
    this.#watchdog.start();
    this.#schedulePump();
  }

  /** Keyed mode: drops keys past the retention (counted from the store's last ID); their deletes ride the next commit. */
  #pruneKeys(): void {
    if (this.#keyed?.prune(this.#commits.lastDurable) === true) this.#schedulePump();
  }

  /** Stops for good: every waiting send rejects with `error`; the outbox keeps unconfirmed messages. */
  #fail(error: DedupError, extra: readonly Entry[] = []): void {
    if (this.#fatal !== undefined) return;
    this.#fatal = error;
    this.#log.error(
      { producer: this.producerName, target: this.#transport.target, err: error },
      'stream-dedup: publisher stopped',
    );
    letGoAll(this.#queue, this.#commits, this.#keyed, error, extra);
    void this.close();
    for (const listener of this.#failureListeners.splice(0)) listener(error);
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
    this.#halt();
    const reconnecting = this.#reconnector.stop();
    this.#watchdog.stop();
    this.#unobserve();
    // A group commit being written finishes first: its messages are then in the outbox. A publish
    // waiting for a socket that does not drain is not waited for (#halted): the watchdog, which
    // would have torn such a connection down, has just stopped, and only the transport's close
    // below ends that wait (issue 32, item 7: close() never returned).
    while (this.#pumping) await new Promise<void>((resolve) => this.#idle.push(resolve));
    await settleAtClose(this.#queue, this.#commits, this.#keyed, {
      producerName: this.producerName,
      durability: this.durability,
      fatal: () => this.#fatal,
    });
    // A reconnect attempt in progress may still open a connection: let it finish, then close it.
    await reconnecting;
    await this.#transport.close();
    this.#state.release();
    await this.#ownedStore?.close();
    this.#status = 'closed';
    this.#resolveClosed(this.#fatal);
  }
}
