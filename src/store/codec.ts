import { DedupError } from '../errors.js';
import { writeSafeUint64BE, writeUint64BE } from '../identity/publishing-id.js';

/** Header values a message carries besides the identity stamps. */
export type Headers = Readonly<Record<string, string | number>>;

/** One message waiting in the outbox for its confirm. */
export interface OutboxEntry {
  readonly publishingId: bigint;
  readonly body: Uint8Array;
  /** Application properties (stream) or headers (AMQP) the caller gave, without the identity stamps. */
  readonly headers: Headers | undefined;
  /** The domain key of a keyed send (`idMode: 'keyed'`). */
  readonly key?: string | undefined;
}

/** The durable state of one producer. */
export interface ProducerMeta {
  /** Which kind of IDs the producer uses; a store refuses to be reopened in another mode. */
  readonly idMode: IdMode;
  /**
   * Written with an outbox commit: the highest publishing ID handed out (before any message
   * carrying it leaves). Written by a `reserve` block with automatic IDs: the highest ID
   * below every unconfirmed or unsent one then (every ID up to it was confirmed); the IDs above it
   * are within `reservedUpTo`.
   */
  readonly lastId: bigint;
  /** In `reserve` durability, IDs up to this one are reserved; after a crash the next ID is above it. */
  readonly reservedUpTo: bigint;
  /**
   * A skip not yet declared in the stream: IDs from this one up to the first ID the producer uses
   * next were deliberately left unused (the rest of a reserved block after a crash). The next
   * message carries it (`x-dedup-skip-from`); it stays here until that message is confirmed, so
   * that a crash in between cannot leave an undeclared hole.
   */
  readonly skipFrom?: bigint | undefined;
  /**
   * The highest ID ever written in an outbox commit: every ID up to it reached the broker or is
   * still in the outbox. Explicit IDs resume at least there, whatever the broker reports (a broker
   * that forgot the name reports less).
   */
  readonly outboxHigh?: bigint | undefined;
}

/** How a producer's publishing IDs are chosen. */
export type IdMode = 'auto' | 'explicit' | 'keyed';

const META_VERSION = 1;
/** Version 2 adds `skipFrom` and `outboxHigh` (written only when one is set: otherwise version 1). */
const META_VERSION_SKIP = 2;
const SEGMENT_VERSION = 1;
/** Version 2 adds the sub-entry batches of the segment (docs/design.md §10). */
const SEGMENT_VERSION_BATCHES = 2;
/** The most messages one sub-entry batch holds (the protocol's u16 record count). */
export const MAX_SUB_ENTRY_SIZE = 65_535;
const ID_MODES: readonly IdMode[] = ['auto', 'explicit', 'keyed'];

function corrupt(what: string, detail: string): DedupError {
  return new DedupError('DEDUP_STORE_CORRUPT', `store record ${what} cannot be decoded: ${detail}`);
}

/**
 * Encodes producer metadata: version, mode, lastId, reservedUpTo (18 bytes); version 2 adds a
 * pending skip's first ID and the outbox's high-water mark (0 for none; 34 bytes).
 */
export function encodeMeta(meta: ProducerMeta): Buffer {
  const skipFrom = meta.skipFrom ?? 0n;
  const outboxHigh = meta.outboxHigh ?? 0n;
  const v2 = skipFrom > 0n || outboxHigh > 0n;
  const buf = Buffer.allocUnsafe(v2 ? 34 : 18);
  buf.writeUInt8(v2 ? META_VERSION_SKIP : META_VERSION, 0);
  buf.writeUInt8(ID_MODES.indexOf(meta.idMode), 1);
  buf.writeBigUInt64BE(meta.lastId, 2);
  buf.writeBigUInt64BE(meta.reservedUpTo, 10);
  if (v2) {
    buf.writeBigUInt64BE(skipFrom, 18);
    buf.writeBigUInt64BE(outboxHigh, 26);
  }
  return buf;
}

