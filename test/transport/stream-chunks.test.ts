import { gzipSync } from 'node:zlib';
import * as zlib from 'node:zlib';
import { describe, expect, it } from 'vitest';
import { ChunkDecodeError } from '../../src/transport/amqp10-decode.js';
import {
  DEFAULT_MAX_INFLATED_BYTES,
  INFLATE_RATIO,
  decodeChunk,
  decodeDeliverFrame,
  type StreamChunk,
} from '../../src/transport/stream-chunks.js';
import {
  deliverFrame,
  encodeChunk,
  encodeEntry,
  encodeMessage,
  type TestEntry,
  type TestMessage,
  clientCodecs,
  clientResponseDecoder,
} from '../support/chunks.js';
import { thrown } from '../support/thrown.js';

// The Deliver chunk decoder: plain entries, sub-entry batches (none, gzip), mixes of both, chunk
// types without messages, offsets counted across the whole chunk, and typed refusals.

const msg = (i: number): TestMessage => ({
  body: Buffer.from(`body-${i}`),
  properties: { 'x-dedup-producer': 'p', 'x-dedup-id': String(i), n: i },
});
const rec = (i: number): Buffer => encodeMessage(msg(i));
const plain = (i: number): TestEntry => ({ records: [rec(i)] });
const batch = (codec: number, ...ids: number[]): TestEntry => ({ records: ids.map(rec), codec });

/** Offset, body and id of every record. */
function summary(chunk: StreamChunk): Array<[bigint, string, unknown]> {
  return chunk.messages.map((m) => [m.offset, m.content.toString(), m.applicationProperties['x-dedup-id']]);
}

function expected(first: bigint, ids: number[]): Array<[bigint, string, unknown]> {
  return ids.map((id, i) => [first + BigInt(i), `body-${id}`, String(id)]);
}

function refused(f: () => unknown, message: RegExp): void {
  const err = thrown(f);
  expect(err).toBeInstanceOf(ChunkDecodeError);
  expect((err as Error).message).toMatch(message);
}

