import { randomBytes } from 'node:crypto';
import type { Entry } from './entry.js';

/** A hash slot without an entry. */
const EMPTY = 0;
/** No record: what {@link KeyTable.find} answers for an unknown key. */
export const NO_RECORD = -1;

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

const MIN_SLOTS = 64;
const MIN_RECORDS = 64;
const MIN_CHARS = 1024;
/**
 * Char offsets only grow (doubles, exact below 2^53): past this they are moved back by a multiple of
 * the ring's size, which leaves every position where it is (years of keys at any rate).
 */
const REBASE_AT = 2 ** 40;

/** The smallest power of two of at least `min` that is at least `n`. */
function powerOfTwo(n: number, min: number): number {
  let c = min;
  while (c < n) c *= 2;
  return c;
}

/**
 * The retained keys of a keyed publisher, with no object per key: each record (its key's UTF-16
 * units, its publishing ID, when it was made) lives in typed arrays, and an open-addressing hash
 * table with linear probing finds a key's newest record.
 *
 * Why no objects: a keyed publisher keeps every key for `keyRetention.maxKeys` later sends (0.7 s
 * at 150 000 sends/s with the default 100 000), long enough that each record, its key string, its
 * boxed time and its bigint ID outlived the young generation and were promoted. In typed arrays the
 * keyed bench's heap after collection peaks at 82–85 MB against 135–160 MB with objects (issue 39,
 * measured). Its main-thread collection time did not fall (740–940 ms against 820–840 ms a run) and
 * keyed p99 did not move measurably: the latency tail has another cause (see the benchmarks guide).
 *
 * Records are numbered by a sequence (`seq`) in the order they are added and kept in a ring in that
 * order: the publisher adds a key's record at its group commit (in ID order; a send aborted before
 * its commit never gets one) and drops them oldest first ({@link KeyTable.dropBefore}), so the
 * ring's head only moves forward. A record can lose its key before the head reaches it (a close
 * whose last write failed: {@link KeyTable.kill}). A key's chars never wrap around the end of the
 * char ring (the cursor skips to its start instead), so a key is one run.
 *
 * The hash table maps a key's hash to the seq of the key's newest record; a lookup compares 32-bit
 * hashes in one contiguous array and the chars on every hash match, so it is exact. A delete shifts
 * the later entries of its probe run back into the hole (no tombstones, so no periodic rebuild).
 * Every array is rebuilt only when what it holds outgrows half of it (hash slots) or all of it
 * (records, chars), or shrinks below an eighth of it.
 */
export class KeyTable {
  // The hash table: a key's hash and the seq of its newest record.
  #hashes = new Int32Array(MIN_SLOTS);
  #seqs = new Float64Array(MIN_SLOTS);
  #slotMask = MIN_SLOTS - 1;
  /** Keys in the table. */
  #size = 0;

  // The records, at `seq % capacity`, for seq in [#head, #tail).
  #ids = new BigUint64Array(MIN_RECORDS);
  #times = new Float64Array(MIN_RECORDS);
  /** Where the record's chars start: an offset into the char ring's sequence (not wrapped). */
  #starts = new Float64Array(MIN_RECORDS);
  #lengths = new Int32Array(MIN_RECORDS);
  /** The key's hash (to find its slot when the record is dropped, without rebuilding the key). */
  #keyHashes = new Int32Array(MIN_RECORDS);
  /** The first send of the record's key while it is unconfirmed (one array: no object per key). */
  #inFlight: Array<Entry | undefined> = new Array<Entry | undefined>(MIN_RECORDS).fill(undefined);
  #head = 0;
  #tail = 0;

  // The chars of the records in [#head, #tail), from #charHead to #charTail (offsets, not wrapped).
  #chars = new Uint16Array(MIN_CHARS);
  #charHead = 0;
  #charTail = 0;

  readonly #hashOf: (key: string) => number;
  /** Rebuilds of any of its arrays so far (the unit test's cost model). @internal */
  rebuilds = 0;

  /** @param hash The key hash (tests pass a colliding one); FNV-1a by default. */
  constructor(hash: (key: string) => number = fnv1a) {
    this.#hashOf = hash;
  }

  /** Keys in the table (each with its newest record). */
  get size(): number {
    return this.#size;
  }

  /** Records held, dead ones included (the unit test's memory bound). @internal */
  get records(): number {
    return this.#tail - this.#head;
  }

  /** The seq the next record gets. */
  get nextSeq(): number {
    return this.#tail;
  }

  /** The seq of `key`'s newest record, or {@link NO_RECORD}. */
  find(key: string): number {
    const slot = this.#findSlot(key, this.#hash(key));
    return slot >= 0 ? this.#seqs[slot]! : NO_RECORD;
  }

