import { describe, expect, it } from 'vitest';
import { identityHeaders, readIdentity } from '../../src/identity/headers.js';
import type { OutgoingMessage } from '../../src/publisher/types.js';
import {
  ChunkDecodeError,
  decodeAmqp10Message,
  readValue,
  type Cursor,
} from '../../src/transport/amqp10-decode.js';
import { decodeDeliverFrame } from '../../src/transport/stream-chunks.js';
import { PublishFrameEncoder } from '../../src/transport/stream-frames.js';
import {
  amqpBinary,
  amqpInt,
  amqpList,
  amqpMap,
  amqpString,
  deliverFrame,
  encodeChunk,
  section,
  clientCodecs,
  clientResponseDecoder,
} from '../support/chunks.js';
import { thrown } from '../support/thrown.js';

// The AMQP 1.0 decoder of the stream consumer: every primitive type, the message sections, the
// values the client's decoder gave for what our publisher writes, and typed refusals of malformed
// bytes.

/** Decodes one value and checks it used every byte. */
function value(bytes: readonly number[] | Buffer): unknown {
  const buf = Buffer.from(bytes);
  const c: Cursor = { buf, pos: 0, end: buf.length, allowance: buf.length };
  const v = readValue(c, 0);
  expect(c.pos).toBe(buf.length);
  return v;
}

function u32(n: number): number[] {
  return [(n >>> 24) & 0xff, (n >>> 16) & 0xff, (n >>> 8) & 0xff, n & 0xff];
}

