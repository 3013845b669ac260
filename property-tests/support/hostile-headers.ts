import { isUtf8 } from 'node:buffer';
import fc from 'fast-check';
import { decodeAmqp10Message, readValue } from '../../src/transport/amqp10-decode.js';
import { amqpBinary, amqpList, amqpMap, amqpString, section } from '../../test/support/chunks.js';

// Header values as a hostile writer puts them on the wire (issue 32): AMQP 1.0 encodings of every
// type — strings and symbols of arbitrary bytes (Latin-1, invalid UTF-8, UTF-8-encoded surrogates),
// chars holding surrogate code points, integers of every width, timestamps, uuids, binaries,
// decimals, lists, maps keyed `__proto__` or `constructor`, arrays, described values — decoded by
// the stream consumer's own decoder, so that every value it can produce reaches process().

function u32(n: number): number[] {
  return [(n >>> 24) & 0xff, (n >>> 16) & 0xff, (n >>> 8) & 0xff, n & 0xff];
}

/** str8/str32 (`0xa1`/`0xb1`) or sym8/sym32 (`0xa3`/`0xb3`) holding exactly `bytes`. */
export function amqpStringBytes(bytes: Uint8Array, code: 0xa1 | 0xa3 | 0xb1 | 0xb3): Buffer {
  // A value over 255 bytes takes the 32-bit form whatever was asked.
  const head =
    code < 0xb0 && bytes.length <= 255 ? [code, bytes.length] : [code | 0x10, ...u32(bytes.length)];
  return Buffer.concat([Buffer.from(head), bytes]);
}

/** An AMQP 1.0 char (0x73) holding `point`, surrogates included. */
export function amqpChar(point: number): Buffer {
  return Buffer.from([0x73, ...u32(point)]);
}

const stringCode = fc.constantFrom<0xa1 | 0xa3 | 0xb1 | 0xb3>(0xa1, 0xa3, 0xb1, 0xb3);

/**
 * Bytes of a name no publisher may use, from a foreign writer: bytes that are not UTF-8 (a byte
 * that cannot be there, inserted anywhere), Latin-1 text, a UTF-8-encoded surrogate, or UTF-8 text
 * with U+FFFD, a control character, or over 256 bytes. Never the bytes of a valid producer name.
 */
export const hostileNameBytes: fc.Arbitrary<Uint8Array> = fc.oneof(
  fc
    .tuple(
      fc.uint8Array({ maxLength: 8 }),
      fc.constantFrom(0x80, 0xbf, 0xc0, 0xc3, 0xe9, 0xe8, 0xed, 0xf5, 0xff),
      fc.nat(),
    )
    .map(([bytes, bad, at]) => {
      const i = at % (bytes.length + 1);
      return Uint8Array.from([...bytes.subarray(0, i), bad, ...bytes.subarray(i)]);
    })
    .filter((b) => !isUtf8(b)),
  fc.constantFrom('café', 'cafè', 'naïve').map((s) => Buffer.from(s, 'latin1')),
  fc
    .integer({ min: 0xd800, max: 0xdfff })
    .map((p) => Buffer.from([0xe0 | (p >> 12), 0x80 | ((p >> 6) & 0x3f), 0x80 | (p & 0x3f)])),
  fc
    .constantFrom('caf\uFFFD', '\uFFFD', 'a\u0000b', 'tab\t', 'del\u007f', 'x'.repeat(257), 'é'.repeat(129))
    .map((s) => Buffer.from(s, 'utf8')),
);

/** A char no name may hold: a surrogate code point, mostly, or a control character. */
const hostileChar = fc.oneof(
  { weight: 3, arbitrary: fc.integer({ min: 0xd800, max: 0xdfff }) },
  { weight: 1, arbitrary: fc.integer({ min: 0, max: 0x1f }) },
  { weight: 1, arbitrary: fc.constant(0xfffd) },
);

const fixed = (code: number, width: number): fc.Arbitrary<Buffer> =>
  fc.uint8Array({ minLength: width, maxLength: width }).map((b) => Buffer.from([code, ...b]));

/** Maps keyed by names that are special on a plain object, or by the identity headers themselves. */
const specialKey = fc
  .constantFrom('__proto__', 'constructor', 'toString', 'valueOf', 'hasOwnProperty', 'x-dedup-producer')
  .map(amqpString);

/** One encoded AMQP 1.0 value of any type, compounds nested up to a few levels. */
export const amqpValueBytes: fc.Arbitrary<Buffer> = fc.letrec<{ value: Buffer }>((tie) => ({
  value: fc.oneof(
    { depthSize: 'small', withCrossShrink: true },
    fc.constantFrom(0x40, 0x41, 0x42, 0x43, 0x44, 0x45).map((c) => Buffer.from([c])), // null, true, false, uint0, ulong0, list0
    fc.constantFrom(0x56, 0x50, 0x51, 0x52, 0x53, 0x54, 0x55).chain((c) => fixed(c, 1)),
    fc.constantFrom(0x60, 0x61).chain((c) => fixed(c, 2)),
    fc.constantFrom(0x70, 0x71, 0x72, 0x74).chain((c) => fixed(c, 4)), // uint, int, float, decimal32
    fc.constantFrom(0x80, 0x81, 0x82, 0x83, 0x84).chain((c) => fixed(c, 8)), // ulong, long, double, timestamp, decimal64
    fc.constantFrom(0x94, 0x98).chain((c) => fixed(c, 16)), // decimal128, uuid
    hostileChar.map(amqpChar),
    fc.tuple(hostileNameBytes, stringCode).map(([b, c]) => amqpStringBytes(b, c)),
    fc.tuple(fc.string({ maxLength: 6 }), stringCode).map(([t, c]) => amqpStringBytes(Buffer.from(t), c)),
    fc.uint8Array({ maxLength: 8 }).map(amqpBinary),
    fc.array(tie('value'), { maxLength: 3 }).map(amqpList),
    fc.array(fc.tuple(specialKey, tie('value')), { maxLength: 3 }).map((pairs) => amqpMap(pairs.flat())),
    // At most 4 nulls: an array's zero-width elements draw from the message's allowance, one per
    // byte, and this array is 4 bytes (more is refused by the decoder, issue 32 item 3).
    fc.tuple(fc.constantFrom(0x40, 0x50), fc.nat({ max: 4 })).map(([code, n]) => {
      const elements = code === 0x40 ? [] : Array.from({ length: n }, (_, i) => i);
      return Buffer.from([0xe0, 2 + elements.length, n, code, ...elements]); // array8 of null or ubyte
    }),
    fc
      .tuple(fc.nat({ max: 255 }), tie('value'))
      .map(([d, v]) => Buffer.concat([Buffer.from([0x00, 0x53, d]), v])),
  ),
})).value;

