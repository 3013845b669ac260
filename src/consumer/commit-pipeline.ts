/**
 * The verifying consumer's commit pipeline (docs/design.md §5): the pending batch — the handlers'
 * writes, the scopes they touched, the messages and their settles — goes to LevelDB as one batch
 * with the verifier state and the offset, per message, per `commitEvery` messages or after
 * `commitLingerMs` of quiet, with one write in flight at most. Nothing that writes (a commit, an
 * eviction's deletions) starts while a handler is between two of its writes: a commit then would
 * hold half a message, and the handler may still throw.
 */
import { encodeOffset } from '../store/consumer-keys.js';
import type { ChunkIdentity } from '../store/chunk-identity.js';
import type { ConsumerStore, Op } from './consumer-store.js';
import type { ResolvedVerifyingConsumerOptions } from './options.js';
import type { VerifyStats } from './types.js';

// Op lives in consumer-store.ts (the store writes it; no import cycle); its importers find it here.
export type { Op } from './consumer-store.js';

/** A handler's write in the pending batch: a string value is encoded once, when the batch is written. */
export type PendingOp =
  { type: 'put'; key: string; value: Uint8Array | string } | { type: 'del'; key: string };

/** What the pipeline asks of the verifier state of the scopes a batch touched. */
export interface ScopeStager {
  /**
   * Adds the working state of each of `scopes` to `ops`, as part of write number `write`; returns
   * what to do once that write is durable.
   */
  stage(scopes: ReadonlySet<string>, write: number, ops: Op[]): () => void;
  /** Drops the working state of `scopes`: their batch was discarded. */
  discard(scopes: ReadonlySet<string>): void;
}

/** What a {@link CommitPipeline} is built from. */
export interface CommitPipelineOptions {
  /** Where batches are written (LevelDB, or a PostgreSQL transaction). */
  readonly store: ConsumerStore;
  /** The key of the consumer's offset record. */
  readonly offsetKey: string;
  /** The offset committed by an earlier life, if any. */
  readonly committedOffset: bigint | undefined;
  /** The identity of the chunk holding it, when stored. */
  readonly committedChunk: ChunkIdentity | undefined;
  readonly scopes: ScopeStager;
  readonly options: ResolvedVerifyingConsumerOptions;
  /** The consumer's counters (`commits` is counted here). */
  readonly stats: VerifyStats;
  /** Called whenever the pipeline stops with `error` (`first`: the first time); `cause` is what was thrown. */
  readonly onStop: (error: Error, cause: unknown, first: boolean) => void;
  /**
   * Runs before each batch is written to LevelDB, with the batch's writes (the offset record
   * last): a consumer group appends them to the partition's changelog (src/group). The batch is
   * written only once it resolves; when it rejects, the pipeline stops with its error and nothing
   * of the batch is written.
   */
  readonly journal?: Journal | undefined;
  /**
   * How many batches may be handed to the journal at once (an integer ≥ 1; only with a journal):
   * batch n + 1 is journaled while batch n waits for its journal, but the batches are written to
   * the store one at a time, in order, each only after its own journal resolved; a batch whose
   * predecessor was not written (its journal rejected: fenced, moved) is dropped, never written.
   * Default 1: one batch in flight at a time.
   */
  readonly journalDepth?: number | undefined;
  /**
   * Asked just before each batch's store write and again just before its commit is reported
   * (only with a journal): `undefined` to go on in the same call, or a promise that resolves to go
   * on and rejects to drop the batch, with every later one, as a rejected journal does. A consumer
   * group's proof that the member still holds the partition (src/group/hold-lease.ts): a process
   * paused after a batch was decided must not write or report it once the partition moved.
   */
  readonly gate?: (() => Promise<void> | undefined) | undefined;
  /** Starts a batch's `settle` span (and commit-time measure); the returned function ends it. */
  readonly traceSettle?: ((messages: number, lastOffset: bigint) => (err?: unknown) => void) | undefined;
  /**
   * A batch's write failed with `error`: `true` when the store recovers from it (the consumer was
   * rebased and subscribes again: the batch is not durable, and the pipeline goes on), else the
   * error to stop with (`undefined`: `error` itself).
   */
  readonly recover?: (error: unknown) => true | Error | undefined;
}