  /**
   * Adds a record for `key` (it becomes the key's newest) and answers its seq. Records are added
   * in the order their IDs were assigned.
   */
  add(key: string, publishingId: bigint, createdAtMs: number, inFlight: Entry | undefined): number {
    if (this.#tail - this.#head === this.#ids.length) this.#resizeRecords(this.#tail - this.#head + 1);
    let start = this.#runStart(key.length);
    if (start + key.length - this.#charHead > this.#chars.length) {
      this.#growChars(this.#charTail - this.#charHead + key.length);
      start = this.#runStart(key.length);
    }
    const at = start % this.#chars.length;
    const chars = this.#chars;
    for (let i = 0; i < key.length; i++) chars[at + i] = key.charCodeAt(i);
    this.#charTail = start + key.length;

    const seq = this.#tail++;
    const r = seq % this.#ids.length;
    this.#ids[r] = publishingId;
    this.#times[r] = createdAtMs;
    this.#starts[r] = start;
    const hash = this.#hash(key);
    this.#lengths[r] = key.length;
    this.#keyHashes[r] = hash;
    this.#inFlight[r] = inFlight;

    const slot = this.#findSlot(key, hash);
    if (slot >= 0) {
      this.#seqs[slot] = seq;
      return seq;
    }
    if ((this.#size + 1) * 2 > this.#hashes.length) {
      this.#rehash(this.#size + 1);
      this.#insert(hash, seq);
    } else {
      this.#hashes[-1 - slot] = hash;
      this.#seqs[-1 - slot] = seq;
    }
    this.#size++;
    return seq;
  }

  /** The record's publishing ID. */
  publishingId(seq: number): bigint {
    return this.#ids[seq % this.#ids.length]!;
  }

  /** When the record was made (ms since the epoch). */
  createdAtMs(seq: number): number {
    return this.#times[seq % this.#ids.length]!;
  }

  /** The record's first send while unconfirmed. */
  inFlight(seq: number): Entry | undefined {
    return this.#inFlight[seq % this.#ids.length];
  }

  setInFlight(seq: number, entry: Entry | undefined): void {
    this.#inFlight[seq % this.#ids.length] = entry;
  }

  /** The record's key, as a string (tests). */
  keyOf(seq: number): string {
    const r = seq % this.#ids.length;
    const at = this.#starts[r]! % this.#chars.length;
    return String.fromCharCode(...this.#chars.subarray(at, at + this.#lengths[r]!));
  }

  /**
   * A record whose message will not be sent after all (a close whose last write failed): its key
   * leaves the table if this is its newest record. The record stays until its segment is dropped.
   */
  kill(seq: number): void {
    this.#unindex(seq);
    this.#inFlight[seq % this.#ids.length] = undefined;
  }

  /**
   * Drops every record below `end` (those of pruned key segments): a key leaves the table unless
   * a later record of it is its newest (or it left already: a killed record's key).
   */
  dropBefore(end: number): void {
    if (end <= this.#head) return;
    for (let seq = this.#head; seq < end; seq++) {
      this.#unindex(seq);
      this.#inFlight[seq % this.#ids.length] = undefined;
    }
    this.#head = end;
    this.#charHead = end < this.#tail ? this.#starts[end % this.#ids.length]! : this.#charTail;
    if (this.#charHead >= REBASE_AT) this.#rebaseChars();
    const held = this.#tail - this.#head;
    if (held * 8 < this.#ids.length && this.#ids.length > MIN_RECORDS) this.#resizeRecords(held);
    const chars = this.#charTail - this.#charHead;
    if (chars * 8 < this.#chars.length && this.#chars.length > MIN_CHARS) this.#compactChars(chars);
  }

  /** The key's hash, never EMPTY. */
  #hash(key: string): number {
    const h = this.#hashOf(key) | 0;
    return h === EMPTY ? 1 : h;
  }

  /** Whether the record `seq` holds `key`. */
  #holds(seq: number, key: string): boolean {
    const r = seq % this.#ids.length;
    if (this.#lengths[r] !== key.length) return false;
    const at = this.#starts[r]! % this.#chars.length;
    const chars = this.#chars;
    for (let i = 0; i < key.length; i++) if (chars[at + i] !== key.charCodeAt(i)) return false;
    return true;
  }

  /** Slot of `key`, or -1 - (the empty slot that ends its probe run) when absent. */
  #findSlot(key: string, hash: number): number {
    const hashes = this.#hashes;
    const mask = this.#slotMask;
    for (let i = hash & mask; ; i = (i + 1) & mask) {
      const h = hashes[i]!;
      if (h === EMPTY) return -1 - i;
      if (h === hash && this.#holds(this.#seqs[i]!, key)) return i;
    }
  }

  /** Takes record `seq`'s key out of the hash table if `seq` is its newest record. */
  #unindex(seq: number): void {
    const hashes = this.#hashes;
    const seqs = this.#seqs;
    const mask = this.#slotMask;
    // The key's newest record sits in its hash's probe run, which ends at an empty slot.
    let hole = this.#keyHashes[seq % this.#ids.length]! & mask;
    for (; ; hole = (hole + 1) & mask) {
      if (hashes[hole] === EMPTY) return;
      if (seqs[hole] === seq) break;
    }
    // Backward shift: an entry later in the run moves into the hole when the hole lies between its
    // home slot and where it sits (it was probed past the hole), so every lookup still finds it.
    for (let j = (hole + 1) & mask; hashes[j] !== EMPTY; j = (j + 1) & mask) {
      if (((j - (hashes[j]! & mask)) & mask) >= ((j - hole) & mask)) {
        hashes[hole] = hashes[j]!;
        seqs[hole] = seqs[j]!;
        hole = j;
      }
    }
    hashes[hole] = EMPTY;
    this.#size--;
    if (this.#size * 8 < hashes.length && hashes.length > MIN_SLOTS) this.#rehash(this.#size);
  }

  /** Puts (hash, seq) in the first empty slot of its probe run (the key is known to be absent). */
  #insert(hash: number, seq: number): void {
    const mask = this.#slotMask;
    let j = hash & mask;
    while (this.#hashes[j] !== EMPTY) j = (j + 1) & mask;
    this.#hashes[j] = hash;
    this.#seqs[j] = seq;
  }

  /** Rebuilds the hash table for `entries` keys. */
  #rehash(entries: number): void {
    this.rebuilds++;
    const capacity = powerOfTwo(entries * 3, MIN_SLOTS);
    const oldHashes = this.#hashes;
    const oldSeqs = this.#seqs;
    this.#hashes = new Int32Array(capacity);
    this.#seqs = new Float64Array(capacity);
    this.#slotMask = capacity - 1;
    for (let i = 0; i < oldHashes.length; i++) {
      if (oldHashes[i] !== EMPTY) this.#insert(oldHashes[i]!, oldSeqs[i]!);
    }
  }

  /** Moves every char offset back by a multiple of the ring's size: no position changes. */
  #rebaseChars(): void {
    const shift = this.#charHead - (this.#charHead % this.#chars.length);
    for (let seq = this.#head; seq < this.#tail; seq++) this.#starts[seq % this.#ids.length]! -= shift;
    this.#charHead -= shift;
    this.#charTail -= shift;
  }

  /** Where a key of `length` chars starts: at the tail, or at the ring's start when it would wrap. */
  #runStart(length: number): number {
    const start = this.#charTail;
    const offset = start % this.#chars.length;
    return offset + length > this.#chars.length ? start + this.#chars.length - offset : start;
  }

  /**
   * Rebuilds the record ring for `records` records. The records keep their seqs (so the hash table
   * stays valid) and move in at most three block copies per array: no bigint made per ID.
   */
  #resizeRecords(records: number): void {
    this.rebuilds++;
    const capacity = powerOfTwo(records * 2, MIN_RECORDS);
    const [head, tail] = [this.#head, this.#tail];
    this.#ids = copyRing(this.#ids, new BigUint64Array(capacity), head, tail);
    this.#times = copyRing(this.#times, new Float64Array(capacity), head, tail);
    this.#starts = copyRing(this.#starts, new Float64Array(capacity), head, tail);
    this.#lengths = copyRing(this.#lengths, new Int32Array(capacity), head, tail);
    this.#keyHashes = copyRing(this.#keyHashes, new Int32Array(capacity), head, tail);
    const inFlight = new Array<Entry | undefined>(capacity).fill(undefined);
    for (let seq = head; seq < tail; seq++)
      inFlight[seq % capacity] = this.#inFlight[seq % this.#inFlight.length];
    this.#inFlight = inFlight;
  }

  /**
   * Grows the char ring to hold at least `chars` chars (twice that, at least twice its size). Every
   * offset stays: the new size is a multiple of the old, so a key that did not wrap still does not.
   */
  #growChars(chars: number): void {
    this.rebuilds++;
    const capacity = Math.max(powerOfTwo(chars * 2, MIN_CHARS), this.#chars.length * 2);
    this.#chars = copyRing(this.#chars, new Uint16Array(capacity), this.#charHead, this.#charTail);
  }

  /** Shrinks the char ring around its `chars` chars, laid out again from offset 0. */
  #compactChars(chars: number): void {
    this.rebuilds++;
    const ring = new Uint16Array(powerOfTwo(chars * 2, MIN_CHARS));
    let cursor = 0;
    for (let seq = this.#head; seq < this.#tail; seq++) {
      const r = seq % this.#ids.length;
      const at = this.#starts[r]! % this.#chars.length;
      const length = this.#lengths[r]!;
      for (let i = 0; i < length; i++) ring[cursor + i] = this.#chars[at + i]!;
      this.#starts[r] = cursor;
      cursor += length;
    }
    this.#chars = ring;
    this.#charHead = 0;
    this.#charTail = cursor;
  }
}

/** The typed arrays the rings are made of. */
interface Ring<T> {
  readonly length: number;
  subarray(begin: number, end: number): T;
  set(source: T, offset: number): void;
}

/**
 * Copies positions [first, end) of one ring into another of another size (a position p sits at
 * `p % length` in each), in as few block copies as the two wrap points allow, and answers `to`.
 */
function copyRing<T extends Ring<T>>(from: T, to: T, first: number, end: number): T {
  for (let p = first; p < end;) {
    const a = p % from.length;
    const b = p % to.length;
    const n = Math.min(end - p, from.length - a, to.length - b);
    to.set(from.subarray(a, a + n), b);
    p += n;
  }
  return to;
}
