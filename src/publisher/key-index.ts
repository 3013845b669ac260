import { randomBytes } from 'node:crypto';

/** What the key index stores: a value that knows its key. */
export interface Keyed {
  readonly key: string;
}

/** A slot without an entry. */
const EMPTY = 0;

/**
 * A random start for every process: keys can come from outside (order IDs, request IDs), and with
 * a fixed hash anyone could compute a set of colliding keys in advance and make every lookup walk
 * them all (hash flooding), which V8's own Map prevents the same way, with a per-process seed.
 */
const SEED = randomBytes(4).readInt32LE(0);

/** FNV-1a over the UTF-16 units of a string, from the process's random seed. */
function fnv1a(key: string): number {
  let h = 0x811c9dc5 ^ SEED;
  for (let i = 0; i < key.length; i++) {
    h ^= key.charCodeAt(i);
    h = Math.imul(h, 0x01000193);
  }
  return h;
}

const MIN_CAPACITY = 64;

/**
 * The exact index of a keyed publisher's retained keys: an open-addressing hash table with linear
 * probing, hashes in a typed array and values beside them. A lookup compares 32-bit hashes in one
 * contiguous array and the key string itself on every hash match, so the index is exact (two keys
 * with one hash are told apart by their strings). With a `Map` of 100 000 string keys the lookup
 * showed as about 0.65 µs a keyed send in the publisher's profile (its entries and their key
 * strings spread over the heap: a cache miss per probe); here a miss usually reads one slot.
 *
 * A delete leaves no tombstone: it shifts the later entries of its probe run back into the hole
 * (backward-shift deletion), so every slot holds a live entry or is empty. A keyed publisher at
 * its retention deletes a key for every key it adds; with tombstones the table filled up with them
 * and was rebuilt about once a second at 150 000 keyed sends/s, a synchronous 5–39 ms pause each
 * (measured, issue 39). Now the table is rebuilt only when its live entries outgrow half of it, or
 * shrink below an eighth of it.
 */
export class KeyIndex<V extends Keyed> {
  #hashes = new Int32Array(MIN_CAPACITY);
  #values: Array<V | undefined> = new Array<V | undefined>(MIN_CAPACITY).fill(undefined);
  #mask = MIN_CAPACITY - 1;
  /** Live entries: the slots with a hash. */
  #size = 0;
  readonly #hashOf: (key: string) => number;
  /** Rebuilds of the table so far (the unit test's cost model). @internal */
  rebuilds = 0;

  /** @param hash The key hash (tests pass a colliding one); FNV-1a by default. */
  constructor(hash: (key: string) => number = fnv1a) {
    this.#hashOf = hash;
  }

  /** The key's hash, never EMPTY. */
  #hash(key: string): number {
    const h = this.#hashOf(key) | 0;
    return h === EMPTY ? 1 : h;
  }

  get size(): number {
    return this.#size;
  }

  /** Slot of `key`, or -1 - (the empty slot that ends its probe run) when absent. */
  #find(key: string, hash: number): number {
    const hashes = this.#hashes;
    const mask = this.#mask;
    for (let i = hash & mask; ; i = (i + 1) & mask) {
      const h = hashes[i]!;
      if (h === EMPTY) return -1 - i;
      if (h === hash && this.#values[i]!.key === key) return i;
    }
  }

  get(key: string): V | undefined {
    const i = this.#find(key, this.#hash(key));
    return i >= 0 ? this.#values[i] : undefined;
  }

  /** Inserts or replaces the value of `value.key`. */
  set(value: V): void {
    const hash = this.#hash(value.key);
    const i = this.#find(value.key, hash);
    if (i >= 0) {
      this.#values[i] = value;
      return;
    }
    // Keep at most half the table in use, so probe runs stay short.
    if ((this.#size + 1) * 2 > this.#hashes.length) {
      this.#resize(this.#size + 1);
      this.set(value);
      return;
    }
    const slot = -1 - i;
    this.#hashes[slot] = hash;
    this.#values[slot] = value;
    this.#size++;
  }

  /** Deletes `key`; with `only`, only while `only` is its value. */
  delete(key: string, only?: V): boolean {
    let hole = this.#find(key, this.#hash(key));
    if (hole < 0 || (only !== undefined && this.#values[hole] !== only)) return false;
    const hashes = this.#hashes;
    const values = this.#values;
    const mask = this.#mask;
    // Backward shift: an entry later in the run moves into the hole when the hole lies between its
    // home slot and where it sits (it was probed past the hole), so every lookup still finds it.
    for (let j = (hole + 1) & mask; hashes[j] !== EMPTY; j = (j + 1) & mask) {
      if (((j - (hashes[j]! & mask)) & mask) >= ((j - hole) & mask)) {
        hashes[hole] = hashes[j]!;
        values[hole] = values[j];
        hole = j;
      }
    }
    hashes[hole] = EMPTY;
    values[hole] = undefined;
    this.#size--;
    if (this.#size * 8 < hashes.length && hashes.length > MIN_CAPACITY) this.#resize(this.#size);
    return true;
  }

  /** Rebuilds the table for `entries` live entries. */
  #resize(entries: number): void {
    this.rebuilds++;
    let capacity = MIN_CAPACITY;
    while (capacity < entries * 3) capacity *= 2;
    const oldHashes = this.#hashes;
    const oldValues = this.#values;
    this.#hashes = new Int32Array(capacity);
    this.#values = new Array<V | undefined>(capacity).fill(undefined);
    this.#mask = capacity - 1;
    for (let i = 0; i < oldValues.length; i++) {
      const v = oldValues[i];
      if (v === undefined) continue;
      let j = oldHashes[i]! & this.#mask;
      while (this.#hashes[j] !== EMPTY) j = (j + 1) & this.#mask;
      this.#hashes[j] = oldHashes[i]!;
      this.#values[j] = v;
    }
  }
}
