import { MemoryLevel } from 'memory-level';
import { DedupStore, type KeyValueDb } from '../../src/store/store.js';

/** A DedupStore over memory-level: the store's logic without a disk, for unit and property tests. */
export async function memoryStore(db?: MemoryLevel<string, Uint8Array>): Promise<DedupStore> {
  const level = db ?? new MemoryLevel<string, Uint8Array>({ keyEncoding: 'utf8', valueEncoding: 'view' });
  return DedupStore.wrap(level as unknown as KeyValueDb);
}

/** A memory-level database that outlives the stores wrapping it (a "disk" across simulated crashes). */
export function memoryDisk(): MemoryLevel<string, Uint8Array> {
  return new MemoryLevel<string, Uint8Array>({ keyEncoding: 'utf8', valueEncoding: 'view' });
}

/**
 * A KeyValueDb that forwards every call to `disk`, except those `overrides` replace (a slow or
 * failing `batch`, an iterator that waits): the one wrapper the store's fault tests build on.
 */
export function passThroughDb(disk: KeyValueDb, overrides: Partial<Omit<KeyValueDb, 'status'>>): KeyValueDb {
  return {
    get status() {
      return disk.status;
    },
    open: () => disk.open(),
    close: () => disk.close(),
    get: (key) => disk.get(key),
    iterator: (options) => disk.iterator(options),
    batch: (ops, options) => disk.batch(ops, options),
    ...overrides,
  };
}
