/**
 * What a verifying consumer's batches are written to (docs/design.md §5, §13): one interface, two
 * implementations. The LevelDB store (level-consumer-store.ts) writes a batch as one LevelDB batch;
 * the PostgreSQL store (src/postgres) runs the batch's handlers inside one database transaction and
 * writes the verifier state and the offset in it, fenced on the offset row. The core and the commit
 * pipeline are the same for both.
 */
import type { ChunkIdentity } from '../store/chunk-identity.js';

/** One write of a LevelDB batch. */
export type Op = { type: 'put'; key: string; value: Uint8Array } | { type: 'del'; key: string };

/** A batch as the pipeline hands it to its store: what it writes and the offsets it covers. */
export interface StoreBatch {
  /**
   * Every write of the batch as key-value operations: the handlers' effects (LevelDB only), the
   * verifier state of each scope the batch touched, and the consumer's offset record last.
   */
  readonly ops: readonly Op[];
  /** The batch's last offset (the offset record's value). */
  readonly lastOffset: bigint;
  /** The offset the batch was computed on: the one committed before it, `undefined` for the first. */
  readonly baseOffset: bigint | undefined;
  /** The identity of the stream chunk holding `lastOffset`, when the transport gives one. */
  readonly lastChunk: ChunkIdentity | undefined;
}

/**
 * One consumer's view of its store, opened by the core for one consumer name. Not exported by the
 * package's entries: the stores implement it.
 */
export interface ConsumerStore {
  /** The consumer's committed offset: as read at open, after each commit, and as re-read at a fence. */
  readonly committedOffset: bigint | undefined;
  /**
   * The identity of the stream chunk holding {@link ConsumerStore.committedOffset}, read and
   * re-read with it; `undefined` when none was stored (older versions, AMQP 0-9-1 consumers).
   */
  readonly committedChunk: ChunkIdentity | undefined;
  /** Reads one record outside any batch (a scope's verifier state). */
  get(key: string): Promise<Uint8Array | undefined>;
  /**
   * Called before each message is verified: `undefined` when the store is ready at once (LevelDB),
   * else a promise that resolves once the batch's transaction is open (PostgreSQL: after the
   * previous batch is committed). It rejects with `DEDUP_CONSUMER_FENCED` when another process
   * moved the consumer's offset.
   */
  enter(): Promise<void> | undefined;
  /** The second argument of one handler call. */
  handlerContext(): unknown;
  /** The handler call that was given `context` returned or threw: `context` is no longer usable. */
  releaseContext?(context: unknown): void;
  /**
   * Writes one batch, durably and atomically, or rejects with nothing of it written. Fenced
   * stores reject with `DEDUP_CONSUMER_FENCED` when the batch was not computed on the stored offset.
   */
  write(batch: StoreBatch): Promise<void>;
  /** Writes `ops` outside a batch (an eviction's deletions); only stores that evict idle scopes. */
  writeOps?(ops: Op[]): Promise<void>;
  /** The pending batch is dropped (a handler threw, a lost subscription): what it wrote goes too. */
  discard(): void;
  /** Releases what the consumer holds (the name claim; an owned store or connection). */
  close(): Promise<void>;
  /**
   * What to do about `error`, which ended a message (before or in its handler): `undefined` to stop
   * the consumer with it (LevelDB: always); a {@link Rewind} to drop the batch and go on from the
   * store's {@link ConsumerStore.committedOffset} (re-read: another process may have moved it); an
   * Error to stop with that error instead (retries exhausted).
   */
  recover?(error: unknown): Rewind | Error | undefined;
}

/** See {@link ConsumerStore.recover}. */
export interface Rewind {
  /**
   * `fenced`: another process moved the offset; `retry`: a transient failure (a deadlock);
   * `reconnect`: the connection to the store was lost.
   */
  readonly kind: 'fenced' | 'retry' | 'reconnect';
  /** How long to wait before subscribing again, in ms. */
  readonly delayMs: number;
}

/**
 * A store that opens verifying consumers on itself: `PostgresStore` (`stream-dedup/postgres`). The
 * LevelDB store is given as a folder path or a `DedupStore` instead.
 *
 * @remarks Since 0.6.0
 */
export interface ConsumerStoreProvider {
  /**
   * Opens the store of consumer `consumerName`; `onFailure` is called when the store itself must stop
   * the consumer (a handler that misused its client after returning).
   *
   * @internal
   */
  openConsumerStore(consumerName: string, onFailure: (error: Error) => void): Promise<ConsumerStore>;
  /**
   * `commitLingerMs` must be less than this (PostgreSQL: `idleInTransactionTimeoutMs`, which would
   * end a quiet tail's open batch first); checked when a consumer opens, before any I/O.
   *
   * @internal
   */
  readonly commitLingerLimitMs?: number;
}

/**
 * Separates a group's name from a partition's in the consumer name a shared database keeps a
 * partition's rows under (`<group>\u001f<partition>`, group/shared-db-strategy.ts). A plain
 * consumer's name on a {@link ConsumerStoreProvider} may not hold it (the core refuses one), so
 * no plain consumer shares a group partition's offset row or scopes. U+001F (INFORMATION
 * SEPARATOR ONE), since PostgreSQL's text cannot hold U+0000, which LevelDB's namespace uses.
 *
 * @internal
 */
export const PARTITION_SEPARATOR = '\u001f';

/** True when `value` is a {@link ConsumerStoreProvider}. */
export function isConsumerStoreProvider(value: unknown): value is ConsumerStoreProvider {
  return (
    typeof value === 'object' &&
    value !== null &&
    typeof (value as { openConsumerStore?: unknown }).openConsumerStore === 'function'
  );
}
