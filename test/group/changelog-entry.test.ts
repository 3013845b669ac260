import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import type { Op } from '../../src/consumer/commit-pipeline.js';
import { DedupError } from '../../src/errors.js';
import {
  decodeEntry,
  decodeRecord,
  encodeEntry,
  encodeGenesis,
  entryId,
  GENESIS_ID,
  type ChangelogEntry,
} from '../../src/group/changelog-entry.js';
import { encodeScopeKey } from '../../src/identity/scope-key.js';
import {
  changelogPositionKey,
  effectKeyPrefix,
  isConsumerKey,
  offsetKey,
  scopeStateKey,
} from '../../src/store/consumer-keys.js';

const HEADER_BYTES = 23;
const WHERE = 'orders-2@41';
const ownsAll = (): boolean => true;

// Well-formed strings only: a lone UTF-16 surrogate becomes U+FFFD in UTF-8 (as it does in LevelDB).
const keyArb = fc.oneof(
  fc.string({ unit: 'binary', maxLength: 40 }),
  fc.string({ unit: 'grapheme', maxLength: 10 }),
  fc.string({ maxLength: 20 }),
);
const opArb: fc.Arbitrary<Op> = fc.oneof(
  fc.record({ type: fc.constant('put' as const), key: keyArb, value: fc.uint8Array({ maxLength: 64 }) }),
  fc.record({ type: fc.constant('del' as const), key: keyArb }),
);
const offsetsArb = fc.bigInt({ min: 0n, max: 2n ** 63n }).chain((lastOffset) =>
  fc.record({
    lastOffset: fc.constant(lastOffset),
    baseOffset:
      lastOffset === 0n
        ? fc.constant(undefined)
        : fc.option(fc.bigInt({ min: 0n, max: lastOffset - 1n }), { nil: undefined }),
  }),
);
function entryArb(minOps: number, maxOps: number): fc.Arbitrary<ChangelogEntry> {
  return fc
    .tuple(offsetsArb, fc.array(opArb, { minLength: minOps, maxLength: maxOps }))
    .map(([offsets, ops]) => ({ ...offsets, ops }));
}

/** The entry with its values as hex, so that a Buffer and a Uint8Array of the same bytes compare equal. */
function plain(entry: ChangelogEntry): unknown {
  return {
    lastOffset: entry.lastOffset,
    baseOffset: entry.baseOffset,
    ops: entry.ops.map((op) =>
      op.type === 'put'
        ? { type: op.type, key: op.key, value: Buffer.from(op.value).toString('hex') }
        : { type: op.type, key: op.key },
    ),
  };
}

/** Expects `decodeEntry` to refuse `raw` with DEDUP_CHANGELOG_INVALID and exactly this reason. */
function expectInvalid(
  raw: Uint8Array,
  why: string,
  ownsKey: (key: string) => boolean = ownsAll,
  where = WHERE,
): void {
  let thrown: unknown;
  try {
    decodeEntry(raw, ownsKey, where);
  } catch (err) {
    thrown = err;
  }
  expect(thrown).toBeInstanceOf(DedupError);
  expect(thrown).toMatchObject({
    code: 'DEDUP_CHANGELOG_INVALID',
    message: `changelog entry ${where} ${why}`,
  });
}

const sample: ChangelogEntry = {
  lastOffset: 9n,
  baseOffset: 4n,
  ops: [
    { type: 'put', key: 'k', value: Uint8Array.of(0xaa, 0xbb) },
    { type: 'del', key: 'é' },
  ],
};

