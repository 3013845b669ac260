import { gunzipSync } from 'node:zlib';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { PublishFrameEncoder } from '../../src/transport/stream-frames.js';
import type { OutgoingMessage } from '../../src/publisher/types.js';
import type { Headers } from '../../src/store/codec.js';

interface Decoded {
  readonly publishingId: bigint;
  /** The ID of the entry carrying it: its own, or its sub-entry batch's. */
  readonly entryId: bigint;
  /** Its sub-entry batch's codec (0 none, 1 gzip), or undefined for a plain entry. */
  readonly codec?: number;
  readonly properties: Record<string, string | number>;
  readonly body: Buffer;
}

/** Reads one AMQP 1.0 message of `length` bytes at `at` (application properties, then data). */
function decodeMessage(frame: Buffer, at: number, length: number): Omit<Decoded, 'entryId' | 'publishingId'> {
  let o = at;
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
  const body = frame.subarray(o, o + bodyLength);
  o += bodyLength;
  expect(o).toBe(end);
  return { properties, body };
}

/**
 * Reads Publish frames (key 2, version 1) back, by the stream protocol's and AMQP 1.0's encoding
 * rules, independently of the encoder: plain entries (u64 ID, u32 length, message) and sub-entry
 * batches (u64 ID, u8 0x80 | codec << 4, u16 count, u32 uncompressed, u32 length, data).
 */
function decodeFrame(frame: Buffer, publisherId: number): Decoded[] {
  expect(frame.readUInt32BE(0)).toBe(frame.length - 4);
  expect(frame.readUInt16BE(4)).toBe(2);
  expect(frame.readUInt16BE(6)).toBe(1);
  expect(frame[8]).toBe(publisherId);
  const count = frame.readUInt32BE(9);
  let o = 13;
  const out: Decoded[] = [];
  for (let n = 0; n < count; n++) {
    const entryId = frame.readBigUInt64BE(o);
    if ((frame[o + 8]! & 0x80) === 0) {
      const length = frame.readUInt32BE(o + 8);
      out.push({ publishingId: entryId, entryId, ...decodeMessage(frame, o + 12, length) });
      o += 12 + length;
      continue;
    }
    const codec = (frame[o + 8]! >> 4) & 0x07;
    const records = frame.readUInt16BE(o + 9);
    const uncompressed = frame.readUInt32BE(o + 11);
    const length = frame.readUInt32BE(o + 15);
    o += 19;
    const packed = frame.subarray(o, o + length);
    o += length;
    const data = codec === 0 ? packed : codec === 1 ? gunzipSync(packed) : expect.fail(`codec ${codec}`);
    expect(data.length).toBe(uncompressed);
    let d = 0;
    for (let r = 0; r < records; r++) {
      const size = data.readUInt32BE(d);
      const m = decodeMessage(data, d + 4, size);
      out.push({ publishingId: BigInt(m.properties['x-dedup-id']!), entryId, codec, ...m });
      d += 4 + size;
    }
    expect(d).toBe(data.length);
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

  it('publish frames - sub-entry batches: one entry per batch with its last ID, every message whole, gzip or not', () => {
    fc.assert(
      fc.property(
        fc.array(fc.tuple(headersArb, fc.uint8Array({ maxLength: 300 }), fc.integer({ min: 1, max: 4 })), {
          minLength: 1,
          maxLength: 30,
        }),
        fc.constantFrom<'none' | 'gzip'>('none', 'gzip'),
        fc.integer({ min: 0, max: 255 }),
        fc.integer({ min: 4_000, max: 20_000 }),
        (items, compression, publisherId, maxFrameSize) => {
          // Runs of 1 to 4 messages with increasing IDs (gaps allowed: explicit IDs).
          const messages: Array<OutgoingMessage & { batch?: OutgoingMessage[] }> = [];
          let id = 0n;
          for (const [headers, body, run] of items) {
            const members: Array<OutgoingMessage & { batch?: OutgoingMessage[] }> = [];
            for (let k = 0; k < run; k++)
              members.push({ publishingId: (id += 1n + BigInt(k % 2)), headers, body });
            if (run > 1) for (const m of members) m.batch = members;
            messages.push(...members);
          }
          const encoder = new PublishFrameEncoder(publisherId, 'p', maxFrameSize, compression);
          const decoded = encoder.encode(messages).flatMap((f) => decodeFrame(f, publisherId));
          expect(decoded.map((d) => d.publishingId)).toEqual(messages.map((m) => m.publishingId));
          decoded.forEach((d, i) => {
            const m = messages[i]!;
            const last = m.batch?.[m.batch.length - 1]?.publishingId ?? m.publishingId;
            expect(d.entryId).toBe(last);
            expect(d.codec).toBe(m.batch === undefined ? undefined : compression === 'gzip' ? 1 : 0);
            expect(d.properties).toEqual({
              'x-dedup-producer': 'p',
              'x-dedup-id': m.publishingId.toString(),
              ...m.headers,
            });
            expect(Buffer.compare(d.body, Buffer.from(m.body))).toBe(0);
          });
        },
      ),
      { numRuns: 200 },
    );
  });

  it('publish frames - a batch handed over in part is refused, not sent as separate entries', () => {
    const members: Array<OutgoingMessage & { batch?: OutgoingMessage[] }> = [1n, 2n, 3n].map(
      (publishingId) => ({
        publishingId,
        headers: undefined,
        body: Buffer.from('x'),
      }),
    );
    for (const m of members) m.batch = members;
    const encoder = new PublishFrameEncoder(1, 'p', 1 << 20);
    expect(() => encoder.encode(members.slice(1))).toThrow(/in part/);
    expect(() => encoder.encode(members.slice(0, 2))).toThrow(/in part/);
    expect(encoder.encode(members)).toHaveLength(1);
  });
});
