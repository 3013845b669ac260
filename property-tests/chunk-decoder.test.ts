import fc from 'fast-check';
import { mutated } from './support/mutations.js';
import type { Client } from 'rabbitmq-stream-js-client';
import { describe, expect, it } from 'vitest';
import { ChunkDecodeError, decodeAmqp10Message } from '../src/transport/amqp10-decode.js';
import { decodeDeliveriesOurselves } from '../src/transport/stream-client-internals.js';
import { decodeDeliverFrame, type ChunkRecord } from '../src/transport/stream-chunks.js';
import {
  clientCodecs,
  clientResponseDecoder,
  deliverFrame,
  encodeChunk,
  encodeMessage,
  type TestEntry,
  type TestMessage,
} from '../test/support/chunks.js';
import { assertProperty } from './support/runs.js';

// The Deliver chunk decoder (src/transport/stream-chunks.ts) against an encoder written from the
// protocol (test/support/chunks.ts): any messages, cut into any mix of plain entries and sub-entry
// batches (uncompressed, gzip), come back as the same records at the chunk's first offset plus
// their index — decoded directly and through the reader hooked into a client connection, however
// the socket cuts the bytes. And no input makes either decoder throw anything but
// ChunkDecodeError. The seed is set globally by property-tests/setup.ts.

const FUZZ_RUNS = 50_000;

const properties = fc.option(
  fc.dictionary(
    fc.oneof(fc.string({ maxLength: 8 }), fc.constantFrom('__proto__', 'constructor', 'x-dedup-id')),
    fc.oneof(fc.string({ maxLength: 300 }), fc.integer({ min: -0x8000_0000, max: 0x7fff_ffff })),
    { maxKeys: 4 },
  ),
  { nil: undefined },
);
const message: fc.Arbitrary<TestMessage> = fc.record({
  body: fc.oneof(fc.uint8Array({ maxLength: 16 }), fc.uint8Array({ minLength: 250, maxLength: 400 })),
  properties,
});
/** How entries are cut: a plain entry (one message) or a batch of `size` messages with a codec. */
const cut = fc.oneof(
  fc.constant({ codec: undefined, size: 1 }),
  fc.record({ codec: fc.constantFrom(0, 1), size: fc.integer({ min: 1, max: 6 }) }),
);

/** The messages cut into entries, in order (the last batch takes what is left). */
function entriesOf(
  messages: readonly TestMessage[],
  cuts: ReadonlyArray<{ codec: number | undefined; size: number }>,
): TestEntry[] {
  const entries: TestEntry[] = [];
  let i = 0;
  for (let k = 0; i < messages.length; k++) {
    const { codec, size } = cuts[k % Math.max(1, cuts.length)] ?? { codec: undefined, size: 1 };
    const records = messages.slice(i, i + size).map(encodeMessage);
    entries.push({ records, codec });
    i += records.length;
  }
  return entries;
}

function check(records: readonly ChunkRecord[], messages: readonly TestMessage[], first: bigint): void {
  expect(records).toHaveLength(messages.length);
  records.forEach((r, i) => {
    const m = messages[i]!;
    expect(r.offset).toBe(first + BigInt(i));
    expect(r.content.equals(Buffer.from(m.body))).toBe(true);
    expect(Object.getPrototypeOf(r.applicationProperties)).toBe(Object.prototype);
    expect(Object.entries(r.applicationProperties)).toEqual(Object.entries(m.properties ?? {}));
    expect(r.messageAnnotations).toEqual({});
  });
}

/** A compound (list, map) of encoded elements: the 8-bit form when it fits, else the 32-bit one. */
function sized(small: number, wide: number, elements: readonly Buffer[], count: number): Buffer {
  const body = Buffer.concat(elements);
  if (body.length + 1 <= 255 && count <= 255)
    return Buffer.concat([Buffer.from([small, body.length + 1, count]), body]);
  const head = Buffer.alloc(9);
  head[0] = wide;
  head.writeUInt32BE(body.length + 4, 1);
  head.writeUInt32BE(count, 5);
  return Buffer.concat([head, body]);
}

