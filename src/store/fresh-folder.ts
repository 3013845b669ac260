/**
 * A store folder that an `open()` created and then failed in (the broker refused it, or was not
 * there) is removed again, so that a mistyped stream name leaves no folder behind (issue 38). Only
 * a folder that did not exist before the open, that no other process holds, and that holds no
 * key: a store with anything in it is left alone, whoever wrote it.
 */
import { existsSync } from 'node:fs';
import { rename, rm } from 'node:fs/promises';
import { DedupStore } from './store.js';

/** The folder `store` names if it does not exist yet (an `open()` will create it), else undefined. */
export function folderToCreate(store: unknown): string | undefined {
  return typeof store === 'string' && store.length > 0 && !existsSync(store) ? store : undefined;
}

/**
 * Removes `path`, which the failed open created, if it holds nothing. Never throws: a folder that
 * cannot be checked or removed stays. Opening it takes LevelDB's lock, so a folder another
 * process opened meanwhile is left; it is renamed while the lock is held (the lock follows the
 * open file), so no one opens the old folder between the check and the removal.
 */
export async function removeCreatedStoreFolder(path: string): Promise<void> {
  let store: DedupStore;
  try {
    store = await DedupStore.open(path);
  } catch {
    return;
  }
  const doomed = `${path}.removing-${process.pid}-${Date.now()}`;
  let renamed = false;
  try {
    for await (const _entry of store.db.iterator({ gte: '', lt: '\uffff' })) return;
    await rename(path, doomed);
    renamed = true;
  } catch {
    // Left as it is.
  } finally {
    await store.close().catch(() => undefined);
  }
  if (renamed) await rm(doomed, { recursive: true, force: true }).catch(() => undefined);
}

/**
 * Runs `open` (a publisher's or consumer's open with `store` as its option); when it fails and
 * `store` named a folder that did not exist before, removes that folder if it holds nothing.
 */
export async function cleaningCreatedFolder<T>(store: unknown, open: () => Promise<T>): Promise<T> {
  const created = folderToCreate(store);
  try {
    return await open();
  } catch (err) {
    if (created !== undefined) await removeCreatedStoreFolder(created);
    throw err;
  }
}
