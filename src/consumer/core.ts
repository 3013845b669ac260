/**
 * The transport-agnostic verifying consumer (docs/design.md §5): each message's identity is
 * checked against its scope's tracker, a new message runs the handler, and the commit pipeline
 * writes the handler's effects, the trackers and the offset in one LevelDB batch.
 */
import { DedupError } from '../errors.js';
import { holdsIdentity, parseIdentity, type MessageIdentity } from '../identity/headers.js';
import { tenantProblem } from '../identity/scope-key.js';
import { offsetKey } from '../store/consumer-keys.js';
import type { DedupStore } from '../store/store.js';
import { histogramRecorder, observeVerifier, verifierAttributes } from '../telemetry/metrics.js';
import { startSettle, traceProcess } from '../telemetry/tracing.js';
import { outOfRange } from '../util/options.js';
import { ChunkExpectation, type ChunkIdentity } from '../store/chunk-identity.js';
import { CommitPipeline, type Journal } from './commit-pipeline.js';
import {
  isConsumerStoreProvider,
  PARTITION_SEPARATOR,
  type ConsumerStore,
  type ConsumerStoreProvider,
} from './consumer-store.js';
import { Effects } from './effect-transaction.js';
import { LevelConsumerStore } from './level-consumer-store.js';
import { resolveVerifyingConsumerOptions, type ResolvedVerifyingConsumerOptions } from './options.js';
import { ScopeCache, type ScopeState } from './scope-cache.js';
import type {
  EffectTransaction,
  IncomingMessage,
  VerifyEvent,
  VerifyingConsumerOptions,
  VerifyStats,
} from './types.js';
import { Verified } from './verified-message.js';

export type {
  EffectTransaction,
  MessageHandler,
  SubscriptionOptions,
  VerifiedMessage,
  VerifyEvent,
  VerifyingConsumerOptions,
  VerifyStats,
} from './types.js';

/** What a consumer group adds to a partition's core (src/group); nothing for a plain consumer. */
export interface CoreExtensions {
  /** Appends each batch to the partition's changelog before it is written (CommitPipeline). */
  readonly journal?: Journal;
  /** Batches whose journal may run at once (CommitPipeline's `journalDepth`; default 1). */
  readonly journalDepth?: number;
  /** Before each write and commit report with a journal: the member still holds the partition (CommitPipeline's `gate`). */
  readonly gate?: () => Promise<void> | undefined;
  /** A stop with this error is expected (a lost partition, a fenced write): it is not logged as an error. */
  readonly expectedStop?: (error: unknown) => boolean;
  /** Called once when the core stops on an error (`cause`: what was thrown), wherever it was seen. */
  readonly onStop?: (error: Error, cause: unknown) => void;
  /** The stream (or queue) read: the `messaging.destination.name` of its spans. */
  readonly destination?: string;
  /**
   * The consumer's name in its spans (`messaging.consumer.group.name`) and metrics (`consumer`)
   * when it is not the core's: a group partition's core is named after its namespace in the
   * store, its telemetry after the group (the partition is the `destination`).
   */
  readonly telemetryName?: string;
  /**
   * The consumer name is a group partition's in a shared database (`<group>` + {@link
   * PARTITION_SEPARATOR} + `<partition>`): the separator a plain consumer's name may not hold.
   */
  readonly groupPartition?: boolean;
}

/**
 * Refuses a `commitLingerMs` the store cannot hold a batch open for: a quiet tail's batch stays
 * open commitLingerMs, and the server (PostgreSQL: `idleInTransactionTimeoutMs`) must not end it
 * first. Pure: called before any I/O by the core and by a group member's options.
 *
 * @throws RangeError when `commitLingerMs` is not less than the store's limit.
 * @internal
 */
export function checkCommitLinger(commitLingerMs: number, provider: ConsumerStoreProvider | undefined): void {
  const lingerLimit = provider?.commitLingerLimitMs;
  if (lingerLimit !== undefined && commitLingerMs >= lingerLimit) {
    outOfRange(
      'commitLingerMs',
      `less than the store's idleInTransactionTimeoutMs (${lingerLimit})`,
      commitLingerMs,
    );
  }
}

/**
 * Refuses, on a shared store (a {@link ConsumerStoreProvider}), a consumer name holding the
 * separator of a group partition's name: such a plain consumer could share a partition's offset
 * row and verifier scopes (a group's too: its name is checked the same way). Pure.
 *
 * @throws RangeError for a name holding U+001F.
 * @internal
 */
