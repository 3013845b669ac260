/**
 * Decodes one AMQP 1.0 message — the bytes of one stream record — into its body and its header
 * sections, for the stream consumer's hot path (`stream-chunks.ts` calls it once per record).
 *
 * Why our own: rabbitmq-stream-js-client 1.0's decoder (`response_decoder.js`, `decodeFormatCode`)
 * throws on common types (long, short, double, timestamp, uuid, list, array…), decodes `null`
 * as 0 and a binary value as its length, and throws in its socket handler when it meets them,
 * which kills the process. This one reads every type of AMQP 1.0 part 1 ("Types") and the message
 * sections of part 3 ("Messaging" §3.2) and refuses malformed input with a
 * {@link ChunkDecodeError}: it never reads outside its bounds, and every loop is bounded by the
 * bytes it was given.
 *
 * Values, where the client decoded the type at all, are what the client gave (so identity stamps
 * and headers read the same: docs/design.md §2, §3 rule 7): str, sym → `string` (a `Buffer` of
 * their bytes when these are not UTF-8: see `readString`); int, smallint,
 * uint, smalluint, uint0, ubyte → `number`; booleans → `boolean`. Beyond that: ulong, smallulong,
 * ulong0 → `bigint` (the client gave a `number` for smallulong and ulong0, a `bigint` for ulong:
 * one type for one AMQP type here); long, smalllong → `bigint`; byte, short, ushort, float,
 * double → `number`; null → `null`; timestamp → `Date` (as the client's properties section);
 * uuid → its 36-character lowercase string; char → a one-code-point string; binary → a `Buffer`
 * (a copy); decimal32/64/128 → the raw bytes as a `Buffer`; list, array → an array; map → a plain
 * object whose keys are strings (other key types through `String()`, a map key as
 * `[object Object]`; `__proto__` stays a plain key); a described value → its value (the
 * descriptor is dropped).
 *
 * The body becomes `content`: the data sections, concatenated; for an amqp-value section the
 * bytes of a binary value, the UTF-8 bytes of a string or symbol value, otherwise the value's
 * encoded bytes (its constructor included); for amqp-sequence sections their encoded lists,
 * concatenated. Every `content` is a copy: a message the application keeps must not pin the
 * whole frame it came in.
 *
 * Memory: decoding N bytes allocates O(N). Every value takes at least its type code's byte except
 * an array's elements of a zero-width type (null, true, false, uint0, ulong0, list0), which share
 * the array's one constructor; those draw from an allowance per message of one per byte of the
 * message, all its arrays together however nested (issue 32: a per-array allowance of 65 536 let
 * 466 bytes of nested arrays decode into 3.1 M values). So a message of N bytes decodes into at
 * most 2N values, and the property tests check c = 32: at most 32·N values and 32·N bytes of
 * strings, buffers and value slots (8 bytes each) for any input, N counting the record's 4-byte
 * size (property-tests/chunk-decoder.test.ts; docs/design.md §10).
 */
import { isUtf8 } from 'node:buffer';
import type { ChunkIdentity } from '../consumer/chunk-identity.js';

/**
 * Malformed bytes in a delivered chunk or one of its messages: truncated, a length beyond the
 * bytes there are, an unknown type code or section, nesting deeper than 32, a record count that
 * does not match, arrays announcing more zero-width elements than the message's allowance, a
 * section descriptor that is none of the nine, compressed batches announcing more than the chunk's
 * ceiling, or a compression this process cannot read. Not part of the public API: the
 * stream consumer and `readStreamToEnd` wrap it in a `DedupError` (`DEDUP_STREAM_UNREADABLE`).
 */
export class ChunkDecodeError extends Error {
  /** `message` says what was malformed and where. */
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = new.target.name;
  }
}

/** The header section (0x70) of a message. Fields the message leaves null are absent. */
export interface Amqp10Header {
  durable?: boolean;
  priority?: number;
  ttl?: number;
  firstAcquirer?: boolean;
  deliveryCount?: number;
}

