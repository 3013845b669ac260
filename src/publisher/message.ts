/**
 * What `send()` checks and copies of its input before the core takes it: the domain key, the
 * caller's headers (copied: the caller may reuse its object while the message waits), their size,
 * and the skip declaration added to the first message after a deliberate skip of IDs.
 */
import { DedupError } from '../errors.js';
import { ID_HEADER, PRODUCER_HEADER, SKIP_HEADER } from '../identity/headers.js';
import { assertPublishingId } from '../identity/publishing-id.js';
import { measureUtf8 } from '../identity/utf8.js';
import type { Headers, IdMode } from '../store/codec.js';
import type { SendOptions } from './types.js';

/** Header names the library stamps itself. */
const RESERVED_PREFIX = 'x-dedup-';

/** The caller's headers (a copy, or none) with the skip declaration added. */
export function withSkip(headers: Headers | undefined, from: bigint): Headers {
  const copy = Object.create(null) as Record<string, string | number>;
  if (headers !== undefined) for (const k of Object.keys(headers)) copy[k] = headers[k]!;
  copy[SKIP_HEADER] = from.toString();
  return copy;
}

/**
 * The headers without a skip declaration: an outbox message re-assigned to a new ID by an adopting
 * open must not declare the old skip from its new place (docs/design.md §4.5: adopting skips nothing).
 */
export function withoutSkip(headers: Headers | undefined): Headers | undefined {
  if (headers === undefined || !Object.hasOwn(headers, SKIP_HEADER)) return headers;
  const copy = Object.create(null) as Record<string, string | number>;
  for (const k of Object.keys(headers)) if (k !== SKIP_HEADER) copy[k] = headers[k]!;
  return Object.keys(copy).length === 0 ? undefined : copy;
}

/** The longest domain key, in UTF-8 bytes. */
export const MAX_KEY_BYTES = 512;

/**
 * Checks a domain key: a non-empty string of at most {@link MAX_KEY_BYTES} UTF-8 bytes without a
 * lone UTF-16 surrogate, in one pass over it (keyed sends call this for every message).
 * @internal Exported for its tests.
 */
export function assertKey(key: unknown): asserts key is string {
  if (typeof key !== 'string') throw new TypeError(`options.key must be a string, got ${typeof key}`);
  if (key.length === 0) throw new RangeError('options.key must not be empty');
  const { bytes, loneSurrogate } = measureUtf8(key);
  if (bytes > MAX_KEY_BYTES) {
    throw new RangeError(`options.key is ${bytes} UTF-8 bytes; at most ${MAX_KEY_BYTES}`);
  }
  // LevelDB stores keys as UTF-8, where every lone surrogate becomes U+FFFD: two distinct keys
  // would collide, and the second would be dropped as a duplicate.
  if (loneSurrogate) throw new RangeError('options.key must not contain a lone UTF-16 surrogate');
}

/**
 * Checks the caller's headers and returns a copy: the message is encoded later (after its group
 * commit), and the caller may reuse and change its object meanwhile. The copy has no prototype, so
 * a `__proto__` header is an ordinary key.
 */
export function validateHeaders(headers: SendOptions['headers']): Headers | undefined {
  if (headers === undefined) return undefined;
  if (typeof headers !== 'object' || headers === null || Array.isArray(headers)) {
    throw new TypeError('options.headers must be an object of string or number values');
  }
  let copy: Record<string, string | number> | undefined;
  for (const [k, v] of Object.entries(headers)) {
    if (k.startsWith(RESERVED_PREFIX)) {
      throw new RangeError(
        `header ${k} is reserved: stream-dedup stamps ${PRODUCER_HEADER} and ${ID_HEADER} itself`,
      );
    }
    // What survives to every consumer: rabbitmq-stream-js-client 1.0's decoder throws inside its
    // socket handler on an empty string, a zero, or anything but a 32-bit integer.
    if (typeof v === 'string') {
      if (v.length === 0) throw new RangeError(`header ${k} must not be an empty string`);
    } else if (typeof v === 'number') {
      if (!Number.isInteger(v) || v === 0 || v < -0x8000_0000 || v > 0x7fff_ffff) {
        throw new RangeError(`header ${k} must be a non-zero 32-bit integer (or a string), got ${v}`);
      }
    } else {
      throw new TypeError(`header ${k} must be a string or a number, got ${typeof v}`);
    }
    copy ??= Object.create(null) as Record<string, string | number>;
    copy[k] = v;
  }
  return copy;
}

