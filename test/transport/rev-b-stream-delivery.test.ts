/**
 * Hostile review B: the read-ahead's byte bound counts only `content`. A message's application
 * properties and annotations (up to the broker's message size, decoded into strings) are not counted.
 */
import { describe, expect, it } from 'vitest';
import type { IncomingMessage } from '../../src/consumer/types.js';
import { OrderedDelivery } from '../../src/transport/stream-delivery.js';

const MiB = 1024 * 1024;

describe('rev-b: stream consumer read-ahead', () => {
  it('rev-b - holds the credit back at the byte bound when the bytes are in application properties (empty bodies)', async () => {
    // One 1 MiB header value shared by every message: counted, not allocated.
    const big = 'h'.repeat(MiB);
    let release!: () => void;
    const held = new Promise<void>((resolve) => (release = resolve));
    let first = true;
    let tail = Promise.resolve();
    const delivery = new OrderedDelivery({
      process: () => {
        if (first) {
          first = false;
          return held;
        }
        return undefined;
      },
      stopped: false,
      stop: () => undefined,
      enqueue: (task) => {
        tail = tail.then(task);
      },
    });
    const isCurrent = (): boolean => true;
    let credits = 1;
    let sent = 0;
    let peak = 0;
    const chunks = 6_000;
    while (credits > 0 && sent < chunks) {
      credits--;
      for (let i = 0; i < 4; i++) {
        const message: IncomingMessage = {
          offset: BigInt(sent * 4 + i),
          content: Buffer.alloc(0),
          applicationProperties: { note: big },
        };
        delivery.deliver(isCurrent, message as never);
      }
      sent++;
      peak = Math.max(peak, delivery.buffered * MiB);
      await delivery.onChunkCompleted(isCurrent, (n) => {
        credits += n;
        return Promise.resolve();
      });
    }
    release();
    await tail;
    // Same bound as the content case: 32 MiB plus one chunk. Observed: the 20 000-message bound only.
    expect(peak).toBeLessThanOrEqual(32 * MiB + 4 * MiB);
  });
});