/** The properties section (0x73) of a message, named as the client names them. Null fields are absent. */
export interface Amqp10Properties {
  messageId?: unknown;
  userId?: Buffer;
  to?: string;
  subject?: string;
  replyTo?: string;
  correlationId?: unknown;
  contentType?: string;
  contentEncoding?: string;
  absoluteExpiryTime?: Date;
  creationTime?: Date;
  groupId?: string;
  groupSequence?: number;
  replyToGroupId?: string;
}

/** One decoded message: the shape of the stream client's delivered message. */
export interface Amqp10Message {
  /** The body (see the file's comment for each body kind); empty when the message has none. */
  readonly content: Buffer;
  /** The application-properties section (0x74); `{}` when absent. */
  readonly applicationProperties: Record<string, unknown>;
  /** The message-annotations section (0x72); `{}` when absent. */
  readonly messageAnnotations: Record<string, unknown>;
  /** The properties section (0x73), when present. */
  readonly messageProperties: Amqp10Properties | undefined;
  /** The header section (0x70), when present. */
  readonly messageHeader: Amqp10Header | undefined;
  /** The record's offset in the stream, when a chunk decoder decoded it (`stream-chunks.ts`). */
  readonly offset: bigint | undefined;
  /** The chunk it came in, when a chunk decoder decoded it (`stream-chunks.ts`). */
  readonly chunk: ChunkIdentity | undefined;
}

/**
 * A read position in a buffer: `pos` moves forward, nothing at or beyond `end` is read. One plain
 * object per decode (no closure, no per-value allocation for the position).
 *
 * @internal
 */
export interface Cursor {
  buf: Buffer;
  pos: number;
  end: number;
  /**
   * Array elements of zero width (null, true, false, uint0, ulong0, list0: no bytes after the
   * array's one constructor) the message may still decode, all its arrays together, however
   * nested: {@link readMessage} sets it to the message's length in bytes.
   */
  allowance: number;
  /**
   * Values a whole chunk may still decode into, shared by every cursor of the chunk (its compressed
   * batches' included): set by the chunk decoder from the chunk's bytes as they arrived, so that
   * inflated bytes cannot buy values (a 15 KB frame of gzip'd empty maps once decoded into 458 MiB
   * of heap). Absent outside a chunk, where every value costs bytes that arrived.
   */
  values?: { left: number };
}

/** Compound values (list, map, array, described) nested deeper than this are refused: a stack bomb. */
const MAX_DEPTH = 32;
const EMPTY = Buffer.alloc(0);

/**
 * Section codes (descriptors) of AMQP 1.0 part 3 §3.2, by their symbolic names. A `Map`, not an
 * object literal: a name from the wire must not find `constructor`, `toString` or `__proto__` on
 * `Object.prototype` (issue 32: they were accepted as sections).
 */
const SECTION_NAMES: ReadonlyMap<string, number> = new Map([
  ['amqp:header:list', 0x70],
  ['amqp:delivery-annotations:map', 0x71],
  ['amqp:message-annotations:map', 0x72],
  ['amqp:properties:list', 0x73],
  ['amqp:application-properties:map', 0x74],
  ['amqp:data:binary', 0x75],
  ['amqp:amqp-sequence:list', 0x76],
  ['amqp:value:*', 0x77],
  ['amqp:footer:map', 0x78],
]);

function hex(byte: number): string {
  return `0x${byte.toString(16).padStart(2, '0')}`;
}

/**
 * Claims the next `n` bytes and returns where they start.
 * @internal Shared with the chunk decoder.
 * @throws ChunkDecodeError when fewer than `n` bytes are left.
 */
export function take(c: Cursor, n: number, what: string): number {
  const at = c.pos;
  if (n > c.end - at) {
    throw new ChunkDecodeError(
      `truncated ${what} at byte ${at}: it needs ${n} bytes, ${Math.max(0, c.end - at)} are left`,
    );
  }
  c.pos = at + n;
  return at;
}

/**
 * A copy of `buf[start, end)`: a kept value must not pin the frame. Empty ones share one buffer:
 * an array of empty binaries costs a byte per element, not a Buffer object per byte.
 */
