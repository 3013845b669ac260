/**
 * revB: CHANGELOG.md, [Unreleased] 0.6.0, "Upgrading": "Store formats of publishers and plain
 * verifying consumers are unchanged: a rollback to 0.5.0 reads them." Since h/rec32 a stream
 * consumer's commit writes a 24-byte offset record (offset, chunk first offset, chunk timestamp);
 * 0.5.0's reader (src/store/consumer-keys.ts at 8d5c000, copied verbatim below) accepts only 8
 * bytes. A consumer rolled back as the CHANGELOG allows refuses to open with DEDUP_STORE_CORRUPT.
 * (The "Added" entry of the same section also still says a recreated stream that holds messages
 * "is not detected".)
 */
import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { DedupError } from '../../src/errors.js';
import { encodeOffset } from '../../src/store/consumer-keys.js';

/** 0.5.0's decodeOffset (8d5c000:src/store/consumer-keys.ts, lines 92-96). */
function decodeOffset050(raw: Uint8Array): bigint {
  if (raw.length !== 8)
    throw new DedupError('DEDUP_STORE_CORRUPT', `consumer offset record has ${raw.length} bytes, expected 8`);
  return Buffer.from(raw.buffer, raw.byteOffset, raw.byteLength).readBigUInt64BE(0);
}

describe('revB: rollback of a plain verifying consumer to 0.5.0', () => {
  it('the CHANGELOG promises 0.5.0 reads the store; the offset record a 0.6.0 stream consumer commits does not decode there', () => {
    const changelog = readFileSync(new URL('../../CHANGELOG.md', import.meta.url), 'utf8');
    expect(changelog).toMatch(/plain verifying consumers are unchanged: a rollback to 0\.5\.0\s+reads them/);
    // What StreamVerifyingConsumer's commit pipeline now writes (commit-pipeline.ts #beginCommit).
    const record = encodeOffset(4n, { firstOffset: 0n, timestamp: 1_000n });
    expect(() => decodeOffset050(record)).not.toThrow();
  });
});