/** Fixed-width type codes and their widths (AMQP 1.0 part 1). */
const FIXED: ReadonlyArray<readonly [number, number]> = [
  [0x40, 0],
  [0x41, 0],
  [0x42, 0],
  [0x43, 0],
  [0x44, 0],
  [0x45, 0],
  [0x56, 1],
  [0x50, 1],
  [0x51, 1],
  [0x52, 1],
  [0x53, 1],
  [0x54, 1],
  [0x55, 1],
  [0x60, 2],
  [0x61, 2],
  [0x70, 4],
  [0x71, 4],
  [0x72, 4],
  [0x73, 4],
  [0x74, 4],
  [0x80, 8],
  [0x81, 8],
  [0x82, 8],
  [0x83, 8],
  [0x84, 8],
  [0x94, 16],
  [0x98, 16],
];

/** One well-formed encoded AMQP 1.0 value of any type, nested up to a few levels. */
const amqpValue: fc.Arbitrary<Buffer> = fc.letrec<{ value: Buffer }>((tie) => ({
  value: fc.oneof(
    { depthSize: 'small', withCrossShrink: true },
    fc
      .tuple(fc.constantFrom(...FIXED), fc.uint8Array({ minLength: 16, maxLength: 16 }))
      .map(([[code, width], bytes]) => Buffer.concat([Buffer.from([code]), bytes.subarray(0, width)])),
    fc
      .tuple(fc.constantFrom(0xa0, 0xa1, 0xa3, 0xb0, 0xb1, 0xb3), fc.string({ maxLength: 12 }))
      .map(([code, text]) => {
        const bytes = Buffer.from(text);
        if (code < 0xb0) return Buffer.concat([Buffer.from([code, bytes.length]), bytes]);
        const head = Buffer.alloc(5);
        head[0] = code;
        head.writeUInt32BE(bytes.length, 1);
        return Buffer.concat([head, bytes]);
      }),
    fc.array(tie('value'), { maxLength: 4 }).map((elements) => sized(0xc0, 0xd0, elements, elements.length)),
    fc
      .array(fc.tuple(tie('value'), tie('value')), { maxLength: 3 })
      .map((pairs) => sized(0xc1, 0xd1, pairs.flat(), pairs.length * 2)),
    fc
      .tuple(
        fc.constantFrom(...FIXED),
        fc.array(fc.uint8Array({ minLength: 16, maxLength: 16 }), { maxLength: 4 }),
      )
      .map(([[code, width], items]) =>
        sized(
          0xe0,
          0xf0,
          [Buffer.from([code]), ...items.map((b) => Buffer.from(b.subarray(0, width)))],
          items.length,
        ),
      ),
    fc
      .tuple(fc.constantFrom(Buffer.from([0x53, 0x01]), Buffer.from([0xa3, 1, 0x78])), tie('value'))
      .map(([descriptor, value]) => Buffer.concat([Buffer.from([0x00]), descriptor, value])),
  ),
})).value;

/** Runs `decode`; anything thrown but a ChunkDecodeError fails. */
function typedOnly(decode: () => unknown): void {
  try {
    decode();
  } catch (err) {
    if (!(err instanceof ChunkDecodeError)) throw err;
  }
}

const chunkFrame = fc
  .tuple(
    fc.array(message, { maxLength: 12 }),
    fc.array(cut, { maxLength: 6 }),
    fc.bigInt(0n, 2n ** 64n - 1_000n),
    fc.constantFrom<1 | 2>(1, 2),
    fc.integer({ min: 0, max: 255 }),
  )
  .map(([messages, cuts, first, version, subscriptionId]) => ({
    messages,
    first,
    version,
    subscriptionId,
    frame: deliverFrame(encodeChunk(entriesOf(messages, cuts), { firstOffset: first }), {
      version,
      subscriptionId,
      committedChunkId: first,
    }),
  }));

