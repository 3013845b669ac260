import type { EventEmitter } from 'node:events';
import { gzipSync, gunzipSync } from 'node:zlib';
import { ResponseDecoder } from 'rabbitmq-stream-js-client/dist/response_decoder.js';

// Encoders of what the broker sends a stream consumer — AMQP 1.0 messages, OSIRIS chunks with
// plain entries and sub-entry batches, Deliver frames — written from the protocol's description
// (PROTOCOL.adoc "Deliver", AMQP 1.0 parts 1 and 3) as the inverse of
// src/transport/stream-chunks.ts, for its tests.

/** A message as the tests build it: application properties (string or int values) and a body. */
export interface TestMessage {
  readonly body: Uint8Array;
  readonly properties?: Readonly<Record<string, string | number>> | undefined;
}

/** str8 (up to 255 bytes) or str32. */
export function amqpString(value: string): Buffer {
  const bytes = Buffer.from(value, 'utf8');
  if (bytes.length <= 255) return Buffer.concat([Buffer.from([0xa1, bytes.length]), bytes]);
  const head = Buffer.alloc(5);
  head[0] = 0xb1;
  head.writeUInt32BE(bytes.length, 1);
  return Buffer.concat([head, bytes]);
}

/** int (0x71). */
export function amqpInt(value: number): Buffer {
  const b = Buffer.alloc(5);
  b[0] = 0x71;
  b.writeInt32BE(value, 1);
  return b;
}

/** vbin8 or vbin32. */
export function amqpBinary(value: Uint8Array): Buffer {
  if (value.length <= 255) return Buffer.concat([Buffer.from([0xa0, value.length]), value]);
  const head = Buffer.alloc(5);
  head[0] = 0xb0;
  head.writeUInt32BE(value.length, 1);
  return Buffer.concat([head, value]);
}

/** A list (list0, list8 or list32) of encoded elements. */
export function amqpList(elements: readonly Buffer[]): Buffer {
  return compound(0x45, 0xc0, 0xd0, elements);
}

/** A map (map8 or map32) of encoded keys and values, alternating. */
export function amqpMap(elements: readonly Buffer[]): Buffer {
  return compound(undefined, 0xc1, 0xd1, elements);
}

function compound(
  empty: number | undefined,
  small: number,
  wide: number,
  elements: readonly Buffer[],
): Buffer {
  if (elements.length === 0 && empty !== undefined) return Buffer.from([empty]);
  const body = Buffer.concat(elements);
  if (body.length + 1 <= 255 && elements.length <= 255) {
    return Buffer.concat([Buffer.from([small, body.length + 1, elements.length]), body]);
  }
  const head = Buffer.alloc(9);
  head[0] = wide;
  head.writeUInt32BE(body.length + 4, 1);
  head.writeUInt32BE(elements.length, 5);
  return Buffer.concat([head, body]);
}

/** A message section: 0x00, smallulong descriptor `code`, then the value. */
export function section(code: number, value: Buffer): Buffer {
  return Buffer.concat([Buffer.from([0x00, 0x53, code]), value]);
}

/** Application properties (when any) and one data section. */
export function encodeMessage(m: TestMessage): Buffer {
  const parts: Buffer[] = [];
  if (m.properties !== undefined) {
    const elements: Buffer[] = [];
    for (const [key, value] of Object.entries(m.properties)) {
      elements.push(amqpString(key), typeof value === 'string' ? amqpString(value) : amqpInt(value));
    }
    parts.push(section(0x74, amqpMap(elements)));
  }
  parts.push(section(0x75, amqpBinary(m.body)));
  return Buffer.concat(parts);
}

/** One entry of a chunk: a plain record (`codec` undefined, one record) or a sub-entry batch. */
export interface TestEntry {
  readonly records: readonly Buffer[];
  /** 0 none, 1 gzip, or any code (to build batches the decoder must refuse). */
  readonly codec?: number | undefined;
}

