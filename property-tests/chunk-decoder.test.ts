import { spawn } from 'node:child_process';
import { once } from 'node:events';
import fc from 'fast-check';
import { mutated } from './support/mutations.js';
import type { Client } from 'rabbitmq-stream-js-client';
import { describe, expect, it } from 'vitest';
import { ChunkDecodeError, decodeAmqp10Message } from '../src/transport/amqp10-decode.js';
import { decodeDeliveriesOurselves } from '../src/transport/stream-client-internals.js';
import { decodeDeliverFrame, INFLATE_RATIO, type ChunkRecord } from '../src/transport/stream-chunks.js';
import {
  clientCodecs,
  clientResponseDecoder,
  deliverFrame,
  encodeChunk,
  encodeEntry,
  encodeMessage,
  type TestEntry,
  type TestMessage,
} from '../test/support/chunks.js';
import {
  bombEntry,
  FIXED,
  encodeMessage as encodeModelMessage,
  messageNode,
  mutatedFields,
} from './support/amqp10-arbitrary.js';
import { assertProperty } from './support/runs.js';

// The Deliver chunk decoder (src/transport/stream-chunks.ts) against an encoder written from the
// protocol (test/support/chunks.ts): any messages, cut into any mix of plain entries and sub-entry
// batches (uncompressed, gzip), come back as the same records at the chunk's first offset plus
// their index — decoded directly and through the reader hooked into a client connection, however
// the socket cuts the bytes. And no input makes either decoder throw anything but
// ChunkDecodeError. The seed is set globally by property-tests/setup.ts.

const FUZZ_RUNS = 50_000;

const properties = fc.option(
  fc.dictionary(
    fc.oneof(fc.string({ maxLength: 8 }), fc.constantFrom('__proto__', 'constructor', 'x-dedup-id')),
    fc.oneof(fc.string({ maxLength: 300 }), fc.integer({ min: -0x8000_0000, max: 0x7fff_ffff })),
    { maxKeys: 4 },
  ),
  { nil: undefined },
);
const message: fc.Arbitrary<TestMessage> = fc.record({
  body: fc.oneof(fc.uint8Array({ maxLength: 16 }), fc.uint8Array({ minLength: 250, maxLength: 400 })),
  properties,
});
/** How entries are cut: a plain entry (one message) or a batch of `size` messages with a codec. */
const cut = fc.oneof(
  fc.constant({ codec: undefined, size: 1 }),
  fc.record({ codec: fc.constantFrom(0, 1), size: fc.integer({ min: 1, max: 6 }) }),
);

/** The messages cut into entries, in order (the last batch takes what is left). */
function entriesOf(
  messages: readonly TestMessage[],
  cuts: ReadonlyArray<{ codec: number | undefined; size: number }>,
): TestEntry[] {
  const entries: TestEntry[] = [];
  let i = 0;
  for (let k = 0; i < messages.length; k++) {
    const { codec, size } = cuts[k % Math.max(1, cuts.length)] ?? { codec: undefined, size: 1 };
    const records = messages.slice(i, i + size).map(encodeMessage);
    entries.push({ records, codec });
    i += records.length;
  }
  return entries;
}

function check(records: readonly ChunkRecord[], messages: readonly TestMessage[], first: bigint): void {
  expect(records).toHaveLength(messages.length);
  records.forEach((r, i) => {
    const m = messages[i]!;
    expect(r.offset).toBe(first + BigInt(i));
    expect(r.content.equals(Buffer.from(m.body))).toBe(true);
    expect(Object.getPrototypeOf(r.applicationProperties)).toBe(Object.prototype);
    expect(Object.entries(r.applicationProperties)).toEqual(Object.entries(m.properties ?? {}));
    expect(r.messageAnnotations).toEqual({});
  });
}

