import { DedupError } from '../errors.js';
import { readIdentity, type MessageIdentity } from '../identity/headers.js';
import { encodeScopeKey, scopeKeyPrefix } from '../identity/scope-key.js';
import { DedupStore, type KeyValueDb } from '../store/store.js';
import { createTracker, decodeTracker } from '../verifier/window.js';
import type { IdRange, PolicySpec, SequenceTracker } from '../verifier/types.js';

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
  get(key: string): Promise<Uint8Array | undefined>;
  put(key: string, value: string | Uint8Array): void;
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
      /** IDs missing: `confirmed` false when first skipped over, true when they left the window unseen. */
      readonly kind: 'gap';
      readonly scope: string;
      readonly range: IdRange;
      readonly confirmed: boolean;
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
  unidentified: number;
  commits: number;
}

/** A message as a transport hands it to the core. */
export interface IncomingMessage {
  readonly offset: bigint;
  readonly body: Buffer;
  /** Header sources in order of precedence (see `readIdentity`). */
  readonly headerSources: ReadonlyArray<Readonly<Record<string, unknown>> | undefined>;
  /** Called once the message's outcome is committed (AMQP: ack). */
  readonly settle?: (() => void) | undefined;
}

interface ScopeState {
  committed: SequenceTracker;
  working: SequenceTracker | undefined;
  lastSeenMs: number;
}

type Op = { type: 'put'; key: string; value: Uint8Array } | { type: 'del'; key: string };

