import { Level } from 'level';
import { DedupError } from '../errors.js';
import { measureUtf8 } from '../identity/utf8.js';
import {
  decodeKeySegment,
  decodeMeta,
  decodePartitionList,
  decodeSegmentRecord,
  encodeKeySegment,
  encodeMeta,
  encodePartitionList,
  encodeSegment,
  type KeyEntry,
  type OutboxEntry,
  type ProducerMeta,
} from './codec.js';

/**
 * The subset of an abstract-level database the store uses. `level` (LevelDB on disk) is the
 * default; property tests pass a `memory-level` instance.
 */
export interface KeyValueDb {
  readonly status: string;
  open(): Promise<void>;
  close(): Promise<void>;
  get(key: string): Promise<Uint8Array | undefined>;
  /** Several keys in one call (abstract-level's `getMany`); optional, `get` is used without it. */
  getMany?(keys: string[]): Promise<Array<Uint8Array | undefined>>;
  batch(
    ops: Array<{ type: 'put'; key: string; value: Uint8Array } | { type: 'del'; key: string }>,
    options?: { sync?: boolean },
  ): Promise<void>;
  iterator(options: { gte: string; lt: string }): AsyncIterableIterator<[string, Uint8Array]> & {
    close(): Promise<void>;
  };
}

/** Options of {@link DedupStore.open}. */
export interface StoreOptions {
  /**
   * Ask LevelDB to fsync every commit (`sync: true`). Without it a commit survives a process
   * crash but not a machine crash or power loss.
   * @defaultValue false
   */
  readonly sync?: boolean;
}

/**
 * The durable state of every producer and verifier using one folder: publishing IDs, outbox
 * segments and verifier scopes, in one LevelDB. LevelDB's lock keeps a second process out.
 *
 * @example
 * ```ts
 * const store = await DedupStore.open('./.dedup');
 * // share it between producers, then
 * await store.close();
 * ```
 */
export class DedupStore {
  readonly #db: KeyValueDb;
  readonly #sync: boolean;
  readonly #claims = new Set<string>();
  #closing: Promise<void> | undefined;

  private constructor(db: KeyValueDb, sync: boolean) {
    this.#db = db;
    this.#sync = sync;
  }

  /**
   * Opens (creating if needed) the LevelDB store in `path`.
   *
   * Before it resolves it writes one warm-up batch (a put and a delete of one key of its own, not
   * synced), so that its first commits do not pay the process's first LevelDB write; the store's
   * contents are unchanged. Since 0.6.0.
   *
   * @throws DedupError `DEDUP_STORE_LOCKED` when another process (or another open store object)
   *   holds the folder's lock; `DEDUP_STORE_CORRUPT` when LevelDB reports corruption, or the folder
   *   cannot be opened; `DEDUP_STORE_REFUSED` when it opened but cannot be written (a full disk,
   *   read-only files: nothing says its contents are damaged, so do not delete it).
   */
  static async open(path: string, options: StoreOptions = {}): Promise<DedupStore> {
    if (typeof path !== 'string' || path.length === 0)
      throw new TypeError('store path must be a non-empty string');
    const db = new Level<string, Uint8Array>(path, { keyEncoding: 'utf8', valueEncoding: 'view' });
    try {
      await db.open();
    } catch (err) {
      throw mapOpenError(err, path);
    }
    try {
      await warmUp(db as unknown as KeyValueDb);
    } catch (err) {
      await db.close().catch(() => undefined);
      // Not CORRUPT: that invites deleting the store (and with it what the broker's dedup relies
      // on) for a full disk or read-only files (revP S1).
      throw new DedupError(
        'DEDUP_STORE_REFUSED',
        `store ${path} opened but cannot be written (a full disk, read-only files?); its contents were not found damaged: ${String(err)}`,
        { cause: err },
      );
    }
    return new DedupStore(db as unknown as KeyValueDb, options.sync ?? false);
  }

  /**
   * Wraps an already created abstract-level database (opened here if needed): tests and property
   * tests pass a `memory-level` one.
   *
   * @internal
   */
  static async wrap(db: KeyValueDb, options: StoreOptions = {}): Promise<DedupStore> {
    if (db.status !== 'open') {
      try {
        await db.open();
      } catch (err) {
        throw mapOpenError(err, '(wrapped database)');
      }
    }
    return new DedupStore(db, options.sync ?? false);
  }