/** A compound (list, map) of encoded elements: the 8-bit form when it fits, else the 32-bit one. */
function sized(small: number, wide: number, elements: readonly Buffer[], count: number): Buffer {
  const body = Buffer.concat(elements);
  if (body.length + 1 <= 255 && count <= 255)
    return Buffer.concat([Buffer.from([small, body.length + 1, count]), body]);
  const head = Buffer.alloc(9);
  head[0] = wide;
  head.writeUInt32BE(body.length + 4, 1);
  head.writeUInt32BE(count, 5);
  return Buffer.concat([head, body]);
}

/** One well-formed encoded AMQP 1.0 value of any type, nested up to a few levels. */
const amqpValue: fc.Arbitrary<Buffer> = fc.letrec<{ value: Buffer }>((tie) => ({
  value: fc.oneof(
    { depthSize: 'small', withCrossShrink: true },
    fc
      .tuple(fc.constantFrom(...FIXED), fc.uint8Array({ minLength: 16, maxLength: 16 }))
      .map(([[code, width], bytes]) => Buffer.concat([Buffer.from([code]), bytes.subarray(0, width)])),
    fc
      .tuple(fc.constantFrom(0xa0, 0xa1, 0xa3, 0xb0, 0xb1, 0xb3), fc.string({ maxLength: 12 }))
      .map(([code, text]) => {
        const bytes = Buffer.from(text);
        if (code < 0xb0) return Buffer.concat([Buffer.from([code, bytes.length]), bytes]);
        const head = Buffer.alloc(5);
        head[0] = code;
        head.writeUInt32BE(bytes.length, 1);
        return Buffer.concat([head, bytes]);
      }),
    fc.array(tie('value'), { maxLength: 4 }).map((elements) => sized(0xc0, 0xd0, elements, elements.length)),
    fc
      .array(fc.tuple(tie('value'), tie('value')), { maxLength: 3 })
      .map((pairs) => sized(0xc1, 0xd1, pairs.flat(), pairs.length * 2)),
    fc
      .tuple(
        fc.constantFrom(...FIXED),
        fc.array(fc.uint8Array({ minLength: 16, maxLength: 16 }), { maxLength: 4 }),
      )
      .map(([[code, width], items]) =>
        sized(
          0xe0,
          0xf0,
          [Buffer.from([code]), ...items.map((b) => Buffer.from(b.subarray(0, width)))],
          items.length,
        ),
      ),
    fc
      .tuple(fc.constantFrom(Buffer.from([0x53, 0x01]), Buffer.from([0xa3, 1, 0x78])), tie('value'))
      .map(([descriptor, value]) => Buffer.concat([Buffer.from([0x00]), descriptor, value])),
  ),
})).value;

/** Runs `decode`; anything thrown but a ChunkDecodeError fails. */
function typedOnly(decode: () => unknown): void {
  try {
    decode();
  } catch (err) {
    if (!(err instanceof ChunkDecodeError)) throw err;
  }
}

const chunkFrame = fc
  .tuple(
    fc.array(message, { maxLength: 12 }),
    fc.array(cut, { maxLength: 6 }),
    fc.bigInt(0n, 2n ** 64n - 1_000n),
    fc.constantFrom<1 | 2>(1, 2),
    fc.integer({ min: 0, max: 255 }),
  )
  .map(([messages, cuts, first, version, subscriptionId]) => ({
    messages,
    first,
    version,
    subscriptionId,
    frame: deliverFrame(encodeChunk(entriesOf(messages, cuts), { firstOffset: first }), {
      version,
      subscriptionId,
      committedChunkId: first,
    }),
  }));

