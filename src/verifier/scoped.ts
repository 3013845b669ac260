/**
 * One tracker per scope (consumer, tenant, producer), created on first record and evicted when
 * idle. Time is passed in by the caller: there is no clock in here.
 */
import {
  checkPolicySpec,
  type CheckResult,
  type PolicySpec,
  type RecordResult,
  type SequenceTracker,
} from './types.js';
import { createTracker } from './window.js';

/**
 * A scope's tracker and when it last recorded an ID.
 *
 * @remarks Since 0.1.0
 */
export interface ScopeEntry {
  /** The scope's tracker. */
  readonly tracker: SequenceTracker;
  /** The `nowMs` of the last `record` or `set` for the scope. */
  readonly lastSeenMs: number;
}

interface MutableEntry {
  tracker: SequenceTracker;
  lastSeenMs: number;
}

/**
 * The trackers of many scopes under one policy, keyed by an opaque scope key: use
 * `encodeScopeKey({ consumer, tenant, producer })`, whose encoding is injective, so that two scopes
 * never share a tracker.
 *
 * Retention (docs/design.md §5): {@link ScopedVerifier.evictIdle} forgets scopes idle longer than a TTL. A
 * duplicate that arrives after its scope was evicted is judged `new` and takes effect again; a
 * finite window and a finite TTL protect for that long, not forever.
 *
 * @example
 * ```ts
 * const verifier = new ScopedVerifier({ kind: 'window', size: 1024 });
 * const key = encodeScopeKey({ consumer: 'balance-projection', tenant: 'acme', producer: 'orders-svc' });
 * if (verifier.check(key, 17n).outcome === 'new') {
 *   applyEffect();
 *   verifier.record(key, 17n, Date.now());
 * }
 * verifier.evictIdle(Date.now(), 7 * 24 * 3600_000);
 * ```
 * @remarks Since 0.1.0
 */
export class ScopedVerifier {
  /** The policy of every tracker this verifier creates (frozen). */
  readonly spec: PolicySpec;
  readonly #entries = new Map<string, MutableEntry>();
  // Answers `check` for scopes never recorded: always empty, never recorded into.
  readonly #empty: SequenceTracker;
  // The scope the last `check` looked up, and its entry: a consumer records right after it checks,
  // and the record then skips a second Map lookup (the key is usually the very same string, so the
  // comparison is a pointer comparison). Reset by everything that adds or removes entries.
  #checkedKey: string | undefined;
  #checkedEntry: MutableEntry | undefined;

  /**
   * @throws TypeError when `spec` is not an object, or a window `size` is not a number.
   * @throws RangeError when `kind` is unknown, or a window `size` is not an integer from 1 to 2^20.
   */
  constructor(spec: PolicySpec) {
    this.spec = checkPolicySpec(spec);
    this.#empty = createTracker(this.spec);
  }

  /** The number of scopes held. */
  get size(): number {
    return this.#entries.size;
  }