describe('amqp10 decode - primitive values', () => {
  it('reads null, booleans and every integer type with the client’s types (number; bigint for (small)ulong and long)', () => {
    expect(value([0x40])).toBeNull();
    expect(value([0x41])).toBe(true);
    expect(value([0x42])).toBe(false);
    expect(value([0x56, 0x01])).toBe(true);
    expect(value([0x56, 0x00])).toBe(false);
    expect(value([0x50, 0xff])).toBe(255);
    expect(value([0x51, 0xff])).toBe(-1);
    expect(value([0x60, 0xff, 0xff])).toBe(65_535);
    expect(value([0x61, 0xff, 0xfe])).toBe(-2);
    expect(value([0x70, 0xff, 0xff, 0xff, 0xff])).toBe(4_294_967_295);
    expect(value([0x52, 0x07])).toBe(7);
    expect(value([0x43])).toBe(0);
    expect(value([0x71, 0x80, 0, 0, 0])).toBe(-2_147_483_648);
    expect(value([0x54, 0xfe])).toBe(-2);
    expect(value([0x80, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff])).toBe(2n ** 64n - 1n);
    expect(value([0x53, 0x05])).toBe(5n);
    expect(value([0x44])).toBe(0n);
    expect(value([0x81, 0x80, 0, 0, 0, 0, 0, 0, 0])).toBe(-(2n ** 63n));
    expect(value([0x55, 0xff])).toBe(-1n);
  });

  it('reads floats, decimals (raw bytes), chars, timestamps (Date) and uuids (string)', () => {
    expect(value([0x72, 0x3f, 0xc0, 0, 0])).toBe(1.5);
    const pi = Buffer.alloc(9);
    pi[0] = 0x82;
    pi.writeDoubleBE(Math.PI, 1);
    expect(value(pi)).toBe(Math.PI);
    expect(value([0x74, 1, 2, 3, 4])).toEqual(Buffer.from([1, 2, 3, 4]));
    expect(value([0x84, 1, 2, 3, 4, 5, 6, 7, 8])).toEqual(Buffer.from([1, 2, 3, 4, 5, 6, 7, 8]));
    expect(value([0x94, ...new Array<number>(16).fill(9)])).toEqual(Buffer.alloc(16, 9));
    expect(value([0x73, ...u32(0x1f600)])).toBe('😀');
    const ts = Buffer.alloc(9);
    ts[0] = 0x83;
    ts.writeBigInt64BE(1_700_000_000_123n, 1);
    expect(value(ts)).toEqual(new Date(1_700_000_000_123));
    ts.writeBigInt64BE(-1n, 1);
    expect(value(ts)).toEqual(new Date(-1));
    const uuid = Buffer.from('0123456789abcdef0123456789abcdef', 'hex');
    expect(value(Buffer.concat([Buffer.from([0x98]), uuid]))).toBe('01234567-89ab-cdef-0123-456789abcdef');
  });

  it('reads binaries as Buffers, strings and symbols as strings, 8- and 32-bit lengths alike', () => {
    expect(value([0xa0, 2, 0xca, 0xfe])).toEqual(Buffer.from([0xca, 0xfe]));
    expect(value([0xb0, ...u32(3), 1, 2, 3])).toEqual(Buffer.from([1, 2, 3]));
    expect(value(amqpString('héllo'))).toBe('héllo');
    const long = 'x'.repeat(300);
    expect(value(amqpString(long))).toBe(long);
    expect(value([0xa3, 3, 0x61, 0x62, 0x63])).toBe('abc');
    expect(value([0xb3, ...u32(1), 0x7a])).toBe('z');
    expect(value([0xa1, 0])).toBe('');
  });

  it('reads lists, maps (string keys; __proto__ a plain key), arrays and described values', () => {
    expect(value([0x45])).toEqual([]);
    expect(value(amqpList([amqpInt(1), amqpString('a'), Buffer.from([0x40])]))).toEqual([1, 'a', null]);
    const wide = amqpList(new Array(100).fill(amqpString('abc')) as Buffer[]);
    expect(wide[0]).toBe(0xd0);
    expect(value(wide)).toEqual(new Array(100).fill('abc'));
    const map = value(amqpMap([amqpString('a'), amqpInt(1), Buffer.from([0x53, 5]), amqpString('five')]));
    expect(map).toEqual({ a: 1, '5': 'five' });
    const proto = value(amqpMap([amqpString('__proto__'), amqpString('x')])) as Record<string, unknown>;
    expect(Object.getPrototypeOf(proto)).toBe(Object.prototype);
    expect(Object.keys(proto)).toEqual(['__proto__']);
    expect(proto['__proto__']).toBe('x');
    // Keys that are maps or lists never call a toString or valueOf the message itself defined (a
    // string there made String() throw a TypeError: found by the fuzz property, seed 39454632).
    const hostile = amqpMap([amqpString('toString'), amqpString('x'), amqpString('valueOf'), amqpInt(1)]);
    expect(value(amqpMap([hostile, amqpInt(7)]))).toEqual({ '[object Object]': 7 });
    expect(value(amqpMap([amqpList([amqpInt(1), hostile, Buffer.from([0x40])]), amqpInt(8)]))).toEqual({
      '1,[object Object],': 8,
    });
    expect(
      value(amqpMap([amqpList([amqpInt(1), amqpList([amqpString('a'), amqpInt(2)])]), amqpInt(9)])),
    ).toEqual({
      [String([1, ['a', 2]])]: 9,
    });
    // array8 of int, array32 of str8, an array of booleans, an array with a described constructor
    expect(value([0xe0, 10, 2, 0x71, 0, 0, 0, 1, 0, 0, 0, 2])).toEqual([1, 2]);
    expect(value([0xf0, ...u32(9), ...u32(2), 0xa1, 1, 0x61, 1, 0x62])).toEqual(['a', 'b']);
    expect(value([0xe0, 4, 2, 0x56, 1, 0])).toEqual([true, false]);
    expect(value([0xe0, 7, 2, 0x00, 0x53, 0x09, 0x50, 7, 8])).toEqual([7, 8]);
    expect(value([0xe0, 2, 3, 0x40])).toEqual([null, null, null]);
    expect(value([0x00, 0x53, 0x01, ...amqpString('described')])).toBe('described');
    expect(value([0x00, 0xa3, 1, 0x78, 0x40])).toBeNull();
  });
});