export function checkPlainName(consumerName: string): void {
  if (consumerName.includes(PARTITION_SEPARATOR)) {
    outOfRange(
      'consumerName',
      'a string without U+001F with this store (it separates a group from its partition)',
      consumerName,
    );
  }
}

/** How often idle scopes are looked for when `scopeTtlMs` is set. */
const EVICTION_INTERVAL_MS = 3_600_000;

/**
 * The transport-agnostic verifying consumer: dedup check, handler, and one LevelDB batch holding
 * the handler's effect, the verifier state and the offset.
 *
 * @internal Applications use `StreamVerifyingConsumer` or `AmqpVerifyingConsumer`.
 */
export class VerifyingConsumerCore {
  readonly consumerName: string;
  readonly stats: VerifyStats = {
    new: 0,
    duplicate: 0,
    stale: 0,
    gapsReported: 0,
    gapsConfirmed: 0,
    skips: 0,
    unidentified: 0,
    commits: 0,
    fences: 0,
    retries: 0,
    reconnects: 0,
  };
  readonly #store: ConsumerStore;
  readonly #opts: ResolvedVerifyingConsumerOptions;
  readonly #scopes: ScopeCache;
  readonly #pipeline: CommitPipeline;
  /** The LevelDB store's effects; `undefined` on a store whose handlers write their own tables. */
  readonly #effects: Effects | undefined;
  #ttlTimer: NodeJS.Timeout | undefined;
  /** `close()` was called: no new message is accepted. */
  #closing = false;
  /** The first offset delivered while nothing was committed (see startOffset). */
  #firstDelivered: bigint | undefined;
  readonly #stopListeners = new Set<(error: Error) => void>();
  #unobserve: () => void = () => undefined;
  readonly #extensions: CoreExtensions;
  /** The transport's way to subscribe again from the committed offset (see {@link VerifyingConsumerCore.onRewind}). */
  #rewindListener: ((delayMs: number) => void) | undefined;
  /** What the first message of the current subscription must come from (recreated-stream check). */
  readonly #expectation = new ChunkExpectation();

