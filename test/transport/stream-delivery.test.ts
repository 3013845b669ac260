import { describe, expect, it } from 'vitest';
import type { IncomingMessage } from '../../src/consumer/types.js';
import { messageBytes as countedBytes, OrderedDelivery } from '../../src/transport/stream-delivery.js';

const MiB = 1024 * 1024;

/** Where a message's bytes sit: its body, or one of the sections the decoder decodes into values. */
type Where = 'body' | 'application property' | 'message annotation' | 'properties' | 'nested';

/**
 * A broker that sends one chunk per credit, as the stream protocol does, to an OrderedDelivery
 * whose handler is held: how far ahead of the handler does the consumer read? Each message holds
 * `messageBytes` bytes (string characters outside the body) where `where` says.
 */
function rig(chunkMessages: number, messageBytes: number, chunks: number, where: Where = 'body') {
  // One body or one string shared by every message: the bytes are counted, not allocated.
  const body = Buffer.alloc(where === 'body' ? messageBytes : 0);
  const text = where === 'body' ? '' : 'h'.repeat(messageBytes);
  const sections: Partial<IncomingMessage> & { messageProperties?: object } =
    where === 'application property'
      ? { applicationProperties: { note: text } }
      : where === 'message annotation'
        ? { messageAnnotations: { 'x-note': text } }
        : where === 'properties'
          ? { messageProperties: { subject: text } }
          : where === 'nested'
            ? {
                applicationProperties: {
                  list: [{ inner: [text.slice(0, messageBytes / 2)] }, text.slice(messageBytes / 2)],
                },
              }
            : {};
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
        delivery.deliver(isCurrent, { offset, content: body, ...sections } as never);
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

  it.each<Where>(['application property', 'message annotation', 'properties', 'nested'])(
    'holds the credit back at the byte bound when the bytes are in the decoded sections, not the body (%s, empty bodies)',
    async (where) => {
      // Review B, M4: with bodies alone counted, 20 000 empty-bodied messages each with a 1 MiB
      // string (20 GiB) were read ahead of a held handler; only the message bound held them.
      const r = rig(4, MiB, 6_000, where);
      await r.pump();
      expect(r.sent).toBeLessThan(6_000);
      expect(r.peakBytes).toBeLessThanOrEqual(32 * MiB + 4 * MiB);
      r.release();
      await r.drained();
      expect(r.stopped).toBeUndefined();
      expect(r.processed.length).toBe(24_000);
      expect(r.processed.every((offset, i) => offset === BigInt(i))).toBe(true);
    },
  );

  it('counts a message as its body plus its decoded sections (8 per value, 2 per string unit, Buffer lengths)', () => {
    const empty = { offset: 0n, content: Buffer.alloc(0) };
    expect(countedBytes(empty)).toBe(32); // four absent sections, 8 each
    const message = {
      offset: 0n,
      content: Buffer.alloc(100),
      applicationProperties: { ab: 'xyz', n: 1, list: [Buffer.alloc(10), null] },
      messageAnnotations: {},
      messageProperties: { userId: Buffer.alloc(5), creationTime: new Date(0) },
      messageHeader: undefined,
    };
    const application = 8 + (4 + 8 + 6) + (2 + 8) + (8 + 8 + 8 + 10 + 8);
    const properties = 8 + (12 + 8 + 5) + (24 + 8);
    expect(countedBytes(message as never)).toBe(100 + application + 8 + properties + 8);
  });

  it('still delivers a message larger than the bound (its chunk is asked for whenever the buffer is empty)', async () => {
    const r = rig(1, 64 * MiB, 3);
    await r.pump();
    r.release();
    await r.drained();
    expect(r.processed).toEqual([0n, 1n, 2n]);
  });
});
