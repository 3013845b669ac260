/**
 * A partition's changelog snapshot (docs/design.md §12.1): every key of the partition's namespace
 * as it stood at input offset `X`, split over as many messages ("parts") as it needs, then a
 * closing marker carrying the parts' count and a SHA-256 digest of their bodies. A restore applies
 * a snapshot only once its marker matches what it read: a torn snapshot (a crash mid-way, parts of
 * two writers mixed) is never applied half.
 *
 * Snapshots go into the changelog stream under their own producer name (the changelog's + a
 * suffix, {@link snapshotProducerName}) with publishing IDs `(X + 2) · 2^20 + i` (part `i`, the
 * marker after the last part): the broker keeps one message per ID and drops every ID at or below
 * its last one, so a snapshot of an older state than one already begun (a zombie's) is dropped.
 *
 * Layout, big-endian: u8 'S' (0x53), u8 version (1), u8 kind (1 part, 2 marker), u64 X, u32 i
 * (part: its index; marker: the part count), then a part's body — a changelog entry
 * (`encodeEntry`, lastOffset X, no base, puts only) — or the marker's u32 key count and 32 bytes
 * of digest.
 */
import { createHash } from 'node:crypto';
import { DedupError } from '../errors.js';
import type { Op } from '../consumer/commit-pipeline.js';
import { effectKeyPrefix, offsetKey, scopeStateKeysOf, type KeyRange } from '../store/consumer-keys.js';
import { decodeEntry, encodeEntry } from './changelog-entry.js';

const MAGIC = 0x53;
const VERSION = 1;
const PART = 1;
const MARKER = 2;
const HEADER_BYTES = 3 + 8 + 4;
const DIGEST_BYTES = 32;

/**
 * Bits of a snapshot's publishing ID that number its messages: at most 2^20 − 1 parts.
 *
 * @internal
 */
export const PART_BITS = 20n;
/** @internal */
export const MAX_PARTS = (1 << Number(PART_BITS)) - 1;

/**
 * The producer name a group's snapshots are written under on each changelog (also their offset
 * reference: at most 256 bytes). A changelog producer name too long for the `.snapshot` suffix (a
 * group name of 225–233 bytes, accepted before snapshots) gets `stream-dedup.snapshot.` and the
 * SHA-256 of it instead (86 bytes): no group's plain name begins so.
 *
 * @internal
 */
export function snapshotProducerName(changelogProducer: string): string {
  const plain = `${changelogProducer}.snapshot`;
  if (Buffer.byteLength(plain, 'utf8') <= 256) return plain;
  return `stream-dedup.snapshot.${createHash('sha256').update(changelogProducer, 'utf8').digest('hex')}`;
}

/**
 * The publishing ID of message `index` of the snapshot of the state at `offset` (the marker has
 * index = the part count). `undefined` when it does not fit 64 bits (offsets above 2^43).
 *
 * @internal
 */
export function snapshotId(offset: bigint, index: number): bigint | undefined {
  const id = ((offset + 2n) << PART_BITS) + BigInt(index);
  return id < 1n << 64n ? id : undefined;
}

/**
 * The state offset of the snapshot a publishing ID belongs to (the inverse of {@link snapshotId}).
 *
 * @internal
 */
export function offsetOfSnapshotId(id: bigint): bigint {
  return (id >> PART_BITS) - 2n;
}

/** A decoded snapshot message. @internal */
export type SnapshotRecord =
  | {
      readonly kind: 'part';
      readonly offset: bigint;
      readonly index: number;
      readonly ops: readonly Op[];
      /** The body the marker's digest covers. */
      readonly body: Uint8Array;
    }
  | {
      readonly kind: 'marker';
      readonly offset: bigint;
      readonly parts: number;
      readonly keys: number;
      readonly digest: Buffer;
    };

function header(kind: number, offset: bigint, index: number, size: number): Buffer {
  const b = Buffer.allocUnsafe(size);
  b[0] = MAGIC;
  b[1] = VERSION;
  b[2] = kind;
  b.writeBigUInt64BE(offset, 3);
  b.writeUInt32BE(index, 11);
  return b;
}

/** @internal */
export function encodePart(offset: bigint, index: number, ops: readonly Op[]): Buffer {
  const body = encodeEntry({ lastOffset: offset, baseOffset: undefined, ops });
  const b = header(PART, offset, index, HEADER_BYTES + body.length);
  body.copy(b, HEADER_BYTES);
  return b;
}

/**
 * The body of an encoded part: what the marker's digest covers.
 *
 * @internal
 */