describe('stream chunks - records and offsets', () => {
  it('plain entries only: each record at the chunk’s first offset plus its index', () => {
    const chunk = decodeChunk(encodeChunk([plain(1), plain(2), plain(3)], { firstOffset: 100n }));
    expect(chunk).toMatchObject({ chunkType: 0, firstOffset: 100n, numRecords: 3 });
    expect(summary(chunk)).toEqual(expected(100n, [1, 2, 3]));
    expect(chunk.messages[0]!.applicationProperties).toEqual({
      'x-dedup-producer': 'p',
      'x-dedup-id': '1',
      n: 1,
    });
  });

  it('one sub-entry batch: every record of it, numbered from the chunk’s first offset (not from 0)', () => {
    const chunk = decodeChunk(encodeChunk([batch(0, 1, 2, 3, 4)], { firstOffset: 7n }));
    expect(summary(chunk)).toEqual(expected(7n, [1, 2, 3, 4]));
  });

  it('several sub-entry batches in one chunk, uncompressed and gzip: offsets run on across them', () => {
    const chunk = decodeChunk(
      encodeChunk([batch(0, 1, 2), batch(1, 3, 4, 5), batch(0, 6)], { firstOffset: 50n }),
    );
    expect(summary(chunk)).toEqual(expected(50n, [1, 2, 3, 4, 5, 6]));
  });

  it('plain entries and batches mixed, in any order', () => {
    const entries = [plain(1), batch(1, 2, 3, 4), plain(5), batch(0, 6, 7), batch(1, 8), plain(9)];
    const chunk = decodeChunk(encodeChunk(entries, { firstOffset: 2n ** 63n }));
    expect(summary(chunk)).toEqual(expected(2n ** 63n, [1, 2, 3, 4, 5, 6, 7, 8, 9]));
  });

  it('gzip: a batch of 1 000 records with long bodies decompresses whole', () => {
    const ids = Array.from({ length: 1_000 }, (_, i) => i + 1);
    const chunk = decodeChunk(encodeChunk([batch(1, ...ids)]));
    expect(summary(chunk)).toEqual(expected(0n, ids));
  });

  it('a chunk that is not user data (tracking) comes with no messages but is still reported', () => {
    const chunk = decodeChunk(encodeChunk([plain(1)], { chunkType: 1, firstOffset: 9n, timestamp: 5n }));
    expect(chunk).toEqual({ chunkType: 1, firstOffset: 9n, timestamp: 5n, numRecords: 1, messages: [] });
    const empty = decodeChunk(encodeChunk([], { chunkType: 2 }));
    expect(empty.messages).toEqual([]);
  });

  it('every record carries its chunk: first offset and timestamp, plain entries and batch members alike', () => {
    const chunk = decodeChunk(
      encodeChunk([plain(1), batch(1, 2, 3), batch(0, 4)], { firstOffset: 40n, timestamp: -7n }),
    );
    expect(chunk.timestamp).toBe(-7n);
    expect(chunk.messages.map((m) => [m.offset, m.chunk])).toEqual(
      [40n, 41n, 42n, 43n].map((offset) => [offset, { firstOffset: 40n, timestamp: -7n }]),
    );
  });

  it('Deliver frames of versions 1 and 2: subscription id, committed chunk id, the chunk', () => {
    const chunk = encodeChunk([plain(1), batch(0, 2)], { firstOffset: 3n });
    const v1 = deliverFrame(chunk, { subscriptionId: 7 });
    expect(decodeDeliverFrame(v1, 4)).toMatchObject({
      version: 1,
      subscriptionId: 7,
      committedChunkId: undefined,
    });
    const v2 = deliverFrame(chunk, { version: 2, subscriptionId: 255, committedChunkId: 12n });
    const decoded = decodeDeliverFrame(v2, 4);
    expect(decoded).toMatchObject({ version: 2, subscriptionId: 255, committedChunkId: 12n });
    expect(summary(decoded.chunk)).toEqual(expected(3n, [1, 2]));
  });

  it('bytes after the chunk’s data (a trailer) are not read', () => {
    const chunk = Buffer.concat([encodeChunk([plain(1)]), Buffer.from([1, 2, 3])]);
    expect(summary(decodeChunk(chunk))).toEqual(expected(0n, [1]));
  });

  it('rabbitmq-stream-js-client 1.0 misreads the same chunk (why this decoder exists: re-check on a client upgrade)', () => {
    const frame = deliverFrame(encodeChunk([batch(0, 1, 2), batch(0, 3)], { firstOffset: 10n }));
    const theirs: Array<{ offset?: bigint }> = [];
    const client = clientResponseDecoder();
    client.emitter.on('deliverV1', (r: { messages: Array<{ offset?: bigint }> }) =>
      theirs.push(...r.messages),
    );
    client.add(frame, clientCodecs);
    // Only the first batch, numbered from 0.
    expect(theirs.map((m) => m.offset)).toEqual([0n, 1n]);
    expect(decodeDeliverFrame(frame, 4).chunk.messages.map((m) => m.offset)).toEqual([10n, 11n, 12n]);
  });
});

