/**
 * The handler's effects: the {@link EffectTransaction} it reads and writes through (the pending
 * batch, then the batch being written, then the store), and reads of committed effects. Keys go
 * to the store under the consumer's own prefix.
 */
import { effectKeyPrefix } from '../store/consumer-keys.js';
import type { KeyValueDb } from '../store/store.js';
import type { CommitPipeline } from './commit-pipeline.js';
import type { EffectTransaction } from './types.js';

/** Handler keys whose stored key is cached: `prefix + key` per put is a new string to hash. */
const MAX_CACHED_KEYS = 4096;

/**
 * One consumer's effects.
 *
 * @internal
 */
export class Effects {
  readonly #db: KeyValueDb;
  readonly #pipeline: CommitPipeline;
  readonly #prefix: string;
  readonly #keys = new Map<string, string>();

  constructor(db: KeyValueDb, pipeline: CommitPipeline, consumerName: string) {
    this.#db = db;
    this.#pipeline = pipeline;
    this.#prefix = effectKeyPrefix(consumerName);
  }

  /** Reads a value the handler committed (outside any batch). */
  readCommitted(key: string): Promise<Buffer | undefined> {
    return this.#db.get(this.#storedKey(key)).then(asBuffer);
  }

  /** The handler's transaction: one object for the consumer's life, reading and writing the pending batch. */
  readonly transaction: EffectTransaction = {
    get: async (key) => {
      const full = this.#storedKey(key);
      // This batch, then the batch being written (the database does not show it yet), then the database.
      const op = this.#pipeline.pendingEffect(full);
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
      this.#pipeline.putEffect(this.#storedKey(key), typeof value === 'string' ? value : Buffer.from(value));
    },
    del: (key) => {
      if (typeof key !== 'string') throw new TypeError('effect keys are strings');
      this.#pipeline.delEffect(this.#storedKey(key));
    },
  };

  /** The stored key of a handler's key (cached for up to 4096 distinct keys). */
  #storedKey(key: string): string {
    let full = this.#keys.get(key);
    if (full === undefined) {
      full = this.#prefix + key;
      if (this.#keys.size < MAX_CACHED_KEYS) this.#keys.set(key, full);
    }
    return full;
  }
}

/** A value from the database as a Buffer, without a copy (LevelDB's 'view' encoding gives Uint8Arrays). */
function asBuffer(value: Uint8Array | undefined): Buffer | undefined {
  if (value === undefined || Buffer.isBuffer(value)) return value;
  return Buffer.from(value.buffer, value.byteOffset, value.byteLength);
}
