import { existsSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import {
  cleaningCreatedFolder,
  folderToCreate,
  removeCreatedStoreFolder,
} from '../../src/store/fresh-folder.js';
import { DedupStore } from '../../src/store/store.js';
import { useTempDir } from '../support/tmp.js';

const tempDir = useTempDir();

describe('store folders left by a failed open (issue 38)', () => {
  it('a folder the failed open created, holding nothing, is removed; the error is kept', async () => {
    const dir = await tempDir();
    const path = join(dir, 'store');
    const failure = new Error('refused');
    await expect(
      cleaningCreatedFolder(path, async () => {
        await (await DedupStore.open(path)).close();
        throw failure;
      }),
    ).rejects.toBe(failure);
    expect(readdirSync(dir)).toEqual([]);
  });

  it('a folder that existed before the open is left', async () => {
    const path = join(await tempDir(), 'store');
    await (await DedupStore.open(path)).close();
    expect(folderToCreate(path)).toBeUndefined();
    await expect(cleaningCreatedFolder(path, () => Promise.reject(new Error('refused')))).rejects.toThrow(
      'refused',
    );
    expect(existsSync(path)).toBe(true);
  });

  it('a created folder that holds a key is left', async () => {
    const path = join(await tempDir(), 'store');
    const store = await DedupStore.open(path);
    await store.db.batch([{ type: 'put', key: 'p:x', value: new Uint8Array([1]) }]);
    await store.close();
    await removeCreatedStoreFolder(path);
    expect(existsSync(path)).toBe(true);
  });

  it('a created folder another open holds (locked) is left', async () => {
    const path = join(await tempDir(), 'store');
    const store = await DedupStore.open(path);
    await removeCreatedStoreFolder(path);
    expect(existsSync(path)).toBe(true);
    await store.close();
  });
});
