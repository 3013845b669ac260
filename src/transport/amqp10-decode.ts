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
import type { ChunkIdentity } from '../store/chunk-identity.js';
import {
  ChunkDecodeError,
  copyOut,
  EMPTY,
  hex,
  readBody,
  readMap,
  readValue,
  take,
  variableLength,
  type Cursor,
} from './amqp10-values.js';

// The type system lives in amqp10-values.ts; the chunk decoder and the tests find these here too.
export { ChunkDecodeError } from './amqp10-values.js';
/** @internal */
export { readValue, take, type Cursor } from './amqp10-values.js';

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
