import { randomBytes } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { Entry } from '../../src/publisher/entry.js';
import { headersSize, stampBytesOf } from '../../src/publisher/message.js';
import { compressedBound, formBatches } from '../../src/publisher/sub-entries.js';
import { PublishFrameEncoder } from '../../src/transport/stream-frames.js';

// Sub-entry batches are cut by an estimate of their bytes, for the frame size the broker
// negotiated; the estimate must be an upper bound of what the encoder writes, or a batch's frame
// exceeds the frame size (the broker closes the connection, and the batch, fixed in the outbox,
// is re-sent in the same frame at every reconnect). It counted 8 bytes per header where the
// encoder writes str32 (5 bytes of type and length) for keys and values over 255 bytes, and
// ignored that compression expands incompressible data.

/** The stream transport's room for the frame and entry headers (FRAME_OVERHEAD). */
const FRAME_OVERHEAD = 512;

function frames(entries: Entry[], maxFrameSize: number, compression: 'none' | 'gzip'): Buffer[] {
  const sizes = formBatches(entries, 100, maxFrameSize - FRAME_OVERHEAD, stampBytesOf('p'));
  expect(sizes).toBeDefined();
  return new PublishFrameEncoder(1, 'p', maxFrameSize, compression).encode(entries);
}

describe('sub-entry batch size estimate', () => {
  it('counts str32 keys and values: batches of long headers fit their frame', () => {
    // 400 headers of 300-byte keys and values a message (each 610 bytes encoded, 608 estimated).
    const headers: Record<string, string> = {};
    for (let h = 0; h < 400; h++) headers[`k${String(h).padStart(299, '0')}`] = 'v'.repeat(300);
    const entries = Array.from(
      { length: 8 },
      (_, i) => new Entry(BigInt(i + 1), Buffer.alloc(18_711, 1), headers, undefined),
    );
    // Before: batches [4, 4] in frames of 1 051 116 bytes for a frame size of 1 048 576.
    for (const frame of frames(entries, 1_048_576, 'none'))
      expect(frame.length).toBeLessThanOrEqual(1_048_576);
    expect(headersSize({ ['k'.repeat(300)]: 'v'.repeat(300) })).toBeGreaterThanOrEqual(610);
    expect(headersSize({ ['k'.repeat(300)]: 7 })).toBeGreaterThanOrEqual(305 + 5);
  });

  it('counts the expansion of incompressible data: gzip batches fit their frame', () => {
    const maxFrameSize = 8 * 1_048_576;
    // Two bodies whose raw estimate just fits: gzip adds ~0.03 % to random bytes (2.6 KB here).
    const body = (maxFrameSize - FRAME_OVERHEAD) / 2 - stampBytesOf('p') - 100;
    const entries = [1n, 2n].map((id) => new Entry(id, randomBytes(body), undefined, undefined));
    entries.push(new Entry(3n, Buffer.alloc(10), undefined, undefined));
    // Before: one batch [1, 2] in a frame of 8 390 465 bytes for a frame size of 8 388 608.
    for (const frame of frames(entries, maxFrameSize, 'gzip'))
      expect(frame.length).toBeLessThanOrEqual(maxFrameSize);
  });

  it('bounds each codec above what it makes of random bytes', () => {
    expect(compressedBound(1_000, 'none')).toBe(1_000);
    expect(compressedBound(0, 'gzip')).toBe(25);
    expect(compressedBound(1_048_000, 'gzip')).toBe(1_048_343);
    expect(compressedBound(1_048_000, 'zstd')).toBe(1_052_093);
    // Without a codec: the larger bound.
    expect(compressedBound(1_048_000)).toBe(1_052_093);
    expect(compressedBound(0)).toBe(64);
  });
});
