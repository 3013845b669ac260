import fc from 'fast-check';
import { mutated } from './support/mutations.js';
import { describe, expect, it } from 'vitest';
import { VerifyingConsumerCore } from '../src/consumer/core.js';
import { DedupError } from '../src/errors.js';
import { ID_HEADER, PRODUCER_HEADER, identityHeaders, readIdentity } from '../src/identity/headers.js';
import { MAX_PUBLISHING_ID, parsePublishingId } from '../src/identity/publishing-id.js';
import { encodeScopeKey } from '../src/identity/scope-key.js';
import {
  decodeMeta,
  decodeSegment,
  encodeMeta,
  encodeSegment,
  type OutboxEntry,
  type ProducerMeta,
} from '../src/store/codec.js';
import { DedupStore } from '../src/store/store.js';
import { createTracker } from '../src/verifier/index.js';
import { memoryDisk } from '../test/support/memory-store.js';
import { ProcessDisk } from './support/disk.js';
import { assertProperty } from './support/runs.js';

// The seed is set globally by property-tests/setup.ts. decodeTracker is fuzzed in verifier.test.ts.

const FUZZ_RUNS = 100_000;

/** Runs `decode`; any exception but DedupError DEDUP_STORE_CORRUPT fails. Returns the value or undefined. */
function corruptOrValue<T>(decode: () => T): T | undefined {
  try {
    return decode();
  } catch (err) {
    if (err instanceof DedupError && err.code === 'DEDUP_STORE_CORRUPT') return undefined;
    throw err;
  }
}

const u64 = fc.oneof(
  fc.constantFrom(0n, 1n, MAX_PUBLISHING_ID, 2n ** 63n),
  fc.bigInt(0n, 1_000n),
  fc.bigInt(0n, MAX_PUBLISHING_ID),
);

const meta: fc.Arbitrary<ProducerMeta> = fc.record({
  idMode: fc.constantFrom<'auto' | 'explicit'>('auto', 'explicit'),
  lastId: u64,
  reservedUpTo: u64,
});

const headerValue = fc.oneof(
  fc.string({ minLength: 1, maxLength: 8 }),
  fc.integer({ min: -0x8000_0000, max: 0x7fff_ffff }).filter((n) => n !== 0),
);
const headers = fc.option(
  fc.dictionary(
    fc.oneof(fc.string({ maxLength: 6 }), fc.constantFrom('__proto__', 'constructor', '0', '1')),
    headerValue,
    { maxKeys: 3 },
  ),
  { nil: undefined },
);

const segment: fc.Arbitrary<OutboxEntry[]> = fc
  .tuple(
    fc.bigInt(1n, 1_000n),
    fc.array(fc.tuple(fc.bigInt(1n, 5n), fc.uint8Array({ maxLength: 12 }), headers), {
      minLength: 1,
      maxLength: 5,
    }),
  )
  .map(([first, rows]) => {
    let id = first - 1n;
    return rows.map(([step, body, h]) => {
      id += step;
      return {
        publishingId: id,
        body,
        headers: h === undefined || Object.keys(h).length === 0 ? undefined : h,
      };
    });
  });

/** Header JSON that is valid, invalid, or of the wrong shape, for segment envelopes built by hand. */
const headerJson = fc.oneof(
  fc.constantFrom(
    '',
    '{}',
    '[]',
    'null',
    '1',
    '"x"',
    '{"a":null}',
    '{"a":[1]}',
    '{"a":{}}',
    '{"__proto__":1}',
    '{"a":1e400}',
    '{',
    '\uFFFF',
  ),
  fc.json({ maxDepth: 2 }),
  fc.string({ maxLength: 10 }),
);

