/**
 * The LevelDB implementation of {@link ConsumerStore}: a batch is one LevelDB batch (effects, verifier
 * state, offset), the handler's context the consumer's {@link EffectTransaction}. The folder's lock and
 * the per-store name claim keep a second writer out, so nothing here is fenced.
 */
import { decodeOffsetRecord, offsetKey, type OffsetRecord } from '../store/consumer-keys.js';
import { DedupStore, type KeyValueDb } from '../store/store.js';
import type { ChunkIdentity } from '../store/chunk-identity.js';
import type { Op } from './commit-pipeline.js';
import type { ConsumerStore, StoreBatch } from './consumer-store.js';
import type { EffectTransaction } from './types.js';

/**
 * One consumer's LevelDB store.
 *
 * @internal
 */
export class LevelConsumerStore implements ConsumerStore {
  readonly db: KeyValueDb;
  readonly committedOffset: bigint | undefined;
  readonly committedChunk: ChunkIdentity | undefined;
  readonly #sync: boolean;
  readonly #owned: DedupStore | undefined;
  readonly #release: () => void;
  /** The handler's transaction, set by the core once its pipeline exists. */
  transaction: EffectTransaction | undefined;

  private constructor(
    store: DedupStore,
    owned: DedupStore | undefined,
    release: () => void,
    committed: OffsetRecord | undefined,
  ) {
    this.db = store.db;
    this.#sync = store.sync;
    this.#owned = owned;
    this.#release = release;
    this.committedOffset = committed?.offset;
    this.committedChunk = committed?.chunk;
  }

  /**
   * Opens the store when given a path, claims the consumer's name and reads its committed offset.
   *
   * @throws DedupError `DEDUP_STORE_LOCKED`, `DEDUP_STORE_CORRUPT`, `DEDUP_STORE_CLOSED`.
   */
  static async open(
    store: string | DedupStore,
    consumerName: string,
    sync: boolean,
  ): Promise<LevelConsumerStore> {
    const owned = typeof store === 'string' ? await DedupStore.open(store, { sync }) : undefined;
    const opened = owned ?? (store as DedupStore);
    let release: (() => void) | undefined;
    try {
      release = opened.claimConsumer(consumerName);
      const raw = await opened.db.get(offsetKey(consumerName));
      return new LevelConsumerStore(
        opened,
        owned,
        release,
        raw === undefined ? undefined : decodeOffsetRecord(raw),
      );
    } catch (err) {
      // A failed open gives the name back, so the next try reports the real error again.
      release?.();
      await owned?.close();
      throw err;
    }
  }

  get(key: string): Promise<Uint8Array | undefined> {
    return this.db.get(key);
  }

  enter(): undefined {
    return undefined;
  }

  handlerContext(): unknown {
    return this.transaction;
  }

  write(batch: StoreBatch): Promise<void> {
    return this.db.batch(batch.ops as Op[], { sync: this.#sync });
  }

  /** Writes `ops` outside a batch (an eviction's deletions). */
  writeOps(ops: Op[]): Promise<void> {
    return this.db.batch(ops, { sync: this.#sync });
  }

  discard(): void {
    // Nothing is written before the batch: nothing to undo.
  }

  async close(): Promise<void> {
    this.#release();
    await this.#owned?.close();
  }
}
