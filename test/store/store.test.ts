import { fork } from 'node:child_process';
import { readdir, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { once } from 'node:events';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { DedupError } from '../../src/errors.js';
import {
  decodeKeySegment,
  decodeMeta,
  decodeSegment,
  decodeSegmentRecord,
  encodeKeySegment,
  encodeMeta,
  encodeSegment,
} from '../../src/store/codec.js';
import { DedupStore } from '../../src/store/store.js';
import { useTempDir } from '../support/tmp.js';

const tempDir = useTempDir();
const holder = fileURLToPath(new URL('../fixtures/hold-store.ts', import.meta.url));

describe('store - lock', () => {
  it('a second process opening the same store gets DEDUP_STORE_LOCKED, and the store opens after it exits', async () => {
    const path = join(await tempDir(), 'store');
    const child = fork(holder, [path], { execArgv: ['--import', 'tsx'], stdio: 'inherit' });
    try {
      const [message] = (await once(child, 'message')) as [string];
      expect(message).toBe('open');
      const err = await DedupStore.open(path).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(DedupError);
      expect((err as DedupError).code).toBe('DEDUP_STORE_LOCKED');
      expect((err as DedupError).message).toMatch(/locked by another process/);
      child.send('close');
      await once(child, 'exit');
      const store = await DedupStore.open(path);
      await store.close();
    } finally {
      child.kill('SIGKILL');
    }
  }, 30_000);

  it('a second open in the same process is DEDUP_STORE_LOCKED too', async () => {
    const path = join(await tempDir(), 'store');
    const store = await DedupStore.open(path);
    await expect(DedupStore.open(path)).rejects.toMatchObject({ code: 'DEDUP_STORE_LOCKED' });
    await store.close();
    await store.close(); // idempotent
  });
});

describe('store - corruption', () => {
  it('a store whose LevelDB files are garbage is DEDUP_STORE_CORRUPT, not a crash', async () => {
    const path = join(await tempDir(), 'store');
    const store = await DedupStore.open(path);
    await store.close();
    for (const f of await readdir(path)) {
      if (f.startsWith('MANIFEST') || f === 'CURRENT') await writeFile(join(path, f), 'garbage, not LevelDB');
    }
    await expect(DedupStore.open(path)).rejects.toMatchObject({ code: 'DEDUP_STORE_CORRUPT' });
  });

  it('an undecodable producer record is DEDUP_STORE_CORRUPT on load, naming the key', async () => {
    const path = join(await tempDir(), 'store');
    const store = await DedupStore.open(path);
    const state = store.claimProducer('orders', 'p');
    await state.commit({ meta: { idMode: 'auto', lastId: 1n, reservedUpTo: 0n } });
    await store.db.batch([{ type: 'put', key: 'p:6:orders1:p/m', value: Buffer.from([9, 9]) }]);
    await expect(state.load()).rejects.toMatchObject({
      code: 'DEDUP_STORE_CORRUPT',
      message: /p:6:orders1:p\/m/,
    });
    state.release();
    await store.close();
  });
});

describe('store - records', () => {
  it('meta and segments round-trip, headers included (a header named __proto__ stays a header)', () => {
    const meta = { idMode: 'explicit' as const, lastId: 0xffff_ffff_ffff_ffffn, reservedUpTo: 7n };
    expect(decodeMeta(encodeMeta(meta))).toEqual(meta);
    const entries = [
      { publishingId: 1n, body: Buffer.from('a'), headers: undefined },
      {
        publishingId: 5n,
        body: Buffer.alloc(0),
        headers: JSON.parse('{"__proto__":"x","n":3}') as Record<string, string>,
      },
    ];
    const decoded = decodeSegment(encodeSegment(entries));
    expect(decoded.map((e) => [e.publishingId, Buffer.from(e.body).toString(), e.headers])).toEqual([
      [1n, 'a', undefined],
      [5n, '', entries[1]!.headers],
    ]);
    expect(Object.getPrototypeOf(decoded[1]!.headers)).toBe(Object.prototype);
    expect(Object.keys(decoded[1]!.headers!)).toEqual(['__proto__', 'n']);
  });

  it('truncated, extended or reordered segments are DEDUP_STORE_CORRUPT', () => {
    const good = encodeSegment([
      { publishingId: 1n, body: Buffer.from('abc'), headers: { k: 'v' } },
      { publishingId: 2n, body: Buffer.from('d'), headers: undefined },
    ]);
    for (let cut = 0; cut < good.length; cut++) {
      expect(() => decodeSegment(good.subarray(0, cut))).toThrow(DedupError);
    }
    expect(() => decodeSegment(Buffer.concat([good, Buffer.from([0])]))).toThrow(/trailing/);
    const reordered = encodeSegment([
      { publishingId: 2n, body: Buffer.from('x'), headers: undefined },
      { publishingId: 1n, body: Buffer.from('y'), headers: undefined },
    ]);
    expect(() => decodeSegment(reordered)).toThrow(/not increasing/);
  });

  it('segments with sub-entry batches round-trip (version 2); without, they stay version 1', () => {
    const entries = [1n, 2n, 3n, 4n].map((publishingId) => ({
      publishingId,
      body: Buffer.from(`m${publishingId}`),
      headers: undefined,
    }));
    const plain = encodeSegment(entries);
    expect(plain[0]).toBe(1);
    expect(decodeSegmentRecord(plain).batches).toBeUndefined();
    const batched = encodeSegment(entries, [3, 1]);
    expect(batched[0]).toBe(2);
    const decoded = decodeSegmentRecord(batched);
    expect(decoded.batches).toEqual([3, 1]);
    expect(decoded.entries.map((e) => e.publishingId)).toEqual([1n, 2n, 3n, 4n]);
    expect(decodeSegment(batched).map((e) => Buffer.from(e.body).toString())).toEqual([
      'm1',
      'm2',
      'm3',
      'm4',
    ]);
    for (let cut = 0; cut < batched.length; cut++) {
      expect(() => decodeSegmentRecord(batched.subarray(0, cut))).toThrow(DedupError);
    }
    // Batch sizes that are zero or do not add up to the messages are corrupt.
    for (const sizes of [
      [3, 2],
      [4, 0],
      [2, 1],
      [0, 4],
    ]) {
      expect(() => decodeSegmentRecord(encodeSegment(entries, sizes))).toThrow(/batch/);
    }
  });

  it('key segments round-trip and refuse truncation, trailing bytes and decreasing ids', () => {
    const keys = [
      { key: 'credit-17', publishingId: 5n, createdAtMs: 1_700_000_000_000 },
      { key: 'é-𝄞', publishingId: 9n, createdAtMs: 1_700_000_000_001 },
    ];
    const encoded = encodeKeySegment(keys);
    expect(decodeKeySegment(encoded)).toEqual(keys);
    for (let cut = 0; cut < encoded.length; cut++) {
      expect(() => decodeKeySegment(encoded.subarray(0, cut))).toThrow(DedupError);
    }
    expect(() => decodeKeySegment(Buffer.concat([encoded, Buffer.from([1])]))).toThrow(/trailing/);
    expect(() => decodeKeySegment(encodeKeySegment([...keys].reverse()))).toThrow(/not increasing/);
  });
});
