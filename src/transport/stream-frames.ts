/**
 * Encodes stream-protocol Publish frames (key 0x0002, version 1) with AMQP 1.0 messages, for the
 * stream transport's hot path. The client's own encoder formats every frame for a debug log even
 * when logging is off and walks the application properties several times per message, which
 * costs two thirds of its throughput once two identity properties are stamped (measured: 392k →
 * 118–138k msg/s); these frames carry the bytes the client would send.
 *
 * Message layout: application-properties section (described 0x74, map8 or map32 of str8/str32 keys to
 * str8/str32 or int values, the identity stamps first) then one data section (described 0x75,
 * vbin8/vbin32).
 */
import { ID_HEADER, PRODUCER_HEADER } from '../identity/headers.js';
import { decimalLength, writeDecimal, writeUint64BE } from '../identity/publishing-id.js';
import type { Headers } from '../store/codec.js';
import { InvariantError } from '../publisher/errors.js';
import type { OutgoingMessage } from '../publisher/types.js';
import { CODEC_CODES, compress } from './compression.js';
import type { SubEntryCompression } from './stream-options.js';

const PUBLISH_KEY = 0x0002;
const PUBLISH_VERSION = 1;
/** u32 size, u16 key, u16 version, u8 publisher id, u32 message count. */
const FRAME_HEADER = 4 + 2 + 2 + 1 + 4;
/** u64 publishing id, u32 message length. */
const ENTRY_HEADER = 8 + 4;
/** u64 publishing id, u8 entry type, u16 record count, u32 uncompressed length, u32 data length. */
const SUB_ENTRY_HEADER = 8 + 1 + 2 + 4 + 4;
/** The entry type's top bit: a sub-entry batch (the codec in bits 4-6). */
const SUB_ENTRY_FLAG = 0x80;

/** map8 (code, size, count: 3 bytes) while size and count fit a byte; map32 (9 bytes) beyond. */
function mapHeaderSize(content: number): number {
  return content + 1 <= 255 ? 3 : 9;
}

/** Bytes of an AMQP 1.0 string (str8 or str32) holding `byteLength` UTF-8 bytes. */
function strSize(byteLength: number): number {
  return byteLength <= 255 ? 2 + byteLength : 5 + byteLength;
}

function writeStr(buf: Buffer, o: number, value: string, byteLength: number): number {
  if (byteLength <= 255) {
    buf[o] = 0xa1;
    buf[o + 1] = byteLength;
    o += 2;
  } else {
    buf[o] = 0xb1;
    buf.writeUInt32BE(byteLength, o + 1);
    o += 5;
  }
  return o + buf.write(value, o, byteLength, 'utf8');
}

function encodeStr(value: string): Buffer {
  const len = Buffer.byteLength(value, 'utf8');
  const buf = Buffer.allocUnsafe(strSize(len));
  writeStr(buf, 0, value, len);
  return buf;
}

/** Size of the caller's own headers inside the map (keys and values). */
function headersSize(headers: Headers): number {
  let n = 0;
  for (const key of Object.keys(headers)) {
    const value = headers[key]!;
    n += strSize(Buffer.byteLength(key, 'utf8'));
    n += typeof value === 'string' ? strSize(Buffer.byteLength(value, 'utf8')) : 5;
  }
  return n;
}

function writeHeaders(buf: Buffer, o: number, headers: Headers): number {
  for (const key of Object.keys(headers)) {
    const value = headers[key]!;
    o = writeStr(buf, o, key, Buffer.byteLength(key, 'utf8'));
    if (typeof value === 'string') {
      o = writeStr(buf, o, value, Buffer.byteLength(value, 'utf8'));
    } else {
      buf[o] = 0x71;
      buf.writeInt32BE(value, o + 1);
      o += 5;
    }
  }
  return o;
}

/** Encodes the Publish frames of one producer, stamping its identity into every message. */
export class PublishFrameEncoder {
  /** `x-dedup-producer` → name, then the `x-dedup-id` key: the same bytes in every message. */
  readonly #stampPrefix: Buffer;
  readonly #publisherId: number;
  readonly #maxFrameSize: number;
  readonly #compression: SubEntryCompression;

