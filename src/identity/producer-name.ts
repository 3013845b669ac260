import { measureUtf8 } from './utf8.js';

/** The longest producer name the broker accepts (`publisherRef`), in UTF-8 bytes. */
export const MAX_PRODUCER_NAME_BYTES = 256;

// C0 and C1 control characters (including DEL): invisible in logs and easy to get wrong.
// eslint-disable-next-line no-control-regex
const CONTROL = /[\u0000-\u001f\u007f-\u009f]/;
const REPLACEMENT = '\uFFFD';

/**
 * What is wrong with a producer name, or `undefined` when it is one a publisher may use: a
 * non-empty string of at most 256 UTF-8 bytes without control characters, lone UTF-16 surrogates
 * or U+FFFD.
 *
 * Each refusal keeps names injective: UTF-8 turns every lone surrogate into U+FFFD, and a lossy
 * decoder (amqplib's `longstr`, a foreign client, a shovel) writes U+FFFD for every byte sequence
 * that is not UTF-8, so two different names holding either could become one name in the store,
 * at the broker and in a consumer's scope. The verifying consumer and `audit` report a message
 * whose name fails this check as unidentified, with this reason.
 *
 * @internal Shared by {@link assertProducerName} and the consumer's identity check.
 */
export function producerNameProblem(name: string): string | undefined {
  if (name.length === 0) return 'must not be empty';
  const { bytes, loneSurrogate } = measureUtf8(name);
  if (bytes > MAX_PRODUCER_NAME_BYTES) {
    return `is ${bytes} UTF-8 bytes; the broker accepts at most ${MAX_PRODUCER_NAME_BYTES}`;
  }
  if (CONTROL.test(name)) return 'must not contain control characters';
  if (loneSurrogate) return 'must not contain a lone UTF-16 surrogate';
  if (name.includes(REPLACEMENT)) {
    return 'must not contain U+FFFD (a lossy decoder writes it for bytes that are not UTF-8)';
  }
  return undefined;
}

/**
 * Checks a producer name: a non-empty string of at most 256 UTF-8 bytes without control
 * characters, lone UTF-16 surrogates or U+FFFD. The name is the
 * producer's identity across restarts, so it must be stable and unique among the live producers
 * of a stream.
 *
 * @throws TypeError when `name` is not a string.
 * @throws RangeError when it is empty, longer than 256 UTF-8 bytes, has a control character,
 * holds a lone UTF-16 surrogate (UTF-8 turns every one into U+FFFD: two such names would be one
 * name in the store and at the broker), or holds U+FFFD (the character a lossy decoder writes for
 * bytes that are not UTF-8: every verifying consumer would report the name's messages as
 * unidentified).
 * @example
 * ```ts
 * assertProducerName('orders-svc'); // ok
 * ```
 */
export function assertProducerName(name: unknown, what = 'producerName'): asserts name is string {
  if (typeof name !== 'string') throw new TypeError(`${what} must be a string, got ${typeof name}`);
  const problem = producerNameProblem(name);
  if (problem !== undefined) throw new RangeError(`${what} ${problem}`);
}
