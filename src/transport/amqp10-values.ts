/**
 * The AMQP 1.0 type system (part 1, "Types") for amqp10-decode.ts: a bounded cursor, and the
 * reading of every primitive, list, map, array and described value. Which JavaScript value each
 * type becomes, and the memory bounds, are in amqp10-decode.ts's opening comment; the sections of a
 * message are read there. Apart from it since issue 38 (one concept per file, ~600 lines).
 */
import { isUtf8 } from 'node:buffer';

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
   * nested: `readMessage` (amqp10-decode.ts) sets it to the message's length in bytes.
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
/** The empty buffer: one, shared. @internal */
export const EMPTY: Buffer = Buffer.alloc(0);

/** `0x` and two hex digits. @internal */
export function hex(byte: number): string {
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
 * @internal
 */
export function copyOut(buf: Buffer, start: number, end: number): Buffer {
  if (end === start) return EMPTY;
  const out = Buffer.allocUnsafe(end - start);
  buf.copy(out, 0, start, end);
  return out;
}

/** The length of a variable-width value (1-byte or 4-byte prefix); the bytes follow at `c.pos`. @internal */
export function variableLength(c: Cursor, wide: boolean, what: string): number {
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

/** Reads the body of a value whose type code is `code` (already read). @internal */
export function readBody(c: Cursor, code: number, depth: number): unknown {
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

/** Reads a map's size, count and pairs (its type code read). @internal */
export function readMap(c: Cursor, wide: boolean, depth: number): Record<string, unknown> {
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