function copyOut(buf: Buffer, start: number, end: number): Buffer {
  if (end === start) return EMPTY;
  const out = Buffer.allocUnsafe(end - start);
  buf.copy(out, 0, start, end);
  return out;
}

/** The length of a variable-width value (1-byte or 4-byte prefix); the bytes follow at `c.pos`. */
function variableLength(c: Cursor, wide: boolean, what: string): number {
  const at = take(c, wide ? 4 : 1, what);
  const length = wide ? c.buf.readUInt32BE(at) : c.buf[at]!;
  if (length > c.end - c.pos) {
    throw new ChunkDecodeError(
      `${what} at byte ${at - 1} announces ${length} bytes, ${c.end - c.pos} are left`,
    );
  }
  return length;
}

/**
 * Reads one value: its constructor, then its body.
 * @internal
 * @throws ChunkDecodeError on malformed input.
 */
export function readValue(c: Cursor, depth: number): unknown {
  if (c.pos >= c.end) throw new ChunkDecodeError(`truncated value: no type code at byte ${c.pos}`);
  return readBody(c, c.buf[c.pos++]!, depth);
}

/** Reads the body of a value whose type code is `code` (already read). */
function readBody(c: Cursor, code: number, depth: number): unknown {
  const buf = c.buf;
  if (c.values !== undefined && --c.values.left < 0) {
    throw new ChunkDecodeError(
      `value at byte ${c.pos}: the chunk decodes into more values than its bytes allow ` +
        '(16 per byte that arrived, at least 65 536)',
    );
  }
  switch (code) {
    case 0x00: {
      // A described value: the descriptor (a symbol or ulong) is not kept.
      if (depth >= MAX_DEPTH) throw tooDeep(c);
      readValue(c, depth + 1);
      return readValue(c, depth + 1);
    }
    case 0x40:
      return null;
    case 0x41:
      return true;
    case 0x42:
      return false;
    case 0x56:
      return buf[take(c, 1, 'boolean')] !== 0;
    case 0x50:
      return buf[take(c, 1, 'ubyte')];
    case 0x51:
      return buf.readInt8(take(c, 1, 'byte'));
    case 0x60:
      return buf.readUInt16BE(take(c, 2, 'ushort'));
    case 0x61:
      return buf.readInt16BE(take(c, 2, 'short'));
    case 0x70:
      return buf.readUInt32BE(take(c, 4, 'uint'));
    case 0x52:
      return buf[take(c, 1, 'smalluint')];
    case 0x43:
      return 0;
    case 0x71:
      return buf.readInt32BE(take(c, 4, 'int'));
    case 0x54:
      return buf.readInt8(take(c, 1, 'smallint'));
    case 0x80:
      return buf.readBigUInt64BE(take(c, 8, 'ulong'));
    case 0x53:
      return BigInt(buf[take(c, 1, 'smallulong')]!);
    case 0x44:
      return 0n;
    case 0x81:
      return buf.readBigInt64BE(take(c, 8, 'long'));
    case 0x55:
      return BigInt(buf.readInt8(take(c, 1, 'smalllong')));
    case 0x72:
      return buf.readFloatBE(take(c, 4, 'float'));
    case 0x82:
      return buf.readDoubleBE(take(c, 8, 'double'));
    case 0x74: {
      const at = take(c, 4, 'decimal32');
      return copyOut(buf, at, at + 4);
    }
    case 0x84: {
      const at = take(c, 8, 'decimal64');
      return copyOut(buf, at, at + 8);
    }
    case 0x94: {
      const at = take(c, 16, 'decimal128');
      return copyOut(buf, at, at + 16);
    }
    case 0x73: {
      const at = take(c, 4, 'char');
      const point = buf.readUInt32BE(at);
      if (point > 0x10ffff)
        throw new ChunkDecodeError(`char at byte ${at - 1} is not a code point: ${point}`);
      return String.fromCodePoint(point);
    }
    case 0x83: {
      // Milliseconds since the epoch, a signed 64-bit integer: exact as a number up to 2^53.
      const at = take(c, 8, 'timestamp');
      return new Date(buf.readInt32BE(at) * 4_294_967_296 + buf.readUInt32BE(at + 4));
    }
    case 0x98: {
      const at = take(c, 16, 'uuid');
      const h = buf.toString('hex', at, at + 16);
      return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
    }
    case 0xa0:
    case 0xb0: {
      const length = variableLength(c, code === 0xb0, 'binary');
      const at = c.pos;
      c.pos += length;
      return copyOut(buf, at, at + length);
    }
    case 0xa1:
    case 0xa3:
    case 0xb1:
    case 0xb3: {
      const length = variableLength(c, code >= 0xb0, code === 0xa1 || code === 0xb1 ? 'string' : 'symbol');
      const at = c.pos;
      c.pos += length;
      return readString(buf, at, at + length);
    }
    case 0x45:
      return [];
    case 0xc0:
    case 0xd0:
      return readList(c, code === 0xd0, depth);
    case 0xc1:
    case 0xd1:
      return readMap(c, code === 0xd1, depth);
    case 0xe0:
    case 0xf0:
      return readArray(c, code === 0xf0, depth);
    default:
      throw new ChunkDecodeError(`unknown AMQP 1.0 type code ${hex(code)} at byte ${c.pos - 1}`);
  }
}

