// The decoders' memory property, run in a child process with a small heap
// (`node --max-old-space-size=64 --import tsx`, started by property-tests/chunk-decoder.test.ts):
// a regression must fail that test — this process aborts on a heap OOM, or exits 3 when what a
// decode retains (its heap and its Buffers) exceeds RETAINED_MAX — instead of killing the test
// runner. Feeds the inputs (466 bytes → 3.1 M values; a 90 KB record in a Deliver frame; a
// 261 KB frame of gzip inflating into 256 MiB; a chunk of many batches each under any per-batch
// ceiling) and a fast-check run of hostile structured messages and chunks. Prints one JSON line of
// figures per input. FC_SEED: the parent's seed.
import fc from 'fast-check';
import { gzipSync } from 'node:zlib';
import { ChunkDecodeError, decodeAmqp10Message } from '../../src/transport/amqp10-decode.js';
import { decodeDeliverFrame } from '../../src/transport/stream-chunks.js';
import { deliverFrame, encodeChunk } from '../../test/support/chunks.js';
import { bombEntry, encodeMessage, messageNode, mutatedFields } from './amqp10-arbitrary.js';

/** The most a decode may retain above what this process held before it: far below the 64 MB heap. */
const RETAINED_MAX = 24 * 1_048_576;

const gc = (globalThis as { gc?: () => void }).gc;
if (gc === undefined) throw new Error('run with --expose-gc');

/** Heap and Buffers in use once garbage is collected (Buffers' memory is freed after a turn). */
async function held(): Promise<number> {
  for (let i = 0; i < 2; i++) {
    gc!();
    await new Promise((resolve) => setImmediate(resolve));
  }
  const m = process.memoryUsage();
  return m.heapUsed + m.arrayBuffers;
}

/** Decodes while holding the result; exits 3 when it retains more than RETAINED_MAX. */
async function retainedBy(what: string, decode: () => unknown): Promise<[number, string]> {
  const before = await held();
  let outcome: string;
  let kept: unknown;
  try {
    kept = decode();
    outcome = 'read';
  } catch (err) {
    if (!(err instanceof ChunkDecodeError)) throw err;
    outcome = `refused: ${err.message.slice(0, 160)}`;
  }
  const grew = (await held()) - before;
  if (grew > RETAINED_MAX) {
    console.log(JSON.stringify({ what, failed: `retained ${grew} bytes > ${RETAINED_MAX}` }));
    process.exit(3);
  }
  // Held until measured.
  if (kept === null) console.log('');
  return [grew, outcome];
}

async function measure(what: string, input: Buffer, decode: () => unknown): Promise<void> {
  const [grew, outcome] = await retainedBy(what, decode);
  console.log(JSON.stringify({ what, bytes: input.length, outcome, retainedBytes: grew }));
}

const u32 = (n: number): Buffer => {
  const b = Buffer.alloc(4);
  b.writeUInt32BE(n, 0);
  return b;
};

/** An array32 of `outer` array32s of `inner` nulls each: 9 bytes per inner array. */
function amplifier(outer: number, inner: number): Buffer {
  const element = Buffer.concat([u32(5), u32(inner), Buffer.from([0x40])]);
  const body = Buffer.concat([u32(outer), Buffer.from([0xf0]), ...new Array<Buffer>(outer).fill(element)]);
  return Buffer.concat([Buffer.from([0xf0]), u32(body.length), body]);
}

const amqpValue = (value: Buffer): Buffer => Buffer.concat([Buffer.from([0x00, 0x53, 0x77]), value]);

// 1. The 466 bytes: 48 arrays of 65 536 nulls (3.1 M values).
const small = amqpValue(amplifier(48, 65_536));
await measure('amplifier message (3.1 M values announced)', small, () => decodeAmqp10Message(small));

// 2. A 90 KB record in a Deliver frame: 10 000 arrays of 65 536 nulls (655 M values announced).
const record = amqpValue(amplifier(10_000, 65_536));
const frame90k = deliverFrame(encodeChunk([{ records: [record] }]));
await measure('90 KB record in a Deliver frame', frame90k, () => decodeDeliverFrame(frame90k, 4));

// 3. A 261 KB frame of one gzip batch inflating into 256 MiB: 256 gzip members of 1 MiB each (the
//    first starts the one record: a data section of 256 MiB - 12 bytes).
const MIB = 1_048_576;
const total = 256 * MIB;
const first = Buffer.alloc(MIB);
first.writeUInt32BE(total - 4, 0);
Buffer.from([0x00, 0x53, 0x75, 0xb0]).copy(first, 4);
first.writeUInt32BE(total - 12, 8);
const zeros = gzipSync(Buffer.alloc(MIB));
const data = Buffer.concat([gzipSync(first), ...new Array<Buffer>(255).fill(zeros)]);
const head = Buffer.alloc(11);
head[0] = 0x90;
head.writeUInt16BE(1, 1);
head.writeUInt32BE(total, 3);
head.writeUInt32BE(data.length, 7);
const bombData = Buffer.concat([head, data]);
const bombFrame = deliverFrame(
  Buffer.concat([encodeChunk([], { numEntries: 1, numRecords: 1, dataLength: bombData.length }), bombData]),
);
await measure('gzip batch of 256 MiB in one frame', bombFrame, () => decodeDeliverFrame(bombFrame, 4));