/** @throws DedupError `DEDUP_STORE_CORRUPT` on anything but a well-formed record. */
export function decodeMeta(buf: Uint8Array, what = 'meta'): ProducerMeta {
  const b = Buffer.from(buf.buffer, buf.byteOffset, buf.byteLength);
  const version = b.length > 0 ? b.readUInt8(0) : -1;
  const expected = version === META_VERSION_SKIP ? 34 : 18;
  if (buf.length !== expected) throw corrupt(what, `expected ${expected} bytes, got ${buf.length}`);
  if (version !== META_VERSION && version !== META_VERSION_SKIP)
    throw corrupt(what, `unknown version ${version}`);
  const idMode = ID_MODES[b.readUInt8(1)];
  if (idMode === undefined) throw corrupt(what, `unknown id mode ${b.readUInt8(1)}`);
  const lastId = b.readBigUInt64BE(2);
  const reservedUpTo = b.readBigUInt64BE(10);
  if (version === META_VERSION) return { idMode, lastId, reservedUpTo };
  const skipFrom = b.readBigUInt64BE(18);
  const outboxHigh = b.readBigUInt64BE(26);
  if (skipFrom === 0n && outboxHigh === 0n)
    throw corrupt(what, 'a version 2 record with nothing of version 2');
  return {
    idMode,
    lastId,
    reservedUpTo,
    ...(skipFrom === 0n ? {} : { skipFrom }),
    ...(outboxHigh === 0n ? {} : { outboxHigh }),
  };
}

/**
 * Encodes a flush segment: every message of one group commit in a single record, so that the hot
 * path writes one LevelDB value per flush instead of one per message (docs/design.md §3, LevelDB costs).
 * Layout: u8 version, u32 count, then per entry u64 id, u32 header-JSON length, header JSON,
 * u16 key length, key (UTF-8), u32 body length, body.
 *
 * With `batches` (the sizes of the segment's sub-entry batches, in order, summing to the count:
 * docs/design.md §10) the record is version 2: after the count come u32 batch count and one u16
 * size per batch. Without, it is version 1, byte for byte what earlier versions wrote.
 */
export function encodeSegment(entries: readonly OutboxEntry[], batches?: readonly number[]): Buffer {
  const headerJson: (Buffer | undefined)[] = new Array<Buffer | undefined>(entries.length);
  const prefix = batches === undefined ? 5 : 9 + 2 * batches.length;
  let size = prefix;
  for (let i = 0; i < entries.length; i++) {
    const e = entries[i]!;
    const h = e.headers === undefined ? undefined : Buffer.from(JSON.stringify(e.headers), 'utf8');
    headerJson[i] = h;
    size += 18 + (h?.length ?? 0) + (e.key === undefined ? 0 : utf8Length(e.key)) + e.body.length;
  }
  const buf = Buffer.allocUnsafe(size);
  buf.writeUInt8(batches === undefined ? SEGMENT_VERSION : SEGMENT_VERSION_BATCHES, 0);
  buf.writeUInt32BE(entries.length, 1);
  let o = 5;
  if (batches !== undefined) {
    buf.writeUInt32BE(batches.length, 5);
    o = 9;
    for (const n of batches) {
      buf.writeUInt16BE(n, o);
      o += 2;
    }
  }
  for (let i = 0; i < entries.length; i++) {
    const e = entries[i]!;
    const h = headerJson[i];
    writeUint64BE(buf, e.publishingId, o);
    o += 8;
    buf.writeUInt32BE(h?.length ?? 0, o);
    o += 4;
    if (h !== undefined) o += h.copy(buf, o);
    const keyLength = e.key === undefined ? 0 : writeUtf8(buf, e.key, o + 2);
    buf.writeUInt16BE(keyLength, o);
    o += 2 + keyLength;
    buf.writeUInt32BE(e.body.length, o);
    o += 4;
    buf.set(e.body, o);
    o += e.body.length;
  }
  return buf;
}

/** Strings up to this many UTF-16 units are measured and written by a loop while they are ASCII. */
const SHORT = 64;

/** The UTF-8 length of a string (domain keys: short, mostly ASCII, two per keyed send). */
function utf8Length(s: string): number {
  if (s.length <= SHORT) {
    let i = 0;
    while (i < s.length && s.charCodeAt(i) < 0x80) i++;
    if (i === s.length) return s.length;
  }
  return Buffer.byteLength(s, 'utf8');
}

/** Writes a string as UTF-8 at `o`; returns the bytes written. Short ASCII strings skip the call into C++. */
function writeUtf8(buf: Buffer, s: string, o: number): number {
  if (s.length <= SHORT) {
    let i = 0;
    for (; i < s.length; i++) {
      const c = s.charCodeAt(i);
      if (c >= 0x80) break;
      buf[o + i] = c;
    }
    if (i === s.length) return i;
  }
  return buf.write(s, o, 'utf8');
}

/**
 * The 5-byte header both segment kinds share: u8 version, u32 entry count. A count that cannot
 * fit the bytes (each entry at least `minEntry` bytes) is corrupt before anything is allocated.
 */