/**
 * A str or sym value: its text when its bytes are UTF-8, else a copy of its bytes (a `Buffer`).
 * `toString('utf8')` alone would write U+FFFD for each byte sequence that is not UTF-8, so the
 * Latin-1 names `caf\xE9` and `caf\xE8` would both be `caf\uFFFD`: two producers in one scope.
 * The bytes keep distinct values distinct, a reader that wants text gets the lossy one with
 * `String(value)`, and the identity check reports a `Buffer` name as malformed. Only a text that
 * holds U+FFFD is checked again (a sender's own U+FFFD is UTF-8): no cost for the common case.
 */
function readString(buf: Buffer, start: number, end: number): string | Buffer {
  const text = buf.toString('utf8', start, end);
  if (!text.includes('\uFFFD') || isUtf8(buf.subarray(start, end))) return text;
  return copyOut(buf, start, end);
}

function tooDeep(c: Cursor): ChunkDecodeError {
  return new ChunkDecodeError(`values nested deeper than ${MAX_DEPTH} at byte ${c.pos - 1}`);
}

/**
 * Reads a compound's size and count (list, map, array: 1-byte or 4-byte fields) and narrows
 * `c.end` to the compound's end; the caller saved the outer end first and restores it through
 * {@link leaveCompound}, which checks that the elements filled the size exactly.
 */
function enterCompound(c: Cursor, wide: boolean, depth: number, what: string): number {
  if (depth >= MAX_DEPTH) throw tooDeep(c);
  const width = wide ? 4 : 1;
  const at = take(c, 2 * width, what);
  const size = wide ? c.buf.readUInt32BE(at) : c.buf[at]!;
  const count = wide ? c.buf.readUInt32BE(at + 4) : c.buf[at + 1]!;
  // The size counts the count field and the elements.
  if (size < width || size - width > c.end - c.pos) {
    throw new ChunkDecodeError(
      `${what} at byte ${at - 1} announces ${size} bytes, ${c.end - c.pos + width} are left`,
    );
  }
  c.end = c.pos + size - width;
  return count;
}

function leaveCompound(c: Cursor, outer: number, what: string): void {
  if (c.pos !== c.end) {
    throw new ChunkDecodeError(
      `${what} ending at byte ${c.end} holds ${c.end - c.pos} bytes after its elements`,
    );
  }
  c.end = outer;
}

function readList(c: Cursor, wide: boolean, depth: number): unknown[] {
  const outer = c.end;
  const count = enterCompound(c, wide, depth, 'list');
  // Every element takes at least its type code: a larger count is a lie, refused before allocating.
  if (count > c.end - c.pos) {
    throw new ChunkDecodeError(`list at byte ${c.pos} announces ${count} elements in ${c.end - c.pos} bytes`);
  }
  const out = new Array<unknown>(count);
  for (let i = 0; i < count; i++) out[i] = readValue(c, depth + 1);
  leaveCompound(c, outer, 'list');
  return out;
}

