import { describe, expect, it } from 'vitest';
import { ChunkOrder } from '../../src/group/chunk-order.js';
import { messageBytes, type StreamMessage } from '../../src/transport/stream-delivery.js';

/** A changelog entry whose bytes sit in an application property, not its (empty) body. */
function entry(offset: bigint, propertyBytes: number): StreamMessage {
  return {
    content: Buffer.alloc(0),
    offset,
    applicationProperties: { blob: 'x'.repeat(propertyBytes) },
  };
}

describe('ChunkOrder: the restore read-ahead counts whole messages', () => {
  it('counts bytes held in application properties, and releases them when taken (in any arrival order)', () => {
    const order = new ChunkOrder();
    order.chunkStarted();
    const late = entry(2n, 1 << 20);
    const early = entry(1n, 1 << 19);
    order.push(late);
    order.push(early);
    // The body is empty: counting bodies alone held 0 bytes for 1.5 MiB of entries.
    expect(order.waitingBytes).toBe(messageBytes(late) + messageBytes(early));
    expect(order.waitingBytes).toBeGreaterThan(1.5 * (1 << 20));
    expect(order.chunkCompleted()).toBe(true);
    expect(order.next()).toBe(early);
    expect(order.waitingBytes).toBe(messageBytes(late));
    expect(order.next()).toBe(late);
    expect(order.waitingBytes).toBe(0);
  });
});
