import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { PublishFrameEncoder } from '../../src/transport/stream-frames.js';
import type { OutgoingMessage } from '../../src/publisher/types.js';
import type { Headers } from '../../src/store/codec.js';

interface Decoded {
  readonly publishingId: bigint;
  readonly properties: Record<string, string | number>;
  readonly body: Buffer;
}

/** Reads Publish frames (key 2, version 1) back, by the AMQP 1.0 encoding rules, independently of the encoder. */
function decodeFrame(frame: Buffer, publisherId: number): Decoded[] {
  expect(frame.readUInt32BE(0)).toBe(frame.length - 4);
  expect(frame.readUInt16BE(4)).toBe(2);
  expect(frame.readUInt16BE(6)).toBe(1);
  expect(frame[8]).toBe(publisherId);
  const count = frame.readUInt32BE(9);
  let o = 13;
  const out: Decoded[] = [];
  const str = (): string => {
    const code = frame[o]!;
    let len: number;
    if (code === 0xa1) {
      len = frame[o + 1]!;
      o += 2;
    } else {
      expect(code).toBe(0xb1);
      len = frame.readUInt32BE(o + 1);
      o += 5;
    }
    const s = frame.toString('utf8', o, o + len);
    o += len;
    return s;
  };
  for (let n = 0; n < count; n++) {
    const publishingId = frame.readBigUInt64BE(o);
    const length = frame.readUInt32BE(o + 8);
    o += 12;
    const end = o + length;
    expect([frame[o], frame[o + 1], frame[o + 2]]).toEqual([0x00, 0x53, 0x74]);
    o += 3;
    let pairs: number;
    let mapEnd: number;
    if (frame[o] === 0xc1) {
      mapEnd = o + 2 + frame[o + 1]!;
      pairs = frame[o + 2]! / 2;
      o += 3;
    } else {
      expect(frame[o]).toBe(0xd1);
      mapEnd = o + 5 + frame.readUInt32BE(o + 1);
      pairs = frame.readUInt32BE(o + 5) / 2;
      o += 9;
    }
    const properties: Record<string, string | number> = {};
    for (let p = 0; p < pairs; p++) {
      const key = str();
      // A key repeated on the wire would let a header shadow another (an identity stamp, say).
      expect(Object.hasOwn(properties, key), `key ${JSON.stringify(key)} twice`).toBe(false);
      let value: string | number;
      if (frame[o] === 0x71) {
        value = frame.readInt32BE(o + 1);
        o += 5;
      } else {
        value = str();
      }
      // Not `properties[key] = value`: a `__proto__` key would set the prototype (or be dropped).
      Object.defineProperty(properties, key, { value, enumerable: true, writable: true, configurable: true });
    }
    expect(o).toBe(mapEnd);
    expect([frame[o], frame[o + 1], frame[o + 2]]).toEqual([0x00, 0x53, 0x75]);
    let bodyLength: number;
    if (frame[o + 3] === 0xa0) {
      bodyLength = frame[o + 4]!;
      o += 5;
    } else {
      expect(frame[o + 3]).toBe(0xb0);
      bodyLength = frame.readUInt32BE(o + 4);
      o += 8;
    }
    out.push({ publishingId, properties, body: frame.subarray(o, o + bodyLength) });
    o += bodyLength;
    expect(o).toBe(end);
  }
  expect(o).toBe(frame.length);
  return out;
}

const idArb = fc.oneof(
  fc.bigInt({ min: 1n, max: 2n ** 64n - 1n }),
  // Around the boundaries of the encoder's fast path and of the digit counts.
  fc.constantFrom(
    1n,
    9n,
    10n,
    99n,
    100n,
    2n ** 32n - 1n,
    2n ** 32n,
    2n ** 53n - 1n,
    2n ** 53n,
    2n ** 53n + 1n,
  ),
  fc.constantFrom(10n ** 15n - 1n, 10n ** 15n, 10n ** 16n - 1n, 10n ** 16n, 2n ** 64n - 1n),
);
const headersArb: fc.Arbitrary<Headers | undefined> = fc.option(
  fc.dictionary(
    fc.oneof(
      fc.string({ minLength: 1, maxLength: 300 }).filter((k) => !k.startsWith('x-dedup-')),
      // Names that plain-object decoders get wrong, every run rather than by chance.
      fc.constantFrom('__proto__', 'constructor', 'toString', 'hasOwnProperty'),
    ),
    fc.oneof(fc.string({ minLength: 1, maxLength: 300 }), fc.integer({ min: 1, max: 0x7fff_ffff })),
    { maxKeys: 4 },
  ),
  { nil: undefined },
);

describe('publish frames', () => {
  it('publish frames - carry every message, its ID, the identity stamps, headers and body, in order', () => {
    fc.assert(
      fc.property(
        fc.array(fc.tuple(idArb, headersArb, fc.uint8Array({ maxLength: 600 })), {
          minLength: 1,
          maxLength: 40,
        }),
        fc.string({ minLength: 1, maxLength: 260 }),
        fc.integer({ min: 0, max: 255 }),
        fc.integer({ min: 2_000, max: 20_000 }),
        (items, producer, publisherId, maxFrameSize) => {
          const messages: OutgoingMessage[] = items.map(([publishingId, headers, body]) => ({
            publishingId,
            headers,
            body,
          }));
          const frames = new PublishFrameEncoder(publisherId, producer, maxFrameSize).encode(messages);
          const decoded = frames.flatMap((f) => decodeFrame(f, publisherId));
          expect(decoded.length).toBe(messages.length);
          decoded.forEach((d, i) => {
            const m = messages[i]!;
            expect(d.publishingId).toBe(m.publishingId);
            expect(d.properties).toEqual({
              'x-dedup-producer': producer,
              'x-dedup-id': m.publishingId.toString(),
              ...m.headers,
            });
            expect(Buffer.compare(d.body, Buffer.from(m.body))).toBe(0);
          });
          // Every frame fits the negotiated size, unless it holds a single message that is larger.
          for (const f of frames) {
            if (f.length > maxFrameSize) expect(f.readUInt32BE(9)).toBe(1);
          }
        },
      ),
      { numRuns: 300 },
    );
  });

  it('publish frames - the ID property is the decimal string the consumers parse', () => {
    const encoder = new PublishFrameEncoder(7, 'p', 1 << 20);
    for (const id of [1n, 9n, 10n, 123_456_789n, 2n ** 53n - 1n, 2n ** 53n, 2n ** 64n - 1n]) {
      const [frame] = encoder.encode([{ publishingId: id, headers: undefined, body: Buffer.from('x') }]);
      const [message] = decodeFrame(frame!, 7);
      expect(message!.properties['x-dedup-id']).toBe(id.toString());
      expect(message!.publishingId).toBe(id);
    }
  });
});
