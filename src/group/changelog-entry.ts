/**
 * One changelog entry: what one committed batch of a partition wrote to the member's store, as
 * the resulting values of the keys it wrote (docs/design.md §12). Applying an entry again, or an
 * entry of another member that covers an overlapping range, gives the same state: entries are
 * puts and deletes of values, never increments.
 *
 * Layout (version 2), big-endian:
 *   u8 'G' (0x47), u8 version (2), u8 flags (bit 0: a base offset follows),
 *   u64 lastOffset, u64 baseOffset (0 without one), u32 op count,
 *   then per op: u8 kind (1 put, 2 delete), u32 key bytes, the key (UTF-8),
 *   and for a put u32 value bytes and the value.
 *
 * A changelog begins with its genesis (flags bit 1, the header alone, lastOffset holding the
 * partition's first input offset): publishing ID 1, which only the first member to write it gets
 * in (design §12). Batch entries have IDs from 2.
 */
import { DedupError } from '../errors.js';
import type { Op } from '../consumer/commit-pipeline.js';

const MAGIC = 0x47;
/**
 * 2 since the genesis (entry IDs L + 2). Version 1 (IDs L + 1, no genesis) was written only by
 * development builds of 0.5.0, never released: such a changelog is refused, never misread.
 */
const VERSION = 2;
const HEADER_BYTES = 3 + 8 + 8 + 4;
const HAS_BASE = 1;
const GENESIS = 2;
const PUT = 1;
const DEL = 2;

/**
 * A decoded entry.
 *
 * @internal
 */
export interface ChangelogEntry {
  /** The last input offset of the batch: the entry's publishing ID is `lastOffset + 2`. */
  readonly lastOffset: bigint;
  /** The input offset of the state the batch was computed on (`undefined`: the partition's first batch). */
  readonly baseOffset: bigint | undefined;
  readonly ops: readonly Op[];
}

/**
 * The publishing ID of the genesis: the lowest, so that of two members beginning a partition at
 * once the broker keeps the first one's and drops the other's.
 *
 * @internal
 */
export const GENESIS_ID = 1n;

/**
 * The entry's publishing ID in the changelog: its last input offset + 2 (above the genesis).
 *
 * @internal
 */
export function entryId(lastOffset: bigint): bigint {
  return lastOffset + 2n;
}

/**
 * The genesis: the partition's state begins, empty, at input offset `start`.
 *
 * @internal
 */
export function encodeGenesis(start: bigint): Buffer {
  const b = Buffer.alloc(HEADER_BYTES);
  b[0] = MAGIC;
  b[1] = VERSION;
  b[2] = GENESIS;
  b.writeBigUInt64BE(start, 3);
  return b;
}

/**
 * A changelog message: the genesis or a batch entry.
 *
 * @internal
 */
export type ChangelogRecord =
  { readonly kind: 'genesis'; readonly start: bigint } | ({ readonly kind: 'entry' } & ChangelogEntry);

/**
 * Decodes a changelog message (see {@link decodeEntry} for entries).
 *
 * @throws DedupError `DEDUP_CHANGELOG_INVALID` for anything malformed.
 *
 * @internal
 */
export function decodeRecord(
  raw: Uint8Array,
  ownsKey: (key: string) => boolean,
  where: string,
): ChangelogRecord {
  if (raw.length >= 3 && raw[0] === MAGIC && raw[1] === VERSION && raw[2] === GENESIS) {
    const b = Buffer.isBuffer(raw) ? raw : Buffer.from(raw.buffer, raw.byteOffset, raw.byteLength);
    if (b.length !== HEADER_BYTES || b.readBigUInt64BE(11) !== 0n || b.readUInt32BE(19) !== 0) {
      throw new DedupError('DEDUP_CHANGELOG_INVALID', `changelog genesis ${where} is malformed`);
    }
    return { kind: 'genesis', start: b.readBigUInt64BE(3) };
  }
  return { kind: 'entry', ...decodeEntry(raw, ownsKey, where) };
}

/**
 * Encodes `entry` in one buffer.
 *
 * @internal
 */
