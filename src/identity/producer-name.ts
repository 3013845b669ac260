import { measureUtf8 } from './utf8.js';

/** The longest producer name the broker accepts (`publisherRef`), in UTF-8 bytes. */
export const MAX_PRODUCER_NAME_BYTES = 256;

// C0 and C1 control characters (including DEL): invisible in logs and easy to get wrong.
// eslint-disable-next-line no-control-regex
const CONTROL = /[\u0000-\u001f\u007f-\u009f]/;

/**
 * Checks a producer name: a non-empty string of at most 256 UTF-8 bytes without control
 * characters or lone UTF-16 surrogates. The name is the producer's identity across restarts, so it
 * must be stable and unique among the live producers of a stream.
 *
 * @throws TypeError when `name` is not a string.
 * @throws RangeError when it is empty, longer than 256 UTF-8 bytes, has a control character, or
 * holds a lone UTF-16 surrogate (UTF-8 turns every one into U+FFFD: two such names would be one
 * name in the store and at the broker).
 * @example
 * ```ts
 * assertProducerName('orders-svc'); // ok
 * ```
 */
export function assertProducerName(name: unknown, what = 'producerName'): asserts name is string {
  if (typeof name !== 'string') throw new TypeError(`${what} must be a string, got ${typeof name}`);
  if (name.length === 0) throw new RangeError(`${what} must not be empty`);
  const { bytes, loneSurrogate } = measureUtf8(name);
  if (bytes > MAX_PRODUCER_NAME_BYTES) {
    throw new RangeError(
      `${what} is ${bytes} UTF-8 bytes; the broker accepts at most ${MAX_PRODUCER_NAME_BYTES}`,
    );
  }
  if (CONTROL.test(name)) throw new RangeError(`${what} must not contain control characters`);
  if (loneSurrogate) throw new RangeError(`${what} must not contain a lone UTF-16 surrogate`);
}
