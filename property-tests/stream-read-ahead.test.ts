import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import type { IncomingMessage } from '../src/consumer/types.js';
import { OrderedDelivery } from '../src/transport/stream-delivery.js';
import { assertProperty, MODEL_RUNS } from './support/runs.js';

/**
 * The stream consumer's read-ahead (OrderedDelivery) against a broker that sends one chunk per
 * credit, a handler that is sometimes synchronous and sometimes waits, and an order of events
 * chosen by fast-check's scheduler: the bytes waiting for the handler never exceed the bound plus
 * one chunk, every message is handled once and in stream order, and the stream is always read to
 * its end (a chunk larger than the bound included). A message's bytes sit in its body or in one of
 * the sections the decoder turns into values (review B, M4: only bodies were counted); the bytes
 * waiting are the model's own count (payload bytes delivered and not yet handed to the handler),
 * not the delivery's.
 */
const WHERE = ['body', 'application property', 'message annotation', 'properties'] as const;

/** A message whose `bytes` payload bytes sit `where` (one ASCII character a byte outside the body). */
function messageOf(offset: number, bytes: number, where: (typeof WHERE)[number]): IncomingMessage {
  const content = Buffer.alloc(where === 'body' ? bytes : 0);
  const text = 'x'.repeat(bytes);
  const sections =
    where === 'application property'
      ? { applicationProperties: { note: text } }
      : where === 'message annotation'
        ? { messageAnnotations: { 'x-note': text } }
        : where === 'properties'
          ? { messageProperties: { subject: text } }
          : {};
  return { offset: BigInt(offset), content, ...sections };
}

describe('stream consumer read-ahead', () => {
  it('buffers at most the byte bound plus one chunk, and loses, doubles or reorders nothing', async () => {
    await assertProperty(
      'read-ahead',
      fc.asyncProperty(
        fc.scheduler(),
        fc.integer({ min: 1, max: 64 }),
        // Chunks of messages, each message's size, where its bytes sit and whether its handler waits.
        fc.array(
          fc.array(
            fc.record({
              bytes: fc.integer({ min: 0, max: 160 }),
              where: fc.constantFrom(...WHERE),
              waits: fc.boolean(),
            }),
            {
              minLength: 1,
              maxLength: 6,
            },
          ),
          { minLength: 1, maxLength: 12 },
        ),
        async (s, bound, chunks) => {
          const processed: bigint[] = [];
          let stopped: Error | undefined;
          let tail = Promise.resolve();
          const sizes = chunks.flat();
          // Payload bytes delivered and not yet handed to the handler (the one it runs excluded).
          let waiting = 0;
          const delivery = new OrderedDelivery(
            {
              process: (message: IncomingMessage) => {
                const i = Number(message.offset);
                waiting -= sizes[i]!.bytes;
                if (!sizes[i]!.waits) {
                  processed.push(message.offset);
                  return undefined;
                }
                return s
                  .schedule(Promise.resolve(), `handler of ${i}`)
                  .then(() => void processed.push(message.offset));
              },
              get stopped() {
                return stopped !== undefined;
              },
              stop: (error) => (stopped = error),
              enqueue: (task) => {
                tail = tail.then(task);
              },
            },
            bound,
          );
          const isCurrent = (): boolean => true;
          let sent = 0;
          let offset = 0;
          let peak = 0;
          // The broker: each credit sends the next chunk, at a moment the scheduler picks.
          const sendNext = (): void => {
            if (sent >= chunks.length) return;
            const chunk = chunks[sent++]!;
            void s.schedule(Promise.resolve(), `chunk ${sent - 1}`).then(() => {
              for (const m of chunk) {
                waiting += m.bytes;
                delivery.deliver(isCurrent, messageOf(offset++, m.bytes, m.where) as never);
                peak = Math.max(peak, waiting);
              }
              void delivery.onChunkCompleted(isCurrent, (n) => {
                for (let k = 0; k < n; k++) sendNext();
                return Promise.resolve();
              });
            });
          };
          sendNext();
          // Releases what is scheduled, one at a time, until nothing more is (the drain runs on microtasks).
          for (let i = 0; i < 10_000; i++) {
            await new Promise((resolve) => setImmediate(resolve));
            if (s.count() === 0) break;
            await s.waitNext(1);
          }
          expect(stopped).toBeUndefined();
          expect(sent).toBe(chunks.length);
          expect(processed).toEqual(sizes.map((_, i) => BigInt(i)));
          const largestChunk = Math.max(...chunks.map((c) => c.reduce((sum, m) => sum + m.bytes, 0)));
          expect(peak).toBeLessThanOrEqual(bound + largestChunk);
        },
      ),
      { numRuns: MODEL_RUNS },
    );
  });
});