// 4. One chunk of 40 gzip batches of 1 MiB each: every batch small, the chunk 40 MiB.
const many = new Array<Buffer>(40).fill(bombEntry(MIB - 12));
const manyData = Buffer.concat(many);
const manyFrame = deliverFrame(
  Buffer.concat([encodeChunk([], { numEntries: 40, numRecords: 40, dataLength: manyData.length }), manyData]),
);
await measure('chunk of 40 gzip batches of 1 MiB', manyFrame, () => decodeDeliverFrame(manyFrame, 4));

// 4b. Inflated bytes buying values (hostile review of the merged change): one gzip batch of 15
//     records of 1 MB under the inflate ceiling, each an array of 1 M list0 (zero width, a fresh []
//     each) padded with a data section of zeros that earns the message's allowance: a 15 KB frame
//     that retained ~570 MiB. And the same without zero-width elements: arrays of 500 000 empty
//     map8 (2 bytes each, one {} each), ~460 MiB. The chunk's value budget refuses both.
function propertiesWith(array: Buffer, body: Buffer): Buffer {
  const key = Buffer.from([0xa1, 1, 0x61]); // sym "a"
  const map = Buffer.concat([Buffer.from([0xd1]), u32(4 + key.length + array.length + body.length), u32(2)]);
  return Buffer.concat([Buffer.from([0x00, 0x53, 0x74]), map, key, array, body]);
}
const ELEMENTS = 1_000_000;
const list0Message = Buffer.concat([
  propertiesWith(
    Buffer.concat([Buffer.from([0xf0]), u32(5), u32(ELEMENTS), Buffer.from([0x45])]),
    Buffer.alloc(0),
  ),
  Buffer.from([0x00, 0x53, 0x75, 0xb0]),
  u32(ELEMENTS),
  Buffer.alloc(ELEMENTS),
]);
const list0Frame = deliverFrame(
  encodeChunk([{ records: new Array<Buffer>(15).fill(list0Message), codec: 1 }]),
);
await measure('gzip batch of 15 records of 1 M list0 each', list0Frame, () =>
  decodeDeliverFrame(list0Frame, 4),
);
const MAPS = 500_000;
const emptyMaps = Buffer.alloc(2 * MAPS);
for (let i = 0; i < MAPS; i++) emptyMaps[2 * i] = 1; // map8: size 1, count 0
const mapsMessage = propertiesWith(
  Buffer.concat([Buffer.from([0xf0]), u32(5 + emptyMaps.length), u32(MAPS), Buffer.from([0xc1])]),
  emptyMaps,
);
const mapsFrame = deliverFrame(encodeChunk([{ records: new Array<Buffer>(15).fill(mapsMessage), codec: 1 }]));
await measure('gzip batch of 15 records of 500 000 empty maps each', mapsFrame, () =>
  decodeDeliverFrame(mapsFrame, 4),
);

// 5. Hostile structured messages (nested zero-width arrays of up to 200 000 announced elements,
//    lying counts) and chunks of gzip bombs up to 8 MiB each, several per chunk.
const seed = Number(process.env.FC_SEED ?? Date.now());
let worst = 0;
await fc.assert(
  fc.asyncProperty(
    fc.oneof(
      messageNode.map((m) => encodeMessage(m).bytes),
      mutatedFields(messageNode.map(encodeMessage)),
    ),
    async (bytes) => {
      const [grew] = await retainedBy(`structured message ${bytes.toString('hex').slice(0, 400)}`, () =>
        decodeAmqp10Message(bytes),
      );
      worst = Math.max(worst, grew);
    },
  ),
  { seed, numRuns: 200 },
);
console.log(JSON.stringify({ what: 'structured messages (200 runs)', seed, largestRetainedBytes: worst }));
worst = 0;
await fc.assert(
  fc.asyncProperty(
    fc.array(fc.integer({ min: 1, max: 8 * MIB }), { minLength: 1, maxLength: 6 }),
    async (sizes) => {
      const entries = sizes.map((size) => bombEntry(size));
      const d = Buffer.concat(entries);
      const frame = deliverFrame(
        Buffer.concat([
          encodeChunk([], { numEntries: entries.length, numRecords: entries.length, dataLength: d.length }),
          d,
        ]),
      );
      const [grew] = await retainedBy(`gzip bomb chunk of batches ${sizes.join(', ')}`, () =>
        decodeDeliverFrame(frame, 4),
      );
      worst = Math.max(worst, grew);
    },
  ),
  { seed, numRuns: 30 },
);
console.log(JSON.stringify({ what: 'gzip bomb chunks (30 runs)', seed, largestRetainedBytes: worst }));
