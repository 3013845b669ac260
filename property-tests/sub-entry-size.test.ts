import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { Entry } from '../src/publisher/entry.js';
import { headersSize, stampBytesOf } from '../src/publisher/message.js';
import {
  attachBatches,
  compressedBound,
  formBatches,
  type BatchCodec,
} from '../src/publisher/sub-entries.js';
import { HAS_ZSTD } from '../src/transport/compression.js';
import { PublishFrameEncoder } from '../src/transport/stream-frames.js';
import { checkWithin } from './support/runs.js';

// Sub-entry size model (issue 32, item 12): for arbitrary messages — producer names and headers of
// every length (keys and values over 255 bytes: str32), multi-byte UTF-8, integer headers, bodies
// compressible or not, IDs of 1 to 20 digits — and every codec, the size estimate that cuts
// batches is an upper bound of what the encoder really writes, and batches cut for a frame size
// never make a larger frame.

/** The stream transport's room for the frame and entry headers (stream-transport.ts FRAME_OVERHEAD). */
const FRAME_OVERHEAD = 512;
/** u32 size, u16 key, u16 version, u8 publisher id, u32 entry count. */
const FRAME_HEADER = 13;
/** u64 ID, u8 type, u16 count, u32 uncompressed length, u32 data length. */
const SUB_ENTRY_HEADER = 19;

const codecs: BatchCodec[] = HAS_ZSTD ? ['none', 'gzip', 'zstd'] : ['none', 'gzip'];

/** Bytes no codec shrinks much (xorshift32 from `seed`), or one byte repeated. */
function bodyOf(length: number, seed: number, incompressible: boolean): Buffer {
  const buf = Buffer.alloc(length, seed & 0xff);
  if (!incompressible) return buf;
  let x = seed | 1;
  for (let i = 0; i < length; i++) {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    buf[i] = x & 0xff;
  }
  return buf;
}

/**
 * Strings of 1 to `max` code points, ASCII or any Unicode (up to 4 UTF-8 bytes each), and strings
 * just past the str8 limit (256 to 400 UTF-8 bytes, where the encoder writes str32).
 */
const text = (max: number) =>
  fc.oneof(
    fc.string({ minLength: 1, maxLength: max }),
    fc.string({ unit: 'grapheme', minLength: 1, maxLength: max }),
    fc.integer({ min: 1, max }).map((n) => 'é'.repeat(n)),
    fc
      .tuple(fc.integer({ min: 256, max: 400 }), fc.string({ maxLength: 8 }))
      .map(([n, s]) => s + 'k'.repeat(n)),
  );

const headers = fc.option(
  fc.dictionary(
    text(300).filter((k) => !k.startsWith('x-dedup-')),
    fc.oneof(
      text(300),
      fc.integer({ min: -0x8000_0000, max: 0x7fff_ffff }).filter((n) => n !== 0),
    ),
    { minKeys: 1, maxKeys: 40 },
  ),
  { nil: undefined },
);

const message = fc.record({
  headers,
  length: fc.oneof(
    { arbitrary: fc.nat({ max: 300 }), weight: 3 },
    { arbitrary: fc.nat({ max: 40_000 }), weight: 2 },
    { arbitrary: fc.integer({ min: 100_000, max: 400_000 }), weight: 1 },
  ),
  seed: fc.integer(),
  incompressible: fc.boolean(),
});

const scenario = fc.record({
  producerName: fc.oneof(text(20), fc.constant('n'.repeat(256))),
  firstId: fc.oneof(fc.bigInt({ min: 1n, max: 1000n }), fc.bigInt({ min: 1n, max: 2n ** 63n })),
  messages: fc.array(message, { minLength: 2, maxLength: 8 }),
  codec: fc.constantFrom(...codecs),
});

const compressedScenario = fc
  .tuple(scenario, fc.constantFrom(...codecs.filter((c) => c !== 'none')), fc.boolean())
  .map(([s, codec, plain]) => ({
    ...s,
    codec,
    messages: s.messages.map((m) => ({
      ...m,
      incompressible: true,
      headers: plain ? undefined : m.headers,
    })),
  }));

type Scenario = typeof scenario extends fc.Arbitrary<infer T> ? T : never;

function entriesOf(s: Scenario): Entry[] {
  return s.messages.map(
    (m, i) =>
      new Entry(s.firstId + BigInt(i), bodyOf(m.length, m.seed, m.incompressible), m.headers, undefined),
  );
}

/** The estimate of one message, as the publisher core makes it (body, headers, stamps). */
const estimate = (e: Entry, producerName: string): number =>
  e.body.length + headersSize(e.headers) + stampBytesOf(producerName);

/** The bytes of one message encoded alone in a frame. */
function encodedAlone(producerName: string, id: bigint, headers: Entry['headers'], body: Buffer): number {
  const [frame] = new PublishFrameEncoder(1, producerName, 2 ** 31).encode([
    new Entry(id, body, headers, undefined),
  ]);
  return frame!.length;
}