const DEFAULT_POLICY: PolicySpec = { kind: 'window', size: 1024 };

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
    unidentified: 0,
    commits: 0,
  };
  readonly #db: KeyValueDb;
  readonly #sync: boolean;
  readonly #ownedStore: DedupStore | undefined;
  readonly #release: () => void;
  readonly #opts: VerifyingConsumerOptions;
  readonly #policy: PolicySpec;
  readonly #offsetKey: string;
  readonly #effectPrefix: string;
  readonly #scopes = new Map<string, ScopeState>();
  #committedOffset: bigint | undefined;
  /** The uncommitted batch. */
  #ops = new Map<string, Op>();
  #touched = new Set<string>();
  #pendingMessages = 0;
  #pendingSettles: Array<() => void> = [];
  #lastOffset: bigint | undefined;
  #linger: NodeJS.Timeout | undefined;
  #ttlTimer: NodeJS.Timeout | undefined;
  #committing: Promise<void> | undefined;
  #failed: Error | undefined;
  #closed = false;
  #processing = false;
  readonly #commitListeners = new Set<(offset: bigint) => void>();

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
    this.#offsetKey = consumerPrefix('c', options.consumerName) + '/offset';
    this.#effectPrefix = consumerPrefix('u', options.consumerName);
    this.#committedOffset = committedOffset;
  }

  static async open(options: VerifyingConsumerOptions): Promise<VerifyingConsumerCore> {
    validate(options);
    createTracker(options.policy ?? DEFAULT_POLICY); // validates the policy before anything opens
    const owned =
      typeof options.store === 'string'
        ? await DedupStore.open(options.store, { sync: options.sync ?? false })
        : undefined;
    const store = owned ?? (options.store as DedupStore);
    try {
      const release = store.claimConsumer(options.consumerName);
      const raw = await store.db.get(consumerPrefix('c', options.consumerName) + '/offset');
      const committed = raw === undefined ? undefined : decodeOffset(raw);
      const core = new VerifyingConsumerCore(store.db, store.sync, owned, release, options, committed);
      const ttl = options.scopeTtlMs ?? 0;
      if (ttl > 0) {
        await core.evictIdle(Date.now());
        core.#ttlTimer = setInterval(() => void core.evictIdle(Date.now()).catch(() => undefined), 3_600_000);
        core.#ttlTimer.unref();
      }
      return core;
    } catch (err) {
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

  /** Reads a value the handler committed (outside any batch). */
  readEffect(key: string): Promise<Uint8Array | undefined> {
    return this.#db.get(this.#effectPrefix + key);
  }

  /**
   * Verifies and applies one message. Call in stream order, one at a time (await each). A handler
   * error stops the consumer: nothing of the uncommitted batch is kept, and a restart reprocesses
   * from the last commit.
   */
  async process(message: IncomingMessage): Promise<void> {
    if (this.#failed !== undefined) throw this.#failed;
    if (this.#closed) throw new DedupError('DEDUP_PUBLISHER_CLOSED', 'the verifying consumer is closed');
    // Wait for a commit in progress: its snapshot must not see this message's writes.
    if (this.#committing !== undefined) await this.#committing;
    if (this.#committedOffset !== undefined && message.offset <= this.#committedOffset) {
      // Redelivered below the committed offset (for example a re-subscription): already settled.
      message.settle?.();
      return;
    }
    this.#processing = true;
    try {
      await this.#apply(message);
    } catch (err) {
      throw this.#fail(err);
    } finally {
      this.#processing = false;
    }
    this.#lastOffset = message.offset;
    this.#pendingMessages++;
    if (message.settle !== undefined) this.#pendingSettles.push(message.settle);
    if (
      (this.#opts.commit ?? 'batch') === 'message' ||
      this.#pendingMessages >= (this.#opts.commitEvery ?? 1000)
    ) {
      await this.flush();
    } else {
      this.#armLinger();
    }
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

  async #apply(message: IncomingMessage): Promise<void> {
    const headers = mergeHeaders(message.headerSources);
    const reading = readIdentity(...message.headerSources);
    const tenant = this.#opts.tenant?.({ headers }) ?? '';
    if (reading.kind !== 'ok') {
      const reason = reading.kind === 'missing' ? 'no identity headers' : reading.reason;
      const applied = (this.#opts.unidentified ?? 'reject') === 'pass-through';
      this.stats.unidentified++;
      this.#emit({ kind: 'unidentified', offset: message.offset, reason, applied });
      if (applied) {
        await this.#opts.handler(
          { body: message.body, offset: message.offset, identity: undefined, tenant, headers },
          this.#tx(),
        );
      }
      return;
    }
    const { identity } = reading;
    const scope = encodeScopeKey({ consumer: this.consumerName, tenant, producer: identity.producerName });
    const state = await this.#scope(scope);
    const tracker = state.working ?? state.committed;
    const verdict = tracker.check(identity.publishingId);
    if (verdict.outcome === 'duplicate') {
      this.stats.duplicate++;
      this.#emit({ kind: 'duplicate', scope, publishingId: identity.publishingId, offset: message.offset });
      return;
    }
    if (verdict.outcome === 'stale') {
      this.stats.stale++;
      this.#emit({ kind: 'stale', scope, publishingId: identity.publishingId, offset: message.offset });
      return;
    }
    if (verdict.skipped !== undefined && tracker.highest > 0n) {
      this.stats.gapsReported++;
      this.#emit({ kind: 'gap', scope, range: verdict.skipped, confirmed: false });
    }
    await this.#opts.handler(
      { body: message.body, offset: message.offset, identity, tenant, headers },
      this.#tx(),
    );
    // The window advances in the working copy; the committed copy moves only after the commit.
    const working = (state.working ??= state.committed.clone());
    const { confirmedGaps } = working.record(identity.publishingId);
    for (const range of confirmedGaps) {
      this.stats.gapsConfirmed++;
      this.#emit({ kind: 'gap', scope, range, confirmed: true });
    }
    state.lastSeenMs = Date.now();
    this.#touched.add(scope);
    this.stats.new++;
  }

  #tx(): EffectTransaction {
    const prefix = this.#effectPrefix;
    return {
      get: async (key) => {
        const op = this.#ops.get(prefix + key);
        if (op !== undefined) return op.type === 'put' ? op.value : undefined;
        // A commit in flight holds writes the database does not show yet.
        if (this.#committing !== undefined) await this.#committing;
        return this.#ops.get(prefix + key)?.type === 'del' ? undefined : this.#db.get(prefix + key);
      },
      put: (key, value) => {
        if (typeof key !== 'string') throw new TypeError('effect keys are strings');
        const bytes = typeof value === 'string' ? Buffer.from(value, 'utf8') : value;
        this.#ops.set(prefix + key, { type: 'put', key: prefix + key, value: bytes });
      },
      del: (key) => {
        this.#ops.set(prefix + key, { type: 'del', key: prefix + key });
      },
    };
  }

  async #scope(scope: string): Promise<ScopeState> {
    let state = this.#scopes.get(scope);
    if (state === undefined) {
      const raw = await this.#db.get('v:' + scope);
      state =
        raw === undefined
          ? { committed: createTracker(this.#policy), working: undefined, lastSeenMs: 0 }
          : decodeScope(raw, scope);
      this.#scopes.set(scope, state);
    }
    return state;
  }

  /**
   * Commits the pending batch: effects, touched verifier states and the offset in one LevelDB
   * batch; then settles (acks) the messages. Idempotent when nothing is pending.
   */
  async flush(): Promise<void> {
    if (this.#committing !== undefined) await this.#committing;
    if (this.#pendingMessages === 0 || this.#failed !== undefined) return;
    clearTimeout(this.#linger);
    this.#linger = undefined;
    const ops = [...this.#ops.values()];
    const touched = [...this.#touched];
    for (const scope of touched) {
      const state = this.#scopes.get(scope)!;
      ops.push({
        type: 'put',
        key: 'v:' + scope,
        value: encodeScope(state.working ?? state.committed, state.lastSeenMs),
      });
    }
    const lastOffset = this.#lastOffset!;
    ops.push({ type: 'put', key: this.#offsetKey, value: encodeOffset(lastOffset) });
    const info = { messages: this.#pendingMessages, lastOffset };
    const settles = this.#pendingSettles;
    this.#ops = new Map();
    this.#touched = new Set();
    this.#pendingMessages = 0;
    this.#pendingSettles = [];
    this.#committing = (async () => {
      this.#opts.hooks?.beforeCommit?.(info);
      try {
        await this.#db.batch(ops, { sync: this.#sync });
      } catch (err) {
        throw this.#fail(err);
      }
      for (const scope of touched) {
        const state = this.#scopes.get(scope)!;
        if (state.working !== undefined) state.committed = state.working;
        state.working = undefined;
      }
      this.#committedOffset = lastOffset;
      this.stats.commits++;
      this.#opts.hooks?.afterCommit?.(info);
      for (const listener of this.#commitListeners) listener(lastOffset);
      for (const settle of settles) settle();
    })();
    try {
      await this.#committing;
    } finally {
      this.#committing = undefined;
    }
  }

  /**
   * Drops the uncommitted batch (after a lost connection: the messages are delivered again from
   * the committed offset).
   */
  discardPending(): void {
    clearTimeout(this.#linger);
    this.#linger = undefined;
    for (const scope of this.#touched) {
      const state = this.#scopes.get(scope);
      if (state !== undefined) state.working = undefined;
    }
    this.#ops = new Map();
    this.#touched = new Set();
    this.#pendingMessages = 0;
    this.#pendingSettles = [];
    this.#lastOffset = this.#committedOffset;
  }

  /** Forgets scopes of this consumer idle longer than `scopeTtlMs`; returns how many. */
  async evictIdle(nowMs: number): Promise<number> {
    const ttl = this.#opts.scopeTtlMs ?? 0;
    if (ttl <= 0) return 0;
    const prefix = 'v:' + scopeKeyPrefix(this.consumerName);
    const dels: Op[] = [];
    // After the consumer's part of a scope key comes the tenant's length: a digit, below ':'.
    for await (const [key, value] of this.#db.iterator({ gte: prefix, lt: prefix + ':' })) {
      const scope = key.slice(2);
      if (this.#touched.has(scope)) continue;
      if (nowMs - decodeScope(value, scope).lastSeenMs > ttl) {
        dels.push({ type: 'del', key });
        this.#scopes.delete(scope);
      }
    }
    if (dels.length > 0) await this.#db.batch(dels, { sync: this.#sync });
    return dels.length;
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
    this.#failed ??= err instanceof Error ? err : new Error(`the handler threw ${String(err)}`);
    this.discardPending();
    return this.#failed;
  }

  /** Commits what is pending (unless failed), then releases the store. Idempotent. */
  async close(): Promise<void> {
    if (this.#closed) return;
    await this.flush().catch(() => undefined);
    this.#closed = true;
    clearTimeout(this.#linger);
    clearInterval(this.#ttlTimer);
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

function mergeHeaders(sources: IncomingMessage['headerSources']): Readonly<Record<string, unknown>> {
  if (sources.length === 1) return sources[0] ?? {};
  const out: Record<string, unknown> = {};
  for (let i = sources.length - 1; i >= 0; i--) {
    const s = sources[i];
    if (s !== undefined)
      for (const [k, v] of Object.entries(s)) Object.defineProperty(out, k, { value: v, enumerable: true });
  }
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
  return { committed, working: undefined, lastSeenMs: Number(b.readBigUInt64BE(0)) };
}