  constructor(
    publisherId: number,
    producerName: string,
    maxFrameSize: number,
    compression: SubEntryCompression = 'none',
  ) {
    this.#publisherId = publisherId;
    this.#maxFrameSize = maxFrameSize;
    this.#compression = compression;
    this.#stampPrefix = Buffer.concat([
      encodeStr(PRODUCER_HEADER),
      encodeStr(producerName),
      encodeStr(ID_HEADER),
    ]);
  }

  /**
   * As few frames as fit the negotiated frame size, messages in order; the members of a sub-entry
   * batch (`message.batch`) as one entry with the last member's ID.
   *
   * @throws Error when `messages` holds part of a batch only: the core hands over whole batches,
   *   and a batch cut here would be deduplicated wrongly (docs/design.md §10).
   */
  encode(messages: readonly OutgoingMessage[]): Buffer[] {
    const sizes: number[] = new Array<number>(messages.length);
    const contents: number[] = new Array<number>(messages.length);
    let batched = false;
    for (let i = 0; i < messages.length; i++) {
      const m = messages[i]!;
      const body = m.body.length;
      // The map's entries: the stamps, the ID string, the caller's headers.
      const content =
        this.#stampPrefix.length +
        2 +
        decimalLength(m.publishingId) +
        (m.headers === undefined ? 0 : headersSize(m.headers));
      contents[i] = content;
      sizes[i] = 3 + mapHeaderSize(content) + content + 3 + (body <= 255 ? 2 : 5) + body;
      if (m.batch !== undefined) batched = true;
    }
    if (batched) return this.#encodeBatched(messages, sizes, contents);
    const frames: Buffer[] = [];
    let start = 0;
    while (start < messages.length) {
      let size = FRAME_HEADER;
      let end = start;
      for (; end < messages.length; end++) {
        const next = ENTRY_HEADER + sizes[end]!;
        if (end > start && size + next > this.#maxFrameSize) break;
        size += next;
      }
      frames.push(this.#frame(messages, sizes, contents, start, end, size));
      start = end;
    }
    return frames;
  }

  #frame(
    messages: readonly OutgoingMessage[],
    sizes: readonly number[],
    contents: readonly number[],
    start: number,
    end: number,
    size: number,
  ): Buffer {
    const buf = this.#frameHeader(size, end - start);
    let o = FRAME_HEADER;
    for (let i = start; i < end; i++) {
      writeUint64BE(buf, messages[i]!.publishingId, o);
      buf.writeUInt32BE(sizes[i]!, o + 8);
      o = this.#writeMessage(buf, o + ENTRY_HEADER, messages[i]!, contents[i]!);
    }
    return buf;
  }

  /** A Publish frame of `size` bytes announcing `entries` entries, its body still to write. */
  #frameHeader(size: number, entries: number): Buffer {
    const buf = Buffer.allocUnsafe(size);
    buf.writeUInt32BE(size - 4, 0);
    buf.writeUInt16BE(PUBLISH_KEY, 4);
    buf.writeUInt16BE(PUBLISH_VERSION, 6);
    buf[8] = this.#publisherId;
    buf.writeUInt32BE(entries, 9);
    return buf;
  }

  /**
   * The frames of messages some of which travel in sub-entry batches: each batch is one entry
   * (u64 last ID, u8 0x80 | codec << 4, u16 count, u32 uncompressed length, u32 data length, then
   * the data: per message u32 length and the message, compressed as a whole), every other
   * message an entry of its own.
   */
  #encodeBatched(
    messages: readonly OutgoingMessage[],
    sizes: readonly number[],
    contents: readonly number[],
  ): Buffer[] {
    // Each entry: its messages [start, end), its bytes on the wire, and for a batch its data's
    // uncompressed length and, compressed, the data (uncompressed it is written into the frame
    // directly: no copy of its own).
    const entries: Array<{
      start: number;
      end: number;
      bytes: number;
      batched: boolean;
      raw: number;
      packed: Buffer | undefined;
    }> = [];
    for (let i = 0; i < messages.length;) {
      const batch = messages[i]!.batch;
      if (batch === undefined) {
        entries.push({
          start: i,
          end: i + 1,
          bytes: ENTRY_HEADER + sizes[i]!,
          batched: false,
          raw: 0,
          packed: undefined,
        });
        i++;
        continue;
      }
      const end = i + batch.length;
      let raw = 0;
      for (let k = 0; k < batch.length; k++) {
        if (messages[i + k] !== batch[k]) {
          throw new InvariantError(
            `sub-entry batch ending at ID ${batch[batch.length - 1]!.publishingId} handed over in part`,
          );
        }
        raw += 4 + sizes[i + k]!;
      }
      let packed: Buffer | undefined;
      if (this.#compression !== 'none') {
        const data = Buffer.allocUnsafe(raw);
        this.#writeRecords(data, 0, messages, sizes, contents, i, end);
        packed = compress(this.#compression, data);
      }
      entries.push({
        start: i,
        end,
        bytes: SUB_ENTRY_HEADER + (packed?.length ?? raw),
        batched: true,
        raw,
        packed,
      });
      i = end;
    }
    const frames: Buffer[] = [];
    const codec = SUB_ENTRY_FLAG | (CODEC_CODES[this.#compression] << 4);
    for (let first = 0; first < entries.length;) {
      let size = FRAME_HEADER;
      let last = first;
      for (; last < entries.length; last++) {
        if (last > first && size + entries[last]!.bytes > this.#maxFrameSize) break;
        size += entries[last]!.bytes;
      }
      const buf = this.#frameHeader(size, last - first);
      let o = FRAME_HEADER;
      for (let n = first; n < last; n++) {
        const { start, end, batched, raw, packed } = entries[n]!;
        writeUint64BE(buf, messages[end - 1]!.publishingId, o);
        if (!batched) {
          buf.writeUInt32BE(sizes[start]!, o + 8);
          o = this.#writeMessage(buf, o + ENTRY_HEADER, messages[start]!, contents[start]!);
          continue;
        }
        buf[o + 8] = codec;
        buf.writeUInt16BE(end - start, o + 9);
        buf.writeUInt32BE(raw, o + 11);
        buf.writeUInt32BE(packed?.length ?? raw, o + 15);
        o += SUB_ENTRY_HEADER;
        o =
          packed === undefined
            ? this.#writeRecords(buf, o, messages, sizes, contents, start, end)
            : o + packed.copy(buf, o);
      }
      frames.push(buf);
      first = last;
    }
    return frames;
  }

  /** Writes messages [start, end) as a batch's records (each a u32 length and the message) at `o`. */
  #writeRecords(
    buf: Buffer,
    o: number,
    messages: readonly OutgoingMessage[],
    sizes: readonly number[],
    contents: readonly number[],
    start: number,
    end: number,
  ): number {
    for (let k = start; k < end; k++) {
      buf.writeUInt32BE(sizes[k]!, o);
      o = this.#writeMessage(buf, o + 4, messages[k]!, contents[k]!);
    }
    return o;
  }

  /** Writes one AMQP 1.0 message (its `content` bytes of map entries precomputed) at `o`. */
  #writeMessage(buf: Buffer, o: number, m: OutgoingMessage, content: number): number {
    const id = m.publishingId;
    // application-properties: described 0x74, a map { stamps..., headers... }: map8 when it
    // fits (3 header bytes), map32 otherwise (9).
    buf[o] = 0x00;
    buf[o + 1] = 0x53;
    buf[o + 2] = 0x74;
    const entries = 2 + (m.headers === undefined ? 0 : Object.keys(m.headers).length);
    // (A map of at most 254 bytes has fewer than 64 entries: the count fits a byte too.)
    if (mapHeaderSize(content) === 3) {
      buf[o + 3] = 0xc1;
      buf[o + 4] = content + 1;
      buf[o + 5] = entries * 2;
      o += 6;
    } else {
      buf[o + 3] = 0xd1;
      buf.writeUInt32BE(content + 4, o + 4);
      buf.writeUInt32BE(entries * 2, o + 8);
      o += 12;
    }
    o += this.#stampPrefix.copy(buf, o);
    o = writeIdString(buf, o, id);
    if (m.headers !== undefined) o = writeHeaders(buf, o, m.headers);
    // data: described 0x75, vbin8 / vbin32
    buf[o] = 0x00;
    buf[o + 1] = 0x53;
    buf[o + 2] = 0x75;
    const body = m.body;
    if (body.length <= 255) {
      buf[o + 3] = 0xa0;
      buf[o + 4] = body.length;
      o += 5;
    } else {
      buf[o + 3] = 0xb0;
      buf.writeUInt32BE(body.length, o + 4);
      o += 8;
    }
    buf.set(body, o);
    return o + body.length;
  }
}

/** The ID as an AMQP str8 of its decimal digits (at most 20: always str8). */
function writeIdString(buf: Buffer, o: number, id: bigint): number {
  buf[o] = 0xa1;
  const end = writeDecimal(buf, id, o + 2);
  buf[o + 1] = end - o - 2;
  return end;
}