  private constructor(
    store: ConsumerStore,
    options: ResolvedVerifyingConsumerOptions,
    extensions: CoreExtensions,
  ) {
    this.consumerName = options.consumerName;
    this.#extensions = extensions;
    this.#store = store;
    this.#opts = options;
    const level = store instanceof LevelConsumerStore ? store : undefined;
    const recordCommit = histogramRecorder(
      'commitDuration',
      verifierAttributes(extensions.telemetryName ?? options.consumerName, extensions.destination),
    );
    this.#scopes = new ScopeCache(
      level?.db ?? store,
      options.consumerName,
      options.policy,
      options.scopeTtlMs,
    );
    this.#pipeline = new CommitPipeline({
      store,
      offsetKey: offsetKey(options.consumerName),
      committedOffset: store.committedOffset,
      committedChunk: store.committedChunk,
      scopes: this.#scopes,
      options,
      stats: this.stats,
      onStop: (error, cause, first) => this.#stopped(error, cause, first),
      recover: (error) => this.#recover(error, false),
      journal: extensions.journal,
      journalDepth: extensions.journalDepth,
      gate: extensions.gate,
      traceSettle: (messages, lastOffset) =>
        startSettle(
          extensions.destination,
          extensions.telemetryName ?? options.consumerName,
          messages,
          lastOffset,
          recordCommit,
        ),
    });
    if (level !== undefined) {
      this.#effects = new Effects(level.db, this.#pipeline, options.consumerName);
      level.transaction = this.#effects.transaction;
    }
  }

  /**
   * Checks the options (before any I/O), opens the store when given a path, claims the consumer's
   * name and reads its committed offset.
   *
   * @throws TypeError, RangeError for a bad option ("Expected <option> to be <what>, got <value>").
   * @throws DedupError `DEDUP_STORE_LOCKED`, `DEDUP_STORE_CORRUPT`.
   */
  static async open(
    options: VerifyingConsumerOptions,
    extensions: CoreExtensions = {},
  ): Promise<VerifyingConsumerCore> {
    const opts = resolveVerifyingConsumerOptions(options);
    const provider = isConsumerStoreProvider(opts.store) ? opts.store : undefined;
    if (provider !== undefined && extensions.journal !== undefined) {
      throw new TypeError('a consumer group keeps its state in LevelDB: pass a folder path or a DedupStore');
    }
    if (provider !== undefined && opts.scopeTtlMs > 0) {
      outOfRange('scopeTtlMs', '0 with this store (it does not evict idle scopes)', opts.scopeTtlMs);
    }
    checkCommitLinger(opts.commitLingerMs, provider);
    if (provider !== undefined && extensions.groupPartition !== true) checkPlainName(opts.consumerName);
    // The store may stop the consumer itself (a handler that used its client after returning).
    let fail = (error: Error): void => void error;
    const store =
      provider !== undefined
        ? await provider.openConsumerStore(opts.consumerName, (error) => fail(error))
        : await LevelConsumerStore.open(opts.store as string | DedupStore, opts.consumerName, opts.sync);
    let core: VerifyingConsumerCore | undefined;
    try {
      core = new VerifyingConsumerCore(store, opts, extensions);
      const pipeline = core.#pipeline;
      fail = (error) => void pipeline.fail(error);
      if (opts.scopeTtlMs > 0) await core.evictIdle(Date.now());
      core.#unobserve = observeVerifier(
        core.stats,
        extensions.telemetryName ?? opts.consumerName,
        extensions.destination,
      );
      if (opts.scopeTtlMs > 0) {
        const opened = core;
        core.#ttlTimer = setInterval(
          () => void opened.evictIdle(Date.now()).catch(() => undefined),
          EVICTION_INTERVAL_MS,
        );
        core.#ttlTimer.unref();
      }
      opts.logger.info(
        { consumer: opts.consumerName, resumeOffset: core.resumeOffset?.toString() },
        'stream-dedup: verifying consumer open',
      );
      return core;
    } catch (err) {
      // A failed open gives the name back, so the next try reports the real error again.
      await store.close();
      throw err;
    }
  }

  /** The offset to resume from: one past the last committed message, or `undefined` for a new consumer. */
  get resumeOffset(): bigint | undefined {
    const committed = this.#pipeline.committedOffset;
    return committed === undefined ? undefined : committed + 1n;
  }

  /**
   * Where a subscription starts: {@link VerifyingConsumerCore.resumeOffset}, or before the first
   * commit the first offset this consumer was delivered. A resubscription before the first commit
   * (a lost connection drops the uncommitted batch) must deliver that batch again: at `startFrom`
   * 'next' it would start at the stream's new end, and the dropped batch and everything written
   * while away would never be delivered (review B, finding 1). `undefined`: nothing delivered yet.
   */
  get startOffset(): bigint | undefined {
    return this.resumeOffset ?? this.#firstDelivered;
  }

  /** The last committed offset. */
  get committedOffset(): bigint | undefined {
    return this.#pipeline.committedOffset;
  }

  /**
   * The identity of the stream chunk holding {@link VerifyingConsumerCore.committedOffset}, when
   * the store holds one (stream transport, since 0.6.0).
   */
  get committedChunk(): ChunkIdentity | undefined {
    return this.#pipeline.committedChunk;
  }

  /**
   * A subscription at `chunk.firstOffset` starts (`undefined`: a subscription with no check): its
   * first message must be the first of `chunk`, else the consumer stops with `refuse`'s error
   * before anything of the subscription is verified or handled (consumer/chunk-identity.ts).
   */
  expectChunk(chunk: ChunkIdentity | undefined, refuse?: (found: string) => DedupError): void {
    this.#expectation.arm(chunk, refuse);
  }

  /** The error that stopped the consumer, if any. */
  get failure(): Error | undefined {
    return this.#pipeline.failure;
  }

  /** Calls `listener` with the committed offset after every commit; returns the unsubscribe function. */
  onCommitted(listener: (offset: bigint) => void): () => void {
    return this.#pipeline.onCommitted(listener);
  }

  /**
   * Resolves once every message up to `offset` is committed; rejects if the consumer stops first
   * (with the error that stopped it, or `DEDUP_CONSUMER_CLOSED` after `close()`).
   */
  async waitForOffset(offset: bigint): Promise<void> {
    const committed = this.#pipeline.committedOffset;
    if (committed !== undefined && committed >= offset) return;
    if (this.failure !== undefined) throw this.failure;
    let unsubscribe = (): void => undefined;
    try {
      await new Promise<void>((resolve, reject) => {
        const onCommit = this.onCommitted((at) => {
          if (at >= offset) resolve();
        });
        const onStop = (error: Error): void => reject(error);
        this.#stopListeners.add(onStop);
        unsubscribe = () => {
          onCommit();
          this.#stopListeners.delete(onStop);
        };
      });
    } finally {
      unsubscribe();
    }
  }

  /**
   * Lets the consumer go on after a fence or a retryable failure (PostgreSQL store): `listener` is
   * called once the batch is dropped and the committed offset re-read, and must subscribe again
   * from {@link VerifyingConsumerCore.resumeOffset} after `delayMs` (what was delivered for the old
   * subscription is not processed). Without a listener such errors stop the consumer.
   */
  onRewind(listener: (delayMs: number) => void): void {
    this.#rewindListener = listener;
  }

  /** Reads a value the handler committed (outside any batch). */
  readEffect(key: string): Promise<Buffer | undefined> {
    if (this.#effects === undefined) {
      return Promise.reject(
        new TypeError('readEffect reads LevelDB effects: this consumer writes its own tables'),
      );
    }
    return this.#effects.readCommitted(key);
  }

  /**
   * Verifies and applies one message. Call in stream order, one at a time (await each). A handler
   * error stops the consumer: nothing of the uncommitted batch is kept, and a restart reprocesses
   * from the last commit.
   *
   * @throws DedupError `DEDUP_CONSUMER_CLOSED` once `close()` was called; the error that stopped
   *   the consumer once it stopped.
   */
  process(message: IncomingMessage): Promise<void> | undefined {
    const pipeline = this.#pipeline;
    if (pipeline.failure !== undefined) throw pipeline.failure;
    if (this.#closing) throw new DedupError('DEDUP_CONSUMER_CLOSED', 'the verifying consumer is closed');
    // Another stream under the committed offset's name: nothing of it may be applied.
    const regression = this.#expectation.check(message.offset, message.chunk);
    if (regression !== undefined) throw pipeline.fail(regression);
    if (pipeline.committedOffset === undefined) {
      // Before the first commit: a resubscription starts at the first offset delivered (see
      // startOffset); what a chunk holds before it is not this consumer's input.
      const floor = this.#firstDelivered;
      if (floor === undefined) this.#firstDelivered = message.offset;
      else if (message.offset < floor) {
        message.settle?.();
        return undefined;
      }
    }
    if (pipeline.isHanded(message.offset)) {
      // Redelivered (for example a re-subscription after a lost connection): committed, or in the
      // commit being written; settled once that is durable.
      if (message.settle !== undefined) pipeline.settleRedelivered(message.offset, message.settle);
      return undefined;
    }
    // Synchronous unless a scope must be loaded, the handler is async, or a commit must wait:
    // the per-message path costs no promise in the common case.
    pipeline.beginMessage();
    let applying: Promise<void> | undefined;
    try {
      // A transactional store opens the batch's transaction first (LevelDB: nothing to wait for).
      const entering = this.#store.enter();
      applying =
        entering === undefined ? this.#apply(message) : entering.then(() => this.#applyUnlessFailed(message));
    } catch (err) {
      const recovered = this.#recover(err, true);
      if (recovered === true) return undefined;
      throw pipeline.abortMessage(recovered ?? err);
    }
    if (applying === undefined) return pipeline.endMessage(message.offset, message.settle, message.chunk);
    return applying.then(
      () => pipeline.endMessageAsync(message.offset, message.settle, message.chunk),
      (err: unknown) => {
        // Its batch was discarded while it ran (review B, L4: a group member's partition revoked
        // mid-handler; the PostgreSQL store then refuses its queries): whatever it threw, its
        // message is dropped as if it had returned, and processed again by the next holder.
        if (pipeline.discardedWhileRunning) return pipeline.endMessageAsync(message.offset, message.settle);
        const recovered = this.#recover(err, true);
        if (recovered !== true) pipeline.abortMessageAsync(recovered ?? err);
      },
    );
  }

  /**
   * After a message (`inMessage`) or a batch's write failed with `err`: true when the store
   * recovers from it (a fence, a deadlock, a lost connection): the message and the uncommitted
   * batch are dropped (rolled back), the cached verifier states forgotten, and the transport
   * subscribes again from the store's committed offset (re-read at the next batch: a COMMIT whose
   * answer was lost shows as a fence then). Otherwise the consumer must stop: with `err`
   * (`undefined` returned) or the store's error (its retries ran out).
   */
  #recover(err: unknown, inMessage: boolean): true | Error | undefined {
    const recovery = this.#rewindListener === undefined ? undefined : this.#store.recover?.(err);
    if (recovery === undefined || recovery instanceof Error) return recovery;
    const pipeline = this.#pipeline;
    if (inMessage) pipeline.dropMessage();
    pipeline.rebase(this.#store.committedOffset, this.#store.committedChunk);
    this.#scopes.clear();
    if (recovery.kind === 'fenced') this.stats.fences++;
    else if (recovery.kind === 'retry') this.stats.retries++;
    else this.stats.reconnects++;
    this.#opts.logger.warn(
      {
        consumer: this.consumerName,
        err,
        resumeOffset: this.resumeOffset?.toString(),
        delayMs: recovery.delayMs,
      },
      recovery.kind === 'fenced'
        ? 'stream-dedup: verifying consumer fenced (another process moved its offset); its batch is rolled back and it goes on from the stored offset'
        : recovery.kind === 'retry'
          ? 'stream-dedup: batch rolled back after a transient failure; running it again from the committed offset'
          : 'stream-dedup: lost the connection to the store; reconnecting, then running the batch again from the committed offset',
    );
    this.#rewindListener!(recovery.delayMs);
    return true;
  }

  /**
   * {@link VerifyingConsumerCore.#apply} once the store's batch is open, unless the commit that
   * opening waited for failed meanwhile: the consumer has stopped, and no handler may run after that
   * (its side effects outside the store would happen for a message never committed).
   */
  #applyUnlessFailed(message: IncomingMessage): Promise<void> | undefined {
    const failure = this.#pipeline.failure;
    if (failure !== undefined) throw failure;
    return this.#apply(message);
  }

  /**
   * Commits the pending batch: effects, touched verifier states and the offset in one LevelDB
   * batch; then settles (acks) the messages. Resolves once it is durable. Idempotent when nothing
   * is pending. A handler in progress is waited for, and its message committed too (never part of
   * it): so a handler must not await `flush()` or `close()` itself.
   */
  flush(): Promise<void> {
    return this.#pipeline.flush();
  }

  /**
   * Drops the uncommitted batch (after a lost connection: the messages are delivered again from
   * the committed offset).
   */
  discardPending(): void {
    this.#pipeline.discard();
  }

  /**
   * Forgets scopes of this consumer idle longer than `scopeTtlMs`; returns how many. The scan
   * only proposes: each scope is decided again when the deletions are written, and kept if
   * anything wrote or touched it since the scan began.
   */
  evictIdle(nowMs: number): Promise<number> {
    return this.#scopes.evictIdle(nowMs, this.#pipeline);
  }

  /**
   * Commits what is pending (unless failed), then releases the store. A handler in progress is
   * waited for and its message committed with the rest; `process()` refuses new messages from
   * the call on. Idempotent.
   */
  async close(): Promise<void> {
    if (this.#pipeline.isClosed) return;
    // A handler in progress finishes, and its message is committed with the rest; nothing new starts.
    this.#closing = true;
    await this.flush().catch(() => undefined);
    await this.#pipeline.idle();
    this.#pipeline.close();
    clearInterval(this.#ttlTimer);
    this.#unobserve();
    const closed = new DedupError(
      'DEDUP_CONSUMER_CLOSED',
      'the verifying consumer closed before reaching the offset',
    );
    for (const listener of this.#stopListeners) listener(this.failure ?? closed);
    await this.#store.close();
  }

  #apply(message: IncomingMessage): Promise<void> | undefined {
    const verified = new Verified(message);
    const source = holdsIdentity(message.applicationProperties)
      ? message.applicationProperties
      : holdsIdentity(message.messageAnnotations)
        ? message.messageAnnotations
        : undefined;
    // The identity, or why there is none.
    let identity = source === undefined ? 'no identity headers' : parseIdentity(source);
    let tenant = '';
    if (this.#opts.tenant !== undefined) {
      // The application's function: when it throws, the consumer stops with its error, as with a
      // handler's. A value that cannot be part of a scope key (often a header from the wire) makes
      // the message unidentified: reported and passed, never a throw from process().
      const computed: unknown = this.#opts.tenant({ headers: verified.headers });
      const problem = tenantProblem(computed);
      if (problem === undefined) tenant = computed as string;
      else if (typeof identity !== 'string') identity = problem;
    }
    verified.tenant = tenant;
    if (typeof identity === 'string') {
      const applied = this.#opts.unidentified === 'pass-through';
      this.stats.unidentified++;
      this.#emit({ kind: 'unidentified', offset: message.offset, reason: identity, applied });
      return applied ? this.#runHandler(verified) : undefined;
    }
    verified.identity = identity;
    const scope = this.#scopes.key(tenant, identity.producerName);
    const state = this.#scopes.get(scope);
    if (state === undefined) {
      return this.#scopes
        .load(scope)
        .then((loaded) => this.#applyIn(loaded, scope, verified, identity, message.offset));
    }
    return this.#applyIn(state, scope, verified, identity, message.offset);
  }

  #applyIn(
    state: ScopeState,
    scope: string,
    verified: Verified,
    identity: MessageIdentity,
    offset: bigint,
  ): Promise<void> | undefined {
    const tracker = state.working ?? state.committing ?? state.committed;
    const verdict = tracker.check(identity.publishingId);
    if (verdict.outcome === 'duplicate') {
      this.stats.duplicate++;
      this.#emit({ kind: 'duplicate', scope, publishingId: identity.publishingId, offset });
      return undefined;
    }
    if (verdict.outcome === 'stale') {
      this.stats.stale++;
      this.#emit({ kind: 'stale', scope, publishingId: identity.publishingId, offset });
      return undefined;
    }
    const { publishingId, skippedFrom } = identity;
    if (skippedFrom !== undefined) {
      this.stats.skips++;
      this.#emit({
        kind: 'skip',
        scope,
        range: { from: skippedFrom, to: publishingId - 1n },
        publishingId,
        offset,
      });
    }
    if (verdict.skipped !== undefined && tracker.highest > 0n) {
      // Only the part below a declared skip is possibly lost.
      const { from } = verdict.skipped;
      const to =
        skippedFrom === undefined || skippedFrom > verdict.skipped.to ? verdict.skipped.to : skippedFrom - 1n;
      if (from <= to) {
        this.stats.gapsReported++;
        this.#emit({
          kind: 'gap',
          scope,
          range: to === verdict.skipped.to ? verdict.skipped : { from, to },
          confirmed: false,
        });
      }
    }
    const effect = this.#runHandler(verified);
    if (effect !== undefined) return effect.then(() => this.#record(state, scope, publishingId, skippedFrom));
    this.#record(state, scope, publishingId, skippedFrom);
    return undefined;
  }

  /** Runs the handler with the store's context, which is revoked once the handler has returned or thrown. */
  #runHandler(verified: Verified): Promise<void> | undefined {
    const store = this.#store;
    const context = store.handlerContext();
    // In a `process` span when an OpenTelemetry SDK records (telemetry/tracing.ts).
    const handle = (): Promise<void> | undefined =>
      traceProcess(
        this.#extensions.destination,
        this.#extensions.telemetryName ?? this.consumerName,
        verified,
        () => asPromise(this.#opts.handler(verified, context as EffectTransaction)),
      );
    if (store.releaseContext === undefined) return handle();
    let effect: Promise<void> | undefined;
    try {
      effect = handle();
    } finally {
      if (effect === undefined) store.releaseContext(context);
    }
    if (effect === undefined) return undefined;
    return effect.finally(() => store.releaseContext?.(context));
  }

  /** After the handler: the ID is recorded in the scope's working copy, which the next commit writes. */
  #record(state: ScopeState, scope: string, publishingId: bigint, skippedFrom: bigint | undefined): void {
    const { confirmedGaps } = this.#scopes.record(state, publishingId, skippedFrom);
    for (const range of confirmedGaps) {
      this.stats.gapsConfirmed++;
      this.#emit({ kind: 'gap', scope, range, confirmed: true });
    }
    this.#pipeline.touch(scope);
    this.stats.new++;
  }

  #emit(event: VerifyEvent): void {
    try {
      this.#opts.onEvent?.(event);
    } catch {
      // An observer's bug must not change what is committed.
    }
  }

  /** The pipeline stopped for good (a handler threw, a write failed): log once, tell every waiter. */
  #stopped(error: Error, cause: unknown, first: boolean): void {
    if (first && this.#extensions.expectedStop?.(cause) !== true) {
      this.#opts.logger.error(
        { consumer: this.consumerName, err: cause },
        'stream-dedup: verifying consumer stopped; uncommitted work is dropped and redelivered after a restart',
      );
    }
    if (first) this.#extensions.onStop?.(error, cause);
    for (const listener of this.#stopListeners) listener(error);
  }
}

/** The handler's result as a promise when it is one (a thenable), else `undefined`. */
function asPromise(result: unknown): Promise<void> | undefined {
  if (result === undefined || result === null) return undefined;
  const then = (result as { then?: unknown }).then;
  return typeof then === 'function' ? Promise.resolve(result as PromiseLike<void>) : undefined;
}
