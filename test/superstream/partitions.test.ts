import { describe, expect, it } from 'vitest';
import { DedupError } from '../../src/errors.js';
import { decodePartitionList, encodePartitionList } from '../../src/store/codec.js';
import { checkRecordedPartitions } from '../../src/superstream/partitions.js';
import { memoryDisk, memoryStore } from '../support/memory-store.js';
import { thrown } from '../support/thrown.js';

// The partition list a super stream producer last opened with: one record per (super stream,
// producer name) in the store, and the check that refuses a changed list.

describe('super stream partition record', () => {
  it('encodes and decodes a partition list, order and Unicode kept', () => {
    const list = ['inv-0', 'inv-1', 'facturé-2', 'x'.repeat(255)];
    expect(decodePartitionList(encodePartitionList(list))).toEqual(list);
  });

  it.each([
    ['empty', Buffer.alloc(0)],
    ['unknown version', Buffer.from([2, 0, 1, 0, 1, 0x61])],
    ['no partitions', Buffer.from([1, 0, 0])],
    ['truncated name', Buffer.from([1, 0, 1, 0, 5, 0x61])],
    ['empty name', Buffer.from([1, 0, 1, 0, 0])],
    ['trailing bytes', Buffer.from([1, 0, 1, 0, 1, 0x61, 0])],
    ['count beyond the bytes', Buffer.from([1, 0, 2, 0, 1, 0x61])],
  ])('refuses a malformed record (%s) with DEDUP_STORE_CORRUPT naming it', (_what, bytes) => {
    const err = thrown(() => decodePartitionList(bytes, 's:3:inv1:p'));
    expect(err).toBeInstanceOf(DedupError);
    expect(err).toMatchObject({ code: 'DEDUP_STORE_CORRUPT' });
    expect((err as Error).message).toContain('s:3:inv1:p');
  });

  it('keeps one record per super stream and producer, apart from producer state', async () => {
    const disk = memoryDisk();
    const store = await memoryStore(disk);
    expect(await store.readPartitions('inv', 'p')).toBeUndefined();
    await store.writePartitions('inv', 'p', ['inv-0', 'inv-1']);
    await store.writePartitions('inv', 'q', ['inv-0']);
    await store.writePartitions('in', 'vp', ['other']);
    expect(await store.readPartitions('inv', 'p')).toEqual(['inv-0', 'inv-1']);
    expect(await store.readPartitions('inv', 'q')).toEqual(['inv-0']);
    expect(await store.readPartitions('in', 'vp')).toEqual(['other']);
    // `inspect` lists producers from `p:` keys only: the record is not taken for one.
    expect(await store.listProducers()).toEqual([]);
    await store.close();
    const reopened = await memoryStore(disk);
    expect(await reopened.readPartitions('inv', 'p')).toEqual(['inv-0', 'inv-1']);
    await reopened.close();
    await expect(reopened.readPartitions('inv', 'p')).rejects.toMatchObject({ code: 'DEDUP_STORE_CLOSED' });
    await expect(reopened.writePartitions('inv', 'p', ['inv-0'])).rejects.toMatchObject({
      code: 'DEDUP_STORE_CLOSED',
    });
  });

  it('refuses an empty list and lone surrogates', async () => {
    const store = await memoryStore();
    expect(thrown(() => store.writePartitions('inv', 'p', []))).toBeInstanceOf(RangeError);
    expect(thrown(() => store.writePartitions('inv', 'p', ['a\udc00']))).toBeInstanceOf(RangeError);
    await expect(store.readPartitions('inv\ud800', 'p')).rejects.toBeInstanceOf(RangeError);
    await store.close();
  });

  it('records the list at the first open and refuses another count, other names or another order', async () => {
    const store = await memoryStore();
    const list = ['inv-0', 'inv-1', 'inv-2'];
    await checkRecordedPartitions(store, 'inv', 'p', list);
    expect(await store.readPartitions('inv', 'p')).toEqual(list);
    await checkRecordedPartitions(store, 'inv', 'p', [...list]);
    for (const changed of [
      list.slice(0, 2),
      [...list, 'inv-3'],
      ['inv-0', 'inv-1', 'inv-9'],
      [...list].reverse(),
    ]) {
      const err = await checkRecordedPartitions(store, 'inv', 'p', changed).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(DedupError);
      expect(err).toMatchObject({ code: 'DEDUP_PARTITIONS_CHANGED' });
      expect((err as Error).message).toContain(`first opened it with 3 [inv-0, inv-1, inv-2]`);
    }
    // The record is unchanged by a refusal; another producer has its own.
    expect(await store.readPartitions('inv', 'p')).toEqual(list);
    await checkRecordedPartitions(store, 'inv', 'other', list.slice(0, 2));
    await store.close();
  });
});
