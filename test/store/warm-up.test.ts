import { readdir, stat } from 'node:fs/promises';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { DedupStore } from '../../src/store/store.js';
import { useTempDir } from '../support/tmp.js';

const tempDir = useTempDir();

/** Bytes in the store's LevelDB write-ahead log files (what has been written since the open). */
async function logBytes(path: string): Promise<number> {
  let bytes = 0;
  for (const f of await readdir(path)) if (f.endsWith('.log')) bytes += (await stat(join(path, f))).size;
  return bytes;
}

describe('store - warm-up write', () => {
  it('open() writes once before it resolves (the first commits do not pay the first write) and leaves no key', async () => {
    const path = join(await tempDir(), 'store');
    const store = await DedupStore.open(path);
    try {
      // Without the warm-up a fresh store's log is empty until its first commit.
      expect(await logBytes(path)).toBeGreaterThan(0);
      const keys: string[] = [];
      for await (const [key] of store.db.iterator({ gte: '', lt: '\uffff' })) keys.push(key);
      expect(keys).toEqual([]);
    } finally {
      await store.close();
    }
    // And again on a store that has data: still nothing of the warm-up's.
    const again = await DedupStore.open(path);
    try {
      const state = again.claimProducer('orders', 'p');
      await state.commit({ meta: { idMode: 'auto', lastId: 1n, reservedUpTo: 0n } });
      const keys: string[] = [];
      for await (const [key] of again.db.iterator({ gte: '', lt: '\uffff' })) keys.push(key);
      expect(keys).toEqual(['p:6:orders1:p/m']);
      state.release();
    } finally {
      await again.close();
    }
  });
});
