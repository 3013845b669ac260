import type { MemoryLevel } from 'memory-level';
import type { KeyValueDb } from '../../src/store/store.js';

type BatchOp = Parameters<KeyValueDb['batch']>[0][number];
type BatchOptions = Parameters<KeyValueDb['batch']>[1];
type DbIterator = ReturnType<KeyValueDb['iterator']>;

/** A promise that never settles: what a dead process's I/O turns into. */
export function never<T>(): Promise<T> {
  return new Promise<T>(() => undefined);
}

function deadIterator(): DbIterator {
  const it: DbIterator = {
    next: () => never<IteratorResult<[string, Uint8Array]>>(),
    close: () => never<void>(),
    [Symbol.asyncIterator]: () => it,
  };
  return it;
}

interface HeldBatch {
  readonly ops: BatchOp[];
  readonly options: BatchOptions;
  readonly resolve: () => void;
  readonly reject: (err: unknown) => void;
}

/** Options of a {@link ProcessDisk}. */
export interface ProcessDiskOptions {
  /**
   * Awaited before each batch is applied (batches stay in call order): a test can hand it to
   * `fc.scheduler` so that a crash may fall before or after any group commit.
   */
  readonly gate?: (what: string) => Promise<void>;
}

/**
 * One process life's view of a memory-level "disk" that outlives it. While the process lives,
 * every call goes to the disk; a batch is atomic (applied whole or not at all). `crash()` ends
 * the life: held batches are applied (a prefix of them) or lost, and from then on every call of
 * the dead process never settles, so an abandoned core can neither write nor learn anything.
 */
export class ProcessDisk implements KeyValueDb {
  readonly #disk: KeyValueDb;
  readonly #gate: ProcessDiskOptions['gate'];
  #dead = false;
  #hold = false;
  #held: HeldBatch[] = [];
  #chain: Promise<void> = Promise.resolve();
  /** Calls since the life began (progress detection). */
  calls = 0;
  /** Batches applied to the disk by this life. */
  applied = 0;
  /** Set once the owner closed its store: any later call is a write-after-close. */
  sealed = false;
  /** What was called after {@link ProcessDisk.sealed} was set. */
  readonly afterSeal: string[] = [];

  constructor(disk: MemoryLevel<string, Uint8Array>, options: ProcessDiskOptions = {}) {
    this.#disk = disk as unknown as KeyValueDb;
    this.#gate = options.gate;
  }

  get status(): string {
    return this.#disk.status;
  }

  get isDead(): boolean {
    return this.#dead;
  }

  /** True from {@link ProcessDisk.hold} until every held batch is released. */
  get isHolding(): boolean {
    return this.#hold;
  }

  /** Batches waiting for {@link ProcessDisk.release}. */
  get heldCount(): number {
    return this.#held.length;
  }

  open(): Promise<void> {
    if (this.#dead) return never();
    return this.#disk.status === 'open' ? Promise.resolve() : this.#disk.open();
  }

  /** The disk outlives every process: closing a store over it closes nothing. */
  close(): Promise<void> {
    return Promise.resolve();
  }

  get(key: string): Promise<Uint8Array | undefined> {
    if (this.#dead) return never();
    this.#touch(`get ${key}`);
    return this.#disk.get(key);
  }

  iterator(options: { gte: string; lt: string }): DbIterator {
    if (this.#dead) return deadIterator();
    this.#touch(`iterator ${options.gte}`);
    return this.#disk.iterator(options);
  }

  batch(ops: BatchOp[], options?: BatchOptions): Promise<void> {
    if (this.#dead) return never();
    this.#touch(`batch ${ops.map((op) => `${op.type} ${op.key}`).join(', ')}`);
    if (this.#failNext !== undefined) {
      const failed = this.#failNext;
      this.#failNext = undefined;
      failed();
      return Promise.reject(new Error('no space left on device (the model)'));
    }
    const gate = this.#gate;
    if (gate === undefined && !this.#hold) return this.#apply(ops, options);
    return new Promise<void>((resolve, reject) => {
      this.#chain = this.#chain.then(async () => {
        if (gate !== undefined) await gate(`batch of ${ops.length} ops`);
        if (this.#dead) return; // the process died before this commit reached the disk
        if (this.#hold) this.#held.push({ ops, options, resolve, reject });
        else await this.#apply(ops, options).then(resolve, reject);
      });
    });
  }

  /**
   * The next batch fails, applied not at all, and `failed` is told when it does; later batches
   * succeed (a disk full for a moment).
   */
  failNext(failed: () => void): void {
    this.#failNext = failed;
  }

  #failNext: (() => void) | undefined;

  /** Holds every later batch (a slow disk) until {@link ProcessDisk.release}. */
  hold(): void {
    this.#hold = true;
  }

  /** Applies and acknowledges held batches in order (all by default) and stops holding. */
  async release(count = Number.POSITIVE_INFINITY): Promise<void> {
    const batches = this.#held.splice(0, Math.min(count, this.#held.length));
    if (this.#held.length === 0) this.#hold = false;
    for (const b of batches) await this.#apply(b.ops, b.options).then(b.resolve, b.reject);
  }

  /**
   * The process dies. The first `applyHeld` held batches reached the disk before it died (their
   * callers never learn it); the rest are lost. Every later call never settles.
   */
  async crash(applyHeld = 0): Promise<void> {
    this.#dead = true;
    const reached = this.#held.splice(0, Math.min(applyHeld, this.#held.length));
    this.#held = [];
    for (const b of reached) await this.#disk.batch(b.ops, b.options);
  }

  #touch(what: string): void {
    this.calls++;
    if (this.sealed) this.afterSeal.push(what);
  }

  async #apply(ops: BatchOp[], options: BatchOptions): Promise<void> {
    await this.#disk.batch(ops, options);
    this.applied++;
  }
}

/** A copy of a whole memory-level "disk": a backup, or (empty) a disk that was lost. */
export type DiskSnapshot = ReadonlyArray<readonly [string, Uint8Array]>;

/** Copies every record of `disk` (a consistent point in time: batches are atomic). */
export async function snapshotDisk(disk: MemoryLevel<string, Uint8Array>): Promise<DiskSnapshot> {
  const out: Array<readonly [string, Uint8Array]> = [];
  for await (const [key, value] of disk.iterator()) out.push([key, Uint8Array.from(value)]);
  return out;
}

/** Replaces every record of `disk` with the snapshot's (the store restored from a backup, or lost). */
export async function restoreDisk(
  disk: MemoryLevel<string, Uint8Array>,
  snapshot: DiskSnapshot,
): Promise<void> {
  await disk.clear();
  if (snapshot.length > 0) {
    await disk.batch(
      snapshot.map(([key, value]) => ({ type: 'put' as const, key, value: Uint8Array.from(value) })),
    );
  }
}
