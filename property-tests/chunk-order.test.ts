import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { ChunkOrder } from '../src/group/chunk-order.js';
import { messageBytes, type StreamMessage } from '../src/transport/stream-delivery.js';

// src/group/chunk-order.ts against the way rabbitmq-stream-js-client 1.0 hands over chunks when
// several are in flight: each chunk begins (onChunkReceived) in stream order, the messages of the
// chunks begun and not finished reach the handler in any merge that keeps each chunk's own order,
// each chunk finishes (onChunkCompleted) after its last message, and the reader takes messages at
// any moment. What it takes must be the stream, in order, with nothing missing at the end.

/**
 * A message of `offset` whose content has `offset % 7` bytes and, for odd offsets, an application
 * property of `(offset % 5) * 100` characters: the read-ahead counts both (messageBytes).
 */
const message = (offset: bigint): StreamMessage => ({
  offset,
  content: Buffer.alloc(Number(offset % 7n)),
  ...(offset % 2n === 1n ? { applicationProperties: { p: 'x'.repeat(Number(offset % 5n) * 100) } } : {}),
});
const bytesOf = (offsets: readonly bigint[]): number =>
  offsets.reduce((n, o) => n + messageBytes(message(o)), 0);
/** What a message holds at the least, counted here without messageBytes: its body and property characters. */
const atLeast = (offsets: readonly bigint[]): number =>
  offsets.reduce((n, o) => n + Number(o % 7n) + (o % 2n === 1n ? Number(o % 5n) * 100 : 0), 0);

type Step = 'begin' | 'deliver' | 'take';

describe('ChunkOrder (the changelog restore with several chunks in flight)', () => {
  it('gives the stream in offset order whatever the interleaving of chunks in flight', () => {
    fc.assert(
      fc.property(
        // Chunk sizes (a chunk may hold several entries, one, or none the handler is given).
        fc.array(fc.integer({ min: 0, max: 5 }), { minLength: 1, maxLength: 12 }),
        // The order of events: begin the next chunk, deliver a message of some open chunk, take.
        fc.array(fc.tuple(fc.constantFrom<Step>('begin', 'deliver', 'take'), fc.nat()), {
          maxLength: 200,
        }),
        fc.integer({ min: 1, max: 8 }),
        (sizes, steps, credits) => {
          const chunks: bigint[][] = [];
          let offset = 0n;
          for (const n of sizes) {
            chunks.push(Array.from({ length: n }, () => offset++));
          }
          const order = new ChunkOrder();
          const open: Array<{ left: bigint[] }> = [];
          let begun = 0;
          const taken: bigint[] = [];
          const pushed: bigint[] = [];
          const take = (): void => {
            for (let m = order.next(); m !== undefined; m = order.next()) taken.push(m.offset!);
          };
          const deliver = (pick: number): void => {
            const chunk = open[pick % open.length]!;
            if (chunk.left.length > 0) {
              const offset = chunk.left.shift()!;
              pushed.push(offset);
              order.push(message(offset));
            }
            if (chunk.left.length === 0) {
              open.splice(open.indexOf(chunk), 1);
              order.chunkCompleted();
            }
          };
          const step = ([kind, pick]: [Step, number]): void => {
            if (kind === 'begin' && begun < chunks.length && open.length < credits) {
              order.chunkStarted();
              open.push({ left: [...chunks[begun++]!] });
            } else if (kind === 'deliver' && open.length > 0) deliver(pick);
            else if (kind === 'take') {
              const before = taken.length;
              take();
              // Whatever is taken continues the stream from where the last take stopped.
              expect(taken.slice(before)).toEqual(
                Array.from({ length: taken.length - before }, (_, i) => BigInt(before + i)),
              );
              // The bytes held are those of the messages received and not taken.
              expect(order.waitingBytes).toBe(bytesOf(pushed) - bytesOf(taken));
              expect(order.waitingBytes).toBeGreaterThanOrEqual(atLeast(pushed) - atLeast(taken));
            }
          };
          for (const s of steps) step(s);
          // Then everything left: every chunk begun, delivered and finished.
          while (begun < chunks.length || open.length > 0) {
            if (begun < chunks.length && open.length < credits) step(['begin', 0]);
            else deliver(0);
          }
          take();
          expect(taken).toEqual(chunks.flat());
          expect(order.waiting).toBe(0);
          expect(order.waitingBytes).toBe(0);
        },
      ),
    );
  });

  it('holds every message while a chunk is half delivered', () => {
    const order = new ChunkOrder();
    order.chunkStarted();
    order.chunkStarted();
    order.push(message(0n));
    order.push(message(2n)); // the second chunk's first message, before the first chunk's last
    expect(order.next()).toBeUndefined();
    order.push(message(1n));
    expect(order.chunkCompleted()).toBe(false); // the second chunk is still open
    expect(order.next()).toBeUndefined();
    order.push(message(3n));
    expect(order.chunkCompleted()).toBe(true);
    expect([order.next(), order.next(), order.next(), order.next()].map((m) => m?.offset)).toEqual([
      0n,
      1n,
      2n,
      3n,
    ]);
    expect(order.next()).toBeUndefined();
  });
});
