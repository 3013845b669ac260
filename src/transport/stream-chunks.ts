/**
 * Decodes the chunk of one stream-protocol Deliver frame (key 0x0008, versions 1 and 2) into its
 * records, each with its offset: the verifying stream consumer's and `readStreamToEnd`'s reader
 * (hooked into the client by `stream-client-internals.ts`, `decodeDeliveriesOurselves`).
 *
 * Why our own: rabbitmq-stream-js-client 1.0 (`response_decoder.js`, `decodeDeliverResponse`)
 * reads a chunk whose first entry is a sub-entry batch as that one batch only, numbers its
 * records 0, 1, … instead of from the chunk's first offset, and fails on a chunk that mixes plain
 * entries and batches — the chunks a sub-entry publisher writes (issue #19, docs/design.md §10).
 * Measured against RabbitMQ 4.0: a consumer subscribed at an offset inside a chunk (inside a
 * batch, say) is sent the whole chunk and drops the records below that offset, so the client's
 * offsets lost records (subscribed at 7 inside a batch of three from 6, it delivered none).
 *
 * Layout (the OSIRIS chunk as the stream protocol sends it, PROTOCOL.adoc "Deliver"): u8 magic
 * (high nibble 5) and version, u8 chunk type (0 user data; tracking chunks carry no messages),
 * u16 entries, u32 records, i64 timestamp, u64 epoch, u64 first offset, i32 CRC, u32 data length,
 * u32 trailer length, u32 reserved; then the data: `entries` entries, each either a plain record
 * (u32 size, top bit 0, and an AMQP 1.0 message) or a sub-entry batch (u8 0x80 | codec << 4,
 * u16 records, u32 uncompressed length, u32 data length, then the data, decompressed a sequence
 * of u32 size + message). A record's offset is the chunk's first offset plus its index among all
 * records of the chunk, batch members included.
 *
 * Memory: a compressed batch announces its uncompressed length (a u32), and gzip inflates up to
 * 1 032 times: a 261 KB Deliver frame once inflated into 256 MiB (issue 32). The batches of one
 * chunk may inflate together to {@link INFLATE_RATIO} times the chunk's data bytes, or to
 * {@link ChunkLimits.maxInflatedBytes} (16 MiB by default) where that is more: each batch's
 * announced length is checked against what the chunk has left BEFORE it is inflated, and the
 * inflate itself stops at the announced length (zlib's `maxOutputLength`). Everything else a chunk
 * holds arrived on the wire; its messages decode into O(N) values (`amqp10-decode.ts`).
 *
 * Why a ratio as well as a ceiling: the broker puts many entries in one chunk. stream-dedup's own
 * publisher, gzip and 56 KB JSON bodies (20× compression), wrote chunks of 17+ batches of 1 MiB
 * each, which a 16 MiB ceiling alone refused (its own stream, unreadable for good). Data that
 * compresses more than 64× in chunks of more than 16 MiB inflated needs a larger ceiling.
 *
 * Codecs: 0 none, 1 gzip (Node's zlib), 4 zstd where this Node's zlib has it (22.15 on). Snappy
 * (2) and lz4 (3) would need a native or hand-written codec: a chunk holding them is refused by
 * name rather than misread. The chunk's CRC is not checked, as the client does not: Node 20's
 * zlib has no CRC32 (22.2 on), and TCP checks the bytes in transit.
 */
import { CODEC_CODES, CODEC_NAMES, inflateOf } from './compression.js';
import type { ChunkIdentity } from '../store/chunk-identity.js';
import { ChunkDecodeError, readMessage, take, type Amqp10Message, type Cursor } from './amqp10-decode.js';

/** The stream protocol's Deliver key. */
export const DELIVER_KEY = 0x0008;
/** The chunk header's size in bytes, before the first entry. */
const CHUNK_HEADER = 48;
/** OSIRIS's chunk magic, in the high nibble of the chunk's first byte. */
const CHUNK_MAGIC = 0x5;
/** Chunk type of user data: the only one that carries messages. */
const CHUNK_USER = 0;
/** u8 type, u16 records, u32 uncompressed length, u32 data length. */
const SUB_ENTRY_HEADER = 11;

/**
 * The default of {@link ChunkLimits.maxInflatedBytes}: 16 MiB, 16 times the largest Publish frame a
 * writer may send under RabbitMQ's default `stream.frame_max` (1 MiB). stream-dedup's own
 * publisher cuts batches whose records fit one frame uncompressed.
 */