/**
 * A map key as an object key: strings as they are, scalars, binaries and timestamps through
 * `String()`, lists as their keys joined by commas (as `String()` would), and maps as
 * `[object Object]`. A decoded map is a plain object whose own keys come from the wire: `String()`
 * on it would call a `toString` or `valueOf` the message defined (a string there throws a
 * TypeError), so maps never go through it.
 */
function keyString(key: unknown): string {
  if (typeof key === 'string') return key;
  if (Array.isArray(key)) return key.map((k) => (k === null ? '' : keyString(k))).join(',');
  if (typeof key === 'object' && key !== null && !(key instanceof Uint8Array) && !(key instanceof Date)) {
    return Object.prototype.toString.call(key);
  }
  return String(key);
}

function readMap(c: Cursor, wide: boolean, depth: number): Record<string, unknown> {
  const outer = c.end;
  const count = enterCompound(c, wide, depth, 'map');
  if (count % 2 !== 0) throw new ChunkDecodeError(`map at byte ${c.pos} has an odd element count ${count}`);
  if (count > c.end - c.pos) {
    throw new ChunkDecodeError(`map at byte ${c.pos} announces ${count} elements in ${c.end - c.pos} bytes`);
  }
  const out: Record<string, unknown> = {};
  for (let i = 0; i < count; i += 2) {
    const key = keyString(readValue(c, depth + 1));
    const value = readValue(c, depth + 1);
    // An assignment to `__proto__` would set the object's prototype instead of a key.
    if (key === '__proto__') {
      Object.defineProperty(out, key, { value, writable: true, enumerable: true, configurable: true });
    } else {
      out[key] = value;
    }
  }
  leaveCompound(c, outer, 'map');
  return out;
}

/** Type codes whose values take no bytes after the code. */
function isEmptyWidth(code: number): boolean {
  return code >= 0x40 && code <= 0x45;
}

function readArray(c: Cursor, wide: boolean, depth: number): unknown[] {
  const outer = c.end;
  const count = enterCompound(c, wide, depth, 'array');
  // One constructor for every element: a type code, or a described one (0x00, a descriptor, a code).
  let code = c.buf[take(c, 1, 'array constructor')]!;
  let nesting = depth + 1;
  while (code === 0x00) {
    if (nesting >= MAX_DEPTH) throw tooDeep(c);
    readValue(c, ++nesting);
    code = c.buf[take(c, 1, 'array constructor')]!;
  }
  if (isEmptyWidth(code)) {
    // They take no bytes: the array's size does not bound their count, the message's allowance
    // does (a per-array allowance let nested arrays multiply: 466 bytes made 3.1 M values).
    if (count > c.allowance) {
      throw new ChunkDecodeError(
        `array at byte ${c.pos} announces ${count} elements of zero width; the message's allowance ` +
          `(one per byte of the message) has ${c.allowance} left`,
      );
    }
    c.allowance -= count;
  } else if (count > c.end - c.pos) {
    throw new ChunkDecodeError(
      `array at byte ${c.pos} announces ${count} elements in ${c.end - c.pos} bytes`,
    );
  }
  const out = new Array<unknown>(count);
  for (let i = 0; i < count; i++) out[i] = readBody(c, code, nesting);
  leaveCompound(c, outer, 'array');
  return out;
}