/** A segment record assembled field by field, each length possibly lying. */
const handBuiltSegment = fc
  .tuple(
    fc.constantFrom(0, 1, 1, 1, 2),
    fc.array(
      fc.tuple(
        u64,
        headerJson,
        fc.uint8Array({ maxLength: 6 }),
        fc.integer({ min: -2, max: 2 }),
        fc.integer({ min: -2, max: 2 }),
      ),
      { maxLength: 4 },
    ),
    fc.integer({ min: -1, max: 1 }),
  )
  .map(([version, rows, countDelta]) => {
    const parts: Buffer[] = [];
    const head = Buffer.alloc(5);
    head.writeUInt8(version, 0);
    head.writeUInt32BE(Math.max(0, rows.length + countDelta), 1);
    parts.push(head);
    for (const [id, json, body, hDelta, bDelta] of rows) {
      const h = Buffer.from(json, 'utf8');
      const fixed = Buffer.alloc(12);
      fixed.writeBigUInt64BE(id, 0);
      fixed.writeUInt32BE(Math.max(0, h.length + hDelta), 8);
      const bl = Buffer.alloc(4);
      bl.writeUInt32BE(Math.max(0, body.length + bDelta), 0);
      parts.push(fixed, h, bl, Buffer.from(body));
    }
    return Uint8Array.from(Buffer.concat(parts));
  });