export const DEFAULT_MAX_INFLATED_BYTES: number = 16 * 1_048_576;

/**
 * The compressed batches of a chunk may always inflate to this many times the chunk's data bytes
 * (whatever {@link ChunkLimits.maxInflatedBytes} says): ordinary data (JSON 5-20×, logs up to
 * ~50×) in chunks of many batches. Decoding N bytes so retains O(64·N + maxInflatedBytes).
 */
export const INFLATE_RATIO = 64;

/**
 * A chunk decodes into at most this many values per byte of its data as it arrived (and at least
 * {@link MIN_CHUNK_VALUES}): a value costs ~40 bytes of heap and gzip inflates ~1 000×, so a bound
 * on inflated bytes alone let a 15 KB frame of gzip'd empty maps decode into 458 MiB. Ordinary data
 * decodes into a few values per byte that arrived (a message's headers compress well; its body is
 * one value).
 */
export const VALUES_PER_BYTE = 16;
/** The fewest values a chunk may decode into, whatever its size. */
export const MIN_CHUNK_VALUES = 65_536;

/** Ceilings of the chunk decoder. */
export interface ChunkLimits {
  /**
   * The most bytes the compressed sub-entry batches of one chunk may inflate to, together (so
   * also each batch), unless {@link INFLATE_RATIO} times the chunk's data bytes is more: a batch
   * announcing more than the chunk has left is refused before it is inflated.
   * @defaultValue {@link DEFAULT_MAX_INFLATED_BYTES}
   */
  readonly maxInflatedBytes: number;
}

const DEFAULT_LIMITS: ChunkLimits = Object.freeze({ maxInflatedBytes: DEFAULT_MAX_INFLATED_BYTES });

/** A record of a chunk: an AMQP 1.0 message with its offset. */
export interface ChunkRecord extends Amqp10Message {
  /** The record's offset in the stream. */
  readonly offset: bigint;
}

/** One decoded chunk. */
export interface StreamChunk {
  /** 0 for user data; other types (tracking) carry no messages and come with `messages` empty. */
  readonly chunkType: number;
  /** The offset of the chunk's first record (its chunk ID). */
  readonly firstOffset: bigint;
  /** The timestamp its writer gave it, in ms since the epoch. */
  readonly timestamp: bigint;
  /** Records the chunk holds (batch members counted one by one). */
  readonly numRecords: number;
  /** The records, in stream order, each with its offset; empty for a chunk that is not user data. */
  readonly messages: ChunkRecord[];
}

/** One decoded Deliver frame. */
export interface DeliverFrame {
  /** 1 or 2 (version 2 carries the committed chunk ID). */
  readonly version: 1 | 2;
  /** The subscription the chunk is for (the client finds its consumer by it). */
  readonly subscriptionId: number;
  /** The stream's committed chunk ID (version 2 only). */
  readonly committedChunkId: bigint | undefined;
  /** The chunk it carries. */
  readonly chunk: StreamChunk;
}

/**
 * Decodes a Deliver frame: `frame[start, end)` from its key to its end (the u32 size before it not
 * included).
 *
 * @throws ChunkDecodeError when it is not a Deliver frame of version 1 or 2, or its chunk is
 *   malformed (see {@link decodeChunk}).
 */
export function decodeDeliverFrame(
  frame: Buffer,
  start: number = 0,
  end: number = frame.length,
  limits: ChunkLimits = DEFAULT_LIMITS,
): DeliverFrame {
  checkRange(frame, start, end);
  const c: Cursor = { buf: frame, pos: start, end, allowance: 0 };
  const at = take(c, 5, 'Deliver frame header');
  const key = frame.readUInt16BE(at);
  const version = frame.readUInt16BE(at + 2);
  if (key !== DELIVER_KEY) throw new ChunkDecodeError(`not a Deliver frame: key 0x${key.toString(16)}`);
  if (version !== 1 && version !== 2) {
    throw new ChunkDecodeError(`Deliver frame of version ${version}: only versions 1 and 2 are known`);
  }
  const subscriptionId = frame[at + 4]!;
  const committedChunkId =
    version === 2 ? frame.readBigUInt64BE(take(c, 8, 'Deliver committed chunk ID')) : undefined;
  return { version, subscriptionId, committedChunkId, chunk: decodeChunk(frame, c.pos, end, limits) };
}