describe('amqp10 decode - malformed values are refused with ChunkDecodeError, never read past their bytes', () => {
  const refused = (bytes: readonly number[] | Buffer, message: RegExp): void => {
    const err = thrown(() => value(bytes));
    expect(err).toBeInstanceOf(ChunkDecodeError);
    expect((err as Error).message).toMatch(message);
  };

  it('refuses unknown codes, truncations and lengths beyond the buffer', () => {
    refused([0x01], /unknown AMQP 1\.0 type code 0x01/);
    refused([0x99], /unknown AMQP 1\.0 type code 0x99/);
    refused([], /truncated value/);
    for (const whole of [
      [0x70, 1, 2, 3, 4],
      [0x80, 1, 2, 3, 4, 5, 6, 7, 8],
      [0x83, 1, 2, 3, 4, 5, 6, 7, 8],
      [0x98, ...new Array<number>(16).fill(1)],
      [0xa1, 2, 0x61, 0x62],
      [0xb0, ...u32(2), 1, 2],
      [0xc0, 3, 1, 0x50, 1],
      [0xe0, 4, 2, 0x50, 1, 2],
    ]) {
      for (let cut = 1; cut < whole.length; cut++) {
        expect(thrown(() => value(whole.slice(0, cut)))).toBeInstanceOf(ChunkDecodeError);
      }
    }
    refused([0xb1, ...u32(0xffff_ffff), 0x61], /announces 4294967295 bytes/);
    refused([0x73, ...u32(0x110000)], /not a code point/);
  });

  it('refuses compounds whose counts or sizes lie, odd maps, arrays of too many empty elements, and nesting deeper than 32', () => {
    refused([0xc0, 2, 200, 0x40], /announces 200 elements/);
    refused([0xc0, 3, 1, 0x40, 0x40], /holds 1 bytes after its elements/);
    refused([0xc0, 0, 0], /announces 0 bytes/);
    refused([0xc1, 2, 1, 0x40], /odd element count/);
    refused([0xf0, ...u32(5), ...u32(0xffff_ffff), 0x40], /4294967295 elements of zero width/);
    refused([0xf0, ...u32(5), ...u32(1000), 0x50], /announces 1000 elements/);
    let nested: Buffer = Buffer.from([0x45]);
    for (let i = 0; i < 40; i++) nested = amqpList([nested]);
    refused(nested, /nested deeper than 32/);
    let described: number[] = [0x40];
    for (let i = 0; i < 40; i++) described = [0x00, 0x53, 1, ...described];
    refused(described, /nested deeper than 32/);
  });
});