  /** True once {@link DedupStore.close} was called. */
  get isClosed(): boolean {
    return this.#closing !== undefined;
  }

  /** Whether commits are fsynced. */
  get sync(): boolean {
    return this.#sync;
  }

  /**
   * Claims one producer's state. A producer is claimed at most once at a time per store, so two
   * publishers in one process cannot share a name on one target by accident.
   *
   * @throws DedupError `DEDUP_STORE_LOCKED` when the producer is already claimed;
   *   `DEDUP_STORE_CLOSED` after {@link DedupStore.close}.
   * @throws RangeError when `target` or `producerName` holds a lone UTF-16 surrogate.
   * @internal The publisher's; applications pass the store to `open()`.
   */
  claimProducer(target: string, producerName: string): ProducerState {
    if (this.#closing !== undefined)
      throw storeClosed(`cannot open producer "${producerName}" on "${target}"`);
    refuseLoneSurrogate(target, 'the target (stream or queue name)');
    refuseLoneSurrogate(producerName, 'producerName');
    const prefix = producerPrefix(target, producerName);
    if (this.#claims.has(prefix)) {
      throw new DedupError(
        'DEDUP_STORE_LOCKED',
        `producer "${producerName}" on "${target}" is already open on this store; one live producer per name`,
      );
    }
    this.#claims.add(prefix);
    return new ProducerState(
      this.#db,
      prefix,
      this.#sync,
      () => this.#claims.delete(prefix),
      () => this.#closing !== undefined,
    );
  }

  /**
   * Claims one verifying consumer's state: at most one consumer of a name per store at a time.
   * Returns the function that gives the claim back.
   *
   * @throws DedupError `DEDUP_STORE_LOCKED` when the consumer is already claimed;
   *   `DEDUP_STORE_CLOSED` after {@link DedupStore.close}.
   * @throws RangeError when `consumerName` holds a lone UTF-16 surrogate.
   * @internal The verifying consumer's; applications pass the store to `open()`.
   */
  claimConsumer(consumerName: string): () => void {
    if (this.#closing !== undefined) throw storeClosed(`cannot open consumer "${consumerName}"`);
    refuseLoneSurrogate(consumerName, 'consumerName');
    const claim = `c:${consumerName.length}:${consumerName}`;
    if (this.#claims.has(claim)) {
      throw new DedupError('DEDUP_STORE_LOCKED', `consumer "${consumerName}" is already open on this store`);
    }
    this.#claims.add(claim);
    let released = false;
    return () => {
      if (!released) {
        released = true;
        this.#claims.delete(claim);
      }
    };
  }

  /**
   * Lists the producers with state in this store.
   *
   * @throws DedupError `DEDUP_STORE_CLOSED` after {@link DedupStore.close}.
   * @internal For the CLI's `inspect`.
   */
  async listProducers(): Promise<Array<{ target: string; producerName: string; meta: ProducerMeta }>> {
    if (this.#closing !== undefined) throw storeClosed('cannot list producers');
    const out: Array<{ target: string; producerName: string; meta: ProducerMeta }> = [];
    for await (const [key, value] of this.#db.iterator({ gte: 'p:', lt: 'p;' })) {
      if (!key.endsWith(META_SUFFIX)) continue;
      const parsed = parseProducerPrefix(key.slice(0, -META_SUFFIX.length));
      if (parsed !== undefined) out.push({ ...parsed, meta: decodeMeta(value, key) });
    }
    return out;
  }

  /**
   * The partitions, in the broker's order, that a super stream producer was last opened with;
   * `undefined` before its first open.
   *
   * @throws DedupError `DEDUP_STORE_CORRUPT` for a record that cannot be decoded;
   *   `DEDUP_STORE_CLOSED` after {@link DedupStore.close}.
   * @internal The super stream publisher's.
   */
  async readPartitions(superStream: string, producerName: string): Promise<string[] | undefined> {
    const key = superStreamKey(superStream, producerName);
    const raw = await this.#use('cannot read the super stream record', () => this.#db.get(key));
    return raw === undefined ? undefined : decodePartitionList(raw, key);
  }

  /**
   * Records the partitions a super stream producer opens with (one small record per super stream
   * and producer name, beside the partitions' own producer state).
   *
   * @throws DedupError `DEDUP_STORE_CLOSED` after {@link DedupStore.close}.
   * @throws RangeError for an empty list or a name with a lone UTF-16 surrogate.
   * @internal The super stream publisher's.
   */
  writePartitions(superStream: string, producerName: string, partitions: readonly string[]): Promise<void> {
    if (partitions.length === 0 || partitions.length > 0xffff)
      throw new RangeError('a super stream has 1 to 65535 partitions');
    for (const p of partitions) refuseLoneSurrogate(p, 'a partition name');
    const op = {
      type: 'put' as const,
      key: superStreamKey(superStream, producerName),
      value: encodePartitionList(partitions),
    };
    return this.#use('cannot write the super stream record', () =>
      this.#db.batch([op], { sync: this.#sync }),
    );
  }

  /** One database call, failing with `DEDUP_STORE_CLOSED` once the store is closed (before or during it). */
  async #use<T>(what: string, operation: () => Promise<T>): Promise<T> {
    if (this.#closing !== undefined) throw storeClosed(what);
    try {
      return await operation();
    } catch (err) {
      if (this.#closing !== undefined && !(err instanceof DedupError)) throw storeClosed(what, err);
      throw err;
    }
  }

  /** The raw database, for the verifier and consumer state that share this store. @internal */
  get db(): KeyValueDb {
    return this.#db;
  }

  /**
   * Closes the database. Idempotent. A publisher or consumer that uses the store afterwards fails
   * with `DEDUP_STORE_CLOSED`.
   */
  close(): Promise<void> {
    this.#closing ??= this.#db.close();
    return this.#closing;
  }

  /** Calls {@link DedupStore.close}: `await using store = await DedupStore.open(…)`. */
  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }
}

/** What using a closed store throws, whatever the operation. */
function storeClosed(what: string, cause?: unknown): DedupError {
  return new DedupError(
    'DEDUP_STORE_CLOSED',
    `${what}: the store is closed`,
    cause === undefined ? undefined : { cause },
  );
}

/**
 * LevelDB stores keys as UTF-8, where every lone UTF-16 surrogate becomes U+FFFD: two names that
 * differ only there would share one state on disk while their claims (JS strings) differ, so
 * neither would see `DEDUP_STORE_LOCKED`.
 */
function refuseLoneSurrogate(name: string, what: string): void {
  if (measureUtf8(name).loneSurrogate) {
    throw new RangeError(`${what} must not contain a lone UTF-16 surrogate`);
  }
}

const META_SUFFIX = '/m';
const OUTBOX_INFIX = '/o/';
/** The domain keys first published in one group commit, under the commit's first key's ID. */
const KEY_SEGMENT_INFIX = '/k/';

/**
 * The key of the warm-up write, written and deleted in one batch, so no reader ever sees it. `o:` is
 * no other record's tag (`c:`, `g:`, `p:`, `s:`, `u:`, `v:`, and `w:` the standby copies', are).
 */
const WARM_UP_KEY = 'o:warm-up';

/**
 * One write before `open()` resolves, so that the first commits do not pay the first write of a
 * process (LevelDB's write path, the log file, the thread pool): measured in fresh processes on a
 * fresh store, the first batch took 6–17 ms (median 13) without it and 0.2–12 ms (median 2) after
 * it; in a publisher that cost lands on every send of its first group commits. The batch puts and
 * deletes one key of its own (`o:`, used by nothing else), so the store's contents are unchanged.
 * Not synced: it makes nothing durable, and a synced commit still syncs everything before it.
 */
function warmUp(db: KeyValueDb): Promise<void> {
  return db.batch([
    { type: 'put', key: WARM_UP_KEY, value: new Uint8Array(0) },
    { type: 'del', key: WARM_UP_KEY },
  ]);
}

/** `p:` + length-prefixed target and name: injective, and one producer's keys share a prefix. */
function producerPrefix(target: string, producerName: string): string {
  return `p:${target.length}:${target}${producerName.length}:${producerName}`;
}

/**
 * `s:` + length-prefixed super stream and producer name: the partition list a super stream
 * producer last opened with. Apart from `p:`, so `listProducers` never meets it.
 */
function superStreamKey(superStream: string, producerName: string): string {
  refuseLoneSurrogate(superStream, 'superStream');
  refuseLoneSurrogate(producerName, 'producerName');
  return `s:${superStream.length}:${superStream}${producerName.length}:${producerName}`;
}

function parseProducerPrefix(prefix: string): { target: string; producerName: string } | undefined {
  const m = /^p:(\d+):/.exec(prefix);
  if (m === null) return undefined;
  let o = m[0].length;
  const tLen = Number(m[1]);
  const target = prefix.slice(o, o + tLen);
  o += tLen;
  const m2 = /^(\d+):/.exec(prefix.slice(o));
  if (m2 === null) return undefined;
  o += m2[0].length;
  const producerName = prefix.slice(o, o + Number(m2[1]));
  return o + Number(m2[1]) === prefix.length ? { target, producerName } : undefined;
}

/** 20 decimal digits: lexicographic order of keys is numeric order of IDs. */
function idKey(id: bigint): string {
  return id.toString().padStart(20, '0');
}

/** What {@link ProducerState.load} finds. */
export interface LoadedProducer {
  readonly meta: ProducerMeta | undefined;
  /** Outbox segments in ID order, each with its key ID (the first entry's ID). */
  readonly segments: readonly StoredSegment[];
}

/** One outbox segment as stored. */
export interface StoredSegment {
  /** Its key: the first entry's ID. */
  readonly firstId: bigint;
  readonly entries: readonly OutboxEntry[];
  /** The sizes of its sub-entry batches, in order; `undefined`: one message per entry. */
  readonly batches?: readonly number[] | undefined;
}

/** One group commit: the new segment (if any), the meta, segments to delete, and domain keys. */
export interface ProducerCommit {
  readonly meta: ProducerMeta;
  readonly segment?: readonly OutboxEntry[] | undefined;
  /** The segment's sub-entry batches (sizes in order), when it was published in them. */
  readonly batches?: readonly number[] | undefined;
  readonly deleteSegments?: readonly bigint[] | undefined;
  /** Keys first published in this commit (one record for all of them). */
  readonly keys?: readonly KeyEntry[] | undefined;
  /** Key segments past the retention, by their first ID. */
  readonly deleteKeySegments?: readonly bigint[] | undefined;
}

/** The durable state of one producer in a {@link DedupStore}. */
export class ProducerState {
  readonly #db: KeyValueDb;
  readonly #prefix: string;
  readonly #sync: boolean;
  readonly #release: () => void;
  readonly #storeClosed: () => boolean;
  #released = false;

  /** @internal */
  constructor(
    db: KeyValueDb,
    prefix: string,
    sync: boolean,
    release: () => void,
    storeClosed: () => boolean,
  ) {
    this.#db = db;
    this.#prefix = prefix;
    this.#sync = sync;
    this.#release = release;
    this.#storeClosed = storeClosed;
  }

  /**
   * Runs one read or write of the database, failing with `DEDUP_STORE_CLOSED` rather than
   * LevelDB's "not open" once the store was closed (before the call, or while it ran).
   */
  async #use<T>(what: string, operation: () => Promise<T>): Promise<T> {
    if (this.#storeClosed()) throw storeClosed(what);
    try {
      return await operation();
    } catch (err) {
      // A decoding failure stays what it is; LevelDB's "not open" after a close does not.
      if (this.#storeClosed() && !(err instanceof DedupError)) throw storeClosed(what, err);
      throw err;
    }
  }

  /**
   * Reads meta and every outbox segment.
   *
   * @throws DedupError `DEDUP_STORE_CORRUPT` for a record that cannot be decoded;
   *   `DEDUP_STORE_CLOSED` once the store is closed.
   */
  load(): Promise<LoadedProducer> {
    return this.#use("cannot read the producer's state", () => this.#load());
  }

  async #load(): Promise<LoadedProducer> {
    const metaKey = this.#prefix + META_SUFFIX;
    const raw = await this.#db.get(metaKey);
    const meta = raw === undefined ? undefined : decodeMeta(raw, metaKey);
    const segments: StoredSegment[] = [];
    const gte = this.#prefix + OUTBOX_INFIX;
    for await (const [key, value] of this.#db.iterator({ gte, lt: this.#prefix + '/o0' })) {
      const { entries, batches } = decodeSegmentRecord(value, key);
      segments.push({ firstId: entries[0]!.publishingId, entries, batches });
    }
    return { meta, segments };
  }

  /**
   * Writes one group commit as a single LevelDB batch (atomic).
   *
   * @throws DedupError `DEDUP_STORE_CLOSED` once the store is closed.
   */
  commit(commit: ProducerCommit): Promise<void> {
    // The outbox segment — the large value — goes last. classic-level copies every op into one
    // LevelDB WriteBatch on the main thread, and an op appended after a large one grows (copies)
    // the batch's buffer: measured, an 850 kB segment followed by a 40 B meta took 8.4 ms of the
    // main thread per commit, and 0.24 ms with the meta first (19 % of the publisher's CPU in the
    // sub-entry benchmark). Keys are distinct, so the order changes nothing else.
    const ops: Array<{ type: 'put'; key: string; value: Uint8Array } | { type: 'del'; key: string }> = [];
    for (const id of commit.deleteSegments ?? []) {
      ops.push({ type: 'del', key: this.#prefix + OUTBOX_INFIX + idKey(id) });
    }
    for (const id of commit.deleteKeySegments ?? []) {
      ops.push({ type: 'del', key: this.#prefix + KEY_SEGMENT_INFIX + idKey(id) });
    }
    ops.push({ type: 'put', key: this.#prefix + META_SUFFIX, value: encodeMeta(commit.meta) });
    if (commit.keys !== undefined && commit.keys.length > 0) {
      ops.push({
        type: 'put',
        key: this.#prefix + KEY_SEGMENT_INFIX + idKey(commit.keys[0]!.publishingId),
        value: encodeKeySegment(commit.keys),
      });
    }
    if (commit.segment !== undefined && commit.segment.length > 0) {
      ops.push({
        type: 'put',
        key: this.#prefix + OUTBOX_INFIX + idKey(commit.segment[0]!.publishingId),
        value: encodeSegment(commit.segment, commit.batches),
      });
    }
    return this.#use("cannot write the producer's state", () => this.#db.batch(ops, { sync: this.#sync }));
  }

  /**
   * Replaces key segments in one LevelDB batch: deletes those starting at `deletes`, then writes
   * `puts` (each under its first entry's ID, which may be one of the deleted).
   *
   * @throws DedupError `DEDUP_STORE_CLOSED` once the store is closed.
   */
  rewriteKeySegments(deletes: readonly bigint[], puts: ReadonlyArray<readonly KeyEntry[]>): Promise<void> {
    const ops: Array<{ type: 'put'; key: string; value: Uint8Array } | { type: 'del'; key: string }> = [];
    for (const id of deletes) ops.push({ type: 'del', key: this.#prefix + KEY_SEGMENT_INFIX + idKey(id) });
    for (const entries of puts) {
      if (entries.length === 0) continue;
      ops.push({
        type: 'put',
        key: this.#prefix + KEY_SEGMENT_INFIX + idKey(entries[0]!.publishingId),
        value: encodeKeySegment(entries),
      });
    }
    return this.#use("cannot write the producer's keys", () => this.#db.batch(ops, { sync: this.#sync }));
  }

  /**
   * Reads every key segment, oldest first (keyed producers load them into memory on open).
   *
   * @throws DedupError `DEDUP_STORE_CORRUPT` for a record that cannot be decoded;
   *   `DEDUP_STORE_CLOSED` once the store is closed.
   */
  loadKeySegments(): Promise<Array<{ readonly firstId: bigint; readonly entries: readonly KeyEntry[] }>> {
    return this.#use("cannot read the producer's keys", () => this.#loadKeySegments());
  }

  async #loadKeySegments(): Promise<Array<{ firstId: bigint; entries: KeyEntry[] }>> {
    const out: Array<{ firstId: bigint; entries: KeyEntry[] }> = [];
    const gte = this.#prefix + KEY_SEGMENT_INFIX;
    for await (const [key, value] of this.#db.iterator({ gte, lt: this.#prefix + '/k0' })) {
      const entries = decodeKeySegment(value, key);
      out.push({ firstId: entries[0]!.publishingId, entries });
    }
    return out;
  }

  /** Gives the claim back to the store. Idempotent. */
  release(): void {
    if (!this.#released) {
      this.#released = true;
      this.#release();
    }
  }
}

function mapOpenError(err: unknown, path: string): DedupError {
  const code = (err as { cause?: { code?: string } } | undefined)?.cause?.code;
  if (code === 'LEVEL_LOCKED') {
    return new DedupError(
      'DEDUP_STORE_LOCKED',
      `store ${path} is locked by another process (or another open store in this one); ` +
        `one process per store: share one opened DedupStore between producers instead`,
      { cause: err },
    );
  }
  return new DedupError(
    'DEDUP_STORE_CORRUPT',
    `store ${path} cannot be opened: ${String((err as Error)?.cause ?? err)}`,
    {
      cause: err,
    },
  );
}
