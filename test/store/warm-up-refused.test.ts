/**
 * A LevelDB store that opens but cannot take a write (a full disk, read-only files) is refused by
 * `DedupStore.open` with `DEDUP_STORE_REFUSED`, not `DEDUP_STORE_CORRUPT`: nothing says its contents
 * are damaged, and "corrupt" invites deleting the store (revP's S1 on the warm-up write). The
 * database is closed again. `level` is replaced by a database whose writes fail with ENOSPC.
 */
import { describe, expect, it, vi } from 'vitest';

const h = vi.hoisted(() => ({ closed: 0 }));

vi.mock('level', () => ({
  Level: class {
    status = 'opening';
    open(): Promise<void> {
      this.status = 'open';
      return Promise.resolve();
    }
    batch(): Promise<void> {
      return Promise.reject(
        Object.assign(new Error('IO error: No space left on device'), { code: 'LEVEL_IO_ERROR' }),
      );
    }
    close(): Promise<void> {
      h.closed++;
      this.status = 'closed';
      return Promise.resolve();
    }
  },
}));

import { DedupStore } from '../../src/store/store.js';
import { DedupError } from '../../src/errors.js';

describe('DedupStore.open - a store that cannot be written', () => {
  it('is refused with DEDUP_STORE_REFUSED naming the path, and closed', async () => {
    const err = await DedupStore.open('/tmp/stream-dedup-unwritable').then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(DedupError);
    expect((err as DedupError).code).toBe('DEDUP_STORE_REFUSED');
    expect((err as DedupError).message).toMatch(
      /\/tmp\/stream-dedup-unwritable opened but cannot be written/,
    );
    expect(h.closed).toBe(1);
  });
});