function segmentHeader(
  input: Uint8Array,
  versions: readonly number[],
  minEntry: number,
  what: string,
  noun: string,
): { buf: Buffer; count: number; version: number } {
  const buf = Buffer.from(input.buffer, input.byteOffset, input.byteLength);
  if (buf.length < 5) throw corrupt(what, 'truncated header');
  const version = buf.readUInt8(0);
  if (!versions.includes(version)) throw corrupt(what, `unknown version ${version}`);
  const count = buf.readUInt32BE(1);
  if (count === 0 || count > (buf.length - 5) / minEntry)
    throw corrupt(what, `impossible ${noun} count ${count}`);
  return { buf, count, version };
}

/** A decoded outbox segment: its messages, and its sub-entry batches when it has them. */
export interface DecodedSegment {
  readonly entries: OutboxEntry[];
  /** Sizes of the sub-entry batches, in order (version 2); `undefined`: one message per entry. */
  readonly batches: readonly number[] | undefined;
}

/** @throws DedupError `DEDUP_STORE_CORRUPT` on anything but a well-formed segment. */
export function decodeSegment(input: Uint8Array, what = 'segment'): OutboxEntry[] {
  return decodeSegmentRecord(input, what).entries;
}

/**
 * A segment with its sub-entry batches.
 *
 * @throws DedupError `DEDUP_STORE_CORRUPT` on anything but a well-formed segment (batch sizes
 *   that are zero, above 65 535, or do not sum to the message count included).
 */
export function decodeSegmentRecord(input: Uint8Array, what = 'segment'): DecodedSegment {
  const { buf, count, version } = segmentHeader(
    input,
    [SEGMENT_VERSION, SEGMENT_VERSION_BATCHES],
    18,
    what,
    'entry',
  );
  const entries: OutboxEntry[] = [];
  let o = 5;
  let batches: number[] | undefined;
  if (version === SEGMENT_VERSION_BATCHES) {
    if (buf.length < 9) throw corrupt(what, 'truncated batch count');
    const n = buf.readUInt32BE(5);
    if (n === 0 || n > count || 9 + 2 * n > buf.length) throw corrupt(what, `impossible batch count ${n}`);
    batches = new Array<number>(n);
    let sum = 0;
    for (let i = 0; i < n; i++) {
      const size = buf.readUInt16BE(9 + 2 * i);
      if (size === 0) throw corrupt(what, `batch ${i} is empty`);
      batches[i] = size;
      sum += size;
    }
    if (sum !== count) throw corrupt(what, `batches hold ${sum} messages, the segment ${count}`);
    o = 9 + 2 * n;
  }
  let previous = 0n;
  for (let i = 0; i < count; i++) {
    if (o + 12 > buf.length) throw corrupt(what, `entry ${i} truncated`);
    const publishingId = buf.readBigUInt64BE(o);
    if (publishingId <= previous) throw corrupt(what, `entry ${i} id ${publishingId} is not increasing`);
    previous = publishingId;
    const hLen = buf.readUInt32BE(o + 8);
    o += 12;
    if (o + hLen + 6 > buf.length) throw corrupt(what, `entry ${i} headers truncated`);
    let headers: Headers | undefined;
    if (hLen > 0) {
      headers = parseHeaders(buf.toString('utf8', o, o + hLen), what, i);
      o += hLen;
    }
    const kLen = buf.readUInt16BE(o);
    o += 2;
    if (o + kLen + 4 > buf.length) throw corrupt(what, `entry ${i} key truncated`);
    const key = kLen === 0 ? undefined : buf.toString('utf8', o, o + kLen);
    o += kLen;
    const bLen = buf.readUInt32BE(o);
    o += 4;
    if (o + bLen > buf.length) throw corrupt(what, `entry ${i} body truncated`);
    entries.push({ publishingId, body: buf.subarray(o, o + bLen), headers, key });
    o += bLen;
  }
  if (o !== buf.length) throw corrupt(what, `${buf.length - o} trailing bytes`);
  return { entries, batches };
}

function parseHeaders(text: string, what: string, i: number): Headers {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (err) {
    throw new DedupError('DEDUP_STORE_CORRUPT', `store record ${what} entry ${i}: headers are not JSON`, {
      cause: err,
    });
  }
  if (typeof value !== 'object' || value === null || Array.isArray(value)) {
    throw corrupt(what, `entry ${i} headers are not an object`);
  }
  const out: Record<string, string | number> = {};
  for (const [k, v] of Object.entries(value)) {
    if (typeof v !== 'string' && typeof v !== 'number')
      throw corrupt(what, `entry ${i} header ${k} has type ${typeof v}`);
    // defineProperty, not assignment: a header named __proto__ must stay a plain header.
    Object.defineProperty(out, k, { value: v, enumerable: true, writable: true, configurable: true });
  }
  return out;
}

