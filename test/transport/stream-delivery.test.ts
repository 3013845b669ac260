import { describe, expect, it } from 'vitest';
import type { IncomingMessage } from '../../src/consumer/types.js';
import { OrderedDelivery } from '../../src/transport/stream-delivery.js';

const MiB = 1024 * 1024;

/**
 * A broker that sends one chunk per credit, as the stream protocol does, to an OrderedDelivery
 * whose handler is held: how far ahead of the handler does the consumer read?
 */
function rig(chunkMessages: number, messageBytes: number, chunks: number) {
  // One body shared by every message: the bytes are counted, not allocated.
  const body = Buffer.alloc(messageBytes);
  let release!: () => void;
  const held = new Promise<void>((resolve) => (release = resolve));
  const processed: bigint[] = [];
  let tail = Promise.resolve();
  let stopped: Error | undefined;
  const delivery = new OrderedDelivery({
    process: (message: IncomingMessage) => {
      if (processed.length === 0) {
        return held.then(() => void processed.push(message.offset));
      }
      processed.push(message.offset);
      return undefined;
    },
    get stopped() {
      return stopped !== undefined;
    },
    stop: (error) => (stopped = error),
    enqueue: (task) => {
      tail = tail.then(task);
    },
  });
  let sent = 0;
  let credits = 1;
  let peakBytes = 0;
  const isCurrent = (): boolean => true;
  const pump = async (): Promise<void> => {
    while (credits > 0 && sent < chunks) {
      credits--;
      for (let i = 0; i < chunkMessages; i++) {
        const offset = BigInt(sent * chunkMessages + i);
        delivery.deliver(isCurrent, { offset, content: body });
      }
      sent++;
      peakBytes = Math.max(peakBytes, delivery.buffered * messageBytes);
      await delivery.onChunkCompleted(isCurrent, (n) => {
        credits += n;
        return Promise.resolve();
      });
    }
  };
  return {
    delivery,
    pump,
    release,
    processed,
    get sent() {
      return sent;
    },
    get peakBytes() {
      return peakBytes;
    },
    get stopped() {
      return stopped;
    },
    drained: async (): Promise<void> => {
      // The handler is released: each grant lets the broker send one more chunk, until all are read.
      for (;;) {
        await pump();
        await tail;
        if (sent === chunks && delivery.buffered === 0) return;
        if (credits === 0) await new Promise((resolve) => setImmediate(resolve));
      }
    },
  };
}

describe('stream consumer read-ahead', () => {
  it('holds the credit back once 32 MiB wait for a held handler, not only at 20 000 messages (1 MiB messages, chunks of 4)', async () => {
    // The reviewer's case: gzip'd 1 MiB messages; the message bound alone read 20 000 of them
    // (20 GB) ahead of a handler that waits.
    const r = rig(4, MiB, 6_000);
    await r.pump();
    // Held back: no credit left, far short of the stream's end.
    expect(r.sent).toBeLessThan(6_000);
    // The bound (32 MiB) plus the one chunk asked for before the bound was reached.
    expect(r.peakBytes).toBeLessThanOrEqual(32 * MiB + 4 * MiB);
    r.release();
    await r.drained();
    expect(r.stopped).toBeUndefined();
    // Nothing lost or reordered.
    expect(r.processed.length).toBe(24_000);
    expect(r.processed.every((offset, i) => offset === BigInt(i))).toBe(true);
  });

  it('still delivers a message larger than the bound (its chunk is asked for whenever the buffer is empty)', async () => {
    const r = rig(1, 64 * MiB, 3);
    await r.pump();
    r.release();
    await r.drained();
    expect(r.processed).toEqual([0n, 1n, 2n]);
  });
});