describe('group - changelog entry', () => {
  it('pins the layout of version 2 (an entry, and the genesis)', () => {
    expect(encodeEntry(sample).toString('hex')).toBe(
      '470201' +
        '0000000000000009' +
        '0000000000000004' +
        '00000002' +
        ('01' + '00000001' + '6b' + '00000002' + 'aabb') +
        ('02' + '00000002' + 'c3a9'),
    );
    expect(encodeEntry({ lastOffset: 0n, baseOffset: undefined, ops: [] }).toString('hex')).toBe(
      '470200' + '00'.repeat(20),
    );
    expect(encodeGenesis(7n).toString('hex')).toBe('470202' + '0000000000000007' + '00'.repeat(12));
  });

  it('decodes what it encodes', () => {
    fc.assert(
      fc.property(entryArb(0, 20), fc.nat({ max: 16 }), (entry, shift) => {
        const raw = encodeEntry(entry);
        expect(plain(decodeEntry(raw, ownsAll, WHERE))).toStrictEqual(plain(entry));
        // From a plain Uint8Array inside a larger buffer; the values are copies, not views of it.
        const arena = new Uint8Array(shift + raw.length + 3);
        arena.set(raw, shift);
        const decoded = decodeEntry(arena.subarray(shift, shift + raw.length), ownsAll, WHERE);
        arena.fill(0x5a);
        expect(plain(decoded)).toStrictEqual(plain(entry));
      }),
      { numRuns: 500 },
    );
  });

  it('decodes a value longer than 64 KiB and a base offset just below the last offset', () => {
    const value = Uint8Array.from({ length: 70_000 }, (_, i) => i % 251);
    const entry: ChangelogEntry = {
      lastOffset: 2n ** 64n - 1n,
      baseOffset: 2n ** 64n - 2n,
      ops: [{ type: 'put', key: '', value }],
    };
    expect(plain(decodeEntry(encodeEntry(entry), ownsAll, WHERE))).toStrictEqual(plain(entry));
  });

  it('refuses a buffer shorter than its header', () => {
    fc.assert(
      fc.property(fc.uint8Array({ maxLength: HEADER_BYTES - 1 }), (raw) => {
        expectInvalid(raw, `is ${raw.length} bytes long, shorter than its header`);
      }),
    );
  });

  it('refuses a wrong magic byte', () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 0, max: 255 }).filter((m) => m !== 0x47),
        (magic) => {
          const raw = encodeEntry(sample);
          raw[0] = magic;
          expectInvalid(raw, 'is not a stream-dedup changelog entry');
        },
      ),
    );
  });

  it('refuses another version', () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 0, max: 255 }).filter((v) => v !== 2),
        (version) => {
          const raw = encodeEntry(sample);
          raw[1] = version;
          expectInvalid(raw, `has version ${version}, this version reads 2`);
        },
      ),
    );
  });

  it('refuses unknown flags', () => {
    fc.assert(
      fc.property(fc.integer({ min: 2, max: 255 }), (flags) => {
        const raw = encodeEntry(sample);
        raw[2] = flags;
        expectInvalid(raw, `has unknown flags ${flags}`);
      }),
    );
  });

  it('refuses a base offset not below the last offset', () => {
    fc.assert(
      fc.property(
        fc
          .bigInt({ min: 0n, max: 2n ** 63n })
          .chain((last) => fc.tuple(fc.constant(last), fc.bigInt({ min: last, max: 2n ** 64n - 1n }))),
        ([lastOffset, baseOffset]) => {
          const raw = encodeEntry({ lastOffset, baseOffset, ops: [] });
          expectInvalid(raw, `has base offset ${baseOffset}, not below its last offset ${lastOffset}`);
        },
      ),
    );
    expectInvalid(
      encodeEntry({ ...sample, baseOffset: sample.lastOffset }),
      'has base offset 9, not below its last offset 9',
    );
  });

  it('refuses every strict prefix of an entry', () => {
    fc.assert(
      fc.property(entryArb(1, 6), (entry) => {
        const raw = encodeEntry(entry);
        for (let length = 0; length < raw.length; length++) {
          expectInvalid(
            raw.subarray(0, length),
            length < HEADER_BYTES ? `is ${length} bytes long, shorter than its header` : 'is truncated',
          );
        }
      }),
      { numRuns: 200 },
    );
  });

  it('refuses bytes after the last operation', () => {
    fc.assert(
      fc.property(entryArb(0, 6), fc.uint8Array({ minLength: 1, maxLength: 40 }), (entry, extra) => {
        const raw = Buffer.concat([encodeEntry(entry), extra]);
        expectInvalid(raw, `has ${extra.length} bytes after its last operation`);
      }),
    );
    // An op count below the operations that follow it.
    const raw = encodeEntry(sample);
    raw.writeUInt32BE(1, 19);
    expectInvalid(raw, 'has 7 bytes after its last operation');
  });

  it('refuses an operation of unknown kind', () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 0, max: 255 }).filter((k) => k !== 1 && k !== 2),
        fc.constantFrom<Op>({ type: 'del', key: 'k' }, { type: 'put', key: 'k', value: Uint8Array.of(7) }),
        (kind, op) => {
          const raw = encodeEntry({ lastOffset: 3n, baseOffset: undefined, ops: [op] });
          raw[HEADER_BYTES] = kind;
          expectInvalid(raw, `has an operation of unknown kind ${kind}`);
        },
      ),
    );
  });

  it('refuses a key outside the partition, wherever it is', () => {
    fc.assert(
      fc.property(
        entryArb(1, 10).chain((entry) => fc.tuple(fc.constant(entry), fc.nat({ max: entry.ops.length - 1 }))),
        ([entry, i]) => {
          const refused = entry.ops[i]!.key;
          const seen: string[] = [];
          const ownsKey = (key: string): boolean => {
            seen.push(key);
            return key !== refused;
          };
          expectInvalid(
            encodeEntry(entry),
            `writes key ${JSON.stringify(refused)}, outside its partition`,
            ownsKey,
          );
          // Asked about each key as written, in order, up to the first refused one.
          const first = entry.ops.findIndex((op) => op.key === refused);
          expect(seen).toEqual(entry.ops.slice(0, first + 1).map((op) => op.key));
        },
      ),
      { numRuns: 300 },
    );
  });

  it("refuses another consumer's key with isConsumerKey", () => {
    const entry: ChangelogEntry = {
      lastOffset: 5n,
      baseOffset: undefined,
      ops: [
        { type: 'put', key: effectKeyPrefix('a') + 'total', value: Uint8Array.of(1) },
        { type: 'del', key: effectKeyPrefix('a1') + 'total' },
      ],
    };
    const ownsKey = (key: string): boolean => isConsumerKey('a', key);
    expectInvalid(encodeEntry(entry), 'writes key "u:2:a1total", outside its partition', ownsKey, 'g-0@5');
    expect(
      decodeEntry(encodeEntry({ ...entry, ops: entry.ops.slice(0, 1) }), ownsKey, 'g-0@5').ops,
    ).toHaveLength(1);
  });
});