describe('chunk decoder - properties', () => {
  it('any messages cut into any plain entries and batches decode back to the same records at first offset + index', () => {
    fc.assert(
      fc.property(chunkFrame, ({ messages, first, version, subscriptionId, frame }) => {
        const decoded = decodeDeliverFrame(frame, 4);
        expect(decoded).toMatchObject({
          version,
          subscriptionId,
          committedChunkId: version === 2 ? first : undefined,
        });
        expect(decoded.chunk.numRecords).toBe(messages.length);
        check(decoded.chunk.messages, messages, first);
      }),
      { numRuns: 2_000 },
    );
  });

  it('the reader hooked into a client connection delivers the same, however the socket cuts several frames', async () => {
    await assertProperty(
      'hooked reader',
      fc.asyncProperty(
        fc.array(chunkFrame, { minLength: 1, maxLength: 3 }),
        fc.array(fc.integer({ min: 1, max: 700 }), { minLength: 1, maxLength: 8 }),
        async (frames, steps) => {
          const decoder = clientResponseDecoder();
          const delivered: Array<{ subscriptionId: number; messages: ChunkRecord[] }> = [];
          for (const event of ['deliverV1', 'deliverV2']) {
            decoder.emitter.on(event, (d: { subscriptionId: number; messages: ChunkRecord[] }) =>
              delivered.push(d),
            );
          }
          const client = { getConnection: () => Promise.resolve({ decoder }) } as unknown as Client;
          decodeDeliveriesOurselves(client, (err) => {
            throw err;
          });
          await (client as unknown as { getConnection: () => Promise<unknown> }).getConnection();
          const bytes = Buffer.concat(frames.map((f) => f.frame));
          for (let o = 0, k = 0; o < bytes.length; k++) {
            const step = steps[k % steps.length]!;
            decoder.add(bytes.subarray(o, o + step), clientCodecs);
            o += step;
          }
          expect(delivered).toHaveLength(frames.length);
          frames.forEach((f, i) => {
            expect(delivered[i]!.subscriptionId).toBe(f.subscriptionId);
            check(delivered[i]!.messages, f.messages, f.first);
          });
        },
      ),
      { numRuns: 500 },
    );
  });

  it(`arbitrary and mutated bytes make the decoders throw ChunkDecodeError only (${FUZZ_RUNS} inputs each)`, () => {
    const frames = fc.oneof(
      fc.uint8Array({ maxLength: 80 }).map((b) => Buffer.from(b)),
      mutated(chunkFrame.map((f) => f.frame)),
    );
    fc.assert(
      fc.property(frames, (frame) => typedOnly(() => decodeDeliverFrame(frame, Math.min(4, frame.length)))),
      { numRuns: FUZZ_RUNS },
    );
    const messages = fc.oneof(
      fc.uint8Array({ maxLength: 40 }).map((b) => Buffer.from(b)),
      mutated(message.map(encodeMessage)),
      // Well-formed values of every type as amqp-value bodies and as application properties, mutated:
      // they reach the compound, array and described paths that random bytes rarely do.
      mutated(amqpValue.map((v) => Buffer.concat([Buffer.from([0x00, 0x53, 0x77]), v]))),
      mutated(
        fc
          .array(fc.tuple(amqpValue, amqpValue), { maxLength: 4 })
          .map((pairs) =>
            Buffer.concat([
              Buffer.from([0x00, 0x53, 0x74]),
              sized(0xc1, 0xd1, pairs.flat(), pairs.length * 2),
            ]),
          ),
      ),
    );
    fc.assert(
      fc.property(messages, (bytes) => typedOnly(() => decodeAmqp10Message(bytes))),
      { numRuns: FUZZ_RUNS },
    );
  });
});

// The structure-aware model (property-tests/support/amqp10-arbitrary.ts, issue 32): values of
// every type and width, nested arrays (of arrays, maps, described and zero-width elements), messages
// whose section descriptors may be Object.prototype names, chunks with gzip bombs. The memory bound
// c is the one amqp10-decode.ts and docs/design.md §10 state.

/** Structured inputs reach the deep paths in fewer runs than random bytes: 1 ms each. */
const MODEL_FUZZ_RUNS = 20_000;
/** c: decoding N bytes retains at most c·N values and c·N bytes (see {@link retained}). */
const C = 32;
/** The ceiling the chunk properties decode with (small, so that gzip bombs reach it). */
const LIMITS = { maxInflatedBytes: 4_096 };