export function partBody(message: Buffer): Buffer {
  return message.subarray(HEADER_BYTES);
}

/** @internal */
export function encodeMarker(offset: bigint, parts: number, keys: number, digest: Buffer): Buffer {
  const b = header(MARKER, offset, parts, HEADER_BYTES + 4 + DIGEST_BYTES);
  b.writeUInt32BE(keys, HEADER_BYTES);
  digest.copy(b, HEADER_BYTES + 4);
  return b;
}

/**
 * The running digest of a snapshot's part bodies, in part order.
 *
 * @internal
 */
export function snapshotDigest(): { update(body: Uint8Array): void; digest(): Buffer } {
  const hash = createHash('sha256');
  return { update: (body) => void hash.update(body), digest: () => hash.digest() };
}

/**
 * The bytes a part adds per op (kind, key length, value length) and its fixed overhead: what the
 * writer counts to keep a part under a message's size.
 *
 * @internal
 */
export const PART_OVERHEAD_BYTES = HEADER_BYTES + 23;
/** @internal */
export const OP_OVERHEAD_BYTES = 9;

/**
 * The largest snapshot written and read (its keys and values plus {@link OP_OVERHEAD_BYTES} a key):
 * a restore holds a snapshot's parts in memory until its marker proves them whole, so a state
 * larger than this is not snapshotted (the writer skips it, logged) and a snapshot past it is
 * abandoned by the restore, which reads the whole changelog instead (§12.1). 256 MiB held as ops
 * stays well inside Node's default old space (2 GiB and more on 64-bit) with their per-object
 * overhead (argued, not measured: about 2x for keys of tens of bytes).
 *
 * @internal
 */
export const SNAPSHOT_MAX_BYTES = 256 * 1024 * 1024;

/**
 * Decodes a snapshot message; every key a part writes must be the partition's (`ownsKey`).
 *
 * @throws DedupError `DEDUP_CHANGELOG_INVALID` for anything malformed.
 *
 * @internal
 */
export function decodeSnapshotRecord(
  raw: Uint8Array,
  ownsKey: (key: string) => boolean,
  where: string,
): SnapshotRecord {
  const b = Buffer.isBuffer(raw) ? raw : Buffer.from(raw.buffer, raw.byteOffset, raw.byteLength);
  const bad = (why: string): DedupError =>
    new DedupError('DEDUP_CHANGELOG_INVALID', `changelog snapshot message ${where} ${why}`);
  if (b.length < HEADER_BYTES) throw bad(`is ${b.length} bytes long, shorter than its header`);
  if (b[0] !== MAGIC) throw bad('is not a stream-dedup snapshot message');
  if (b[1] !== VERSION) throw bad(`has version ${b[1]}, this version reads ${VERSION}`);
  const offset = b.readBigUInt64BE(3);
  const index = b.readUInt32BE(11);
  if (b[2] === MARKER) {
    if (b.length !== HEADER_BYTES + 4 + DIGEST_BYTES) throw bad('is a marker of the wrong size');
    return {
      kind: 'marker',
      offset,
      parts: index,
      keys: b.readUInt32BE(HEADER_BYTES),
      digest: Buffer.from(b.subarray(HEADER_BYTES + 4)),
    };
  }
  if (b[2] !== PART) throw bad(`has unknown kind ${b[2]}`);
  const body = b.subarray(HEADER_BYTES);
  const entry = decodeEntry(body, ownsKey, where);
  if (
    entry.lastOffset !== offset ||
    entry.baseOffset !== undefined ||
    entry.ops.some((op) => op.type !== 'put')
  )
    throw bad('has a body that is not the state at its offset');
  return { kind: 'part', offset, index, ops: entry.ops, body };
}

/**
 * Every key range of a partition's namespace a snapshot holds: its offset record, its scopes'
 * verifier states, its effects (what `isConsumerKey` accepts; the changelog position is local).
 *
 * @internal
 */
export function namespaceRanges(namespace: string): KeyRange[] {
  const offset = offsetKey(namespace);
  const effects = effectKeyPrefix(namespace);
  // The effects' range ends at the prefix's successor (the prefix with its last character + 1):
  // in code point order, which is LevelDB's UTF-8 byte order, exactly the keys that begin with it.
  return [
    { gte: offset, lt: offset + '\0' },
    scopeStateKeysOf(namespace),
    { gte: effects, lt: successor(effects) },
  ];
}

/** The first string above every string that begins with `prefix`. */
function successor(prefix: string): string {
  return prefix.slice(0, -1) + String.fromCharCode(prefix.charCodeAt(prefix.length - 1) + 1);
}