/** What a batch's journal is told: its writes, and the offsets it covers. */
export interface JournalEntry {
  /** Every write of the batch, the offset record last. */
  readonly ops: readonly Op[];
  /** The batch's last offset. */
  readonly lastOffset: bigint;
  /**
   * The offset of the state the batch was computed on: the last offset of the batch before it
   * (committed, or handed to a write), `undefined` for the consumer's first batch.
   */
  readonly baseOffset: bigint | undefined;
}

/** See {@link CommitPipelineOptions.journal}. */
export type Journal = (entry: JournalEntry) => Promise<void>;

/** Full batches that may wait behind the write in flight before `add` makes the caller wait. */
const BATCHES_AHEAD = 4;

function encodedOp(op: PendingOp): Op {
  return op.type === 'put' && typeof op.value === 'string'
    ? { type: 'put', key: op.key, value: Buffer.from(op.value, 'utf8') }
    : (op as Op);
}

/**
 * The pending batch and the writes that commit it. Messages go through it one at a time:
 * `beginMessage()`, the handler, then one of `endMessage…()` or `abortMessage…()`.
 *
 * @internal
 */
export class CommitPipeline {
  readonly #store: ConsumerStore;
  readonly #offsetKey: string;
  readonly #scopes: ScopeStager;
  readonly #options: ResolvedVerifyingConsumerOptions;
  readonly #stats: VerifyStats;
  readonly #onStop: (error: Error, cause: unknown, first: boolean) => void;
  readonly #journal: Journal | undefined;
  /** Writes (commits) that may be in flight at once: `journalDepth` with a journal, else 1. */
  readonly #depth: number;
  readonly #gate: (() => Promise<void> | undefined) | undefined;
  readonly #traceSettle: CommitPipelineOptions['traceSettle'];
  readonly #recover: ((error: unknown) => true | Error | undefined) | undefined;
  readonly #commitListeners = new Set<(offset: bigint) => void>();
  #committedOffset: bigint | undefined;
  /** The chunks holding the committed, handed and last pending offsets (stream transport only). */
  #committedChunk: ChunkIdentity | undefined;
  #handedChunk: ChunkIdentity | undefined;
  #lastChunk: ChunkIdentity | undefined;
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
  /**
   * The newest write in flight, if any: a commit, or an eviction's deletions. Writes end in the
   * order they began (each commit waits for the one before it), so this one ends last.
   */
  #committing: Promise<void> | undefined;
  /** The writes in flight, oldest first (at most `#depth`; one for an eviction's deletions). */
  #writes: Array<Promise<unknown>> = [];
  /** The last commit begun: resolves with whether its batch was written (false: dropped, failed). */
  #lastCommit: Promise<boolean> | undefined;
  /** Writes begun and writes finished (durable or failed), in order: writes never overlap. */
  #writesBegun = 0;
  #writesDone = 0;
  /**
   * Who waits for the handler in progress to return (`flush()`, `close()`, eviction): nothing
   * that writes the pending batch may start while a handler is between two of its writes.
   */
  #boundaryWaiters: Array<() => void> | undefined;
  /** `discard()` ran while a handler was in progress: its message is dropped when it returns. */
  #dropCurrent = false;
  /** The effect writes of the batches being written, oldest first (the database does not show them yet). */
  #inflightOps: Array<Map<string, PendingOp>> = [];
  #failed: Error | undefined;
  #closed = false;
  /** A message is in progress: from `beginMessage()` until its handler returned (or threw). */
  #processing = false;