/**
 * Decodes one chunk: `bytes[start, end)` from its magic byte on. Bytes after its data (a trailer)
 * are not read.
 *
 * @throws ChunkDecodeError when the chunk is truncated, its magic is wrong, an entry or record
 *   runs past its bounds, its entries hold another number of records than its header says, a
 *   record is not a well-formed AMQP 1.0 message, a batch uses a codec this process cannot read,
 *   or the chunk's compressed batches announce more than `limits.maxInflatedBytes` uncompressed.
 */
export function decodeChunk(
  bytes: Buffer,
  start: number = 0,
  end: number = bytes.length,
  limits: ChunkLimits = DEFAULT_LIMITS,
): StreamChunk {
  checkRange(bytes, start, end);
  const c: Cursor = { buf: bytes, pos: start, end, allowance: 0 };
  const h = take(c, CHUNK_HEADER, 'chunk header');
  if (bytes[h]! >> 4 !== CHUNK_MAGIC) {
    throw new ChunkDecodeError(`not an OSIRIS chunk: magic byte 0x${bytes[h]!.toString(16)}`);
  }
  const chunkType = bytes[h + 1]!;
  const numEntries = bytes.readUInt16BE(h + 2);
  const numRecords = bytes.readUInt32BE(h + 4);
  const timestamp = bytes.readBigInt64BE(h + 8);
  const firstOffset = bytes.readBigUInt64BE(h + 24);
  const dataLength = bytes.readUInt32BE(h + 36);
  if (dataLength > end - c.pos) {
    throw new ChunkDecodeError(
      `truncated chunk at offset ${firstOffset}: its data is ${dataLength} bytes, ${end - c.pos} arrived`,
    );
  }
  const messages: ChunkRecord[] = [];
  // Tracking chunks (offsets, producer sequences) are the broker's, not the application's.
  if (chunkType !== CHUNK_USER) return { chunkType, firstOffset, timestamp, numRecords, messages };
  // One object per chunk, shared by its records: the consumer stores it with its offset.
  const identity: ChunkIdentity = { firstOffset, timestamp };
  const dataEnd = c.pos + dataLength;
  c.end = dataEnd;
  let next = firstOffset;
  const budget = Math.max(limits.maxInflatedBytes, INFLATE_RATIO * dataLength);
  const inflate = { left: budget, limit: budget };
  // Values, like inflated bytes, are paid for with the bytes that arrived, not the inflated ones.
  c.values = { left: Math.max(MIN_CHUNK_VALUES, VALUES_PER_BYTE * dataLength) };
  for (let entry = 0; entry < numEntries; entry++) {
    if (c.pos >= dataEnd) {
      throw new ChunkDecodeError(
        `chunk at offset ${firstOffset} announces ${numEntries} entries, its data holds ${entry}`,
      );
    }
    if ((bytes[c.pos]! & 0x80) === 0) {
      // A plain entry: one record.
      const size = bytes.readUInt32BE(take(c, 4, 'record size'));
      if (size > dataEnd - c.pos) throw recordBeyond(firstOffset, next, size, dataEnd - c.pos);
      if (messages.length >= numRecords) throw tooMany(firstOffset, numRecords);
      messages.push(readMessage(c, c.pos + size, next, identity) as ChunkRecord);
      next++;
    } else {
      next = readSubEntries(c, dataEnd, messages, identity, numRecords, next, inflate);
    }
  }
  if (c.pos !== dataEnd) {
    throw new ChunkDecodeError(
      `chunk at offset ${firstOffset} holds ${dataEnd - c.pos} bytes after its ${numEntries} entries`,
    );
  }
  if (messages.length !== numRecords) {
    throw new ChunkDecodeError(
      `chunk at offset ${firstOffset} announces ${numRecords} records, its entries hold ${messages.length}`,
    );
  }
  return { chunkType, firstOffset, timestamp, numRecords, messages };
}

/**
 * Reads one sub-entry batch at `c.pos` into `messages`; returns the offset after its last record.
 * A compressed batch takes its announced length from `inflate.left`, the chunk's ceiling.
 */
