import { DedupError } from '../errors.js';
import { holdsIdentity, parseIdentity, type MessageIdentity } from '../identity/headers.js';
import { encodeScopeKey, scopeKeyPrefix } from '../identity/scope-key.js';
import { DedupStore, type KeyValueDb } from '../store/store.js';
import { createTracker, decodeTracker } from '../verifier/window.js';
import type { IdRange, PolicySpec, SequenceTracker } from '../verifier/types.js';
import { silentLogger, type Logger } from '../telemetry/logger.js';
import { observeVerifier } from '../telemetry/metrics.js';

/** A message handed to the handler: identity verified, seen for the first time in its scope. */
export interface VerifiedMessage {
  readonly body: Buffer;
  /** Position in the stream (stream protocol) or the `x-stream-offset` (AMQP 0-9-1). */
  readonly offset: bigint;
  /** The stamped identity; `undefined` only for unidentified messages under `unidentified: 'pass-through'`. */
  readonly identity: MessageIdentity | undefined;
  readonly tenant: string;
  /** The message's headers (application properties, then annotations, merged). */
  readonly headers: Readonly<Record<string, unknown>>;
}

/**
 * The handler's view of the store: its writes are committed in the same LevelDB batch as the
 * verifier state and the consumer's offset, or not at all. Reads see the batch's own writes.
 * Keys live in the consumer's own namespace.
 */
export interface EffectTransaction {
  /**
   * The value of an effect key as this handler sees it: written earlier in the same batch, or
   * committed. Always a Buffer (a copy: changing it changes nothing stored), UTF-8 for what was put
   * as a string — `Number((await tx.get('balance'))?.toString() ?? 0)`.
   */
  get(key: string): Promise<Buffer | undefined>;
  /** Writes an effect key in the batch of this message's dedup state; a Uint8Array is copied at the call. */
  put(key: string, value: string | Uint8Array): void;
  /** Deletes an effect key in the batch of this message's dedup state. */
  del(key: string): void;
}

/** Processes one new message; whatever it writes through `tx` commits atomically with the dedup state. */
export type MessageHandler = (message: VerifiedMessage, tx: EffectTransaction) => void | Promise<void>;

/** Something the verifier noticed, for observation (metrics, logs, alerts). */
export type VerifyEvent =
  | {
      readonly kind: 'duplicate';
      readonly scope: string;
      readonly publishingId: bigint;
      readonly offset: bigint;
    }
  | {
      /** Left of the window: an old repeat or a very late new message. Not applied, never counted as a duplicate. */
      readonly kind: 'stale';
      readonly scope: string;
      readonly publishingId: bigint;
      readonly offset: bigint;
    }
  | {
      /**
       * IDs missing, possibly lost: `confirmed` false when first jumped over, true when they left the
       * window unseen. Never IDs their producer declared skipped (those are `skip`).
       */
      readonly kind: 'gap';
      readonly scope: string;
      readonly range: IdRange;
      readonly confirmed: boolean;
    }
  | {
      /**
       * The message `publishingId` declares that its producer never used the IDs of `range` (a
       * crash in `reserve` durability, an adopting open): not a loss. Reported once per delivery
       * of the declaring message; its IDs are never reported as a `gap`. Since 0.2.0.
       */
      readonly kind: 'skip';
      readonly scope: string;
      readonly range: IdRange;
      readonly publishingId: bigint;
      readonly offset: bigint;
    }
  | {
      readonly kind: 'unidentified';
      readonly offset: bigint;
      readonly reason: string;
      readonly applied: boolean;
    };