  constructor(options: CommitPipelineOptions) {
    this.#store = options.store;
    this.#offsetKey = options.offsetKey;
    this.#scopes = options.scopes;
    this.#options = options.options;
    this.#stats = options.stats;
    this.#onStop = options.onStop;
    this.#journal = options.journal;
    this.#depth = options.journal === undefined ? 1 : (options.journalDepth ?? 1);
    this.#gate = options.journal === undefined ? undefined : options.gate;
    this.#recover = options.recover;
    this.#traceSettle = options.traceSettle;
    this.#committedOffset = options.committedOffset;
    this.#handedOffset = options.committedOffset;
    this.#committedChunk = options.committedChunk;
    this.#handedChunk = options.committedChunk;
  }

  /** The last committed offset. */
  get committedOffset(): bigint | undefined {
    return this.#committedOffset;
  }

  /** The identity of the chunk holding the committed offset, when known. */
  get committedChunk(): ChunkIdentity | undefined {
    return this.#committedChunk;
  }

  /** The error that stopped the pipeline, if any. */
  get failure(): Error | undefined {
    return this.#failed;
  }

  /** True after {@link CommitPipeline.close}. */
  get isClosed(): boolean {
    return this.#closed;
  }

  /** Writes finished so far (durable or failed). */
  get writesDone(): number {
    return this.#writesDone;
  }

  /** Calls `listener` with the committed offset after every commit; returns the unsubscribe function. */
  onCommitted(listener: (offset: bigint) => void): () => void {
    this.#commitListeners.add(listener);
    return () => this.#commitListeners.delete(listener);
  }

  /**
   * True for a redelivery (for example after a re-subscription): its offset is committed, or in
   * the commit being written.
   */
  isHanded(offset: bigint): boolean {
    return this.#handedOffset !== undefined && offset <= this.#handedOffset;
  }