describe('sub-entry size model', () => {
  it('sub-entry - the header estimate is at least the bytes the encoder writes for the headers', async () => {
    // A 256-byte name: the properties map is a map32 with or without the caller's headers, so the
    // difference is the headers' own bytes.
    const name = 'n'.repeat(256);
    await checkWithin(
      'sub-entry: header estimate ≥ header encoding',
      fc.asyncProperty(headers, fc.bigInt({ min: 1n, max: 2n ** 63n }), async (h, id) => {
        const body = Buffer.alloc(10);
        const wrote = encodedAlone(name, id, h, body) - encodedAlone(name, id, undefined, body);
        expect(wrote).toBeLessThanOrEqual(headersSize(h));
        await Promise.resolve();
      }),
      { runs: 1_000, timeLimitMs: 60_000 },
    );
  });

  it('sub-entry - a compressed batch is at most the codec bound of its uncompressed bytes', async () => {
    await checkWithin(
      'sub-entry: codec bound',
      // Compressed, and bodies no codec shrinks (with headers or not): where a codec expands.
      fc.asyncProperty(compressedScenario, async (s) => {
        const entries = entriesOf(s);
        attachBatches(entries, [entries.length]);
        const [frame] = new PublishFrameEncoder(1, s.producerName, 2 ** 31, s.codec).encode(entries);
        // After the frame header: u64 ID, u8 type, u16 count, u32 uncompressed, u32 data length.
        const raw = frame!.readUInt32BE(FRAME_HEADER + 11);
        const data = frame!.readUInt32BE(FRAME_HEADER + 15);
        expect(data, `${s.codec}: ${raw} bytes`).toBeLessThanOrEqual(compressedBound(raw, s.codec));
        await Promise.resolve();
      }),
      { runs: 300, timeLimitMs: 60_000 },
    );
  });

  it('sub-entry - the estimate of a batch is at least the bytes the encoder writes for it', async () => {
    await checkWithin(
      'sub-entry: estimate ≥ encoding',
      fc.asyncProperty(scenario, async (s) => {
        const entries = entriesOf(s);
        attachBatches(entries, [entries.length]);
        const [frame, ...more] = new PublishFrameEncoder(1, s.producerName, 2 ** 31, s.codec).encode(entries);
        expect(more).toHaveLength(0);
        const raw = entries.reduce((sum, e) => sum + estimate(e, s.producerName), 0);
        const wrote = frame!.length - FRAME_HEADER;
        expect(wrote, `${s.codec} batch of ${entries.length}`).toBeLessThanOrEqual(
          SUB_ENTRY_HEADER + compressedBound(raw, s.codec),
        );
        await Promise.resolve();
      }),
      { runs: 500, timeLimitMs: 90_000 },
    );
  });

  it('sub-entry - batches cut for a frame size never make a larger frame', async () => {
    await checkWithin(
      'sub-entry: frames within the frame size',
      fc.asyncProperty(scenario, fc.integer({ min: 4_096, max: 1_200_000 }), async (s, maxFrameSize) => {
        const maxBytes = maxFrameSize - FRAME_OVERHEAD;
        // What send() takes: each message fits alone (assertFits, with the same estimate).
        const entries = entriesOf(s).filter((e) => estimate(e, s.producerName) <= maxBytes);
        fc.pre(entries.length >= 2);
        // As the core cuts a group commit: with the transport's codec.
        formBatches(entries, 100, maxBytes, stampBytesOf(s.producerName), 0n, s.codec);
        for (const frame of new PublishFrameEncoder(1, s.producerName, maxFrameSize, s.codec).encode(
          entries,
        )) {
          expect(frame.length).toBeLessThanOrEqual(maxFrameSize);
        }
        await Promise.resolve();
      }),
      { runs: 500, timeLimitMs: 90_000 },
    );
  });

  it('sub-entry - no batch declares more uncompressed bytes than the cap (issue 33, item 6)', async () => {
    // The broker's `stream.max_uncompressed_sub_entry_batch_size` against the frame size: a cap
    // below it (lowered by an operator) or above it (frame_max raised), whatever the codec.
    await checkWithin(
      'sub-entry: declared uncompressed bytes within the cap',
      fc.asyncProperty(
        scenario,
        fc.integer({ min: 4_096, max: 1_200_000 }),
        fc.integer({ min: 1, max: 1_500_000 }),
        async (s, maxFrameSize, cap) => {
          const maxBytes = maxFrameSize - FRAME_OVERHEAD;
          const entries = entriesOf(s).filter((e) => estimate(e, s.producerName) <= maxBytes);
          fc.pre(entries.length >= 2);
          formBatches(entries, 100, maxBytes, stampBytesOf(s.producerName), 0n, undefined, cap);
          const encoder = new PublishFrameEncoder(1, s.producerName, maxFrameSize, s.codec);
          for (const frame of encoder.encode(entries)) {
            for (let o = FRAME_HEADER, n = frame.readUInt32BE(9); n > 0; n--) {
              if ((frame[o + 8]! & 0x80) === 0) {
                o += 12 + frame.readUInt32BE(o + 8);
                continue;
              }
              const declared = frame.readUInt32BE(o + 11);
              expect(declared, `${s.codec} batch of ${frame.readUInt16BE(o + 9)}`).toBeLessThanOrEqual(cap);
              o += SUB_ENTRY_HEADER + frame.readUInt32BE(o + 15);
            }
          }
          await Promise.resolve();
        },
      ),
      { runs: 500, timeLimitMs: 90_000 },
    );
  });
});