/** Options shared by the verifying consumers of every transport. */
export interface VerifyingConsumerOptions {
  /** The consuming application's name: part of every scope key and of the offset record. */
  readonly consumerName: string;
  /** A LevelDB folder (opened and closed by the consumer) or an opened `DedupStore`. */
  readonly store: string | DedupStore;
  /** fsync every commit; only when `store` is a path. @defaultValue false */
  readonly sync?: boolean;
  /** The handler applied once per new message. */
  readonly handler: MessageHandler;
  /**
   * The sequence policy per (consumer, tenant, producer). `window` accepts reordering up to its
   * size; `highest` only strictly increasing IDs.
   * @defaultValue `{ kind: 'window', size: 1024 }`
   */
  readonly policy?: PolicySpec;
  /** The tenant of a message (part of the scope key). @defaultValue `() => ''` */
  readonly tenant?: (message: { readonly headers: Readonly<Record<string, unknown>> }) => string;
  /**
   * Messages without identity or with malformed identity: `reject` skips them (reported as
   * `unidentified`), `pass-through` applies them without deduplication. Never a crash.
   * @defaultValue 'reject'
   */
  readonly unidentified?: 'reject' | 'pass-through';
  /**
   * `message`: one LevelDB batch per message. `batch`: one per `commitEvery` messages, or after
   * `commitLingerMs` without a new message.
   * @defaultValue 'batch'
   */
  readonly commit?: 'message' | 'batch';
  /** @defaultValue 1000 */
  readonly commitEvery?: number;
  /** @defaultValue 5 */
  readonly commitLingerMs?: number;
  /**
   * Forget the state of a scope idle longer than this many ms (checked at open and hourly). A
   * duplicate that arrives after its scope was forgotten takes effect again. 0 keeps state forever.
   * @defaultValue 0
   */
  readonly scopeTtlMs?: number;
  /** Observation: duplicates, stale messages, gaps, unidentified messages. */
  readonly onEvent?: (event: VerifyEvent) => void;
  /** A pino-compatible logger (open, commit failures). Silent by default. */
  readonly logger?: Logger;
  /** Observation hooks around each commit (for example fault injection in tests). */
  readonly hooks?: {
    readonly beforeCommit?: (info: { readonly messages: number; readonly lastOffset: bigint }) => void;
    readonly afterCommit?: (info: { readonly messages: number; readonly lastOffset: bigint }) => void;
  };
}

/** Counters since open. */
export interface VerifyStats {
  new: number;
  duplicate: number;
  stale: number;
  gapsReported: number;
  gapsConfirmed: number;
  /** Skip declarations seen (`skip` events). Since 0.2.0. */
  skips: number;
  unidentified: number;
  commits: number;
}

/**
 * A message as a transport hands it to the core: the shape of the stream client's delivered
 * message, so that the stream consumer passes deliveries through as they are (no wrapper object
 * per message).
 */
export interface IncomingMessage {
  readonly offset: bigint;
  readonly content: Buffer;
  /** Where the identity is read first: application properties (stream), headers (AMQP 0-9-1). */
  readonly applicationProperties?: Readonly<Record<string, unknown>> | undefined;
  /** Read second: AMQP 0-9-1 `x-` headers arrive here in a stream consumer (see `readIdentity`). */
  readonly messageAnnotations?: Readonly<Record<string, unknown>> | undefined;
  /** Called once the message's outcome is committed (AMQP: ack). */
  readonly settle?: (() => void) | undefined;
}

/**
 * A scope's trackers: `committed` is durable, `committing` is in the batch being written,
 * `working` has this batch's records. Readers take the newest that exists.
 */
interface ScopeState {
  committed: SequenceTracker;
  committing: SequenceTracker | undefined;
  working: SequenceTracker | undefined;
  lastSeenMs: number;
  /** The number of the last write that wrote this scope's state (0: none in this life). */
  writtenBy: number;
}

type Op = { type: 'put'; key: string; value: Uint8Array } | { type: 'del'; key: string };
/** A handler's write in the pending batch: a string value is encoded once, when the batch is written. */
type PendingOp = { type: 'put'; key: string; value: Uint8Array | string } | { type: 'del'; key: string };

function encodedOp(op: PendingOp): Op {
  return op.type === 'put' && typeof op.value === 'string'
    ? { type: 'put', key: op.key, value: Buffer.from(op.value, 'utf8') }
    : (op as Op);
}

