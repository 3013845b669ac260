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