describe('chunk decoder - properties', () => {
  it('any messages cut into any plain entries and batches decode back to the same records at first offset + index', () => {
    fc.assert(
      fc.property(chunkFrame, ({ messages, first, version, subscriptionId, frame }) => {
        const decoded = decodeDeliverFrame(frame, 4);
        expect(decoded).toMatchObject({
          version,
          subscriptionId,
          committedChunkId: version === 2 ? first : undefined,
        });
        expect(decoded.chunk.numRecords).toBe(messages.length);
        check(decoded.chunk.messages, messages, first);
      }),
      { numRuns: 2_000 },
    );
  });

  it('the reader hooked into a client connection delivers the same, however the socket cuts several frames', async () => {
    await assertProperty(
      'hooked reader',
      fc.asyncProperty(
        fc.array(chunkFrame, { minLength: 1, maxLength: 3 }),
        fc.array(fc.integer({ min: 1, max: 700 }), { minLength: 1, maxLength: 8 }),
        async (frames, steps) => {
          const decoder = clientResponseDecoder();
          const delivered: Array<{ subscriptionId: number; messages: ChunkRecord[] }> = [];
          for (const event of ['deliverV1', 'deliverV2']) {
            decoder.emitter.on(event, (d: { subscriptionId: number; messages: ChunkRecord[] }) =>
              delivered.push(d),
            );
          }
          const client = { getConnection: () => Promise.resolve({ decoder }) } as unknown as Client;
          decodeDeliveriesOurselves(client, (err) => {
            throw err;
          });
          await (client as unknown as { getConnection: () => Promise<unknown> }).getConnection();
          const bytes = Buffer.concat(frames.map((f) => f.frame));
          for (let o = 0, k = 0; o < bytes.length; k++) {
            const step = steps[k % steps.length]!;
            decoder.add(bytes.subarray(o, o + step), clientCodecs);
            o += step;
          }
          expect(delivered).toHaveLength(frames.length);
          frames.forEach((f, i) => {
            expect(delivered[i]!.subscriptionId).toBe(f.subscriptionId);
            check(delivered[i]!.messages, f.messages, f.first);
          });
        },
      ),
      { numRuns: 500 },
    );
  });

  it(`arbitrary and mutated bytes make the decoders throw ChunkDecodeError only (${FUZZ_RUNS} inputs each)`, () => {
    const frames = fc.oneof(
      fc.uint8Array({ maxLength: 80 }).map((b) => Buffer.from(b)),
      mutated(chunkFrame.map((f) => f.frame)),
    );
    fc.assert(
      fc.property(frames, (frame) => typedOnly(() => decodeDeliverFrame(frame, Math.min(4, frame.length)))),
      { numRuns: FUZZ_RUNS },
    );
    const messages = fc.oneof(
      fc.uint8Array({ maxLength: 40 }).map((b) => Buffer.from(b)),
      mutated(message.map(encodeMessage)),
      // Well-formed values of every type as amqp-value bodies and as application properties, mutated:
      // they reach the compound, array and described paths that random bytes rarely do.
      mutated(amqpValue.map((v) => Buffer.concat([Buffer.from([0x00, 0x53, 0x77]), v]))),
      mutated(
        fc
          .array(fc.tuple(amqpValue, amqpValue), { maxLength: 4 })
          .map((pairs) =>
            Buffer.concat([
              Buffer.from([0x00, 0x53, 0x74]),
              sized(0xc1, 0xd1, pairs.flat(), pairs.length * 2),
            ]),
          ),
      ),
    );
    fc.assert(
      fc.property(messages, (bytes) => typedOnly(() => decodeAmqp10Message(bytes))),
      { numRuns: FUZZ_RUNS },
    );
  });
});
