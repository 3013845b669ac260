import { describe, expect, it } from 'vitest';
import { VerifyingConsumerCore } from '../../src/consumer/core.js';
import { identityHeaders } from '../../src/identity/headers.js';
import { encodeScopeKey } from '../../src/identity/scope-key.js';
import {
  OFFSET_KEYS,
  SCOPE_STATE_KEYS,
  consumerOfOffsetKey,
  decodeOffset,
  decodeOffsetRecord,
  decodeScopeState,
  effectKeyPrefix,
  encodeOffset,
  encodeScopeState,
  offsetKey,
  scopeKeyOfStateKey,
  scopeStateKey,
  scopeStateKeysOf,
} from '../../src/store/consumer-keys.js';
import { createTracker } from '../../src/verifier/window.js';
import { memoryDisk, memoryStore } from '../support/memory-store.js';

// The on-disk format of 0.1 and 0.2: stores they wrote must open unchanged. These strings and
// bytes are the format; a change here is a breaking change, not a refactoring.

describe('store - consumer key schema', () => {
  it('pins the key strings of offsets, scope states and effects', () => {
    expect(offsetKey('balance-projection')).toBe('c:18:balance-projection/offset');
    expect(offsetKey('c')).toBe('c:1:c/offset');
    const scope = encodeScopeKey({ consumer: 'balance-projection', tenant: 'acme', producer: 'orders-svc' });
    expect(scopeStateKey(scope)).toBe('v:18:balance-projection4:acme10:orders-svc');
    expect(scopeStateKey(encodeScopeKey({ consumer: 'c', tenant: '', producer: 'p' }))).toBe('v:1:c0:1:p');
    expect(effectKeyPrefix('balance-projection') + 'balance').toBe('u:18:balance-projectionbalance');
    expect(OFFSET_KEYS).toEqual({ gte: 'c:', lt: 'c;' });
    expect(SCOPE_STATE_KEYS).toEqual({ gte: 'v:', lt: 'v;' });
    expect(scopeStateKeysOf('balance-projection')).toEqual({
      gte: 'v:18:balance-projection',
      lt: 'v:18:balance-projection:',
    });
  });

  it('decodes its own keys and nothing else', () => {
    expect(consumerOfOffsetKey('c:18:balance-projection/offset')).toBe('balance-projection');
    expect(consumerOfOffsetKey(offsetKey('a:b/offset'))).toBe('a:b/offset');
    expect(consumerOfOffsetKey(offsetKey(''))).toBe('');
    for (const other of [
      'c:4:name/other',
      'c:5:name/offset',
      'c:04:name/offset',
      'c:x:name/offset',
      'v:1:c',
    ]) {
      expect(consumerOfOffsetKey(other), other).toBeUndefined();
    }
    expect(scopeKeyOfStateKey('v:1:c0:1:p')).toBe('1:c0:1:p');
  });

  it("one consumer's scope range holds its scopes only, not those of a consumer whose name extends it", () => {
    const { gte, lt } = scopeStateKeysOf('c');
    const inRange = (key: string) => key >= gte && key < lt;
    expect(inRange(scopeStateKey(encodeScopeKey({ consumer: 'c', tenant: '', producer: 'p' })))).toBe(true);
    expect(
      inRange(scopeStateKey(encodeScopeKey({ consumer: 'c', tenant: 'a'.repeat(12), producer: 'p' }))),
    ).toBe(true);
    expect(inRange(scopeStateKey(encodeScopeKey({ consumer: 'cc', tenant: '', producer: 'p' })))).toBe(false);
  });

  it('pins the value bytes: offsets as u64 big-endian, scope states as u64 lastSeenMs then the tracker', () => {
    expect(Buffer.from(encodeOffset(258n)).toString('hex')).toBe('0000000000000102');
    expect(decodeOffset(Buffer.from('0000000000000102', 'hex'))).toBe(258n);
    expect(() => decodeOffset(Buffer.from([1, 2, 3]))).toThrow(
      expect.objectContaining({
        code: 'DEDUP_STORE_CORRUPT',
        message: 'consumer offset record has 3 bytes, expected 8 or 24',
      }) as Error,
    );
    // Since 0.6.0 with the chunk holding the offset: u64 first offset, i64 timestamp.
    const withChunk = encodeOffset(258n, { firstOffset: 256n, timestamp: -2n });
    expect(Buffer.from(withChunk).toString('hex')).toBe(
      '0000000000000102' + '0000000000000100' + 'fffffffffffffffe',
    );
    expect(decodeOffsetRecord(withChunk)).toEqual({
      offset: 258n,
      chunk: { firstOffset: 256n, timestamp: -2n },
    });
    expect(decodeOffset(withChunk)).toBe(258n);
    expect(decodeOffsetRecord(encodeOffset(258n))).toEqual({ offset: 258n, chunk: undefined });
    expect(() => decodeOffsetRecord(encodeOffset(258n, { firstOffset: 259n, timestamp: 0n }))).toThrow(
      expect.objectContaining({ code: 'DEDUP_STORE_CORRUPT' }) as Error,
    );
    const tracker = createTracker({ kind: 'highest' });
    tracker.record(7n);
    const raw = encodeScopeState(tracker, 4_328_719_365.9);
    expect(Buffer.from(raw.subarray(0, 8)).toString('hex')).toBe('0000000102030405');
    expect(Buffer.from(raw.subarray(8))).toEqual(Buffer.from(tracker.encode()));
    const decoded = decodeScopeState(raw, 'scope');
    expect(decoded.lastSeenMs).toBe(0x0102030405);
    expect(decoded.tracker.highest).toBe(7n);
    expect(Buffer.from(encodeScopeState(tracker, -5).subarray(0, 8)).toString('hex')).toBe(
      '0000000000000000',
    );
    expect(() => decodeScopeState(Buffer.alloc(3), 'sc')).toThrow('verifier state of scope sc is truncated');
    expect(() => decodeScopeState(Buffer.concat([Buffer.alloc(8), Buffer.from([9, 9])]), 'sc')).toThrow(
      /^verifier state of scope sc: /,
    );
  });

  it('a consumer writes exactly these keys, and reopens a store written with them', async () => {
    const disk = memoryDisk();
    const options = {
      consumerName: 'proj',
      handler: (_m: unknown, tx: { put(k: string, v: string): void }) => tx.put('total', '1'),
      commit: 'message' as const,
      policy: { kind: 'highest' as const },
    };
    const first = await VerifyingConsumerCore.open({ ...options, store: await memoryStore(disk) });
    await first.process({
      offset: 5n,
      content: Buffer.from('x'),
      applicationProperties: identityHeaders('p', 3n),
    });
    await first.close();
    const keys: string[] = [];
    for await (const key of disk.keys({ gte: '', lt: '\uffff' })) keys.push(key);
    expect(keys).toEqual(['c:4:proj/offset', 'u:4:projtotal', 'v:4:proj0:1:p']);
    expect(Buffer.from((await disk.get('c:4:proj/offset'))!).toString('hex')).toBe('0000000000000005');

    // A store as 0.2 left it, written by hand: the consumer resumes from it.
    const old = memoryDisk();
    const tracker = createTracker({ kind: 'highest' });
    tracker.record(3n);
    await old.open();
    await old.batch([
      { type: 'put', key: 'c:4:proj/offset', value: Buffer.from('0000000000000005', 'hex') },
      { type: 'put', key: 'v:4:proj0:1:p', value: encodeScopeState(tracker, Date.now()) },
      { type: 'put', key: 'u:4:projtotal', value: Buffer.from('1') },
    ]);
    const again = await VerifyingConsumerCore.open({ ...options, store: await memoryStore(old) });
    expect(again.resumeOffset).toBe(6n);
    expect((await again.readEffect('total'))?.toString()).toBe('1');
    await again.process({
      offset: 6n,
      content: Buffer.from('x'),
      applicationProperties: identityHeaders('p', 3n),
    });
    expect(again.stats).toMatchObject({ new: 0, duplicate: 1 });
    await again.close();
  });
});