describe('store - isConsumerKey', () => {
  const names = [
    'a',
    'a1',
    'ab',
    'a:',
    '1',
    '11',
    '1:a',
    'a\u0000',
    'a\u0000b',
    '\u0000',
    '🚀',
    'balance-projection',
  ];

  /** Keys that consumer `name`'s commits write. */
  function keysOf(name: string): string[] {
    return [
      offsetKey(name),
      effectKeyPrefix(name),
      effectKeyPrefix(name) + 'total',
      effectKeyPrefix(name) + '\u0000',
      scopeStateKey(encodeScopeKey({ consumer: name, tenant: '', producer: 'p' })),
      scopeStateKey(encodeScopeKey({ consumer: name, tenant: 'acme', producer: 'orders-svc' })),
      scopeStateKey(encodeScopeKey({ consumer: name, tenant: 'x'.repeat(12), producer: '🚀' })),
      scopeStateKey(encodeScopeKey({ consumer: name, tenant: '\u0000', producer: '\uffff' })),
    ];
  }

  it('accepts the offset, scope states and effects of the consumer', () => {
    for (const name of names) {
      for (const key of keysOf(name)) expect(isConsumerKey(name, key), `${name} ${key}`).toBe(true);
    }
  });

  it('refuses the keys of every other consumer, names that extend it included', () => {
    for (const name of names) {
      for (const other of names.filter((n) => n !== name)) {
        for (const key of keysOf(other)) expect(isConsumerKey(name, key), `${name} ${key}`).toBe(false);
      }
    }
  });

  it('refuses keys that are almost its own', () => {
    for (const key of [
      '',
      'c:1:a/offse',
      'c:1:a/offset/',
      'c:01:a/offset',
      'c:2:a/offset',
      'u:1:',
      'u:01:a',
      'v:1:a:',
      'v:1:',
      changelogPositionKey('a'),
      'x',
    ]) {
      expect(isConsumerKey('a', key), key).toBe(false);
    }
  });

  it('tells any two consumers apart', () => {
    const name = fc.string({ unit: 'binary', minLength: 1, maxLength: 12 });
    fc.assert(
      fc.property(
        name,
        name,
        fc.string({ unit: 'binary', maxLength: 12 }),
        fc.string({ unit: 'binary', minLength: 1, maxLength: 12 }),
        fc.string({ unit: 'binary', maxLength: 12 }),
        (a, b, tenant, producer, effect) => {
          fc.pre(a !== b);
          const keys = (n: string): string[] => [
            offsetKey(n),
            effectKeyPrefix(n) + effect,
            scopeStateKey(encodeScopeKey({ consumer: n, tenant, producer })),
          ];
          for (const key of keys(a)) expect(isConsumerKey(a, key), key).toBe(true);
          for (const key of keys(b)) expect(isConsumerKey(a, key), key).toBe(false);
        },
      ),
      { numRuns: 2_000 },
    );
  });
});

describe('changelog genesis', () => {
  it('decodes to its start, and entries decode as entries; IDs: the genesis 1, an entry its last offset + 2', () => {
    fc.assert(
      fc.property(fc.bigInt({ min: 0n, max: 2n ** 64n - 1n }), (start) => {
        expect(decodeRecord(encodeGenesis(start), ownsAll, WHERE)).toEqual({ kind: 'genesis', start });
      }),
      { numRuns: 500 },
    );
    const entry: ChangelogEntry = { lastOffset: 9n, baseOffset: 4n, ops: [{ type: 'del', key: 'k' }] };
    expect(decodeRecord(encodeEntry(entry), ownsAll, WHERE)).toEqual({ kind: 'entry', ...entry });
    expect({ genesis: GENESIS_ID, first: entryId(0n), tenth: entryId(9n) }).toEqual({
      genesis: 1n,
      first: 2n,
      tenth: 11n,
    });
  });

  it('refuses a genesis with anything after its header, a base or operations; decodeEntry refuses a genesis', () => {
    const genesis = encodeGenesis(7n);
    const withBase = Buffer.from(genesis);
    withBase.writeBigUInt64BE(3n, 11);
    const withOps = Buffer.from(genesis);
    withOps.writeUInt32BE(1, 19);
    for (const bad of [Buffer.concat([genesis, Buffer.from([0])]), withBase, withOps]) {
      expect(() => decodeRecord(bad, ownsAll, WHERE)).toThrow(
        expect.objectContaining({ code: 'DEDUP_CHANGELOG_INVALID' }) as Error,
      );
    }
    expect(() => decodeEntry(genesis, ownsAll, WHERE)).toThrow(/unknown flags 2/);
  });
});