describe('stream chunks - malformed chunks are refused with ChunkDecodeError', () => {
  const valid = deliverFrame(
    encodeChunk([plain(1), batch(1, 2, 3), batch(0, 4, 5), plain(6)], { firstOffset: 5n }),
    {
      version: 2,
    },
  );

  it('every truncation of a valid frame', () => {
    for (let cut = 4; cut < valid.length; cut++) {
      expect(
        thrown(() => decodeDeliverFrame(valid, 4, cut)),
        `cut at ${cut}`,
      ).toBeInstanceOf(ChunkDecodeError);
    }
  });

  it('not a Deliver frame, an unknown version, a wrong magic', () => {
    const other = Buffer.from(valid);
    other.writeUInt16BE(0x0009, 4);
    refused(() => decodeDeliverFrame(other, 4), /not a Deliver frame: key 0x9/);
    const v3 = Buffer.from(valid);
    v3.writeUInt16BE(3, 6);
    refused(() => decodeDeliverFrame(v3, 4), /version 3/);
    const chunk = encodeChunk([plain(1)]);
    chunk[0] = 0x40;
    refused(() => decodeChunk(chunk), /not an OSIRIS chunk: magic byte 0x40/);
  });

  it('counts that lie: records, entries, data length; bytes after the entries', () => {
    refused(
      () => decodeChunk(encodeChunk([plain(1), batch(0, 2, 3)], { numRecords: 4 })),
      /announces 4 records, its entries hold 3/,
    );
    refused(
      () => decodeChunk(encodeChunk([plain(1), batch(0, 2, 3)], { numRecords: 2 })),
      /more records than the 2/,
    );
    refused(
      () => decodeChunk(encodeChunk([plain(1), plain(2)], { numRecords: 1 })),
      /more records than the 1/,
    );
    refused(
      () => decodeChunk(encodeChunk([plain(1)], { numEntries: 2 })),
      /announces 2 entries, its data holds 1/,
    );
    refused(
      () => decodeChunk(encodeChunk([plain(1), plain(2)], { numEntries: 1, numRecords: 1 })),
      /bytes after its 1 entries/,
    );
    refused(
      () => decodeChunk(encodeChunk([plain(1)], { dataLength: 10_000 })),
      /truncated chunk at offset 0/,
    );
    const entry = encodeEntry(plain(1));
    entry.writeUInt32BE(entry.length, 0);
    const lying = Buffer.concat([
      encodeChunk([], { numEntries: 1, numRecords: 1, dataLength: entry.length }),
      entry,
    ]);
    refused(() => decodeChunk(lying), /announces \d+ bytes, \d+ are left/);
  });

  it('sub-entry batches whose lengths lie, whose data does not decompress, or whose codec is not read here', () => {
    const b = encodeEntry(batch(0, 1, 2));
    const chunkOf = (entry: Buffer, records = 2): Buffer =>
      Buffer.concat([
        encodeChunk([], { numEntries: 1, numRecords: records, dataLength: entry.length }),
        entry,
      ]);
    const wrongUncompressed = Buffer.from(b);
    wrongUncompressed.writeUInt32BE(wrongUncompressed.readUInt32BE(3) + 1, 3);
    refused(() => decodeChunk(chunkOf(wrongUncompressed)), /uncompressed, it holds/);
    const extra = Buffer.from(b);
    extra.writeUInt16BE(1, 1);
    refused(() => decodeChunk(chunkOf(extra, 1)), /bytes after its 1 records/);
    const tooLong = Buffer.from(b);
    tooLong.writeUInt32BE(1_000, 7);
    refused(() => decodeChunk(chunkOf(tooLong)), /announces 1000 bytes, the chunk holds/);
    const garbage = Buffer.from(encodeEntry(batch(1, 1, 2)));
    garbage.fill(0x55, 11);
    refused(() => decodeChunk(chunkOf(garbage)), /does not decompress \(gzip\)/);
    // A gzip bomb stops at the announced length.
    const raw = Buffer.concat([encodeEntry(batch(0, 1)).subarray(11), Buffer.alloc(100_000)]);
    const bomb = Buffer.concat([Buffer.alloc(11), gzipSync(raw)]);
    bomb[0] = 0x90;
    bomb.writeUInt16BE(1, 1);
    bomb.writeUInt32BE(raw.length - 100_000, 3);
    bomb.writeUInt32BE(bomb.length - 11, 7);
    refused(() => decodeChunk(chunkOf(bomb, 1)), /does not decompress \(gzip\)/);
    refused(
      () => decodeChunk(encodeChunk([batch(2, 1)])),
      /compressed with snappy, which stream-dedup does not read/,
    );
    refused(() => decodeChunk(encodeChunk([batch(3, 1)])), /compressed with lz4/);
    refused(() => decodeChunk(encodeChunk([batch(5, 1)])), /compressed with codec 5/);
  });

  it('compressed batches inflate to 16 MiB per chunk together, checked before inflating (issue 32 item 4)', () => {
    // A batch announcing 256 MiB (a 261 KB frame once inflated into that): refused by its
    // announcement alone. Its data is not gzip, so a refusal naming the ceiling was never inflated.
    const announced = Buffer.from(encodeEntry(batch(1, 1, 2)));
    announced.fill(0x55, 11);
    announced.writeUInt32BE(256 * 1_048_576, 3);
    const chunkOf = (entry: Buffer, records: number): Buffer =>
      Buffer.concat([
        encodeChunk([], { numEntries: 1, numRecords: records, dataLength: entry.length }),
        entry,
      ]);
    refused(
      () => decodeChunk(chunkOf(announced, 2)),
      /announces 268435456 bytes uncompressed; the chunk's compressed batches may inflate to 16777216 bytes together/,
    );
    // Each batch under the ceiling, the chunk above it: 17 batches of 1 MiB (1 KB of gzip each).
    const mib = encodeMessage({ body: Buffer.alloc(1_048_576 - 20) });
    const oneMib: TestEntry = { records: [mib], codec: 1 };
    expect(encodeEntry(oneMib).length).toBeLessThan(2_000);
    expect(decodeChunk(encodeChunk(new Array<TestEntry>(15).fill(oneMib))).messages).toHaveLength(15);
    refused(
      () => decodeChunk(encodeChunk(new Array<TestEntry>(17).fill(oneMib), { firstOffset: 3n })),
      /sub-entry batch at offset 19 announces \d+ bytes uncompressed;.* \d+ are left/,
    );
    // Uncompressed batches arrived as they are: not counted.
    const plainMib: TestEntry = { records: [mib], codec: 0 };
    expect(decodeChunk(encodeChunk(new Array<TestEntry>(17).fill(plainMib))).messages).toHaveLength(17);
    expect(DEFAULT_MAX_INFLATED_BYTES).toBe(16 * 1_048_576);
  });

  it("a ceiling of its own: per chunk, through decodeDeliverFrame too; 0 leaves only the ratio to the chunk's bytes", () => {
    // Bodies of zeros: gzip shrinks each batch ~1 000 times, far beyond INFLATE_RATIO, so the
    // ceiling decides.
    const zeros = (i: number): TestEntry => ({
      records: [encodeMessage({ body: Buffer.alloc(65_536), properties: { n: i } })],
      codec: 1,
    });
    const two = encodeChunk([zeros(1), zeros(2), plain(3)], { firstOffset: 7n });
    const sizes = [zeros(1), zeros(2)].map((e) => encodeEntry(e).readUInt32BE(3));
    const both = sizes[0]! + sizes[1]!;
    expect(both).toBeGreaterThan(INFLATE_RATIO * two.length);
    expect(decodeChunk(two, 0, two.length, { maxInflatedBytes: both }).messages).toHaveLength(3);
    refused(() => decodeChunk(two, 0, two.length, { maxInflatedBytes: both - 1 }), /offset 8 announces/);
    refused(
      () => decodeDeliverFrame(deliverFrame(two), 4, undefined, { maxInflatedBytes: both - 1 }),
      /offset 8 announces/,
    );
    refused(() => decodeChunk(two, 0, two.length, { maxInflatedBytes: 0 }), /offset 7 announces/);
  });

  it(`ordinary data in many batches reads whatever the ceiling: up to ${INFLATE_RATIO} times the chunk's bytes`, () => {
    // What stream-dedup's own publisher wrote with gzip and 56 KB JSON bodies (20×): chunks of 17+
    // batches of 1 MiB, refused for good by a 16 MiB ceiling alone. Here: text that gzip shrinks
    // ~20 times, in 20 batches, under a ceiling smaller than one of them.
    const json = Buffer.from(
      JSON.stringify(
        Array.from({ length: 800 }, (_, i) => ({ id: i, name: `customer-${i % 7}`, tags: ['a'] })),
      ),
    );
    const entry = (i: number): TestEntry => ({
      records: [encodeMessage({ body: json, properties: { n: i } })],
      codec: 1,
    });
    const entries = Array.from({ length: 20 }, (_, i) => entry(i));
    const chunk = encodeChunk(entries);
    const inflated = entries.reduce((sum, e) => sum + encodeEntry(e).readUInt32BE(3), 0);
    expect(inflated).toBeGreaterThan(10 * chunk.length);
    expect(decodeChunk(chunk, 0, chunk.length, { maxInflatedBytes: 1_024 }).messages).toHaveLength(20);
  });

  it('zstd: read where Node’s zlib has it, otherwise refused naming the Node.js version it needs', () => {
    const zstd = (zlib as unknown as { zstdCompressSync?: (b: Buffer) => Buffer }).zstdCompressSync;
    if (zstd === undefined) {
      refused(
        () => decodeChunk(encodeChunk([batch(4, 1)])),
        /zstd, which needs Node\.js >= 22\.15 .*this is Node\.js \d/,
      );
      return;
    }
    const raw = encodeEntry(batch(0, 1, 2));
    const data = zstd(raw.subarray(11));
    const head = Buffer.from(raw.subarray(0, 11));
    head[0] = 0xc0;
    head.writeUInt32BE(data.length, 7);
    const entry = Buffer.concat([head, data]);
    const chunk = Buffer.concat([
      encodeChunk([], { numEntries: 1, numRecords: 2, dataLength: entry.length }),
      entry,
    ]);
    expect(summary(decodeChunk(chunk))).toEqual(expected(0n, [1, 2]));
  });

  it('a record that is not an AMQP 1.0 message', () => {
    refused(
      () => decodeChunk(encodeChunk([{ records: [Buffer.from([0x00, 0x53, 0x99, 0x40])] }])),
      /unknown message section/,
    );
    refused(
      () => decodeChunk(encodeChunk([{ records: [Buffer.from([0x00, 0x53, 0x75, 0xa0, 9])] }], {})),
      /announces 9 bytes/,
    );
  });
});