/**
 * What a decoded result retains, counted by walking it (not by measuring the heap): every value
 * reached (objects, arrays, Buffers, strings, scalars) and their bytes — 8 per value (its slot),
 * a Buffer's length, 2 per UTF-16 code unit of strings and of the keys of maps from the wire. The
 * fixed field names of a message, its header and properties are not counted (they are shared).
 */
function retained(root: unknown): { values: number; bytes: number } {
  let values = 0;
  let bytes = 0;
  const stack: Array<[unknown, boolean]> = [[root, false]];
  while (stack.length > 0) {
    const [v, wireKeys] = stack.pop()!;
    values++;
    bytes += 8;
    if (typeof v === 'string') bytes += 2 * v.length;
    else if (Buffer.isBuffer(v)) bytes += v.length;
    else if (Array.isArray(v)) for (const x of v as unknown[]) stack.push([x, wireKeys]);
    else if (typeof v === 'object' && v !== null && !(v instanceof Date)) {
      // A decoded message, a chunk or a frame: fixed names; its maps and values carry wire keys.
      const envelope = !wireKeys;
      for (const key of Object.keys(v)) {
        if (!envelope) bytes += 2 * key.length;
        const fixedNames =
          envelope &&
          (key === 'messageProperties' || key === 'messageHeader' || key === 'chunk' || key === 'messages');
        stack.push([(v as Record<string, unknown>)[key], !envelope || !fixedNames]);
      }
    }
  }
  return { values, bytes };
}

/** Decodes; a ChunkDecodeError gives undefined, anything else thrown fails. */
function decodedOrRefused<T>(decode: () => T): T | undefined {
  try {
    return decode();
  } catch (err) {
    if (err instanceof ChunkDecodeError) return undefined;
    throw err;
  }
}

/** The largest ratios a property met, printed after it (the figures behind c). */
const worst = { values: 0, bytes: 0 };

function printWorst(what: string): void {
  console.log(
    `[${what}] largest ratios met: ${worst.values.toFixed(2)} values, ${worst.bytes.toFixed(2)} bytes per byte`,
  );
  worst.values = 0;
  worst.bytes = 0;
}

/** N counts the record's 4-byte size field: a message always comes with one in a chunk. */
function withinC(result: unknown, n: number, what: string): void {
  const { values, bytes } = retained(result);
  worst.values = Math.max(worst.values, values / n);
  worst.bytes = Math.max(worst.bytes, bytes / n);
  const budget = C * n;
  if (values > budget || bytes > budget) {
    throw new Error(`${what}: ${n} bytes decoded into ${values} values and ${bytes} bytes (c = ${C})`);
  }
}

const modelMessage = messageNode.map(encodeModelMessage);

/** Structured chunks: model messages the decoder reads, cut into plain entries and batches, and gzip bombs. */
const modelChunk = fc
  .tuple(
    fc.array(
      fc.oneof(
        {
          weight: 4,
          arbitrary: fc.array(
            modelMessage.filter((m) => m.valid),
            { minLength: 1, maxLength: 3 },
          ),
        },
        { weight: 1, arbitrary: fc.integer({ min: 1, max: 262_144 }) },
      ),
      { maxLength: 5 },
    ),
    fc.array(fc.constantFrom<0 | 1 | undefined>(undefined, 0, 1), { minLength: 1, maxLength: 5 }),
    fc.bigInt(0n, 2n ** 63n),
  )
  .map(([groups, codecs, first]) => {
    let records = 0;
    const entries = groups.map((g, i) => {
      if (typeof g === 'number') {
        records += 1;
        return bombEntry(g);
      }
      const codec = codecs[i % codecs.length];
      const cut: TestEntry = {
        records: (codec === undefined ? g.slice(0, 1) : g).map((m) => m.bytes),
        codec,
      };
      records += cut.records.length;
      return encodeEntry(cut);
    });
    const data = Buffer.concat(entries);
    const chunk = Buffer.concat([
      encodeChunk([], {
        numEntries: entries.length,
        numRecords: records,
        dataLength: data.length,
        firstOffset: first,
      }),
      data,
    ]);
    return deliverFrame(chunk, { version: 2, committedChunkId: first });
  });