/** A key's record: the ID it was first published with, and when (ms since the epoch). */
export interface KeyRecord {
  readonly publishingId: bigint;
  readonly createdAtMs: number;
}

/** One domain key of a group commit. */
export interface KeyEntry extends KeyRecord {
  readonly key: string;
}

const KEY_SEGMENT_VERSION = 1;

/**
 * Encodes the keys first published in one group commit as one record (the hot path writes few,
 * large records). Layout: u8 version, u32 count, then per key u64 id, u64 created-at ms, u16 key
 * length, key (UTF-8).
 */
export function encodeKeySegment(entries: readonly KeyEntry[]): Buffer {
  let size = 5;
  const lengths = entries.map((e) => utf8Length(e.key));
  for (const len of lengths) size += 18 + len;
  const buf = Buffer.allocUnsafe(size);
  buf.writeUInt8(KEY_SEGMENT_VERSION, 0);
  buf.writeUInt32BE(entries.length, 1);
  let o = 5;
  for (let i = 0; i < entries.length; i++) {
    const e = entries[i]!;
    writeUint64BE(buf, e.publishingId, o);
    writeSafeUint64BE(buf, Math.max(0, Math.floor(e.createdAtMs)), o + 8);
    buf.writeUInt16BE(lengths[i]!, o + 16);
    o += 18;
    o += writeUtf8(buf, e.key, o);
  }
  return buf;
}

/** @throws DedupError `DEDUP_STORE_CORRUPT` on anything but a well-formed key segment. */
export function decodeKeySegment(input: Uint8Array, what = 'key segment'): KeyEntry[] {
  const { buf, count } = segmentHeader(input, [KEY_SEGMENT_VERSION], 19, what, 'key');
  const entries: KeyEntry[] = [];
  let o = 5;
  let previous = 0n;
  for (let i = 0; i < count; i++) {
    if (o + 18 > buf.length) throw corrupt(what, `key ${i} truncated`);
    const publishingId = buf.readBigUInt64BE(o);
    if (publishingId <= previous) throw corrupt(what, `key ${i} id ${publishingId} is not increasing`);
    previous = publishingId;
    const createdAtMs = Number(buf.readBigUInt64BE(o + 8));
    const len = buf.readUInt16BE(o + 16);
    o += 18;
    if (len === 0 || o + len > buf.length) throw corrupt(what, `key ${i} has a bad length`);
    entries.push({ key: buf.toString('utf8', o, o + len), publishingId, createdAtMs });
    o += len;
  }
  if (o !== buf.length) throw corrupt(what, `${buf.length - o} trailing bytes`);
  return entries;
}

const PARTITION_LIST_VERSION = 1;

/**
 * Encodes a super stream's partition list, in the broker's order (hash routing depends on it).
 * Layout: u8 version, u16 count, then per partition u16 length and the name in UTF-8.
 */
export function encodePartitionList(partitions: readonly string[]): Buffer {
  const names = partitions.map((p) => Buffer.from(p, 'utf8'));
  const buf = Buffer.allocUnsafe(3 + names.reduce((n, b) => n + 2 + b.length, 0));
  buf.writeUInt8(PARTITION_LIST_VERSION, 0);
  buf.writeUInt16BE(names.length, 1);
  let o = 3;
  for (const name of names) {
    buf.writeUInt16BE(name.length, o);
    o += 2 + name.copy(buf, o + 2);
  }
  return buf;
}

/** @throws DedupError `DEDUP_STORE_CORRUPT` on anything but a well-formed partition list. */
export function decodePartitionList(input: Uint8Array, what = 'partition list'): string[] {
  const buf = Buffer.from(input.buffer, input.byteOffset, input.byteLength);
  if (buf.length < 3) throw corrupt(what, 'truncated header');
  if (buf.readUInt8(0) !== PARTITION_LIST_VERSION) throw corrupt(what, `unknown version ${buf.readUInt8(0)}`);
  const count = buf.readUInt16BE(1);
  if (count === 0) throw corrupt(what, 'no partitions');
  const out: string[] = [];
  let o = 3;
  for (let i = 0; i < count; i++) {
    if (o + 2 > buf.length) throw corrupt(what, `partition ${i} truncated`);
    const len = buf.readUInt16BE(o);
    o += 2;
    if (len === 0 || o + len > buf.length) throw corrupt(what, `partition ${i} has a bad length`);
    out.push(buf.toString('utf8', o, o + len));
    o += len;
  }
  if (o !== buf.length) throw corrupt(what, `${buf.length - o} trailing bytes`);
  return out;
}