/** The section code of a described section whose 0x00 was read: 0x70 … 0x78, or a ChunkDecodeError. */
function readSectionCode(c: Cursor): number {
  const at = c.pos;
  const code = c.buf[take(c, 1, 'section descriptor')]!;
  let section = -1;
  if (code === 0x53) {
    section = c.buf[take(c, 1, 'section descriptor')]!;
  } else if (code === 0x80) {
    const p = take(c, 8, 'section descriptor');
    // Domain 0 (AMQP's own) in the high half; another domain's descriptor is no section.
    if (c.buf.readUInt32BE(p) === 0) section = c.buf.readUInt32BE(p + 4);
  } else if (code === 0xa3 || code === 0xb3) {
    const name = readBody(c, code, 0) as string;
    section = SECTION_NAMES.get(name) ?? -1;
    if (section < 0)
      throw new ChunkDecodeError(`unknown message section ${JSON.stringify(name)} at byte ${at}`);
  } else {
    throw new ChunkDecodeError(
      `message section at byte ${at - 1} has no ulong or symbol descriptor (${hex(code)})`,
    );
  }
  if (section < 0x70 || section > 0x78) {
    throw new ChunkDecodeError(
      `unknown message section descriptor at byte ${at}${section < 0 ? '' : ` (${hex(section)})`}`,
    );
  }
  return section;
}

/** Reads a section value that must be a map (application properties, annotations). */
function readSectionMap(c: Cursor, what: string): Record<string, unknown> {
  const code = c.pos < c.end ? c.buf[c.pos]! : -1;
  if (code !== 0xc1 && code !== 0xd1) {
    throw new ChunkDecodeError(
      `${what} at byte ${c.pos} is not a map (${code < 0 ? 'truncated' : hex(code)})`,
    );
  }
  c.pos++;
  return readMap(c, code === 0xd1, 1);
}

/** Reads a section value that must be a list (header, properties). */
function readSectionList(c: Cursor, what: string): unknown[] {
  const code = c.pos < c.end ? c.buf[c.pos]! : -1;
  if (code !== 0x45 && code !== 0xc0 && code !== 0xd0) {
    throw new ChunkDecodeError(
      `${what} at byte ${c.pos} is not a list (${code < 0 ? 'truncated' : hex(code)})`,
    );
  }
  return readValue(c, 1) as unknown[];
}

function toHeader(fields: readonly unknown[]): Amqp10Header {
  const h: Amqp10Header = {};
  const [durable, priority, ttl, firstAcquirer, deliveryCount] = fields;
  if (durable != null) h.durable = durable as boolean;
  if (priority != null) h.priority = priority as number;
  if (ttl != null) h.ttl = ttl as number;
  if (firstAcquirer != null) h.firstAcquirer = firstAcquirer as boolean;
  if (deliveryCount != null) h.deliveryCount = deliveryCount as number;
  return h;
}

/** The properties fields in list order (AMQP 1.0 part 3 §3.2.4), as the client names them. */
const PROPERTY_NAMES = [
  'messageId',
  'userId',
  'to',
  'subject',
  'replyTo',
  'correlationId',
  'contentType',
  'contentEncoding',
  'absoluteExpiryTime',
  'creationTime',
  'groupId',
  'groupSequence',
  'replyToGroupId',
] as const;

function toProperties(fields: readonly unknown[]): Amqp10Properties {
  const p: Record<string, unknown> = {};
  // Fields beyond the thirteen of AMQP 1.0 are ignored.
  const n = Math.min(fields.length, PROPERTY_NAMES.length);
  for (let i = 0; i < n; i++) {
    const value = fields[i];
    if (value != null) p[PROPERTY_NAMES[i]!] = value;
  }
  return p;
}

/**
 * Reads the message in `c.buf[c.pos, end)` and leaves `c.pos` at `end`.
 *
 * @internal The chunk decoder's entry point; see {@link decodeAmqp10Message}.
 * @throws ChunkDecodeError when the bytes are not a well-formed AMQP 1.0 message.
 */