describe('decoders - structure-aware model (issue 32)', () => {
  it('a well-formed model message decodes exactly when the model says so: nine section names, bodies that do not mix, zero-width elements within the allowance', () => {
    fc.assert(
      fc.property(modelMessage, (m) => {
        const decoded = decodedOrRefused(() => decodeAmqp10Message(m.bytes));
        if ((decoded !== undefined) !== m.valid) {
          throw new Error(
            `model says ${m.valid ? 'valid' : 'refused'}, the decoder ${decoded === undefined ? 'refused' : 'read'} it`,
          );
        }
      }),
      { numRuns: 10_000 },
    );
  });

  it(`model messages with lying lengths and counts, and flipped bytes, decode or throw ChunkDecodeError (${MODEL_FUZZ_RUNS} inputs)`, () => {
    fc.assert(
      fc.property(
        fc.oneof(mutatedFields(modelMessage), mutated(modelMessage.map((m) => Uint8Array.from(m.bytes)))),
        (bytes) => typedOnly(() => decodeAmqp10Message(bytes)),
      ),
      { numRuns: MODEL_FUZZ_RUNS },
    );
  });

  it(`decoding N bytes of a message retains at most ${C}·N values and ${C}·N bytes, whatever the bytes`, () => {
    fc.assert(
      fc.property(
        fc.oneof(
          modelMessage.map((m) => m.bytes),
          mutatedFields(modelMessage),
        ),
        (bytes) => {
          const decoded = decodedOrRefused(() => decodeAmqp10Message(bytes));
          if (decoded !== undefined) withinC(decoded, 4 + bytes.length, 'message');
        },
      ),
      { numRuns: 10_000 },
    );
    printWorst('message memory');
  });

  it(`decoding a Deliver frame of N bytes retains at most ${C}·(N + max(maxInflatedBytes, ${INFLATE_RATIO}·N)), gzip bombs and mutations included`, () => {
    fc.assert(
      fc.property(fc.oneof(modelChunk, mutated(modelChunk)), (frame) => {
        const decoded = decodedOrRefused(() =>
          decodeDeliverFrame(frame, Math.min(4, frame.length), frame.length, LIMITS),
        );
        const inflated = Math.max(LIMITS.maxInflatedBytes, INFLATE_RATIO * frame.length);
        if (decoded !== undefined) withinC(decoded, frame.length + inflated, 'frame');
      }),
      { numRuns: 2_000 },
    );
    printWorst('frame memory');
  });
});

describe('decoders - memory, in a child process with a 64 MB heap (issue 32)', () => {
  it("the issue's amplification inputs, gzip bombs and hostile structured inputs retain at most 24 MiB each; a regression fails here instead of killing the runner", async () => {
    const child = spawn(
      process.execPath,
      [
        '--max-old-space-size=64',
        '--expose-gc',
        '--import',
        'tsx',
        'property-tests/support/decoder-memory-child.ts',
      ],
      {
        env: { ...process.env, FC_SEED: String(fc.readConfigureGlobal().seed ?? Date.now()) },
        stdio: ['ignore', 'pipe', 'pipe'],
      },
    );
    let out = '';
    let err = '';
    child.stdout.on('data', (b: Buffer) => (out += b.toString()));
    child.stderr.on('data', (b: Buffer) => (err += b.toString()));
    const [code, signal] = (await once(child, 'exit')) as [number | null, NodeJS.Signals | null];
    console.log(`[decoder memory child] exit ${code ?? signal}\n${out}`);
    expect({ code, signal, stderr: err.slice(-2_000) }).toEqual({ code: 0, signal: null, stderr: '' });
  }, 300_000);
});