const DEFAULT_POLICY: PolicySpec = { kind: 'window', size: 1024 };
/** Full batches that may wait behind the write in flight before `process()` makes the caller wait. */
const BATCHES_AHEAD = 4;

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
  };
  readonly #db: KeyValueDb;
  readonly #sync: boolean;
  readonly #ownedStore: DedupStore | undefined;
  readonly #release: () => void;
  readonly #opts: VerifyingConsumerOptions;
  readonly #policy: PolicySpec;
  /** Messages per batch (`commitEvery`). */
  readonly #commitEvery: number;
  readonly #offsetKey: string;
  readonly #effectPrefix: string;
  readonly #scopes = new Map<string, ScopeState>();
  readonly #scopeKeys = new Map<string, Map<string, string>>();
  /** The last (tenant, producer) looked up and its key: consecutive messages mostly share it. */
  #lastScope = { tenant: '', producer: '', key: '' };
  /** Handler keys with the consumer's prefix: `prefix + key` per put is a new string to hash. */
  readonly #effectKeys = new Map<string, string>();
  #committedOffset: bigint | undefined;
  /**
   * The last offset handed to a write: the committed offset, or the last offset of the commit in
   * flight (which becomes durable, or the consumer stops). Redeliveries up to it are not processed.
   */
  #handedOffset: bigint | undefined;
  /** The uncommitted batch. */
  #ops = new Map<string, PendingOp>();
  #touched = new Set<string>();
  #pendingMessages = 0;
  #pendingSettles: Array<() => void> = [];
  #lastOffset: bigint | undefined;
  #linger: NodeJS.Timeout | undefined;
  #ttlTimer: NodeJS.Timeout | undefined;
  /** The write in flight, if any (at most one at a time): a commit, or an eviction's deletions. */
  #committing: Promise<void> | undefined;
  /** Writes begun and writes finished (durable or failed), in order: writes never overlap. */
  #writesBegun = 0;
  #writesDone = 0;
  /**
   * Who waits for the handler in progress to return (`flush()`, `close()`, eviction): nothing
   * that writes the pending batch may start while a handler is between two of its writes.
   */
  #boundaryWaiters: Array<() => void> | undefined;
  /** `discardPending()` ran while a handler was in progress: its message is dropped when it returns. */
  #dropCurrent = false;
  #inflightOps: Map<string, PendingOp> | undefined;
  #failed: Error | undefined;
  #closed = false;
  /** `close()` was called: no new message is accepted. */
  #closing = false;
  /** A message is in progress: from `process()` until its handler returned (or threw). */
  #processing = false;
  readonly #commitListeners = new Set<(offset: bigint) => void>();
  readonly #stopListeners = new Set<(error: Error) => void>();
  #unobserve: () => void = () => undefined;

  private constructor(
    db: KeyValueDb,
    sync: boolean,
    ownedStore: DedupStore | undefined,
    release: () => void,
    options: VerifyingConsumerOptions,
    committedOffset: bigint | undefined,
  ) {
    this.consumerName = options.consumerName;
    this.#db = db;
    this.#sync = sync;
    this.#ownedStore = ownedStore;
    this.#release = release;
    this.#opts = options;
    this.#policy = options.policy ?? DEFAULT_POLICY;
    this.#commitEvery = options.commitEvery ?? 1000;
    this.#offsetKey = consumerPrefix('c', options.consumerName) + '/offset';
    this.#effectPrefix = consumerPrefix('u', options.consumerName);
    this.#committedOffset = committedOffset;
    this.#handedOffset = committedOffset;
  }

  static async open(options: VerifyingConsumerOptions): Promise<VerifyingConsumerCore> {
    validate(options);
    createTracker(options.policy ?? DEFAULT_POLICY); // validates the policy before anything opens
    const owned =
      typeof options.store === 'string'
        ? await DedupStore.open(options.store, { sync: options.sync ?? false })
        : undefined;
    const store = owned ?? (options.store as DedupStore);
    let release: (() => void) | undefined;
    let core: VerifyingConsumerCore | undefined;
    try {
      release = store.claimConsumer(options.consumerName);
      const raw = await store.db.get(consumerPrefix('c', options.consumerName) + '/offset');
      const committed = raw === undefined ? undefined : decodeOffset(raw);
      core = new VerifyingConsumerCore(store.db, store.sync, owned, release, options, committed);
      const ttl = options.scopeTtlMs ?? 0;
      if (ttl > 0) await core.evictIdle(Date.now());
      core.#unobserve = observeVerifier(core.stats, options.consumerName);
      if (ttl > 0) {
        const opened = core;
        core.#ttlTimer = setInterval(
          () => void opened.evictIdle(Date.now()).catch(() => undefined),
          3_600_000,
        );
        core.#ttlTimer.unref();
      }
      (options.logger ?? silentLogger).info(
        { consumer: options.consumerName, resumeOffset: core.resumeOffset?.toString() },
        'stream-dedup: verifying consumer open',
      );
      return core;
    } catch (err) {
      // A failed open gives the name back, so the next try reports the real error again.
      release?.();
      await owned?.close();
      throw err;
    }
  }

  /** The offset to resume from: one past the last committed message, or `undefined` for a new consumer. */
  get resumeOffset(): bigint | undefined {
    return this.#committedOffset === undefined ? undefined : this.#committedOffset + 1n;
  }

  /** The last committed offset. */
  get committedOffset(): bigint | undefined {
    return this.#committedOffset;
  }

  /** The error that stopped the consumer, if any. */
  get failure(): Error | undefined {
    return this.#failed;
  }

  /** Calls `listener` with the committed offset after every commit; returns the unsubscribe function. */
  onCommitted(listener: (offset: bigint) => void): () => void {
    this.#commitListeners.add(listener);
    return () => this.#commitListeners.delete(listener);
  }

  /**
   * Resolves once every message up to `offset` is committed; rejects if the consumer stops first
   * (with the error that stopped it).
   */
  async waitForOffset(offset: bigint): Promise<void> {
    if (this.#committedOffset !== undefined && this.#committedOffset >= offset) return;
    if (this.#failed !== undefined) throw this.#failed;
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

  /** Reads a value the handler committed (outside any batch). */
  readEffect(key: string): Promise<Buffer | undefined> {
    return this.#db.get(this.#effectKey(key)).then(asBuffer);
  }

  /**
   * Verifies and applies one message. Call in stream order, one at a time (await each). A handler
   * error stops the consumer: nothing of the uncommitted batch is kept, and a restart reprocesses
   * from the last commit.
   */
  process(message: IncomingMessage): Promise<void> | undefined {
    if (this.#failed !== undefined) throw this.#failed;
    if (this.#closing) throw new DedupError('DEDUP_PUBLISHER_CLOSED', 'the verifying consumer is closed');
    if (this.#handedOffset !== undefined && message.offset <= this.#handedOffset) {
      // Redelivered (for example a re-subscription after a lost connection): committed, or in the
      // commit being written; settled once that is durable.
      if (message.settle !== undefined) this.#settleRedelivered(message.offset, message.settle);
      return undefined;
    }
    // Synchronous unless a scope must be loaded, the handler is async, or a commit must wait:
    // the per-message path costs no promise in the common case.
    this.#processing = true;
    let applying: Promise<void> | undefined;
    try {
      applying = this.#apply(message);
    } catch (err) {
      this.#processing = false;
      throw this.#fail(err);
    }
    if (applying === undefined) {
      // Synchronous: nothing else ran meanwhile, so nobody waits for this boundary.
      this.#processing = false;
      return this.#applied(message);
    }
    return applying.then(
      () => {
        this.#processing = false;
        try {
          if (!this.#dropCurrent) return this.#applied(message);
          // The batch was discarded while the handler ran (a lost connection, a failed write):
          // what it wrote since is dropped too, and the message is delivered again.
          this.#dropCurrent = false;
          this.discardPending();
          if (this.#failed !== undefined) throw this.#failed;
          return undefined;
        } finally {
          this.#reachBoundary();
        }
      },
      (err: unknown) => {
        this.#processing = false;
        this.#dropCurrent = false;
        try {
          throw this.#fail(err);
        } finally {
          this.#reachBoundary();
        }
      },
    );
  }

  #settleRedelivered(offset: bigint, settle: () => void): void {
    if (this.#committedOffset !== undefined && offset <= this.#committedOffset) settle();
    else
      this.#committing?.then(
        () => {
          // An ack on a connection that is going away may throw: the redelivery then comes again.
          try {
            if (this.#failed === undefined) settle();
          } catch {
            // Nothing to do: the message is redelivered and recognised again.
          }
        },
        () => undefined,
      );
  }

  /** Resolves when the handler in progress has returned or thrown (and its message is counted or dropped). */
  #boundary(): Promise<void> {
    return new Promise((resolve) => (this.#boundaryWaiters ??= []).push(resolve));
  }

  #reachBoundary(): void {
    const waiters = this.#boundaryWaiters;
    if (waiters === undefined) return;
    this.#boundaryWaiters = undefined;
    for (const resolve of waiters) resolve();
  }

  /**
   * Runs `action` at the first moment when no write is in flight and no handler is between two
   * of its writes, in the same turn as the check: whatever it writes holds whole messages only.
   */
  async #whenQuiet<T>(action: () => T): Promise<T> {
    for (;;) {
      if (this.#committing !== undefined) await this.#committing.catch(() => undefined);
      else if (this.#processing) await this.#boundary();
      else return action();
    }
  }

  #applied(message: IncomingMessage): Promise<void> | undefined {
    this.#lastOffset = message.offset;
    this.#pendingMessages++;
    if (message.settle !== undefined) this.#pendingSettles.push(message.settle);
    if ((this.#opts.commit ?? 'batch') === 'message') return this.flush();
    // Pipelined: a full batch is written while the next one is processed, so the per-message path
    // returns no promise. It waits only when the write falls behind by several batches.
    const every = this.#commitEvery;
    if (this.#pendingMessages >= every) {
      if (this.#committing === undefined) {
        this.#beginCommit();
        return undefined;
      }
      if (this.#pendingMessages >= every * BATCHES_AHEAD) return this.#startCommit();
      // Otherwise the write in flight starts this batch when it completes (or the linger does).
    }
    this.#armLinger();
    return undefined;
  }

  /** Commits a quiet tail after `commitLingerMs`; never while a handler runs (its reads would race the commit). */
  #armLinger(): void {
    if (this.#linger !== undefined) return;
    this.#linger = setTimeout(() => {
      this.#linger = undefined;
      if (this.#processing) this.#armLinger();
      else void this.flush().catch(() => undefined);
    }, this.#opts.commitLingerMs ?? 5);
  }

  #apply(message: IncomingMessage): Promise<void> | undefined {
    const verified = new Verified(message);
    const source = holdsIdentity(message.applicationProperties)
      ? message.applicationProperties
      : holdsIdentity(message.messageAnnotations)
        ? message.messageAnnotations
        : undefined;
    // The identity, or why there is none.
    const identity = source === undefined ? 'no identity headers' : parseIdentity(source);
    const tenant = this.#opts.tenant === undefined ? '' : this.#opts.tenant({ headers: verified.headers });
    verified.tenant = tenant;
    if (typeof identity === 'string') {
      const applied = (this.#opts.unidentified ?? 'reject') === 'pass-through';
      this.stats.unidentified++;
      this.#emit({ kind: 'unidentified', offset: message.offset, reason: identity, applied });
      return applied ? asPromise(this.#opts.handler(verified, this.#tx)) : undefined;
    }
    verified.identity = identity;
    const scope = this.#scopeKey(tenant, identity.producerName);
    const state = this.#scopes.get(scope);
    if (state === undefined) {
      return this.#loadScope(scope).then((loaded) =>
        this.#applyIn(loaded, scope, verified, identity, message.offset),
      );
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
    const effect = asPromise(this.#opts.handler(verified, this.#tx));
    if (effect !== undefined) return effect.then(() => this.#record(state, scope, publishingId, skippedFrom));
    this.#record(state, scope, publishingId, skippedFrom);
    return undefined;
  }

  /** After the handler: the window advances in the working copy; the committed copy moves only after the commit. */
  #record(state: ScopeState, scope: string, publishingId: bigint, skippedFrom: bigint | undefined): void {
    const working = (state.working ??= (state.committing ?? state.committed).clone());
    const { confirmedGaps } = working.record(publishingId, skippedFrom);
    for (const range of confirmedGaps) {
      this.stats.gapsConfirmed++;
      this.#emit({ kind: 'gap', scope, range, confirmed: true });
    }
    this.#touched.add(scope);
    this.stats.new++;
  }

  /** The encoded scope key, cached per (tenant, producer): encoding it per message costs more than the check. */
  #scopeKey(tenant: string, producer: string): string {
    const last = this.#lastScope;
    if (producer === last.producer && tenant === last.tenant && last.key !== '') return last.key;
    let byTenant = this.#scopeKeys.get(producer);
    if (byTenant === undefined) {
      byTenant = new Map();
      this.#scopeKeys.set(producer, byTenant);
    }
    let key = byTenant.get(tenant);
    if (key === undefined) {
      key = encodeScopeKey({ consumer: this.consumerName, tenant, producer });
      if (byTenant.size < 4096) byTenant.set(tenant, key);
    }
    this.#lastScope = { tenant, producer, key };
    return key;
  }

  /** The stored key of a handler's key (cached for up to 4096 distinct keys). */
  #effectKey(key: string): string {
    let full = this.#effectKeys.get(key);
    if (full === undefined) {
      full = this.#effectPrefix + key;
      if (this.#effectKeys.size < 4096) this.#effectKeys.set(key, full);
    }
    return full;
  }

  /** The handler's transaction: one object for the consumer's life, reading and writing the pending batch. */
  readonly #tx: EffectTransaction = {
    get: async (key) => {
      const full = this.#effectKey(key);
      // This batch, then the batch being written (the database does not show it yet), then the database.
      const op = this.#ops.get(full) ?? this.#inflightOps?.get(full);
      if (op === undefined) return asBuffer(await this.#db.get(full));
      if (op.type === 'del') return undefined;
      // A copy: the batch keeps its own value whatever the handler does with this one.
      return typeof op.value === 'string' ? Buffer.from(op.value, 'utf8') : Buffer.from(op.value);
    },
    put: (key, value) => {
      if (typeof key !== 'string') throw new TypeError('effect keys are strings');
      if (typeof value !== 'string' && !(value instanceof Uint8Array)) {
        throw new TypeError(
          `effect values are strings or bytes, got ${value === null ? 'null' : typeof value}`,
        );
      }
      // Bytes are copied: a handler may reuse its buffer for the next message before the commit.
      if (typeof value !== 'string') value = Buffer.from(value);
      const full = this.#effectKey(key);
      // A key written again in this batch (a counter, a projection) reuses its entry. The entries
      // of the batch being written are in #inflightOps, never here, so this changes nothing written.
      const op = this.#ops.get(full);
      if (op?.type === 'put') op.value = value;
      else this.#ops.set(full, { type: 'put', key: full, value });
    },
    del: (key) => {
      if (typeof key !== 'string') throw new TypeError('effect keys are strings');
      const full = this.#effectKey(key);
      this.#ops.set(full, { type: 'del', key: full });
    },
  };

  async #loadScope(scope: string): Promise<ScopeState> {
    const raw = await this.#db.get('v:' + scope);
    // Another message of the scope may have loaded it meanwhile: keep the first.
    const existing = this.#scopes.get(scope);
    if (existing !== undefined) return existing;
    const state =
      raw === undefined
        ? {
            committed: createTracker(this.#policy),
            committing: undefined,
            working: undefined,
            lastSeenMs: 0,
            writtenBy: 0,
          }
        : decodeScope(raw, scope);
    this.#scopes.set(scope, state);
    return state;
  }

  /**
   * Commits the pending batch: effects, touched verifier states and the offset in one LevelDB
   * batch; then settles (acks) the messages. Resolves once it is durable. Idempotent when nothing
   * is pending. A handler in progress is waited for, and its message committed too (never part of
   * it): so a handler must not await `flush()` or `close()` itself.
   */
  async flush(): Promise<void> {
    await this.#startCommit();
    const committing = this.#committing;
    if (committing !== undefined) await committing.catch(() => undefined);
    if (this.#failed !== undefined) throw this.#failed;
  }

  /**
   * Starts writing the pending batch once the previous one is durable (one write in flight at a
   * time) and no handler is in the middle of a message, without waiting for the write. A failed
   * write stops the consumer.
   */
  #startCommit(): Promise<void> {
    return this.#whenQuiet(this.#beginIfPending);
  }

  readonly #beginIfPending = (): void => {
    if (this.#pendingMessages > 0 && this.#failed === undefined) this.#beginCommit();
  };

  /**
   * Starts writing the pending batch now. Only while no write is in flight, something is pending,
   * nothing failed, and no handler is in the middle of a message (its writes must all land in
   * one batch, and a handler that has not returned may still throw).
   */
  #beginCommit(): void {
    clearTimeout(this.#linger);
    this.#linger = undefined;
    const batchOps = this.#ops;
    const ops: Op[] = [];
    for (const op of batchOps.values()) ops.push(encodedOp(op));
    const touched: Array<[ScopeState, SequenceTracker]> = [];
    // One clock read per commit: retention counts in hours, not per message.
    const now = Date.now();
    const write = ++this.#writesBegun;
    for (const scope of this.#touched) {
      const state = this.#scopes.get(scope)!;
      const snapshot = state.working!;
      state.lastSeenMs = now;
      state.writtenBy = write;
      // Later messages of the scope record into a fresh working copy of this snapshot.
      state.committing = snapshot;
      state.working = undefined;
      touched.push([state, snapshot]);
      ops.push({ type: 'put', key: 'v:' + scope, value: encodeScope(snapshot, state.lastSeenMs) });
    }
    const lastOffset = this.#lastOffset!;
    this.#handedOffset = lastOffset;
    ops.push({ type: 'put', key: this.#offsetKey, value: encodeOffset(lastOffset) });
    const info = { messages: this.#pendingMessages, lastOffset };
    const settles = this.#pendingSettles;
    this.#inflightOps = batchOps;
    this.#ops = new Map();
    this.#touched = new Set();
    this.#pendingMessages = 0;
    this.#pendingSettles = [];
    const commit = (async () => {
      this.#opts.hooks?.beforeCommit?.(info);
      try {
        await this.#db.batch(ops, { sync: this.#sync });
      } catch (err) {
        throw this.#fail(err);
      } finally {
        if (this.#inflightOps === batchOps) this.#inflightOps = undefined;
      }
      for (const [state, snapshot] of touched) {
        state.committed = snapshot;
        if (state.committing === snapshot) state.committing = undefined;
      }
      this.#committedOffset = lastOffset;
      this.stats.commits++;
      this.#opts.hooks?.afterCommit?.(info);
      for (const listener of this.#commitListeners) listener(lastOffset);
      for (const settle of settles) settle();
    })();
    this.#inFlight(commit);
  }

  /** Makes `write` the write in flight; when it ends, a full batch that waited for it goes. */
  #inFlight(write: Promise<unknown>): void {
    this.#committing = write as Promise<void>;
    const done = (): void => {
      this.#writesDone++;
      if (this.#committing === write) this.#committing = undefined;
      // A full batch that waited for this write goes now, unless a handler is mid-message.
      if (
        this.#committing === undefined &&
        !this.#processing &&
        !this.#closed &&
        this.#failed === undefined &&
        this.#pendingMessages >= this.#commitEvery
      ) {
        this.#beginCommit();
      }
    };
    write.then(done, done);
  }

  /**
   * Drops the uncommitted batch (after a lost connection: the messages are delivered again from
   * the committed offset).
   */
  discardPending(): void {
    clearTimeout(this.#linger);
    this.#linger = undefined;
    // A handler in progress keeps writing into the next batch: its message goes too when it returns.
    if (this.#processing) this.#dropCurrent = true;
    for (const scope of this.#touched) {
      const state = this.#scopes.get(scope);
      if (state !== undefined) state.working = undefined;
    }
    this.#ops = new Map();
    this.#touched = new Set();
    this.#pendingMessages = 0;
    this.#pendingSettles = [];
    // Delivery goes on after what was handed to a write (the write in flight goes on).
    this.#lastOffset = this.#handedOffset;
  }

  /**
   * Forgets scopes of this consumer idle longer than `scopeTtlMs`; returns how many. The scan
   * only proposes: commits go on meanwhile, so each scope is decided again when the deletions are
   * written, as the pipeline's next write (no commit in flight, no handler mid-message), and kept
   * if anything wrote or touched it since the scan began.
   */
  async evictIdle(nowMs: number): Promise<number> {
    const ttl = this.#opts.scopeTtlMs ?? 0;
    if (ttl <= 0) return 0;
    const prefix = 'v:' + scopeKeyPrefix(this.consumerName);
    // Writes after this one may be missing from the scan (a write in flight included).
    const since = this.#writesDone;
    const idle: string[] = [];
    // After the consumer's part of a scope key comes the tenant's length: a digit, below ':'.
    for await (const [key, value] of this.#db.iterator({ gte: prefix, lt: prefix + ':' })) {
      const scope = key.slice(2);
      if (nowMs - decodeScope(value, scope).lastSeenMs > ttl) idle.push(scope);
    }
    if (idle.length === 0) return 0;
    const deleting = await this.#whenQuiet(() => {
      if (this.#closed || this.#failed !== undefined) return undefined;
      const dels: Op[] = [];
      for (const scope of idle) {
        if (this.#touched.has(scope)) continue;
        const state = this.#scopes.get(scope);
        if (state !== undefined) {
          const fresh =
            state.writtenBy > since ||
            state.working !== undefined ||
            state.committing !== undefined ||
            nowMs - state.lastSeenMs <= ttl;
          if (fresh) continue;
          this.#scopes.delete(scope);
        }
        dels.push({ type: 'del', key: 'v:' + scope });
      }
      if (dels.length === 0) return undefined;
      ++this.#writesBegun;
      const write = this.#db.batch(dels, { sync: this.#sync });
      this.#inFlight(write);
      return { write, count: dels.length };
    });
    if (deleting === undefined) return 0;
    await deleting.write;
    return deleting.count;
  }

  #emit(event: VerifyEvent): void {
    try {
      this.#opts.onEvent?.(event);
    } catch {
      // An observer's bug must not change what is committed.
    }
  }

  /** Stops the consumer for good; returns the error it stopped with. */
  #fail(err: unknown): Error {
    if (this.#failed === undefined) {
      (this.#opts.logger ?? silentLogger).error(
        { consumer: this.consumerName, err },
        'stream-dedup: verifying consumer stopped; uncommitted work is dropped and redelivered after a restart',
      );
    }
    this.#failed ??= err instanceof Error ? err : new Error(`the handler threw ${String(err)}`);
    for (const listener of this.#stopListeners) listener(this.#failed);
    this.discardPending();
    return this.#failed;
  }

  /**
   * Commits what is pending (unless failed), then releases the store. A handler in progress is
   * waited for and its message committed with the rest; `process()` refuses new messages from
   * the call on. Idempotent.
   */
  async close(): Promise<void> {
    if (this.#closed) return;
    // A handler in progress finishes, and its message is committed with the rest; nothing new starts.
    this.#closing = true;
    await this.flush().catch(() => undefined);
    await this.#committing?.catch(() => undefined);
    this.#closed = true;
    clearTimeout(this.#linger);
    clearInterval(this.#ttlTimer);
    this.#unobserve();
    const closed = new DedupError(
      'DEDUP_PUBLISHER_CLOSED',
      'the verifying consumer closed before reaching the offset',
    );
    for (const listener of this.#stopListeners) listener(this.#failed ?? closed);
    this.#release();
    await this.#ownedStore?.close();
  }
}

function validate(options: VerifyingConsumerOptions): void {
  if (typeof options !== 'object' || options === null) throw new TypeError('options must be an object');
  if (typeof options.consumerName !== 'string' || options.consumerName.length === 0) {
    throw new RangeError('consumerName must be a non-empty string');
  }
  if (typeof options.handler !== 'function') throw new TypeError('handler must be a function');
  if (typeof options.store !== 'string' && !(options.store instanceof DedupStore)) {
    throw new TypeError('store must be a folder path or an opened DedupStore');
  }
  for (const [name, value] of [
    ['commitEvery', options.commitEvery],
    ['commitLingerMs', options.commitLingerMs],
  ] as const) {
    if (value !== undefined && (!Number.isInteger(value) || value < 1)) {
      throw new RangeError(`${name} must be an integer ≥ 1, got ${value}`);
    }
  }
}

/** `${tag}:` + length-prefixed consumer name. */
function consumerPrefix(tag: string, consumer: string): string {
  return `${tag}:${consumer.length}:${consumer}`;
}

/** The handler's message; `headers` merges the sources only when someone reads it. */
class Verified implements VerifiedMessage {
  readonly body: Buffer;
  readonly offset: bigint;
  identity: MessageIdentity | undefined = undefined;
  tenant = '';
  readonly #message: IncomingMessage;
  #headers: Readonly<Record<string, unknown>> | undefined;

  constructor(message: IncomingMessage) {
    this.body = message.content;
    this.offset = message.offset;
    this.#message = message;
  }

  get headers(): Readonly<Record<string, unknown>> {
    this.#headers ??= mergeHeaders(this.#message);
    return this.#headers;
  }
}

/** The handler's result as a promise when it is one (a thenable), else `undefined`. */
function asPromise(result: unknown): Promise<void> | undefined {
  if (result === undefined || result === null) return undefined;
  const then = (result as { then?: unknown }).then;
  return typeof then === 'function' ? Promise.resolve(result as PromiseLike<void>) : undefined;
}

function mergeHeaders(message: IncomingMessage): Readonly<Record<string, unknown>> {
  const { applicationProperties: first, messageAnnotations: second } = message;
  if (second === undefined) return first ?? {};
  if (first === undefined) return second;
  // Both: the application properties win over annotations of the same name.
  const out: Record<string, unknown> = {};
  for (const s of [second, first])
    for (const [k, v] of Object.entries(s)) Object.defineProperty(out, k, { value: v, enumerable: true });
  return out;
}

function encodeOffset(offset: bigint): Uint8Array {
  const b = Buffer.allocUnsafe(8);
  b.writeBigUInt64BE(offset);
  return b;
}

function decodeOffset(raw: Uint8Array): bigint {
  if (raw.length !== 8)
    throw new DedupError('DEDUP_STORE_CORRUPT', `consumer offset record has ${raw.length} bytes, expected 8`);
  return Buffer.from(raw.buffer, raw.byteOffset, raw.byteLength).readBigUInt64BE();
}

/** u64 lastSeenMs, then the tracker's own encoding. */
function encodeScope(tracker: SequenceTracker, lastSeenMs: number): Uint8Array {
  const t = tracker.encode();
  const b = Buffer.allocUnsafe(8 + t.length);
  b.writeBigUInt64BE(BigInt(Math.max(0, Math.floor(lastSeenMs))));
  b.set(t, 8);
  return b;
}

function decodeScope(raw: Uint8Array, scope: string): ScopeState {
  if (raw.length < 8)
    throw new DedupError('DEDUP_STORE_CORRUPT', `verifier state of scope ${scope} is truncated`);
  const b = Buffer.from(raw.buffer, raw.byteOffset, raw.byteLength);
  let committed: SequenceTracker;
  try {
    committed = decodeTracker(b.subarray(8));
  } catch (err) {
    if (err instanceof DedupError)
      throw new DedupError(err.code, `verifier state of scope ${scope}: ${err.message}`, { cause: err });
    throw err;
  }
  return {
    committed,
    committing: undefined,
    working: undefined,
    lastSeenMs: Number(b.readBigUInt64BE(0)),
    writtenBy: 0,
  };
}

/** A value from the database as a Buffer, without a copy (LevelDB's 'view' encoding gives Uint8Arrays). */
function asBuffer(value: Uint8Array | undefined): Buffer | undefined {
  if (value === undefined || Buffer.isBuffer(value)) return value;
  return Buffer.from(value.buffer, value.byteOffset, value.byteLength);
}