export function readMessage(
  c: Cursor,
  end: number,
  offset: bigint | undefined,
  chunk?: ChunkIdentity,
): Amqp10Message {
  const buf = c.buf;
  const outer = c.end;
  if (end > outer)
    throw new ChunkDecodeError(`message ending at byte ${end} is beyond its record (${outer})`);
  c.end = end;
  c.allowance = end - c.pos;
  let content: Buffer = EMPTY;
  let parts: Buffer[] | undefined;
  let body = 0;
  let applicationProperties: Record<string, unknown> | undefined;
  let messageAnnotations: Record<string, unknown> | undefined;
  let messageProperties: Amqp10Properties | undefined;
  let messageHeader: Amqp10Header | undefined;
  while (c.pos < end) {
    const at = c.pos++;
    if (buf[at] !== 0x00) {
      throw new ChunkDecodeError(`expected a message section (0x00) at byte ${at}, found ${hex(buf[at]!)}`);
    }
    const section = readSectionCode(c);
    switch (section) {
      case 0x74:
        applicationProperties = readSectionMap(c, 'application-properties');
        break;
      case 0x75: {
        if (body !== 0 && body !== 0x75) throw mixedBody(at);
        body = 0x75;
        const code = c.pos < end ? buf[c.pos]! : -1;
        if (code !== 0xa0 && code !== 0xb0) {
          throw new ChunkDecodeError(
            `data section at byte ${at} does not hold a binary (${code < 0 ? 'truncated' : hex(code)})`,
          );
        }
        c.pos++;
        const length = variableLength(c, code === 0xb0, 'data section');
        const start = c.pos;
        c.pos += length;
        if (content === EMPTY && parts === undefined) {
          content = copyOut(buf, start, start + length);
        } else {
          // Several data sections: one copy of all of them at the end.
          parts ??= [content];
          parts.push(buf.subarray(start, start + length));
        }
        break;
      }
      case 0x72:
        messageAnnotations = readSectionMap(c, 'message-annotations');
        break;
      case 0x73:
        messageProperties = toProperties(readSectionList(c, 'properties'));
        break;
      case 0x70:
        messageHeader = toHeader(readSectionList(c, 'header'));
        break;
      case 0x71:
      case 0x78:
        // Delivery annotations and footer: read (to find their end) and dropped.
        readSectionMap(c, section === 0x71 ? 'delivery-annotations' : 'footer');
        break;
      case 0x77: {
        if (body !== 0) throw mixedBody(at);
        body = 0x77;
        const start = c.pos;
        const code = start < end ? buf[start]! : -1;
        readValue(c, 1);
        // A binary or a string is the payload itself; anything else is kept as its encoding.
        const prefix =
          code === 0xa0 || code === 0xa1 || code === 0xa3 ? 2 : code >= 0xb0 && code <= 0xb3 ? 5 : 0;
        content = copyOut(buf, start + prefix, c.pos);
        break;
      }
      case 0x76: {
        if (body !== 0 && body !== 0x76) throw mixedBody(at);
        body = 0x76;
        const start = c.pos;
        readSectionList(c, 'amqp-sequence');
        if (content === EMPTY && parts === undefined) {
          content = copyOut(buf, start, c.pos);
        } else {
          parts ??= [content];
          parts.push(buf.subarray(start, c.pos));
        }
        break;
      }
    }
  }
  c.end = outer;
  if (parts !== undefined) content = Buffer.concat(parts);
  return {
    content,
    applicationProperties: applicationProperties ?? {},
    messageAnnotations: messageAnnotations ?? {},
    messageProperties,
    messageHeader,
    offset,
    chunk,
  };
}

function mixedBody(at: number): ChunkDecodeError {
  return new ChunkDecodeError(
    `body section at byte ${at} follows a body of another kind (data, amqp-sequence and amqp-value do not mix)`,
  );
}

/**
 * Decodes one AMQP 1.0 message: the bytes `bytes[start, end)` of one stream record.
 *
 * @example
 * ```ts
 * const m = decodeAmqp10Message(record);
 * readIdentity(m.applicationProperties, m.messageAnnotations);
 * ```
 * @throws ChunkDecodeError when the bytes are not a well-formed AMQP 1.0 message.
 */
export function decodeAmqp10Message(
  bytes: Buffer,
  start: number = 0,
  end: number = bytes.length,
): Amqp10Message {
  if (start < 0 || end > bytes.length || start > end) {
    throw new RangeError(`Expected 0 <= start <= end <= ${bytes.length}, got ${start} and ${end}`);
  }
  return readMessage({ buf: bytes, pos: start, end, allowance: 0 }, end, undefined);
}
