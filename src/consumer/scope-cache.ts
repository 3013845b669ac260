/**
 * The verifier state of the consumer's scopes (consumer, tenant, producer) in memory: loaded from
 * the store on first use, recorded into a working copy that replaces the committed one only once
 * its write is durable, and forgotten after `scopeTtlMs` of idleness (docs/design.md §5).
 */
import { encodeScopeKey } from '../identity/scope-key.js';
import {
  decodeScopeState,
  encodeScopeState,
  scopeKeyOfStateKey,
  scopeStateKey,
  scopeStateKeysOf,
} from '../store/consumer-keys.js';
import type { KeyValueDb } from '../store/store.js';

/**
 * Where scope states are read: the LevelDB (which also lists them, for eviction), or another
 * consumer store that only reads them.
 */
export type ScopeSource = Pick<KeyValueDb, 'get'> & Partial<Pick<KeyValueDb, 'iterator'>>;
import { createTracker } from '../verifier/window.js';
import type { PolicySpec, RecordResult, SequenceTracker } from '../verifier/types.js';
import type { CommitPipeline, Op, ScopeStager } from './commit-pipeline.js';

/**
 * A scope's trackers: `committed` is durable, `committing` is in the batch being written,
 * `working` has this batch's records. Readers take the newest that exists.
 */
export interface ScopeState {
  committed: SequenceTracker;
  committing: SequenceTracker | undefined;
  working: SequenceTracker | undefined;
  lastSeenMs: number;
  /** The number of the last write that wrote this scope's state (0: none in this life). */
  writtenBy: number;
}

/** Scope keys cached per producer: encoding one per message costs more than the check. */
const MAX_CACHED_KEYS = 4096;
/**
 * Producers whose keys are cached: past it the cache starts over. Without a bound, a consumer that
 * sees producers come and go kept every producer's keys for good, evicted scopes included
 * (measured: about 400 B per evicted scope, with `scopeTtlMs` set).
 */
const MAX_CACHED_PRODUCERS = 65_536;

/**
 * The scopes of one consumer.
 *
 * @internal
 */
export class ScopeCache implements ScopeStager {
  readonly #db: ScopeSource;
  readonly #consumerName: string;
  readonly #policy: PolicySpec;
  readonly #ttlMs: number;
  readonly #scopes = new Map<string, ScopeState>();
  readonly #keys = new Map<string, Map<string, string>>();
  /** The last (tenant, producer) looked up and its key: consecutive messages mostly share it. */
  #last = { tenant: '', producer: '', key: '' };

  constructor(db: ScopeSource, consumerName: string, policy: PolicySpec, ttlMs: number) {
    this.#db = db;
    this.#consumerName = consumerName;
    this.#policy = policy;
    this.#ttlMs = ttlMs;
  }

  /** The encoded scope key of (tenant, producer), cached per (tenant, producer). */
  key(tenant: string, producer: string): string {
    const last = this.#last;
    if (producer === last.producer && tenant === last.tenant && last.key !== '') return last.key;
    let byTenant = this.#keys.get(producer);
    if (byTenant === undefined) {
      if (this.#keys.size >= MAX_CACHED_PRODUCERS) this.#keys.clear();
      byTenant = new Map();
      this.#keys.set(producer, byTenant);
    }
    let key = byTenant.get(tenant);
    if (key === undefined) {
      key = encodeScopeKey({ consumer: this.#consumerName, tenant, producer });
      if (byTenant.size < MAX_CACHED_KEYS) byTenant.set(tenant, key);
    }
    this.#last = { tenant, producer, key };
    return key;
  }

  /** Producers whose scope keys are cached (bounded by {@link MAX_CACHED_PRODUCERS}). */
  get cachedKeyProducers(): number {
    return this.#keys.size;
  }

  /** The scope's state if it is in memory. */
  get(scope: string): ScopeState | undefined {
    return this.#scopes.get(scope);
  }

  /** Forgets every cached state: another process may have committed newer ones (a fence). */
  clear(): void {
    this.#scopes.clear();
  }

  /** Reads the scope's state from the store (a new scope starts empty). */
  async load(scope: string): Promise<ScopeState> {
    const raw = await this.#db.get(scopeStateKey(scope));
    // Another message of the scope may have loaded it meanwhile: keep the first.
    const existing = this.#scopes.get(scope);
    if (existing !== undefined) return existing;
    const stored = raw === undefined ? undefined : decodeScopeState(raw, scope);
    const state: ScopeState = {
      committed: stored?.tracker ?? createTracker(this.#policy),
      committing: undefined,
      working: undefined,
      lastSeenMs: stored?.lastSeenMs ?? 0,
      writtenBy: 0,
    };
    this.#scopes.set(scope, state);
    return state;
  }

  /** Records a new ID in the scope's working copy; the committed copy moves only after the commit. */
  record(state: ScopeState, publishingId: bigint, skippedFrom: bigint | undefined): RecordResult {
    const working = (state.working ??= (state.committing ?? state.committed).clone());
    return working.record(publishingId, skippedFrom);
  }

  stage(scopes: ReadonlySet<string>, write: number, ops: Op[]): () => void {
    const staged: Array<[ScopeState, SequenceTracker]> = [];
    // One clock read per commit: retention counts in hours, not per message.
    const now = Date.now();
    for (const scope of scopes) {
      const state = this.#scopes.get(scope)!;
      const snapshot = state.working!;
      state.lastSeenMs = now;
      state.writtenBy = write;
      // Later messages of the scope record into a fresh working copy of this snapshot.
      state.committing = snapshot;
      state.working = undefined;
      staged.push([state, snapshot]);
      ops.push({ type: 'put', key: scopeStateKey(scope), value: encodeScopeState(snapshot, now) });
    }
    return () => {
      for (const [state, snapshot] of staged) {
        state.committed = snapshot;
        if (state.committing === snapshot) state.committing = undefined;
      }
    };
  }

  discard(scopes: ReadonlySet<string>): void {
    for (const scope of scopes) {
      const state = this.#scopes.get(scope);
      if (state !== undefined) state.working = undefined;
    }
  }

  /**
   * Forgets scopes idle longer than the TTL; returns how many. The scan only proposes: commits go
   * on meanwhile, so each scope is decided again when the deletions are written, as the
   * pipeline's next write (no commit in flight, no handler mid-message), and kept if anything
   * wrote or touched it since the scan began.
   */
  async evictIdle(nowMs: number, pipeline: CommitPipeline): Promise<number> {
    const ttl = this.#ttlMs;
    const iterator = this.#db.iterator?.bind(this.#db);
    if (ttl <= 0 || iterator === undefined) return 0;
    // Writes after this one may be missing from the scan (a write in flight included).
    const since = pipeline.writesDone;
    const idle: string[] = [];
    for await (const [key, value] of iterator(scopeStateKeysOf(this.#consumerName))) {
      const scope = scopeKeyOfStateKey(key);
      if (nowMs - decodeScopeState(value, scope).lastSeenMs > ttl) idle.push(scope);
    }
    if (idle.length === 0) return 0;
    const deleting = await pipeline.whenQuiet(() => {
      if (pipeline.isClosed || pipeline.failure !== undefined) return undefined;
      const dels: Op[] = [];
      for (const scope of idle) {
        if (pipeline.touches(scope)) continue;
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
        dels.push({ type: 'del', key: scopeStateKey(scope) });
      }
      if (dels.length === 0) return undefined;
      return { write: pipeline.write(dels), count: dels.length };
    });
    if (deleting === undefined) return 0;
    await deleting.write;
    return deleting.count;
  }
}
