/**
 * The verifying consumer's records in a `DedupStore`: their keys and values. The consumer writes
 * them and `stream-dedup inspect` reads them; both go through this module, so the schema lives in
 * one place. The format is the one of 0.1 and 0.2: stores they wrote open unchanged.
 *
 * - `c:<length>:<consumer>/offset`: the consumer's last committed offset, a u64 big-endian; since
 *   0.6.0 followed by the identity of the stream chunk that holds it (u64 first offset, i64
 *   timestamp: 24 bytes), which a resubscription compares (consumer/chunk-identity.ts). Records of
 *   8 bytes (older versions, AMQP 0-9-1 consumers) carry none.
 * - `v:` + scope key (identity/scope-key.ts): a scope's verifier state, a u64 lastSeenMs, then the
 *   tracker's own encoding.
 * - `u:<length>:<consumer>` + the handler's key: an effect value, as the handler wrote it.
 *
 * Lengths count UTF-16 code units, in decimal without leading zeros (the scope key's encoding).
 *
 * @internal
 */
import { DedupError } from '../errors.js';
import type { ChunkIdentity } from './chunk-identity.js';
import { scopeKeyPrefix } from '../identity/scope-key.js';
import { decodeTracker } from '../verifier/window.js';
import type { SequenceTracker } from '../verifier/types.js';

/** A LevelDB key range: from `gte` (inclusive) up to `lt` (exclusive). */
export interface KeyRange {
  readonly gte: string;
  readonly lt: string;
}

const OFFSET_TAG = 'c:';
const OFFSET_SUFFIX = '/offset';
const SCOPE_TAG = 'v:';
const EFFECT_TAG = 'u:';

/** Every consumer's offset record (`c;` is the first key after every `c:` key). */
export const OFFSET_KEYS: KeyRange = Object.freeze({ gte: OFFSET_TAG, lt: 'c;' });

/** Every scope's verifier state, of every consumer. */
export const SCOPE_STATE_KEYS: KeyRange = Object.freeze({ gte: SCOPE_TAG, lt: 'v;' });

/** `<length>:<name>`: injective, so no consumer's keys are a prefix of another's. */
function lengthPrefixed(consumerName: string): string {
  return `${consumerName.length}:${consumerName}`;
}

/** The key of a consumer's committed offset: `c:<length>:<name>/offset`. */
export function offsetKey(consumerName: string): string {
  return OFFSET_TAG + lengthPrefixed(consumerName) + OFFSET_SUFFIX;
}

/** The consumer name in an {@link offsetKey}, or `undefined` for any other key. */
export function consumerOfOffsetKey(key: string): string | undefined {
  const m = /^c:(0|[1-9][0-9]{0,8}):/.exec(key);
  if (m === null) return undefined;
  const start = m[0].length;
  const end = start + Number(m[1]);
  return key.slice(end) === OFFSET_SUFFIX ? key.slice(start, end) : undefined;
}

/** The key of a scope's verifier state: `v:` + the scope key. */
export function scopeStateKey(scopeKey: string): string {
  return SCOPE_TAG + scopeKey;
}

/** The scope key in a {@link scopeStateKey} (not checked: decode it with `decodeScopeKey`). */
export function scopeKeyOfStateKey(key: string): string {
  return key.slice(SCOPE_TAG.length);
}

/**
 * The verifier states of one consumer's scopes. After the consumer's part of a scope key comes the
 * tenant's length, a digit, so ':' (the next character after the digits) bounds the range.
 */
export function scopeStateKeysOf(consumerName: string): KeyRange {
  const prefix = SCOPE_TAG + scopeKeyPrefix(consumerName);
  return { gte: prefix, lt: prefix + ':' };
}

/** The prefix of a consumer's effect keys: `u:<length>:<name>`, then the handler's key as it is. */
export function effectKeyPrefix(consumerName: string): string {
  return EFFECT_TAG + lengthPrefixed(consumerName);
}

/**
 * An offset record: the offset as a u64, big-endian, then (when known) the identity of the chunk
 * holding it, a u64 first offset and an i64 timestamp.
 */
export function encodeOffset(offset: bigint, chunk?: ChunkIdentity): Uint8Array {
  const b = Buffer.allocUnsafe(chunk === undefined ? 8 : 24);
  b.writeBigUInt64BE(offset);
  if (chunk !== undefined) {
    b.writeBigUInt64BE(chunk.firstOffset, 8);
    b.writeBigInt64BE(chunk.timestamp, 16);
  }
  return b;
}