/** Throws a TypeError unless `body` is bytes (a Buffer or another Uint8Array). */
export function assertBody(body: unknown): asserts body is Uint8Array {
  if (!(body instanceof Uint8Array)) {
    throw new TypeError(`body must be a Buffer or Uint8Array, got ${body === null ? 'null' : typeof body}`);
  }
}

/** Throws a RangeError when the message, with `stampBytes` of identity stamps, exceeds `maxBytes`. */
export function assertFits(
  body: Uint8Array,
  headers: Headers | undefined,
  stampBytes: number,
  maxBytes: number,
): void {
  const size = body.length + headersSize(headers) + stampBytes;
  if (size > maxBytes) {
    throw new RangeError(`message of about ${size} bytes exceeds the broker's limit of ${maxBytes} bytes`);
  }
}

/**
 * An upper bound of the bytes the caller's headers add to a message on the wire, whatever the
 * transport: a key or a string value is an AMQP 1.0 str8 or str32 (2 or 5 bytes of type and
 * length: counted as 5, as keys and values over 255 bytes take), a number an int (5 bytes). An
 * AMQP 0-9-1 field table takes at most as much (a shortstr key, 1 + 4 bytes before a string, 9
 * for a number). Sub-entry batches are cut by it: an estimate below the encoding makes frames
 * larger than the frame size they were cut for.
 */
export function headersSize(headers: Headers | undefined): number {
  if (headers === undefined) return 0;
  let n = 0;
  for (const [k, v] of Object.entries(headers)) {
    n += Buffer.byteLength(k) + 5 + (typeof v === 'string' ? Buffer.byteLength(v) + 5 : 5);
  }
  return n;
}

/**
 * Bytes a message takes beyond its body and its caller's headers, the producer name aside: at most
 * 81 on the stream protocol (a sub-entry record's u32 length 4, the application-properties
 * descriptor 3 and map32 header 9, the stamps' keys 18 + 12, the name's str32 header 5, the ID's
 * str8 of up to 20 digits 22, the data descriptor 3 and vbin32 header 5), with room to spare.
 */
const STAMP_OVERHEAD = 104;

/**
 * An upper bound of the bytes the identity stamps and the message's framing add to each message
 * of `producerName` (see `STAMP_OVERHEAD`).
 */
export function stampBytesOf(producerName: string): number {
  return Buffer.byteLength(producerName) + STAMP_OVERHEAD;
}

/**
 * What a `send()` passes to identify its message, checked against the publisher's ID mode: its
 * own publishing ID (explicit mode, above the last accepted one: a bigint), its key (keyed mode:
 * a string), or nothing (automatic: undefined; nothing allocated on this path). A call that does
 * not fit the mode is a `DedupError` to reject with; a malformed ID or key throws.
 */
export function idOf(
  options: SendOptions,
  idMode: IdMode,
  lastAccepted: bigint,
  producerName: string,
): bigint | string | undefined | DedupError {
  const { publishingId, key } = options;
  if (idMode === 'auto' && publishingId === undefined && key === undefined) return undefined;
  if (idMode === 'explicit') {
    if (publishingId === undefined)
      return mismatch(producerName, idMode, 'every send() needs options.publishingId');
    assertPublishingId(publishingId, 'options.publishingId');
    if (publishingId <= lastAccepted) {
      return new DedupError(
        'DEDUP_ID_REGRESSION',
        `publishingId ${publishingId} is not above the last accepted ${lastAccepted} for producer ` +
          `"${producerName}": the broker would drop it and still confirm it (silent loss). Nothing was sent.`,
      );
    }
  } else if (publishingId !== undefined) {
    return mismatch(producerName, idMode, `open it with idMode 'explicit' to pass publishingId`);
  }
  if (idMode === 'keyed') {
    if (key === undefined) return mismatch(producerName, idMode, 'every send() needs options.key');
    assertKey(key);
    return key;
  }
  if (key !== undefined) return mismatch(producerName, idMode, `open it with idMode 'keyed' to pass a key`);
  return publishingId;
}

function mismatch(producerName: string, idMode: IdMode, what: string): DedupError {
  return new DedupError(
    'DEDUP_ID_MODE_MISMATCH',
    `publisher "${producerName}" uses idMode '${idMode}': ${what}`,
  );
}