function decodeValue(bytes: Buffer): unknown {
  return readValue({ buf: bytes, pos: 0, end: bytes.length, allowance: bytes.length }, 0);
}

/** A stream entry whose headers came off the wire: what the consumer model feeds to process(). */
export interface HostileEntry {
  readonly headers: Record<string, unknown>;
  readonly annotations: Record<string, unknown>;
  /** The identity the verifying consumer must apply it under, by construction; none when it is invalid (identity or tenant). */
  readonly expected: { readonly producerName: string; readonly publishingId: bigint } | null;
}

/** The header the model's tenant function returns as it is (the application trusting the wire). */
export const TENANT_HEADER = 'x-tenant';

/**
 * A tenant value a scope may hold, checked independently of the library: a string that survives
 * UTF-8 unchanged (no lone surrogate) and holds no U+FFFD.
 */
export function isValidTenant(value: unknown): boolean {
  return (
    typeof value === 'string' &&
    Buffer.from(value, 'utf8').toString('utf8') === value &&
    !value.includes('\uFFFD')
  );
}

/**
 * A producer name a publisher may use, checked independently of the library: a non-empty string of
 * at most 256 UTF-8 bytes that survives UTF-8 unchanged, without U+FFFD or control characters.
 */
function isValidName(value: unknown): boolean {
  return (
    isValidTenant(value) &&
    (value as string).length > 0 &&
    Buffer.byteLength(value as string) <= 256 &&
    // eslint-disable-next-line no-control-regex
    !/[\u0000-\u001f\u007f-\u009f]/.test(value as string)
  );
}

function idText(value: unknown): string | undefined {
  return typeof value === 'string' ? value : Buffer.isBuffer(value) ? value.toString('utf8') : undefined;
}

/** An ID header a consumer accepts: the canonical decimal of 1 .. 2^64 - 1, as a string or its bytes. */
function isValidId(value: unknown): boolean {
  const text =
    typeof value === 'string' ? value : Buffer.isBuffer(value) ? value.toString('utf8') : undefined;
  return text !== undefined && /^[1-9][0-9]{0,19}$/.test(text) && BigInt(text) < 2n ** 64n;
}

/**
 * A message from a hostile writer, decoded by the stream consumer's decoder: its producer name a
 * hostile value or `validName` (unique to the entry, so that a valid one never meets another
 * producer), its ID `1` or a hostile value, a tenant header absent, valid or hostile, and message
 * annotations that repeat some headers with other values (the application property wins).
 */
export function hostileEntry(validName: string): fc.Arbitrary<HostileEntry> {
  const tenantValue = fc.oneof(fc.constant(undefined), fc.constant(amqpString('acme')), amqpValueBytes);
  return fc
    .record({
      // A hostile value that decodes to a valid name would be another producer's: excluded.
      name: fc.oneof(
        fc.constant(undefined),
        amqpValueBytes.filter((b) => !isValidName(decodeValue(b))),
      ),
      id: fc.oneof(fc.constant(undefined), amqpValueBytes),
      tenant: tenantValue,
      annotatedTenant: tenantValue,
      annotatedName: fc.option(amqpValueBytes, { nil: undefined }),
    })
    .map(({ name, id, tenant, annotatedTenant, annotatedName }) => {
      const props = [
        amqpString('x-dedup-producer'),
        name ?? amqpString(validName),
        amqpString('x-dedup-id'),
        id ?? amqpString('1'),
      ];
      if (tenant !== undefined) props.push(amqpString(TENANT_HEADER), tenant);
      const annotations: Buffer[] = [];
      if (annotatedTenant !== undefined) annotations.push(amqpString(TENANT_HEADER), annotatedTenant);
      if (annotatedName !== undefined) annotations.push(amqpString('x-dedup-producer'), annotatedName);
      const m = decodeAmqp10Message(
        Buffer.concat([
          ...(annotations.length > 0 ? [section(0x72, amqpMap(annotations))] : []),
          section(0x74, amqpMap(props)),
        ]),
      );
      const merged = { ...m.messageAnnotations, ...m.applicationProperties };
      const idValue = m.applicationProperties['x-dedup-id'];
      const tenantOf = Object.hasOwn(merged, TENANT_HEADER) ? merged[TENANT_HEADER] : '';
      return {
        headers: m.applicationProperties,
        annotations: m.messageAnnotations,
        expected:
          name === undefined && isValidId(idValue) && isValidTenant(tenantOf)
            ? { producerName: validName, publishingId: BigInt(idText(idValue)!) }
            : null,
      };
    });
}
