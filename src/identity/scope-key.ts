import { DedupError } from '../errors.js';

/**
 * What a consumer-side sequence tracker is kept for (docs/design.md §2): the consumer, so that two
 * applications may each process the same message; the tenant, so that customers stay apart; and the
 * producer name whose publishing IDs the tracker follows.
 *
 * @remarks Since 0.1.0
 */
export interface Scope {
  /** The consuming application's name (non-empty). */
  readonly consumer: string;
  /** The tenant; may be empty when the application has none. */
  readonly tenant: string;
  /** The producer name stamped in the messages (non-empty). */
  readonly producer: string;
}

// A lone UTF-16 surrogate: LevelDB stores string keys as UTF-8, where every lone surrogate
// becomes U+FFFD, so two distinct keys would collide on disk. With the `u` flag a well-formed pair
// is one code point outside this class, so only lone surrogates match.
const LONE_SURROGATE = /[\uD800-\uDFFF]/u;
const LENGTH = /^(?:0|[1-9][0-9]{0,8})$/;

/**
 * Encodes a scope as a string key for a `Map` or LevelDB: each component as
 * `<length>:<value>`, consumer then tenant then producer, the length in UTF-16 code units as a
 * decimal without leading zeros. For example `('a:b', '', 'c')` is `3:a:b0:1:c`.
 *
 * The encoding is injective (the length says where each value ends, whatever characters it holds,
 * so `('a:b', 'c')` and `('a', 'b:c')` differ), every key starts with a digit (so no key is
 * `__proto__` or another special name), and all keys of one consumer start with
 * {@link scopeKeyPrefix}, so a LevelDB range scan finds them.
 *
 * @throws TypeError when `scope` is not an object or a component is not a string.
 * @throws RangeError when `consumer` or `producer` is empty, or a component holds a lone UTF-16
 * surrogate (it would not survive UTF-8 encoding on disk).
 * @example
 * ```ts
 * encodeScopeKey({ consumer: 'balance-projection', tenant: 'acme', producer: 'orders-svc' });
 * // '18:balance-projection4:acme10:orders-svc'
 * ```
 * @remarks Since 0.1.0
 */
export function encodeScopeKey(scope: Scope): string {
  if (typeof scope !== 'object' || scope === null) {
    throw new TypeError(`scope must be an object, got ${scope === null ? 'null' : typeof scope}`);
  }
  const { consumer, tenant, producer } = scope;
  return (
    scopeKeyPrefix(consumer) + component(tenant, 'tenant', true) + component(producer, 'producer', false)
  );
}

/**
 * The prefix shared by the keys of every scope of `consumer`, and by no key of another consumer.
 *
 * @throws TypeError when `consumer` is not a string.
 * @throws RangeError when it is empty or holds a lone UTF-16 surrogate.
 * @example
 * ```ts
 * // After the prefix comes the tenant's length, a digit, so ':' (the next character) bounds the scan.
 * const prefix = scopeKeyPrefix('balance-projection');
 * for await (const [key, value] of db.iterator({ gte: prefix, lt: prefix + ':' })) { … }
 * ```
 * @remarks Since 0.1.0
 */
export function scopeKeyPrefix(consumer: string): string {
  return component(consumer, 'consumer', false);
}

/**
 * Decodes a key made by {@link encodeScopeKey}. Only the exact output of `encodeScopeKey` is
 * accepted: `encodeScopeKey(decodeScopeKey(key)) === key` for every key it returns.
 *
 * @throws TypeError when `key` is not a string.
 * @throws DedupError `DEDUP_STORE_CORRUPT` when `key` is not a valid scope key.
 * @example
 * ```ts
 * decodeScopeKey('18:balance-projection4:acme10:orders-svc');
 * // { consumer: 'balance-projection', tenant: 'acme', producer: 'orders-svc' }
 * ```
 * @remarks Since 0.1.0
 */
export function decodeScopeKey(key: string): Scope {
  if (typeof key !== 'string') throw new TypeError(`scope key must be a string, got ${typeof key}`);
  const reader = { key, at: 0 };
  const consumer = readComponent(reader, 'consumer');
  const tenant = readComponent(reader, 'tenant');
  const producer = readComponent(reader, 'producer');
  if (reader.at !== key.length) corrupt(key, 'trailing characters');
  if (consumer.length === 0) corrupt(key, 'empty consumer');
  if (producer.length === 0) corrupt(key, 'empty producer');
  if (LONE_SURROGATE.test(key)) corrupt(key, 'lone UTF-16 surrogate');
  return { consumer, tenant, producer };
}

/**
 * Why the `tenant` function's value cannot be a scope's tenant, or `undefined` when it can: a
 * string without lone UTF-16 surrogates (they would not survive UTF-8 on disk) and without U+FFFD
 * (what a lossy decoder writes for bytes that are not UTF-8: a tenant read from such a header
 * could merge two tenants).
 *
 * @internal The verifying consumer reports a message whose tenant fails this as unidentified.
 */
export function tenantProblem(value: unknown): string | undefined {
  if (typeof value !== 'string') {
    return `the tenant function returned ${value === null ? 'null' : typeof value}, not a string`;
  }
  if (LONE_SURROGATE.test(value)) return 'the tenant function returned a lone UTF-16 surrogate';
  if (value.includes('\uFFFD')) {
    return 'the tenant function returned U+FFFD (a lossy decoder writes it for bytes that are not UTF-8)';
  }
  return undefined;
}

function component(value: unknown, what: string, mayBeEmpty: boolean): string {
  if (typeof value !== 'string') throw new TypeError(`scope ${what} must be a string, got ${typeof value}`);
  if (!mayBeEmpty && value.length === 0) throw new RangeError(`scope ${what} must not be empty`);
  if (LONE_SURROGATE.test(value)) throw new RangeError(`scope ${what} must not hold a lone UTF-16 surrogate`);
  return `${value.length}:${value}`;
}

function readComponent(reader: { readonly key: string; at: number }, what: string): string {
  const { key } = reader;
  const colon = key.indexOf(':', reader.at);
  if (colon < 0) corrupt(key, `no length for ${what}`);
  const digits = key.slice(reader.at, colon);
  if (!LENGTH.test(digits)) corrupt(key, `bad length ${JSON.stringify(digits.slice(0, 12))} for ${what}`);
  const end = colon + 1 + Number(digits);
  if (end > key.length) corrupt(key, `${what} runs past the end`);
  reader.at = end;
  return key.slice(colon + 1, end);
}

function corrupt(key: string, reason: string): never {
  throw new DedupError(
    'DEDUP_STORE_CORRUPT',
    `undecodable scope key ${JSON.stringify(key.slice(0, 80))}: ${reason}`,
  );
}