export function encodeEntry(entry: ChangelogEntry): Buffer {
  let size = HEADER_BYTES;
  const keys: Buffer[] = [];
  for (const op of entry.ops) {
    const key = Buffer.from(op.key, 'utf8');
    keys.push(key);
    size += 1 + 4 + key.length + (op.type === 'put' ? 4 + op.value.length : 0);
  }
  const b = Buffer.allocUnsafe(size);
  b[0] = MAGIC;
  b[1] = VERSION;
  b[2] = entry.baseOffset === undefined ? 0 : HAS_BASE;
  b.writeBigUInt64BE(entry.lastOffset, 3);
  b.writeBigUInt64BE(entry.baseOffset ?? 0n, 11);
  b.writeUInt32BE(entry.ops.length, 19);
  let pos = HEADER_BYTES;
  entry.ops.forEach((op, i) => {
    const key = keys[i]!;
    b[pos] = op.type === 'put' ? PUT : DEL;
    b.writeUInt32BE(key.length, pos + 1);
    key.copy(b, pos + 5);
    pos += 5 + key.length;
    if (op.type === 'put') {
      b.writeUInt32BE(op.value.length, pos);
      b.set(op.value, pos + 4);
      pos += 4 + op.value.length;
    }
  });
  return b;
}

/**
 * Decodes an entry and checks that every key it writes is one of the partition's
 * (`ownsKey`): a changelog never writes outside its partition's namespace.
 *
 * @throws DedupError `DEDUP_CHANGELOG_INVALID` for anything malformed; `where` names the entry.
 *
 * @internal
 */
export function decodeEntry(
  raw: Uint8Array,
  ownsKey: (key: string) => boolean,
  where: string,
): ChangelogEntry {
  const b = Buffer.isBuffer(raw) ? raw : Buffer.from(raw.buffer, raw.byteOffset, raw.byteLength);
  const bad = (why: string): DedupError =>
    new DedupError('DEDUP_CHANGELOG_INVALID', `changelog entry ${where} ${why}`);
  if (b.length < HEADER_BYTES) throw bad(`is ${b.length} bytes long, shorter than its header`);
  if (b[0] !== MAGIC) throw bad('is not a stream-dedup changelog entry');
  if (b[1] !== VERSION) throw bad(`has version ${b[1]}, this version reads ${VERSION}`);
  const flags = b[2]!;
  if ((flags & ~HAS_BASE) !== 0) throw bad(`has unknown flags ${flags}`);
  const lastOffset = b.readBigUInt64BE(3);
  const baseOffset = (flags & HAS_BASE) !== 0 ? b.readBigUInt64BE(11) : undefined;
  if (baseOffset !== undefined && baseOffset >= lastOffset)
    throw bad(`has base offset ${baseOffset}, not below its last offset ${lastOffset}`);
  const count = b.readUInt32BE(19);
  const ops: Op[] = [];
  let pos = HEADER_BYTES;
  for (let i = 0; i < count; i++) {
    if (pos + 5 > b.length) throw bad('is truncated');
    const kind = b[pos]!;
    const keyBytes = b.readUInt32BE(pos + 1);
    pos += 5;
    if (pos + keyBytes > b.length) throw bad('is truncated');
    const key = b.toString('utf8', pos, pos + keyBytes);
    pos += keyBytes;
    if (!ownsKey(key)) throw bad(`writes key ${JSON.stringify(key)}, outside its partition`);
    if (kind === DEL) {
      ops.push({ type: 'del', key });
      continue;
    }
    if (kind !== PUT) throw bad(`has an operation of unknown kind ${kind}`);
    if (pos + 4 > b.length) throw bad('is truncated');
    const valueBytes = b.readUInt32BE(pos);
    pos += 4;
    if (pos + valueBytes > b.length) throw bad('is truncated');
    // A copy: the entry outlives the chunk buffer it was read from only as LevelDB's copy.
    ops.push({ type: 'put', key, value: Uint8Array.prototype.slice.call(b, pos, pos + valueBytes) });
    pos += valueBytes;
  }
  if (pos !== b.length) throw bad(`has ${b.length - pos} bytes after its last operation`);
  return { lastOffset, baseOffset, ops };
}