describe('fuzzing the decoders (100 000 inputs each)', () => {
  it('parsePublishingId - accepts exactly the canonical decimals from 1 to 2^64 - 1 and never throws', () => {
    const digits = fc.string({ unit: fc.constantFrom('0', '1', '9', '8'), maxLength: 22 });
    const text = fc.oneof(
      digits,
      u64.map(String),
      u64.map((v) => String(v + 1n)),
      fc.constantFrom(
        '18446744073709551615',
        '18446744073709551616',
        '0',
        '00',
        '01',
        '-1',
        '+1',
        ' 1',
        '1 ',
        '1e3',
        '0x1f',
        '١',
        '１',
        '1_000',
        '',
      ),
      fc.string({ maxLength: 24 }),
      fc.string({ unit: 'binary', maxLength: 8 }),
    );
    fc.assert(
      fc.property(text, (t) => {
        const parsed = parsePublishingId(t);
        const canonical =
          /^[0-9]+$/.test(t) &&
          BigInt(t).toString() === t &&
          BigInt(t) >= 1n &&
          BigInt(t) <= MAX_PUBLISHING_ID;
        if (canonical ? parsed !== BigInt(t) : parsed !== undefined) {
          throw new Error(`parsePublishingId(${JSON.stringify(t)}) = ${String(parsed)}`);
        }
      }),
      { numRuns: FUZZ_RUNS },
    );
    fc.assert(fc.property(fc.bigInt(1n, MAX_PUBLISHING_ID), (id) => parsePublishingId(id.toString()) === id));
  });

  it('readIdentity - never throws: missing without either header, malformed for anything but a valid pair, ok round-trips through identityHeaders', () => {
    const anyValue = fc.oneof(
      fc.anything({
        withBigInt: true,
        withBoxedValues: true,
        withDate: true,
        withMap: true,
        withSet: true,
        withNullPrototype: true,
        withTypedArray: true,
        withSparseArray: true,
        maxDepth: 2,
      }),
      fc.uint8Array({ maxLength: 8 }).map((b) => Buffer.from(b)),
      fc.constantFrom(Buffer.from([0xff, 0xfe]), Buffer.from('17'), Buffer.from('017'), Symbol('x'), () => 1),
      fc.string({ unit: fc.constantFrom('0', '1', '9'), maxLength: 21 }),
      fc.bigInt(0n, 2n ** 65n).map(String),
      fc.string({ minLength: 250, maxLength: 300 }),
      fc.string({ unit: 'grapheme', minLength: 60, maxLength: 90 }),
    );
    const source = fc.oneof(
      { weight: 1, arbitrary: fc.constantFrom(undefined, null, 0, 'x-dedup-id', [], true) },
      { weight: 2, arbitrary: fc.dictionary(fc.string({ maxLength: 4 }), anyValue, { maxKeys: 2 }) },
      {
        weight: 6,
        arbitrary: fc
          .record(
            { name: anyValue, id: anyValue, extra: anyValue, nullProto: fc.boolean() },
            { requiredKeys: ['nullProto'] },
          )
          .map(({ name, id, extra, nullProto }) => {
            const h: Record<string, unknown> = nullProto
              ? (Object.create(null) as Record<string, unknown>)
              : {};
            if (name !== undefined) h[PRODUCER_HEADER] = name;
            if (id !== undefined) h[ID_HEADER] = id;
            if (extra !== undefined) h['x-other'] = extra;
            return h;
          }),
      },
      {
        weight: 3,
        arbitrary: fc
          .tuple(fc.string({ minLength: 1, maxLength: 10 }), fc.bigInt(1n, MAX_PUBLISHING_ID))
          .map(([n, id]) => identityHeaders(n, id)),
      },
    );
    fc.assert(
      fc.property(fc.array(source, { maxLength: 3 }), (sources) => {
        const reading = readIdentity(...(sources as Array<Record<string, unknown> | undefined>));
        const first = sources.find(
          (s): s is Record<string, unknown> =>
            typeof s === 'object' &&
            s !== null &&
            (Object.hasOwn(s, PRODUCER_HEADER) || Object.hasOwn(s, ID_HEADER)),
        );
        if (first === undefined) {
          expect(reading).toEqual({ kind: 'missing' });
          return;
        }
        if (reading.kind === 'missing') throw new Error('missing although a source holds an identity header');
        if (reading.kind === 'malformed') {
          expect(typeof reading.reason).toBe('string');
          return;
        }
        const { producerName, publishingId } = reading.identity;
        expect(first[PRODUCER_HEADER]).toBe(producerName);
        expect(producerName.length).toBeGreaterThan(0);
        expect(Buffer.byteLength(producerName)).toBeLessThanOrEqual(256);
        const raw = first[ID_HEADER];
        expect(Buffer.isBuffer(raw) ? raw.toString('utf8') : raw).toBe(publishingId.toString());
        expect(readIdentity(identityHeaders(producerName, publishingId))).toEqual(reading);
      }),
      { numRuns: FUZZ_RUNS },
    );
  });

  it('decodeMeta - throws only DedupError DEDUP_STORE_CORRUPT, and whatever it accepts re-encodes to the same bytes', () => {
    fc.assert(
      fc.property(
        fc.oneof(fc.uint8Array({ maxLength: 24 }), mutated(meta.map((m) => Uint8Array.from(encodeMeta(m))))),
        (bytes) => {
          const decoded = corruptOrValue(() => decodeMeta(bytes));
          if (decoded !== undefined)
            expect(Buffer.from(encodeMeta(decoded)).equals(Buffer.from(bytes))).toBe(true);
        },
      ),
      { numRuns: FUZZ_RUNS },
    );
    fc.assert(
      fc.property(meta, (m) => {
        expect(decodeMeta(encodeMeta(m))).toEqual(m);
      }),
      { numRuns: 1_000 },
    );
  });

  it('decodeSegment - throws only DedupError DEDUP_STORE_CORRUPT; what it accepts has increasing ids and string or number headers', () => {
    const bytes = fc.oneof(
      fc.uint8Array({ maxLength: 40 }),
      mutated(segment.map((entries) => Uint8Array.from(encodeSegment(entries)))),
      handBuiltSegment,
    );
    fc.assert(
      fc.property(bytes, (b) => {
        const entries = corruptOrValue(() => decodeSegment(b));
        if (entries === undefined) return;
        expect(entries.length).toBeGreaterThan(0);
        let previous = 0n;
        for (const e of entries) {
          expect(e.publishingId > previous).toBe(true);
          previous = e.publishingId;
          for (const v of Object.values(e.headers ?? {})) expect(['string', 'number']).toContain(typeof v);
        }
      }),
      { numRuns: FUZZ_RUNS },
    );
    fc.assert(
      fc.property(segment, (entries) => {
        const decoded = decodeSegment(encodeSegment(entries));
        expect(decoded.map((e) => ({ ...e, body: Buffer.from(e.body) }))).toEqual(
          entries.map((e) => ({ ...e, body: Buffer.from(e.body) })),
        );
      }),
      { numRuns: 2_000 },
    );
  });

  it('verifying consumer - garbage verifier state (v: key) or offset record makes open/process fail only with DedupError DEDUP_STORE_CORRUPT, never another exception', async () => {
    const scopeKey = encodeScopeKey({ consumer: 'c', tenant: '', producer: 'p' });
    const trackerBytes = fc
      .tuple(
        fc.oneof(
          fc.constant({ kind: 'highest' as const }),
          fc.integer({ min: 1, max: 70 }).map((size) => ({ kind: 'window' as const, size })),
        ),
        fc.array(fc.bigInt(1n, 100n), { maxLength: 10 }),
      )
      .map(([spec, ids]) => {
        const t = createTracker(spec);
        for (const id of ids) if (t.check(id).outcome === 'new') t.record(id);
        return t.encode();
      });
    const scopeRecord = fc.oneof(
      fc.uint8Array({ maxLength: 40 }),
      mutated(
        fc.tuple(fc.oneof(u64, fc.constant(BigInt(Date.now()))), trackerBytes).map(([seen, t]) => {
          const b = Buffer.alloc(8 + t.length);
          b.writeBigUInt64BE(seen, 0);
          b.set(t, 8);
          return Uint8Array.from(b);
        }),
      ),
    );
    const disk = memoryDisk();
    await assertProperty(
      'consumer decodeScope fuzz',
      fc.asyncProperty(
        scopeRecord,
        fc.option(fc.uint8Array({ maxLength: 10 }), { freq: 20, nil: undefined }),
        fc.bigInt(1n, 120n),
        fc.boolean(),
        async (record, offsetRecord, id, withTtl) => {
          await disk.batch([
            { type: 'put', key: `v:${scopeKey}`, value: record },
            offsetRecord === undefined
              ? { type: 'del', key: 'c:1:c/offset' }
              : { type: 'put', key: 'c:1:c/offset', value: offsetRecord },
          ]);
          // A fresh store object per input: a failed open() must not leave a claim behind for the
          // next input (that is a property of its own, below).
          const store = await DedupStore.wrap(new ProcessDisk(disk));
          let core: VerifyingConsumerCore | undefined;
          try {
            // With a TTL, open() reads every scope of the consumer (evictIdle); without, process() does.
            core = await VerifyingConsumerCore.open({
              consumerName: 'c',
              store,
              commit: 'message',
              scopeTtlMs: withTtl ? 3_600_000 : 0,
              handler: () => undefined,
            });
            // Stream offsets are u64: after 2^64 - 1 nothing more can arrive.
            const offset = (core.committedOffset ?? -1n) + 1n;
            if (offset <= MAX_PUBLISHING_ID) {
              await core.process({
                offset,
                content: Buffer.alloc(0),
                applicationProperties: identityHeaders('p', id),
              });
            }
          } catch (err) {
            if (!(err instanceof DedupError) || err.code !== 'DEDUP_STORE_CORRUPT') throw err;
          } finally {
            await core?.close();
          }
        },
      ),
      { numRuns: FUZZ_RUNS },
    );
  });

  it('verifying consumer - an open() that fails on a corrupt record gives the consumer name back: the next open on the same store fails the same way, not with DEDUP_STORE_LOCKED', async () => {
    await assertProperty(
      'consumer claim after a failed open',
      fc.asyncProperty(
        fc.oneof(
          fc.uint8Array({ maxLength: 7 }).map((b) => ({ key: 'c:1:c/offset', value: b })),
          fc.uint8Array({ minLength: 9, maxLength: 12 }).map((b) => ({ key: 'c:1:c/offset', value: b })),
          fc.uint8Array({ maxLength: 7 }).map((b) => ({
            key: `v:${encodeScopeKey({ consumer: 'c', tenant: '', producer: 'p' })}`,
            value: b,
          })),
        ),
        async (record) => {
          const disk = memoryDisk();
          await disk.open();
          await disk.put(record.key, record.value);
          const store = await DedupStore.wrap(new ProcessDisk(disk));
          const open = () =>
            VerifyingConsumerCore.open({
              consumerName: 'c',
              store,
              scopeTtlMs: 3_600_000,
              handler: () => undefined,
            }).then(
              (core) => core.close().then(() => 'opened'),
              (err: unknown) => (err instanceof DedupError ? err.code : String(err)),
            );
          expect(await open()).toBe('DEDUP_STORE_CORRUPT');
          expect(await open()).toBe('DEDUP_STORE_CORRUPT');
        },
      ),
      { numRuns: 200 },
    );
  });
});