/** The bytes of one entry. */
export function encodeEntry(entry: TestEntry): Buffer {
  if (entry.codec === undefined) {
    const record = entry.records[0]!;
    const size = Buffer.alloc(4);
    size.writeUInt32BE(record.length, 0);
    return Buffer.concat([size, record]);
  }
  const raw = Buffer.concat(
    entry.records.flatMap((r) => {
      const size = Buffer.alloc(4);
      size.writeUInt32BE(r.length, 0);
      return [size, r];
    }),
  );
  const data = entry.codec === 1 ? gzipSync(raw) : raw;
  const head = Buffer.alloc(11);
  head[0] = 0x80 | (entry.codec << 4);
  head.writeUInt16BE(entry.records.length, 1);
  head.writeUInt32BE(raw.length, 3);
  head.writeUInt32BE(data.length, 7);
  return Buffer.concat([head, data]);
}

/** Fields of the chunk header a test may set (the counts default to what the entries hold). */
export interface ChunkOptions {
  readonly firstOffset?: bigint;
  readonly chunkType?: number;
  readonly numEntries?: number;
  readonly numRecords?: number;
  /** Overrides the data length the header announces. */
  readonly dataLength?: number;
  /** The chunk's timestamp, ms since the epoch (default: now). */
  readonly timestamp?: bigint;
}

/** An OSIRIS chunk: the 48-byte header, then the entries. */
export function encodeChunk(entries: readonly TestEntry[], options: ChunkOptions = {}): Buffer {
  const data = Buffer.concat(entries.map(encodeEntry));
  const h = Buffer.alloc(48);
  h[0] = 0x50;
  h[1] = options.chunkType ?? 0;
  h.writeUInt16BE(options.numEntries ?? entries.length, 2);
  h.writeUInt32BE(options.numRecords ?? entries.reduce((n, e) => n + e.records.length, 0), 4);
  h.writeBigInt64BE(options.timestamp ?? BigInt(Date.now()), 8);
  h.writeBigUInt64BE(1n, 16);
  h.writeBigUInt64BE(options.firstOffset ?? 0n, 24);
  h.writeUInt32BE(options.dataLength ?? data.length, 36);
  return Buffer.concat([h, data]);
}

/** A whole Deliver frame, its u32 size included. */
export function deliverFrame(
  chunk: Buffer,
  options: {
    readonly version?: 1 | 2;
    readonly subscriptionId?: number;
    readonly committedChunkId?: bigint;
  } = {},
): Buffer {
  const version = options.version ?? 1;
  const head = Buffer.alloc(version === 2 ? 17 : 9);
  head.writeUInt32BE(head.length - 4 + chunk.length, 0);
  head.writeUInt16BE(0x0008, 4);
  head.writeUInt16BE(version, 6);
  head[8] = options.subscriptionId ?? 0;
  if (version === 2) head.writeBigUInt64BE(options.committedChunkId ?? 0n, 9);
  return Buffer.concat([head, chunk]);
}

/** rabbitmq-stream-js-client 1.0's response decoder, with the fields the tests reach. */
export interface ClientResponseDecoder {
  /** Where it emits `deliverV1`, `deliverV2`, `publish_confirm`… */
  readonly emitter: EventEmitter;
  /** The start of a frame it has not seen the end of. */
  lastData: Buffer;
  /** Takes the socket's bytes. */
  add: (data: Buffer, getCompressionBy: unknown) => void;
}

/** The client's own decoder, as its connections create it, logging nothing. */
export function clientResponseDecoder(): ClientResponseDecoder {
  const quiet = {
    debug: () => undefined,
    info: () => undefined,
    warn: () => undefined,
    error: () => undefined,
  };
  return new ResponseDecoder(() => undefined, quiet) as unknown as ClientResponseDecoder;
}

/** The client's codecs for {@link ClientResponseDecoder.add}: none and gzip. */
export function clientCodecs(type: number): { decompress(data: Buffer): Buffer } {
  return { decompress: (data) => (type === 1 ? gunzipSync(data) : data) };
}