function readSubEntries(
  c: Cursor,
  dataEnd: number,
  messages: ChunkRecord[],
  chunk: ChunkIdentity,
  numRecords: number,
  next: bigint,
  inflate: { left: number; readonly limit: number },
): bigint {
  const bytes = c.buf;
  const h = take(c, SUB_ENTRY_HEADER, 'sub-entry batch header');
  const codec = (bytes[h]! >> 4) & 0x7;
  const count = bytes.readUInt16BE(h + 1);
  const uncompressed = bytes.readUInt32BE(h + 3);
  const length = bytes.readUInt32BE(h + 7);
  if (length > dataEnd - c.pos) {
    throw new ChunkDecodeError(
      `sub-entry batch at offset ${next} announces ${length} bytes, the chunk holds ${dataEnd - c.pos} more`,
    );
  }
  if (count > numRecords - messages.length) throw tooMany(chunk.firstOffset, numRecords);
  const start = c.pos;
  c.pos += length;
  // Uncompressed, the records are read where they lie; a codec gives a buffer of their own.
  let inner: Cursor;
  if (codec === 0) {
    inner = { buf: bytes, pos: start, end: start + length, allowance: 0, values: c.values };
  } else {
    // Before inflating anything: the announced length is the most the inflate may produce.
    if (uncompressed > inflate.left) {
      throw new ChunkDecodeError(
        `sub-entry batch at offset ${next} announces ${uncompressed} bytes uncompressed; the chunk's ` +
          `compressed batches may inflate to ${inflate.limit} bytes together (maxInflatedBytes, or ` +
          `${INFLATE_RATIO} times the chunk's data where that is more), ` +
          `${inflate.left} are left`,
      );
    }
    inflate.left -= uncompressed;
    const data = decompress(codec, bytes.subarray(start, start + length), uncompressed, next);
    inner = { buf: data, pos: 0, end: data.length, allowance: 0, values: c.values };
  }
  if (inner.end - inner.pos !== uncompressed) {
    throw new ChunkDecodeError(
      `sub-entry batch at offset ${next} announces ${uncompressed} bytes uncompressed, it holds ${inner.end - inner.pos}`,
    );
  }
  for (let i = 0; i < count; i++) {
    const size = inner.buf.readUInt32BE(take(inner, 4, 'sub-entry record size'));
    if (size > inner.end - inner.pos)
      throw recordBeyond(chunk.firstOffset, next, size, inner.end - inner.pos);
    messages.push(readMessage(inner, inner.pos + size, next, chunk) as ChunkRecord);
    next++;
  }
  if (inner.pos !== inner.end) {
    throw new ChunkDecodeError(
      `sub-entry batch ending at offset ${next - 1n} holds ${inner.end - inner.pos} bytes after its ${count} records`,
    );
  }
  return next;
}

/** The records of a compressed batch, at most `uncompressed` bytes of them (a bomb stops there). */
function decompress(codec: number, data: Buffer, uncompressed: number, offset: bigint): Buffer {
  const options = { maxOutputLength: Math.max(1, uncompressed) };
  const inflate = inflateOf(codec);
  if (inflate === undefined && codec === CODEC_CODES.zstd) {
    throw new ChunkDecodeError(
      `sub-entry batch at offset ${offset} is compressed with zstd, which needs Node.js >= 22.15 ` +
        `(zlib.zstdDecompressSync); this is Node.js ${process.versions.node}`,
    );
  }
  if (inflate === undefined) {
    throw new ChunkDecodeError(
      `sub-entry batch at offset ${offset} is compressed with ${CODEC_NAMES[codec]}, which stream-dedup ` +
        'does not read (it reads none, gzip, and zstd on Node.js >= 22.15)',
    );
  }
  try {
    return inflate(data, options);
  } catch (err) {
    throw new ChunkDecodeError(
      `sub-entry batch at offset ${offset} does not decompress (${CODEC_NAMES[codec]}): ${
        err instanceof Error ? err.message : String(err)
      }`,
      { cause: err },
    );
  }
}

function checkRange(bytes: Buffer, start: number, end: number): void {
  if (start < 0 || end > bytes.length || start > end) {
    throw new RangeError(`Expected 0 <= start <= end <= ${bytes.length}, got ${start} and ${end}`);
  }
}

function recordBeyond(chunk: bigint, offset: bigint, size: number, left: number): ChunkDecodeError {
  return new ChunkDecodeError(
    `record at offset ${offset} (chunk ${chunk}) announces ${size} bytes, ${left} are left`,
  );
}

function tooMany(chunk: bigint, numRecords: number): ChunkDecodeError {
  return new ChunkDecodeError(
    `chunk at offset ${chunk} holds more records than the ${numRecords} it announces`,
  );
}