  /** Settles a redelivered message once its offset is durable (at once when it is). */
  settleRedelivered(offset: bigint, settle: () => void): void {
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

  /**
   * True while the handler in progress runs for a batch that was discarded meanwhile (a lost
   * subscription, a revoked partition): its message is dropped when it returns or throws.
   */
  get discardedWhileRunning(): boolean {
    return this.#dropCurrent;
  }

  /** A handler starts: nothing that writes starts until it has returned or thrown. */
  beginMessage(): void {
    this.#processing = true;
  }

  /**
   * The message's handler returned synchronously (or did not run): the message joins the batch.
   * Nothing else ran meanwhile, so nobody waits for this boundary.
   */
  endMessage(
    offset: bigint,
    settle: (() => void) | undefined,
    chunk?: ChunkIdentity,
  ): Promise<void> | undefined {
    this.#processing = false;
    return this.#add(offset, settle, chunk);
  }

  /** The message's asynchronous handler returned: the message joins the batch, unless it was discarded meanwhile. */
  endMessageAsync(
    offset: bigint,
    settle: (() => void) | undefined,
    chunk?: ChunkIdentity,
  ): Promise<void> | undefined {
    this.#processing = false;
    try {
      if (!this.#dropCurrent) return this.#add(offset, settle, chunk);
      // The batch was discarded while the handler ran (a lost connection, a failed write): what
      // it wrote since is dropped too, and the message is delivered again.
      this.#dropCurrent = false;
      this.discard();
      if (this.#failed !== undefined) throw this.#failed;
      return undefined;
    } finally {
      this.#reachBoundary();
    }
  }

  /** The message's handler threw synchronously: stops the pipeline; returns the error to throw. */
  abortMessage(err: unknown): Error {
    this.#processing = false;
    return this.fail(err);
  }

  /** The message's asynchronous handler threw: stops the pipeline and throws the error it stopped with. */
  abortMessageAsync(err: unknown): never {
    this.#processing = false;
    this.#dropCurrent = false;
    try {
      throw this.fail(err);
    } finally {
      this.#reachBoundary();
    }
  }

  /**
   * The message's handler (or the store before it) failed with an error the store recovers from:
   * the message is dropped, without stopping the pipeline; {@link CommitPipeline.rebase} follows.
   */
  dropMessage(): void {
    this.#processing = false;
    this.#dropCurrent = false;
    this.#reachBoundary();
  }

  /**
   * Drops the uncommitted batch and goes on from `offset`, the store's committed offset as re-read
   * (another process may have moved it either way). Only with no write in flight.
   */
  rebase(offset: bigint | undefined, chunk: ChunkIdentity | undefined): void {
    const before = this.#committedOffset;
    this.discard();
    this.#committedOffset = offset;
    this.#handedOffset = offset;
    this.#lastOffset = offset;
    this.#committedChunk = chunk;
    this.#handedChunk = chunk;
    this.#lastChunk = chunk;
    // Moved on by another process: committed up to there, which waitForOffset() is told.
    if (offset !== undefined && (before === undefined || offset > before)) {
      for (const listener of this.#commitListeners) listener(offset);
    }
  }

  /** The handler's write `op` of `key` in the pending batch, or in the batch being written. */
  pendingEffect(key: string): PendingOp | undefined {
    const pending = this.#ops.get(key);
    if (pending !== undefined) return pending;
    // The newest batch in flight that wrote the key: each was computed on the ones before it.
    for (let i = this.#inflightOps.length - 1; i >= 0; i--) {
      const op = this.#inflightOps[i]!.get(key);
      if (op !== undefined) return op;
    }
    return undefined;
  }

  /** Puts an effect key in the pending batch. */
  putEffect(key: string, value: string | Uint8Array): void {
    // A key written again in this batch (a counter, a projection) reuses its entry. The entries
    // of the batch being written are in #inflightOps, never here, so this changes nothing written.
    const op = this.#ops.get(key);
    if (op?.type === 'put') op.value = value;
    else this.#ops.set(key, { type: 'put', key, value });
  }

  /** Deletes an effect key in the pending batch. */
  delEffect(key: string): void {
    this.#ops.set(key, { type: 'del', key });
  }

  /** Marks a scope as written by the pending batch (its working state goes with it). */
  touch(scope: string): void {
    this.#touched.add(scope);
  }

  /** True when the pending batch writes `scope`. */
  touches(scope: string): boolean {
    return this.#touched.has(scope);
  }

  /**
   * Commits the pending batch: effects, touched verifier states and the offset in one LevelDB
   * batch; then settles (acks) the messages. Resolves once it is durable. Idempotent when nothing
   * is pending. A handler in progress is waited for, and its message committed too (never part of
   * it): so a handler must not await `flush()` or `close()` itself.
   */
  async flush(): Promise<void> {
    await this.#startCommit();
    await this.idle();
    if (this.#failed !== undefined) throw this.#failed;
  }

  /** Resolves once every write in flight, if any, has ended (durable or failed). */
  async idle(): Promise<void> {
    // An ended write leaves #writes before this turn's await returns: the loop ends.
    while (this.#writes.length > 0) await this.#writes.at(-1)!.catch(() => undefined);
  }

  /**
   * Writes `ops` (not the pending batch) as the next write, now: call it from a
   * {@link CommitPipeline.whenQuiet} action. Resolves once it is durable.
   */
  write(ops: Op[]): Promise<void> {
    ++this.#writesBegun;
    const write =
      this.#store.writeOps?.(ops) ?? Promise.reject(new TypeError('this store writes whole batches only'));
    this.#inFlight(write);
    return write;
  }

  /**
   * Runs `action` at the first moment when no write is in flight and no handler is between two
   * of its writes, in the same turn as the check: whatever it writes holds whole messages only.
   */
  async whenQuiet<T>(action: () => T): Promise<T> {
    for (;;) {
      if (this.#writes.length > 0) await this.#writes[0]!.catch(() => undefined);
      else if (this.#processing) await this.#boundary();
      else return action();
    }
  }

  /**
   * Drops the uncommitted batch (after a lost connection: the messages are delivered again from
   * the committed offset).
   */
  discard(): void {
    clearTimeout(this.#linger);
    this.#linger = undefined;
    // A handler in progress keeps writing into the next batch: its message goes too when it returns.
    if (this.#processing) this.#dropCurrent = true;
    this.#scopes.discard(this.#touched);
    this.#store.discard();
    this.#ops = new Map();
    this.#touched = new Set();
    this.#pendingMessages = 0;
    this.#pendingSettles = [];
    // Delivery goes on after what was handed to a write (the write in flight goes on).
    this.#lastOffset = this.#handedOffset;
    this.#lastChunk = this.#handedChunk;
  }

  /** Stops the pipeline for good and drops the uncommitted batch; returns the error it stopped with. */
  fail(err: unknown): Error {
    const first = this.#failed === undefined;
    this.#failed ??= err instanceof Error ? err : new Error(`the handler threw ${describeThrown(err)}`);
    this.#onStop(this.#failed, err, first);
    this.discard();
    return this.#failed;
  }

  /** No write starts from now on (call once what should be committed is). */
  close(): void {
    this.#closed = true;
    clearTimeout(this.#linger);
  }

  #add(
    offset: bigint,
    settle: (() => void) | undefined,
    chunk: ChunkIdentity | undefined,
  ): Promise<void> | undefined {
    this.#lastOffset = offset;
    this.#lastChunk = chunk;
    this.#pendingMessages++;
    if (settle !== undefined) this.#pendingSettles.push(settle);
    if (this.#options.commit === 'message') return this.flush();
    // Pipelined: a full batch is written while the next one is processed, so the per-message path
    // returns no promise. It waits only when the write falls behind by several batches.
    const every = this.#options.commitEvery;
    if (this.#pendingMessages >= every) {
      if (this.#writes.length < this.#depth) {
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
    }, this.#options.commitLingerMs);
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
   * Starts writing the pending batch once the previous one is durable (one write in flight at a
   * time) and no handler is in the middle of a message, without waiting for the write. A failed
   * write stops the consumer.
   */
  async #startCommit(): Promise<void> {
    // As whenQuiet(), but with room for one more write rather than none in flight (journalDepth).
    for (;;) {
      if (this.#writes.length >= this.#depth) await this.#writes[0]!.catch(() => undefined);
      else if (this.#processing) await this.#boundary();
      else return this.#beginIfPending();
    }
  }

  readonly #beginIfPending = (): void => {
    if (this.#pendingMessages > 0 && this.#failed === undefined) this.#beginCommit();
  };

  /**
   * Starts writing the pending batch now. Only while there is room for a write (none in flight,
   * or fewer than `journalDepth` with a journal), something is pending, nothing failed, and no
   * handler is in the middle of a message (its writes must all land in one batch, and a handler
   * that has not returned may still throw).
   */
  #beginCommit(): void {
    clearTimeout(this.#linger);
    this.#linger = undefined;
    const batchOps = this.#ops;
    const ops: Op[] = [];
    for (const op of batchOps.values()) ops.push(encodedOp(op));
    const write = ++this.#writesBegun;
    const staged = this.#scopes.stage(this.#touched, write, ops);
    const lastOffset = this.#lastOffset!;
    const lastChunk = this.#lastChunk;
    const baseOffset = this.#handedOffset;
    this.#handedOffset = lastOffset;
    this.#handedChunk = lastChunk;
    ops.push({ type: 'put', key: this.#offsetKey, value: encodeOffset(lastOffset, lastChunk) });
    const info = { messages: this.#pendingMessages, lastOffset };
    const settles = this.#pendingSettles;
    this.#inflightOps.push(batchOps);
    this.#ops = new Map();
    this.#touched = new Set();
    this.#pendingMessages = 0;
    this.#pendingSettles = [];
    const hooks = this.#options.hooks;
    const settled = this.#traceSettle?.(info.messages, lastOffset);
    const release = (): void => {
      const at = this.#inflightOps.indexOf(batchOps);
      if (at !== -1) this.#inflightOps.splice(at, 1);
    };
    // The commit still in flight before this one (journalDepth > 1): this batch was computed on
    // it, so it is written only after that one was, and dropped if that one was not.
    const previous =
      this.#writes.length > 0
        ? this.#lastCommit?.then(
            (written) => written,
            () => false,
          )
        : undefined;
    const commit = (async (): Promise<boolean> => {
      try {
        // A hook that throws stops the consumer with nothing of the batch written. Outside this
        // try it skipped the write silently while the next batch, based on this one's end, still
        // went: a batch of effects lost and the offset past it.
        callHook('beforeCommit', hooks?.beforeCommit, info);
        // Journaled now, while the batches before it still wait for theirs (pipelined); its
        // outcome is taken only after theirs, in order.
        const journaled = this.#journal?.({ ops, lastOffset, baseOffset });
        journaled?.catch(() => undefined);
        if (previous !== undefined && !(await previous)) {
          // The batch before it was not written (its journal was fenced or failed, or the
          // pipeline stopped): nothing of this one is written either.
          release();
          settled?.(this.#failed ?? new Error('the batch before it was not written'));
          return false;
        }
        // No await when there is nothing to wait for (no journal, no write before it): the store
        // must take the batch in this call, synchronously. The PostgreSQL store hands a handler the
        // transaction still open at its enter(); a write begun one microtask later let the next
        // message (a duplicate's synchronous endMessage, then the next delivery) run its handler in
        // this batch's transaction, revoked under it by this commit: its first statement committed
        // with this batch, its ID recorded in the next, its second refused as "used after the
        // handler returned" (postgres-crash.test.ts, CI of 2026-12-03).
        if (journaled !== undefined) await journaled;
        // Still the partition's holder (a pause since its check: the gate proves it again).
        const writable = this.#gate?.();
        if (writable !== undefined) await writable;
        await this.#store.write({ ops, lastOffset, baseOffset, lastChunk });
        // And again before it is reported: a pause during the write. Not proven, the batch is in
        // the store (a state the changelog holds, §12) but not reported, and every later one dropped.
        const reportable = this.#gate?.();
        if (reportable !== undefined) await reportable;
      } catch (err) {
        settled?.(err);
        release();
        // Recovered (a lost connection, a deadlock): the pipeline was rebased on the stored offset;
        // the batch's messages are delivered again.
        const recovered = this.#recover?.(err);
        if (recovered === true) return false;
        throw this.fail(recovered ?? err);
      } finally {
        release();
      }
      staged();
      this.#committedOffset = lastOffset;
      this.#committedChunk = lastChunk;
      this.#stats.commits++;
      let hookError: { err: unknown } | undefined;
      try {
        callHook('afterCommit', hooks?.afterCommit, info);
      } catch (err) {
        hookError = { err };
      }
      // The batch is durable whatever the hook did: its offset is told and its messages settled.
      for (const listener of this.#commitListeners) listener(lastOffset);
      for (const settle of settles) settle();
      settled?.();
      if (hookError !== undefined) throw this.fail(hookError.err);
      return true;
    })();
    this.#lastCommit = commit;
    this.#inFlight(commit);
  }

  /** Makes `write` the newest write in flight; when one ends, a full batch that waited for room goes. */
  #inFlight(write: Promise<unknown>): void {
    this.#committing = write as Promise<void>;
    this.#writes.push(write);
    const done = (): void => {
      this.#writesDone++;
      const at = this.#writes.indexOf(write);
      if (at !== -1) void this.#writes.splice(at, 1);
      if (this.#committing === write) this.#committing = undefined;
      // A full batch that waited for this write goes now, unless a handler is mid-message.
      if (
        this.#writes.length < this.#depth &&
        !this.#processing &&
        !this.#closed &&
        this.#failed === undefined &&
        this.#pendingMessages >= this.#options.commitEvery
      ) {
        this.#beginCommit();
      }
    };
    write.then(done, done);
  }
}

/** Calls a commit hook; what it throws that is not an Error becomes one that names the hook. */
function callHook<T>(name: string, hook: ((info: T) => void) | undefined, info: T): void {
  try {
    hook?.(info);
  } catch (err) {
    throw err instanceof Error ? err : new Error(`hooks.${name} threw ${describeThrown(err)}`);
  }
}

/** A thrown non-Error as text: `String()` of an object may itself throw (a `toString` that is not a function). */
function describeThrown(value: unknown): string {
  try {
    return String(value);
  } catch {
    return Object.prototype.toString.call(value);
  }
}
