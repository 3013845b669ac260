/**
 * Keyed IDs: the exact in-memory index of retained keys, the key segments it is stored as (one per
 * group commit), retention by count and age, and what happens to a key when its first send
 * settles, is aborted or is dropped. The core asks it whether a key is known and tells it what it
 * committed; it never touches the store itself (its records ride the core's group commits).
 */
import type { KeyEntry } from '../store/codec.js';
import type { ProducerState } from '../store/store.js';
import type { Entry, KeySegment } from './entry.js';
import { KeyTable, NO_RECORD } from './key-table.js';
import type { SendResult } from './types.js';

/** Key segments as the store returns them. */
export type StoredKeySegments = ReadonlyArray<{
  readonly firstId: bigint;
  readonly entries: readonly KeyEntry[];
}>;

export class KeyedIds {
  /**
   * Every committed key still retained, the ID it was first published with and when; loaded on
   * open. Only committed records enter it, in commit order, so nothing but retention drops them.
   */
  readonly #table = new KeyTable();
  /**
   * Keys accepted and not yet committed, each with its send (the entry holds its ID, renumbered
   * while it waits for room, and when it was accepted). Newer than any record of the key in the
   * table. A short-lived map: a send leaves it at its group commit, or when it is aborted unwritten.
   */
  readonly #uncommitted = new Map<string, Entry>();
  /** The key segments in the store, oldest first, for retention. */
  readonly #segments: KeySegment[] = [];
  /** Segments past the retention, deleted by the next group commit. */
  #toDelete: bigint[] = [];
  readonly #retention: { readonly maxKeys: number; readonly maxAgeMs: number };

  constructor(retention: { readonly maxKeys: number; readonly maxAgeMs: number }) {
    this.#retention = retention;
  }

  /** Keys in the index (retained, or accepted and not yet committed; a key in both counts twice). */
  get size(): number {
    return this.#table.size + this.#uncommitted.size;
  }

  /** Records the key table holds, dead ones included (tests bound its memory). @internal */
  get records(): number {
    return this.#table.records;
  }