  /**
   * Classifies `id` for a scope without changing anything; an unknown scope answers like an empty
   * tracker (`new`, nothing skipped).
   *
   * @throws TypeError when `scopeKey` is not a string or `id` not a bigint.
   * @throws RangeError when `id` is not between 1 and 2^64 - 1.
   */
  check(scopeKey: string, id: bigint): CheckResult {
    if (typeof scopeKey !== 'string') throw keyTypeError(scopeKey);
    const entry = this.#entries.get(scopeKey);
    this.#checkedKey = scopeKey;
    this.#checkedEntry = entry;
    return (entry === undefined ? this.#empty : entry.tracker).check(id);
  }

  /**
   * Records `id` for a scope (creating its tracker if needed) and marks the scope seen at `nowMs`.
   * Call it after the effect is committed. Nothing changes when it throws. `skippedFrom` is the
   * message's declared skip (see {@link SequenceTracker.record}).
   *
   * @throws TypeError when `scopeKey` is not a string, `id` or `skippedFrom` not a bigint, or
   * `nowMs` not a number.
   * @throws RangeError when `id` is out of range or not `new` for the scope, `skippedFrom` is not
   * between 1 and `id - 1`, or `nowMs` is not finite.
   * @remarks `skippedFrom` since 0.2.0.
   */
  record(scopeKey: string, id: bigint, nowMs: number, skippedFrom?: bigint): RecordResult {
    if (typeof scopeKey !== 'string') throw keyTypeError(scopeKey);
    assertTime(nowMs, 'nowMs');
    const entry = scopeKey === this.#checkedKey ? this.#checkedEntry : this.#entries.get(scopeKey);
    if (entry !== undefined) {
      const result = entry.tracker.record(id, skippedFrom);
      entry.lastSeenMs = nowMs;
      return result;
    }
    const tracker = createTracker(this.spec);
    const result = tracker.record(id, skippedFrom);
    this.#forgetChecked();
    this.#entries.set(scopeKey, { tracker, lastSeenMs: nowMs });
    return result;
  }

  /**
   * Installs a tracker for a scope: one decoded from the store on start, or a committed clone.
   *
   * @throws TypeError when `scopeKey` is not a string or `nowMs` not a number.
   * @throws RangeError when `tracker.spec` differs from this verifier's, or `nowMs` is not finite.
   */
  set(scopeKey: string, tracker: SequenceTracker, nowMs: number): void {
    if (typeof scopeKey !== 'string') throw keyTypeError(scopeKey);
    assertTime(nowMs, 'nowMs');
    const { spec } = tracker;
    if (
      spec.kind !== this.spec.kind ||
      (spec.kind === 'window' && this.spec.kind === 'window' && spec.size !== this.spec.size)
    ) {
      throw new RangeError(
        `tracker policy ${describeSpec(spec)} differs from the verifier's ${describeSpec(this.spec)}`,
      );
    }
    this.#forgetChecked();
    this.#entries.set(scopeKey, { tracker, lastSeenMs: nowMs });
  }

  /** The tracker of a scope, or `undefined` if the scope is not held. */
  get(scopeKey: string): SequenceTracker | undefined {
    return this.#entries.get(scopeKey)?.tracker;
  }

  /** The scopes held, in insertion order: `[scopeKey, entry]`. */
  entries(): IterableIterator<[string, ScopeEntry]> {
    return this.#entries.entries();
  }

  /**
   * Forgets every scope whose last record is more than `ttlMs` before `nowMs`, and returns how many
   * it forgot. A duplicate that arrives after its scope was forgotten is judged `new` again.
   *
   * @throws TypeError when `nowMs` or `ttlMs` is not a number.
   * @throws RangeError when `nowMs` is not finite, or `ttlMs` is negative or NaN.
   */
  evictIdle(nowMs: number, ttlMs: number): number {
    assertTime(nowMs, 'nowMs');
    if (typeof ttlMs !== 'number') throw new TypeError(`ttlMs must be a number, got ${typeof ttlMs}`);
    if (!(ttlMs >= 0)) throw new RangeError(`ttlMs must be >= 0, got ${ttlMs}`);
    let evicted = 0;
    this.#forgetChecked();
    for (const [key, entry] of this.#entries) {
      if (nowMs - entry.lastSeenMs > ttlMs) {
        this.#entries.delete(key); // deleting the current entry while iterating a Map is safe
        evicted++;
      }
    }
    return evicted;
  }

  #forgetChecked(): void {
    this.#checkedKey = undefined;
    this.#checkedEntry = undefined;
  }
}

function assertTime(value: number, what: string): void {
  if (typeof value !== 'number') throw new TypeError(`${what} must be a number, got ${typeof value}`);
  if (!Number.isFinite(value)) throw new RangeError(`${what} must be finite, got ${value}`);
}

function keyTypeError(key: unknown): TypeError {
  return new TypeError(`scopeKey must be a string, got ${typeof key}`);
}

function describeSpec(spec: PolicySpec): string {
  return spec.kind === 'window' ? `window(${spec.size})` : spec.kind;
}