/** An offset record as stored: the offset, and the identity of its chunk when recorded. */
export interface OffsetRecord {
  readonly offset: bigint;
  readonly chunk: ChunkIdentity | undefined;
}

/**
 * Reads an offset record's offset (see {@link decodeOffsetRecord}).
 *
 * @throws DedupError `DEDUP_STORE_CORRUPT` when it holds neither 8 nor 24 bytes.
 */
export function decodeOffset(raw: Uint8Array): bigint {
  return decodeOffsetRecord(raw).offset;
}

/**
 * Reads an offset record: 8 bytes (the offset alone), or 24 (with its chunk's identity).
 *
 * @throws DedupError `DEDUP_STORE_CORRUPT` when it holds neither 8 nor 24 bytes, or its chunk
 *   starts after the offset.
 */
export function decodeOffsetRecord(raw: Uint8Array): OffsetRecord {
  if (raw.length !== 8 && raw.length !== 24)
    throw new DedupError(
      'DEDUP_STORE_CORRUPT',
      `consumer offset record has ${raw.length} bytes, expected 8 or 24`,
    );
  const b = asBuffer(raw);
  const offset = b.readBigUInt64BE(0);
  if (raw.length === 8) return { offset, chunk: undefined };
  const chunk = { firstOffset: b.readBigUInt64BE(8), timestamp: b.readBigInt64BE(16) };
  if (chunk.firstOffset > offset)
    throw new DedupError(
      'DEDUP_STORE_CORRUPT',
      `consumer offset record: offset ${offset} lies in a chunk said to start at ${chunk.firstOffset}`,
    );
  return { offset, chunk };
}

/** A scope's verifier state as stored. */
export interface ScopeStateRecord {
  readonly tracker: SequenceTracker;
  /** When the scope last committed a message, in ms since the epoch. */
  readonly lastSeenMs: number;
}

/** A scope state record: u64 lastSeenMs (whole ms, at least 0), then the tracker's own encoding. */
export function encodeScopeState(tracker: SequenceTracker, lastSeenMs: number): Uint8Array {
  const t = tracker.encode();
  const b = Buffer.allocUnsafe(8 + t.length);
  b.writeBigUInt64BE(BigInt(Math.max(0, Math.floor(lastSeenMs))));
  b.set(t, 8);
  return b;
}

/**
 * Reads a scope state record; `scopeKey` names the scope in error messages.
 *
 * @throws DedupError `DEDUP_STORE_CORRUPT` when it is truncated or its tracker cannot be decoded.
 */
export function decodeScopeState(raw: Uint8Array, scopeKey: string): ScopeStateRecord {
  if (raw.length < 8)
    throw new DedupError('DEDUP_STORE_CORRUPT', `verifier state of scope ${scopeKey} is truncated`);
  const b = asBuffer(raw);
  let tracker: SequenceTracker;
  try {
    tracker = decodeTracker(b.subarray(8));
  } catch (err) {
    if (err instanceof DedupError)
      throw new DedupError(err.code, `verifier state of scope ${scopeKey}: ${err.message}`, { cause: err });
    throw err;
  }
  return { tracker, lastSeenMs: Number(b.readBigUInt64BE(0)) };
}

/** A value from the database as a Buffer, without a copy (LevelDB's 'view' encoding gives Uint8Arrays). */
function asBuffer(raw: Uint8Array): Buffer {
  return Buffer.isBuffer(raw) ? raw : Buffer.from(raw.buffer, raw.byteOffset, raw.byteLength);
}

const GROUP_TAG = 'g:';
const CHANGELOG_POSITION_SUFFIX = '/changelog';

/**
 * The key of a consumer group partition's changelog read position (src/group): the changelog
 * offset from which its next restore reads. `g:<length>:<partition namespace>/changelog`.
 */
export function changelogPositionKey(consumerName: string): string {
  return GROUP_TAG + lengthPrefixed(consumerName) + CHANGELOG_POSITION_SUFFIX;
}

/**
 * True for the keys a consumer's commits write: its offset record, its scopes' verifier states and
 * its effects. A consumer group's changelog entries may write only these.
 */
export function isConsumerKey(consumerName: string, key: string): boolean {
  if (key === offsetKey(consumerName)) return true;
  if (key.startsWith(effectKeyPrefix(consumerName))) return true;
  const scopes = scopeStateKeysOf(consumerName);
  return key >= scopes.gte && key < scopes.lt;
}