  /** Fills the index from the store's key segments (later ones win). */
  load(segments: StoredKeySegments): void {
    for (const { firstId, entries } of segments) {
      for (const e of entries) this.#table.add(e.key, e.publishingId, e.createdAtMs, undefined);
      const last = entries[entries.length - 1]!;
      this.#segments.push({
        firstId,
        lastId: last.publishingId,
        newestMs: last.createdAtMs,
        end: this.#table.nextSeq,
      });
    }
  }

  /**
   * Resuming: `entry`, re-sent from the outbox, is its key's first send again while the key's
   * record is the one it was written with (same ID): repeats of the key wait for its confirm.
   */
  adopt(entry: Entry): void {
    if (entry.key === undefined) return;
    const seq = this.#table.find(entry.key);
    if (seq !== NO_RECORD && this.#table.publishingId(seq) === entry.publishingId) {
      this.#table.setInFlight(seq, entry);
      entry.keySeq = seq;
    }
  }

  /** Whether record `seq` is inside the retention. */
  #retained(seq: number, lastAssigned: bigint): boolean {
    return this.#inRetention(this.#table.publishingId(seq), this.#table.createdAtMs(seq), lastAssigned);
  }

  /** Whether a key first published with `publishingId` at `createdAtMs` is inside the retention (by count of later IDs, and by age). */
  #inRetention(publishingId: bigint, createdAtMs: number, lastAssigned: bigint): boolean {
    return (
      lastAssigned - publishingId < BigInt(this.#retention.maxKeys) &&
      Date.now() - createdAtMs <= this.#retention.maxAgeMs
    );
  }

  /**
   * A repeat of a retained key: resolves with the first send's ID and `outcome: 'duplicate'`,
   * once that send is confirmed if it is still in flight. Undefined for a key not (or no longer)
   * retained: it is published as new.
   */
  duplicate(key: string, lastAssigned: bigint): Promise<SendResult> | undefined {
    const first = this.#uncommitted.get(key);
    if (first !== undefined) {
      if (!this.#inRetention(first.publishingId, first.keyCreatedAtMs, lastAssigned)) return undefined;
      return KeyedIds.#waitFor(first);
    }
    const seq = this.#table.find(key);
    if (seq === NO_RECORD || !this.#retained(seq, lastAssigned)) return undefined;
    const inFlight = this.#table.inFlight(seq);
    if (inFlight === undefined)
      return Promise.resolve({ publishingId: this.#table.publishingId(seq), outcome: 'duplicate' });
    return KeyedIds.#waitFor(inFlight);
  }

  /** A repeat of the key of `inFlight`, settled when it is. */
  static #waitFor(inFlight: Entry): Promise<SendResult> {
    return new Promise<SendResult>((resolve, reject) => {
      ((inFlight.extra ??= {}).keyWaiters ??= []).push({
        resolve: (publishingId) => resolve({ publishingId, outcome: 'duplicate' }),
        reject,
      });
    });
  }

  /** A new key, for its first send `entry`: uncommitted until the entry's group commit. */
  add(key: string, entry: Entry): void {
    entry.keyCreatedAtMs = Date.now();
    const prev = this.#uncommitted.get(key);
    if (prev !== undefined) (entry.extra ??= {}).keyPrev = prev;
    this.#uncommitted.set(key, entry);
  }

  /**
   * `entry` no longer holds its key uncommitted (committed, aborted, settled by a fatal error):
   * the key goes back to the newest earlier send of it still waiting uncommitted, if any.
   */
  #release(key: string, entry: Entry): void {
    // A send taken over itself keeps its link: the send that took it over may be aborted later and
    // walk through it to an earlier one still waiting.
    if (this.#uncommitted.get(key) !== entry) return;
    const prev = entry.extra?.keyPrev;
    if (prev !== undefined) entry.extra!.keyPrev = undefined;
    let back = prev;
    while (back !== undefined && !KeyedIds.#holdsUncommitted(back)) back = back.extra?.keyPrev;
    if (back === undefined) this.#uncommitted.delete(key);
    else this.#uncommitted.set(key, back);
  }

  /** Whether a send still waits uncommitted with its key (not committed, aborted or settled). */
  static #holdsUncommitted(entry: Entry): boolean {
    return entry.keySeq === NO_RECORD && entry.keyCreatedAtMs !== 0;
  }

  /** A keyed message that will never be written (aborted, closed): its key is free again. */
  forget(entry: Entry, error: Error): void {
    if (entry.key === undefined) return;
    entry.keyCreatedAtMs = 0;
    this.#release(entry.key, entry);
    const seq = entry.keySeq;
    // Committed after all (a close whose last write failed): its record leaves the index. Only
    // while the record is still this entry's: its seq may name another record by now.
    if (seq !== NO_RECORD && this.#table.inFlight(seq) === entry) this.#table.kill(seq);
    entry.keySeq = NO_RECORD;
    this.settled(entry, error);
  }

  /** The first send of a key settled: so do the repeats that waited for it. */
  settled(entry: Entry, outcome: bigint | Error): void {
    if (entry.key === undefined) return;
    // Settled before its commit (a fatal error): the key is not held for it any longer.
    if (entry.keySeq === NO_RECORD) {
      entry.keyCreatedAtMs = 0;
      this.#release(entry.key, entry);
    }
    const seq = entry.keySeq;
    if (seq !== NO_RECORD && this.#table.inFlight(seq) === entry) this.#table.setInFlight(seq, undefined);
    const waiters = entry.extra?.keyWaiters;
    if (waiters !== undefined) entry.extra!.keyWaiters = undefined;
    for (const w of waiters ?? []) {
      if (outcome instanceof Error) w.reject(outcome);
      else w.resolve(outcome);
    }
  }

  /**
   * Drops key segments (and their keys) wholly past the retention counted back from `lastDurable`,
   * the highest ID the store will hold once the commit carrying the deletes is written; their
   * deletes ride that commit. Never from the last ID handed out: an abort or a crash takes back
   * what was not written, and a record dropped by that count could be inside the retention again.
   * Runs before every keyed commit, so that memory holds about `maxKeys` keys (plus one group
   * commit's, and those accepted but not yet committed) at any rate, and every minute for the age
   * limit of an idle publisher. Returns true when something is to be deleted.
   */
  prune(lastDurable: bigint): boolean {
    const oldestKept = lastDurable - BigInt(this.#retention.maxKeys);
    const expiredBefore = Date.now() - this.#retention.maxAgeMs;
    let n = 0;
    while (n < this.#segments.length) {
      const seg = this.#segments[n]!;
      if (seg.lastId > oldestKept && seg.newestMs >= expiredBefore) break;
      this.#toDelete.push(seg.firstId);
      n++;
    }
    if (n === 0) return false;
    // A key published again after it expired has a newer record: that one stays.
    this.#table.dropBefore(this.#segments[n - 1]!.end);
    this.#segments.splice(0, n);
    return true;
  }

  /** Whether a commit has key segments to delete. */
  get hasDeletes(): boolean {
    return this.#toDelete.length > 0;
  }

  /**
   * What the next group commit writes for keys: the records of `batch` (every keyed entry got its
   * record when it was accepted) as a new segment, and the segments to delete.
   */
  takeCommit(batch: readonly Entry[]): { keys: KeyEntry[]; deleteKeySegments: bigint[] } {
    const deleteKeySegments = this.#toDelete;
    this.#toDelete = [];
    const keys: KeyEntry[] = [];
    for (const e of batch) {
      const key = e.key;
      if (key === undefined) continue;
      // A later send may have taken the key over while this one waited (this one was past the
      // retention already): the later one stays uncommitted, and answers for the key until its
      // own record, added after this one's, is the newest in the table.
      keys.push({ key, publishingId: e.publishingId, createdAtMs: e.keyCreatedAtMs });
      e.keySeq = this.#table.add(key, e.publishingId, e.keyCreatedAtMs, e);
      this.#release(key, e);
    }
    if (keys.length > 0) {
      const last = keys[keys.length - 1]!;
      this.#segments.push({
        firstId: keys[0]!.publishingId,
        lastId: last.publishingId,
        newestMs: last.createdAtMs,
        end: this.#table.nextSeq,
      });
    }
    return { keys, deleteKeySegments };
  }
}

/**
 * Keyed sends in a store whose last writer reserved keyed IDs (0.1 allowed keyed + reserve):
 * drops the records of keys whose message is neither in the stream (its ID is above `brokerLast`)
 * nor in the outbox. A record written before its message left can survive a crash that lost the
 * message; kept, it would answer the application's re-send of the key with 'duplicate' and
 * publish nothing. The store is rewritten in one write before anything is sent, so a crash here
 * leaves either state.
 */
export async function forgetUnstoredKeys(
  state: ProducerState,
  segments: StoredKeySegments,
  brokerLast: bigint,
  outbox: readonly { readonly publishingId: bigint }[],
): Promise<StoredKeySegments> {
  const inOutbox = new Set(outbox.map((e) => e.publishingId));
  const kept: Array<{ readonly firstId: bigint; readonly entries: readonly KeyEntry[] }> = [];
  const deletes: bigint[] = [];
  const puts: KeyEntry[][] = [];
  for (const segment of segments) {
    const entries = segment.entries.filter(
      (e) => e.publishingId <= brokerLast || inOutbox.has(e.publishingId),
    );
    if (entries.length === segment.entries.length) {
      kept.push(segment);
      continue;
    }
    deletes.push(segment.firstId);
    if (entries.length > 0) {
      puts.push(entries);
      kept.push({ firstId: entries[0]!.publishingId, entries });
    }
  }
  if (deletes.length > 0) await state.rewriteKeySegments(deletes, puts);
  return kept;
}