describe('amqp10 decode - a budget per message: N bytes decode into O(N) values (issue 32 item 3)', () => {
  /** array32 (size, count) of `count` elements of the zero-width constructor `code`. */
  const emptyArray = (count: number, code = 0x40): number[] => [0xf0, ...u32(5), ...u32(count), code];
  /** An array32 of `outer` array32s of `inner` nulls each: 9 bytes per inner array. */
  const amplifier = (outer: number, inner: number): Buffer => {
    const element = [...u32(5), ...u32(inner), 0x40];
    const body = [...u32(outer), 0xf0, ...new Array<number[]>(outer).fill(element).flat()];
    return Buffer.from([0xf0, ...u32(body.length), ...body]);
  };

  it("refuses the issue's 466 bytes that decoded into 3.1 M values, before allocating them", () => {
    // 48 arrays of 65 536 nulls: 3 145 728 values under the old per-array allowance.
    const bytes = Buffer.concat([Buffer.from([0x00, 0x53, 0x77]), amplifier(48, 65_536)]);
    expect(bytes.length).toBe(3 + 9 + 1 + 48 * 9);
    const err = thrown(() => decodeAmqp10Message(bytes));
    expect(err).toBeInstanceOf(ChunkDecodeError);
    expect((err as Error).message).toMatch(/65536 elements of zero width.*message's allowance/);
  });

  it('nested arrays, lists and maps draw from one allowance per message: the bytes of the message', () => {
    // An array of 40 nulls in a 43-byte message (3 + 10 + 30 bytes of padding) reads; 44 do not.
    const pad = (n: number): number[] => [0xa0, n - 2, ...new Array<number>(n - 2).fill(0x61)];
    const message = (count: number): Buffer =>
      Buffer.concat([section(0x77, amqpList([Buffer.from(emptyArray(count)), Buffer.from(pad(30))]))]);
    const size = message(0).length;
    const ok = decodeAmqp10Message(message(size)).content;
    expect(ok.length).toBe(size - 3);
    expect(thrown(() => decodeAmqp10Message(message(size + 1)))).toBeInstanceOf(ChunkDecodeError);
    // Two arrays inside a map in the application properties share it with the body's.
    const half = Buffer.from(emptyArray(20, 0x41));
    const twoSections = (count: number): Buffer =>
      Buffer.concat([
        section(0x74, amqpMap([amqpString('a'), half, amqpString('b'), half])),
        section(0x77, Buffer.from(emptyArray(count, 0x45))),
      ]);
    const n = twoSections(0).length;
    expect(decodeAmqp10Message(twoSections(n - 40)).applicationProperties['a']).toEqual(
      new Array<boolean>(20).fill(true),
    );
    expect(thrown(() => decodeAmqp10Message(twoSections(n - 39)))).toBeInstanceOf(ChunkDecodeError);
  });

  it('every message of a chunk has its own allowance: a chunk of many such messages reads', () => {
    const record = (count: number): Buffer => section(0x77, Buffer.from(emptyArray(count)));
    const size = record(0).length;
    const chunk = encodeChunk(
      new Array<number>(50).fill(0).map(() => ({ records: [record(size)] })),
      { firstOffset: 10n },
    );
    const decoded = decodeDeliverFrame(deliverFrame(chunk), 4);
    expect(decoded.chunk.messages).toHaveLength(50);
    const over = encodeChunk([{ records: [record(size), record(size + 1)], codec: 0 }]);
    const err = thrown(() => decodeDeliverFrame(deliverFrame(over), 4));
    expect(err).toBeInstanceOf(ChunkDecodeError);
  });
});

describe('amqp10 decode - message sections', () => {
  it('reads header, annotations, properties and application properties; skips delivery annotations and footer; concatenates data sections', () => {
    const ts = Buffer.alloc(9);
    ts[0] = 0x83;
    ts.writeBigInt64BE(1_000n, 1);
    const message = Buffer.concat([
      section(0x70, amqpList([Buffer.from([0x41]), Buffer.from([0x50, 4]), Buffer.from([0x40])])),
      section(0x71, amqpMap([Buffer.from([0xa3, 1, 0x78]), amqpInt(1)])),
      section(0x72, amqpMap([Buffer.from([0xa3, 7, ...Buffer.from('x-dedup')]), amqpString('a')])),
      section(
        0x73,
        amqpList([
          Buffer.from([0x53, 7]),
          amqpBinary(Buffer.from('me')),
          amqpString('to'),
          Buffer.from([0x40]),
          Buffer.from([0x40]),
          amqpString('corr'),
          Buffer.from([0xa3, 4, ...Buffer.from('text')]),
          Buffer.from([0x40]),
          Buffer.from([0x40]),
          ts,
        ]),
      ),
      section(0x74, amqpMap([amqpString('k'), amqpString('v')])),
      section(0x75, amqpBinary(Buffer.from('hello '))),
      section(0x75, amqpBinary(Buffer.from('world'))),
      section(0x78, amqpMap([])),
    ]);
    const m = decodeAmqp10Message(message);
    expect(m.content).toEqual(Buffer.from('hello world'));
    expect(m.messageHeader).toEqual({ durable: true, priority: 4 });
    expect(m.messageAnnotations).toEqual({ 'x-dedup': 'a' });
    expect(m.messageProperties).toEqual({
      messageId: 7n,
      userId: Buffer.from('me'),
      to: 'to',
      correlationId: 'corr',
      contentType: 'text',
      creationTime: new Date(1_000),
    });
    expect(m.applicationProperties).toEqual({ k: 'v' });
    expect(m.offset).toBeUndefined();
  });

  it('takes the payload of an amqp-value binary or string, the encoding of any other value, and the lists of amqp-sequence', () => {
    expect(decodeAmqp10Message(section(0x77, amqpBinary(Buffer.from('bin')))).content).toEqual(
      Buffer.from('bin'),
    );
    expect(decodeAmqp10Message(section(0x77, amqpString('text'))).content).toEqual(Buffer.from('text'));
    expect(decodeAmqp10Message(section(0x77, amqpInt(5))).content).toEqual(amqpInt(5));
    const list = amqpList([amqpInt(1)]);
    expect(decodeAmqp10Message(Buffer.concat([section(0x76, list), section(0x76, list)])).content).toEqual(
      Buffer.concat([list, list]),
    );
    const empty = decodeAmqp10Message(Buffer.alloc(0));
    expect(empty).toMatchObject({
      content: Buffer.alloc(0),
      applicationProperties: {},
      messageAnnotations: {},
    });
  });

  it('accepts ulong and symbol descriptors for sections', () => {
    const ulong = Buffer.concat([
      Buffer.from([0x00, 0x80, 0, 0, 0, 0, 0, 0, 0, 0x75]),
      amqpBinary(Buffer.from('u')),
    ]);
    expect(decodeAmqp10Message(ulong).content).toEqual(Buffer.from('u'));
    const name = Buffer.from('amqp:application-properties:map');
    const symbol = Buffer.concat([
      Buffer.from([0x00, 0xa3, name.length]),
      name,
      amqpMap([amqpString('a'), amqpString('b')]),
    ]);
    expect(decodeAmqp10Message(symbol).applicationProperties).toEqual({ a: 'b' });
  });

  it('refuses bytes that are not sections, unknown sections, mixed bodies, and section values of the wrong type', () => {
    const refused = (bytes: Buffer, message: RegExp): void => {
      const err = thrown(() => decodeAmqp10Message(bytes));
      expect(err).toBeInstanceOf(ChunkDecodeError);
      expect((err as Error).message).toMatch(message);
    };
    refused(Buffer.from([0x53, 0x75]), /expected a message section/);
    refused(section(0x79, Buffer.from([0x40])), /unknown message section/);
    refused(Buffer.from([0x00, 0xa3, 1, 0x78, 0x40]), /unknown message section "x"/);
    refused(Buffer.from([0x00, 0x80, 0, 0, 0, 1, 0, 0, 0, 0x75, 0xa0, 0]), /unknown message section/);
    refused(Buffer.from([0x00, 0x71]), /no ulong or symbol descriptor/);
    refused(
      Buffer.concat([section(0x75, amqpBinary(Buffer.from('a'))), section(0x77, amqpInt(1))]),
      /another kind/,
    );
    refused(section(0x74, amqpList([])), /application-properties at byte 3 is not a map/);
    refused(section(0x70, amqpMap([])), /header at byte 3 is not a list/);
    refused(section(0x75, amqpString('a')), /does not hold a binary/);
    refused(Buffer.from([0x00, 0x53]), /truncated section descriptor/);
  });

  it('recognises only the nine AMQP 1.0 section names: Object.prototype members are unknown sections (issue 32 item 5)', () => {
    const named = (name: string, value: Buffer): Buffer => {
      const bytes = Buffer.from(name, 'utf8');
      return Buffer.concat([Buffer.from([0x00, 0xa3, bytes.length]), bytes, value]);
    };
    const members = ['constructor', 'toString', '__proto__', 'valueOf', 'hasOwnProperty', 'isPrototypeOf'];
    for (const name of members) {
      // Alone, followed by a value, or in front of a valid section: refused by name every time.
      for (const rest of [Buffer.alloc(0), amqpMap([]), section(0x75, amqpBinary(Buffer.from('x')))]) {
        const err = thrown(() => decodeAmqp10Message(named(name, rest)));
        expect(err, name).toBeInstanceOf(ChunkDecodeError);
        expect((err as Error).message).toContain(`unknown message section ${JSON.stringify(name)}`);
      }
    }
    // The nine names still read, the symbol32 form included.
    const value = Buffer.from('amqp:value:*');
    const sym32 = Buffer.concat([Buffer.from([0x00, 0xb3, ...u32(value.length)]), value, amqpInt(7)]);
    expect(decodeAmqp10Message(sym32).content).toEqual(amqpInt(7));
  });
});

describe('amqp10 decode - what the client decoded, it decodes the same', () => {
  it("gives the client's values for messages our publisher writes (identity stamps, string and int headers, short and long bodies)", () => {
    const encoder = new PublishFrameEncoder(0, 'producer-é', 1 << 20);
    const messages: OutgoingMessage[] = [
      { publishingId: 1n, body: Buffer.from('one'), headers: undefined },
      { publishingId: 2n, body: Buffer.alloc(300, 7), headers: { type: 'created', n: 42, neg: -5 } },
      { publishingId: 18_446_744_073_709_551_615n, body: Buffer.alloc(0), headers: { big: 2_000_000_000 } },
      {
        publishingId: 4n,
        body: Buffer.from('wide'),
        headers: Object.fromEntries(Array.from({ length: 40 }, (_, i) => [`h${i}`, 'v'.repeat(i + 1)])),
      },
    ];
    const [frame] = encoder.encode(messages);
    // Publish frame: u32 size, u16 key, u16 version, u8 publisher, u32 count, then per message
    // u64 publishing ID, u32 length, the message.
    const records: Buffer[] = [];
    for (let o = 13; o < frame!.length;) {
      const length = frame!.readUInt32BE(o + 8);
      records.push(frame!.subarray(o + 12, o + 12 + length));
      o += 12 + length;
    }
    expect(records).toHaveLength(messages.length);
    const deliver = deliverFrame(
      encodeChunk(
        records.map((r) => ({ records: [r] })),
        { firstOffset: 1_000n },
      ),
    );

    const theirs: unknown[] = [];
    const client = clientResponseDecoder();
    client.emitter.on('deliverV1', (r: { messages: unknown[] }) => theirs.push(...r.messages));
    client.add(deliver, clientCodecs);

    const ours = decodeDeliverFrame(deliver, 4).chunk.messages;
    expect(theirs).toHaveLength(messages.length);
    ours.forEach((m, i) => {
      const c = theirs[i] as typeof m;
      expect(m.content).toEqual(c.content);
      expect(m.applicationProperties).toStrictEqual(c.applicationProperties);
      expect(m.messageAnnotations).toStrictEqual(c.messageAnnotations);
      expect(m.offset).toBe(c.offset);
      expect(m.applicationProperties).toEqual({
        ...identityHeaders('producer-é', messages[i]!.publishingId),
        ...messages[i]!.headers,
      });
    });
  });
});

describe('amqp10 decode - strings that are not UTF-8 (issue 32, item 1)', () => {
  /** A message whose producer name is the str8 (or sym8 with `code` 0xa3) holding `name`'s bytes. */
  const stamped = (name: readonly number[], code = 0xa1) =>
    Buffer.concat([
      section(
        0x74,
        amqpMap([
          amqpString('x-dedup-producer'),
          Buffer.from([code, name.length, ...name]),
          amqpString('x-dedup-id'),
          amqpString('1'),
        ]),
      ),
      section(0x75, amqpBinary(Buffer.from('body'))),
    ]);

  it('decodes a str or sym whose bytes are not UTF-8 into a copy of its bytes: two such names stay two', () => {
    const e9 = decodeAmqp10Message(stamped([0x63, 0x61, 0x66, 0xe9])).applicationProperties;
    const e8 = decodeAmqp10Message(stamped([0x63, 0x61, 0x66, 0xe8])).applicationProperties;
    expect(e9['x-dedup-producer']).toEqual(Buffer.from([0x63, 0x61, 0x66, 0xe9]));
    expect(e8['x-dedup-producer']).toEqual(Buffer.from([0x63, 0x61, 0x66, 0xe8]));
    // The lossy text is one String() away.
    expect(String(e9['x-dedup-producer'])).toBe('caf\uFFFD');
    expect(value([0xa3, 2, 0xc3, 0x28])).toEqual(Buffer.from([0xc3, 0x28]));
    expect(value([0xb1, ...u32(3), 0xed, 0xa0, 0x80])).toEqual(Buffer.from([0xed, 0xa0, 0x80])); // a UTF-8-encoded surrogate
    // A sender's own U+FFFD is UTF-8: it stays a string.
    expect(value(amqpString('a\uFFFDb'))).toBe('a\uFFFDb');
    // The identity of either message is malformed, never one shared name.
    for (const m of [e9, e8]) expect(readIdentity(m).kind).toBe('malformed');
  });

  it('a char (0x73) holding a surrogate code point decodes to a string the identity check refuses', () => {
    expect(value([0x73, ...u32(0xd800)])).toBe('\uD800');
    const m = decodeAmqp10Message(
      section(
        0x74,
        amqpMap([
          amqpString('x-dedup-producer'),
          Buffer.from([0x73, ...u32(0xdc00)]),
          amqpString('x-dedup-id'),
          amqpString('1'),
        ]),
      ),
    );
    expect(readIdentity(m.applicationProperties)).toEqual({
      kind: 'malformed',
      reason: expect.stringMatching(/lone UTF-16 surrogate/) as string,
    });
  });
});
