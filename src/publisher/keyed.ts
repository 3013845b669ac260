/**
 * Keyed IDs: the exact in-memory index of retained keys, the key segments it is stored as (one per
 * group commit), retention by count and age, and what happens to a key when its first send
 * settles, is aborted or is dropped. The core asks it whether a key is known and tells it what it
 * committed; it never touches the store itself (its records ride the core's group commits).
 */
import type { KeyEntry, KeyRecord } from '../store/codec.js';
import type { ProducerState } from '../store/store.js';
import type { Entry, KeySegment, LiveKey } from './entry.js';
import { KeyIndex } from './key-index.js';
import type { SendResult } from './types.js';

/** Key segments as the store returns them. */
export type StoredKeySegments = ReadonlyArray<{
  readonly firstId: bigint;
  readonly entries: readonly KeyEntry[];
}>;

export class KeyedIds {
  /** Every retained key and the ID it was first published with; loaded on open. */
  readonly #index = new KeyIndex<LiveKey>();
  /** The key segments in the store, oldest first, for retention. */
  readonly #segments: KeySegment[] = [];
  /** Segments past the retention, deleted by the next group commit. */
  #toDelete: bigint[] = [];
  readonly #retention: { readonly maxKeys: number; readonly maxAgeMs: number };

  constructor(retention: { readonly maxKeys: number; readonly maxAgeMs: number }) {
    this.#retention = retention;
  }

  /** Keys in the index (retained, or accepted and not yet committed). */
  get size(): number {
    return this.#index.size;
  }

  /** Fills the index from the store's key segments (later ones win). */
  load(segments: StoredKeySegments): void {
    for (const { firstId, entries } of segments) {
      const records = entries.map((e): LiveKey => ({
        key: e.key,
        publishingId: e.publishingId,
        createdAtMs: e.createdAtMs,
        inFlight: undefined,
      }));
      for (const record of records) this.#index.set(record);
      const last = records[records.length - 1]!;
      this.#segments.push({ firstId, lastId: last.publishingId, newestMs: last.createdAtMs, records });
    }
  }

  /** The key's record, if it has one (retained or not). */
  get(key: string): LiveKey | undefined {
    return this.#index.get(key);
  }

  /** Whether a record is inside the retention (by count of later IDs, and by age). */
  retained(record: KeyRecord, lastAssigned: bigint): boolean {
    return (
      lastAssigned - record.publishingId < BigInt(this.#retention.maxKeys) &&
      Date.now() - record.createdAtMs <= this.#retention.maxAgeMs
    );
  }

  /**
   * A repeat of a retained key: resolves with the first send's ID and `outcome: 'duplicate'`,
   * once that send is confirmed if it is still in flight. Undefined for a key not (or no longer)
   * retained: it is published as new.
   */
  duplicate(key: string, lastAssigned: bigint): Promise<SendResult> | undefined {
    const known = this.#index.get(key);
    if (known === undefined || !this.retained(known, lastAssigned)) return undefined;
    const inFlight = known.inFlight;
    if (inFlight === undefined)
      return Promise.resolve({ publishingId: known.publishingId, outcome: 'duplicate' });
    return new Promise<SendResult>((resolve, reject) => {
      ((inFlight.extra ??= {}).keyWaiters ??= []).push({
        resolve: (publishingId) => resolve({ publishingId, outcome: 'duplicate' }),
        reject,
      });
    });
  }

  /** A new key's record, for its first send `entry` (which points back to it). */
  add(key: string, entry: Entry): void {
    const record: LiveKey = {
      key,
      publishingId: entry.publishingId,
      createdAtMs: Date.now(),
      inFlight: entry,
    };
    this.#index.set(record);
    entry.keyRecord = record;
  }

  /** A keyed message that will never be written (aborted, closed): its key is free again. */
  forget(entry: Entry, error: Error): void {
    if (entry.key === undefined) return;
    if (entry.keyRecord !== undefined) this.#index.delete(entry.key, entry.keyRecord);
    KeyedIds.settled(entry, error);
  }

  /** The first send of a key settled: so do the repeats that waited for it. */
  static settled(entry: Entry, outcome: bigint | Error): void {
    if (entry.key === undefined) return;
    const record = entry.keyRecord;
    if (record?.inFlight === entry) record.inFlight = undefined;
    const waiters = entry.extra?.keyWaiters;
    if (waiters !== undefined) entry.extra!.keyWaiters = undefined;
    for (const w of waiters ?? []) {
      if (outcome instanceof Error) w.reject(outcome);
      else w.resolve(outcome);
    }
  }

  /**
   * Drops key segments (and their keys) wholly past the retention; their deletes ride the next
   * commit. Runs before every keyed commit, so that memory holds about `maxKeys` keys (plus one
   * group commit's, and those accepted but not yet committed) at any rate, and every minute for the
   * age limit of an idle publisher. Returns true when something is to be deleted.
   */
  prune(lastAssigned: bigint): boolean {
    const oldestKept = lastAssigned - BigInt(this.#retention.maxKeys);
    const expiredBefore = Date.now() - this.#retention.maxAgeMs;
    let n = 0;
    while (n < this.#segments.length) {
      const seg = this.#segments[n]!;
      if (seg.lastId > oldestKept && seg.newestMs >= expiredBefore) break;
      this.#toDelete.push(seg.firstId);
      n++;
    }
    if (n === 0) return false;
    for (const seg of this.#segments.splice(0, n)) {
      // A key published again after it expired has a newer record: that one stays.
      for (const record of seg.records) this.#index.delete(record.key, record);
    }
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
  takeCommit(batch: readonly Entry[]): { keys: LiveKey[]; deleteKeySegments: bigint[] } {
    const deleteKeySegments = this.#toDelete;
    this.#toDelete = [];
    const keys: LiveKey[] = [];
    for (const e of batch) if (e.keyRecord !== undefined) keys.push(e.keyRecord);
    if (keys.length > 0) {
      const last = keys[keys.length - 1]!;
      this.#segments.push({
        firstId: keys[0]!.publishingId,
        lastId: last.publishingId,
        newestMs: last.createdAtMs,
        records: keys,
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
