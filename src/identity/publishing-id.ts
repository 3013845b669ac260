/** The largest publishing ID: the stream protocol carries it as an unsigned 64-bit integer. */
export const MAX_PUBLISHING_ID: bigint = 0xffff_ffff_ffff_ffffn;

/**
 * Checks an application-supplied publishing ID: a `bigint` from 1 to 2^64 - 1. Zero is refused
 * because the broker answers 0 both for "never published" and "last ID was 0".
 *
 * @throws TypeError when `id` is not a bigint.
 * @throws RangeError when it is below 1 or above 2^64 - 1.
 */
export function assertPublishingId(id: unknown, what = 'publishingId'): asserts id is bigint {
  if (typeof id !== 'bigint') throw new TypeError(`${what} must be a bigint, got ${typeof id}`);
  if (id < 1n || id > MAX_PUBLISHING_ID) {
    throw new RangeError(`${what} must be between 1 and 2^64 - 1, got ${id}`);
  }
}

const DECIMAL = /^[1-9][0-9]{0,19}$/;

/**
 * Parses the decimal form of a publishing ID as stamped in message headers. Returns `undefined`
 * for anything that is not a canonical decimal from 1 to 2^64 - 1 (no sign, no leading zeros, no
 * white space), so that two spellings can never name one ID.
 */
export function parsePublishingId(text: string): bigint | undefined {
  // Up to 15 digits (every ID a producer reaches in practice) the digits are read by hand into a
  // number, exact below 2^53, and converted once: about twice as fast as the regex and BigInt(text).
  const length = text.length;
  if (length > 0 && length <= 15) {
    let n = text.charCodeAt(0) - 48;
    if (n < 1 || n > 9) return undefined;
    for (let i = 1; i < length; i++) {
      const d = text.charCodeAt(i) - 48;
      if (d < 0 || d > 9) return undefined;
      n = n * 10 + d;
    }
    return BigInt(n);
  }
  if (!DECIMAL.test(text)) return undefined;
  const id = BigInt(text);
  return id <= MAX_PUBLISHING_ID ? id : undefined;
}

const MAX_SAFE = BigInt(Number.MAX_SAFE_INTEGER);
const TWO_32 = 0x1_0000_0000;

/**
 * Writes an unsigned 64-bit integer big-endian, as `buf.writeBigUInt64BE` does. Values up to
 * 2^53 - 1 (every ID a producer reaches in practice) go through a double: the BigInt shifts and
 * masks of `writeBigUInt64BE` allocate, and showed in the publisher's profile.
 */
export function writeUint64BE(buf: Buffer, value: bigint, offset: number): void {
  if (value >= 0n && value <= MAX_SAFE) writeSafeUint64BE(buf, Number(value), offset);
  else buf.writeBigUInt64BE(value, offset);
}

/** Writes a non-negative safe integer as an unsigned 64-bit integer, big-endian. */
export function writeSafeUint64BE(buf: Buffer, n: number, offset: number): void {
  const high = Math.floor(n / TWO_32);
  buf.writeUInt32BE(high, offset);
  buf.writeUInt32BE(n - high * TWO_32, offset + 4);
}

/** 10^k for k = 0..16: a safe integer has at most 16 digits. */
const POWERS_OF_TEN = Array.from({ length: 17 }, (_, k) => 10 ** k);

/** How many decimal digits a publishing ID has (its length as stamped in `x-dedup-id`). */
export function decimalLength(id: bigint): number {
  if (id > MAX_SAFE) return id.toString().length;
  const n = Number(id);
  let digits = 1;
  while (digits < 16 && n >= POWERS_OF_TEN[digits]!) digits++;
  return digits;
}

/**
 * Writes the decimal digits of a publishing ID (`decimalLength(id)` bytes, ASCII) at `offset`,
 * without making a string; returns the offset after them.
 */
export function writeDecimal(buf: Buffer, id: bigint, offset: number): number {
  if (id > MAX_SAFE) return offset + buf.write(id.toString(), offset, 'latin1');
  const digits = decimalLength(id);
  let n = Number(id);
  for (let k = offset + digits - 1; k >= offset; k--) {
    const q = Math.floor(n / 10);
    buf[k] = 48 + (n - q * 10);
    n = q;
  }
  return offset + digits;
}
