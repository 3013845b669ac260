import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { readIdentity } from '../src/identity/headers.js';
import { encodeScopeKey } from '../src/identity/scope-key.js';
import { decodeAmqp10Message } from '../src/transport/amqp10-decode.js';
import { amqpMap, amqpString, section } from '../test/support/chunks.js';
import { amqpChar, amqpStringBytes } from './support/hostile-headers.js';

// Issue 32, item 1: identity decoding is injective. Whatever bytes a writer puts in
// x-dedup-producer, two different byte strings never become two identities with one name or one
// scope key, and a decoded value re-encodes to the bytes it came from. Checked on both consumer
// paths: the stream consumer's AMQP 1.0 decoder, and amqplib's field-table decoder (AMQP 0-9-1),
// which hands strings over already decoded.
//
// The seed is set globally by property-tests/setup.ts; replay with FC_SEED=… (and FC_PATH=…).

// amqplib's own field-table decoder (not exported: loaded by path), as its consumer path runs it.
const require = createRequire(import.meta.url);
const codec = require(join(dirname(require.resolve('amqplib')), 'lib', 'codec.js')) as {
  decodeFields(this: void, slice: Buffer): Record<string, unknown>;
};
const decodeFields = codec.decodeFields;

const RUNS = 10_000;

/**
 * Byte strings as names: arbitrary bytes, and near-misses of UTF-8 text (one byte changed,
 * dropped or added), so that pairs often differ only where a lossy decoder would replace.
 */
const nameBytes: fc.Arbitrary<Uint8Array> = fc.oneof(
  fc.uint8Array({ minLength: 1, maxLength: 8 }),
  fc
    .tuple(
      fc.string({ unit: 'grapheme', minLength: 1, maxLength: 4 }),
      fc.nat(),
      fc.integer({ min: 0, max: 255 }),
    )
    .map(([text, at, byte]) => {
      const b = Buffer.from(text, 'utf8');
      b[at % b.length] = byte;
      return b;
    }),
  fc.constantFrom('café', 'cafè', 'caf\uFFFD').map((s) => Buffer.from(s, 'latin1')),
);

/** A pair of different byte strings, often one byte apart. */
const twoNames = fc
  .oneof(
    fc.tuple(nameBytes, nameBytes),
    fc.tuple(nameBytes, fc.nat(), fc.integer({ min: 0, max: 255 })).map(([a, at, byte]) => {
      const b = Buffer.from(a);
      b[at % b.length] = byte;
      return [a, b] as [Uint8Array, Uint8Array];
    }),
  )
  .filter(([a, b]) => !Buffer.from(a).equals(Buffer.from(b)));

const stringCode = fc.constantFrom<0xa1 | 0xa3 | 0xb1 | 0xb3>(0xa1, 0xa3, 0xb1, 0xb3);

/** The application properties of an AMQP 1.0 message stamped with the encoded name `name` and ID 1. */
function amqp10Headers(name: Buffer): Record<string, unknown> {
  return decodeAmqp10Message(
    section(0x74, amqpMap([amqpString('x-dedup-producer'), name, amqpString('x-dedup-id'), amqpString('1')])),
  ).applicationProperties;
}

/** The headers amqplib gives an AMQP 0-9-1 consumer for a field table whose x-dedup-producer is the longstr `name`. */
function amqp091Headers(name: Uint8Array): Record<string, unknown> {
  const field = (key: string, value: Uint8Array) => {
    const k = Buffer.from(key, 'latin1');
    const length = Buffer.alloc(4);
    length.writeUInt32BE(value.length);
    return Buffer.concat([Buffer.from([k.length]), k, Buffer.from('S'), length, value]);
  };
  return decodeFields(
    Buffer.concat([field('x-dedup-producer', name), field('x-dedup-id', Buffer.from('1'))]),
  );
}

/** Two readings of different bytes never share a name or a scope key. */
function expectApart(a: Record<string, unknown>, b: Record<string, unknown>): void {
  const ra = readIdentity(a);
  const rb = readIdentity(b);
  if (ra.kind !== 'ok' || rb.kind !== 'ok') return;
  expect(ra.identity.producerName).not.toBe(rb.identity.producerName);
  const key = (producer: string) => encodeScopeKey({ consumer: 'c', tenant: '', producer });
  expect(key(ra.identity.producerName)).not.toBe(key(rb.identity.producerName));
}

/** A decoded value re-encodes to the bytes it came from; an accepted name re-encodes too. */
function expectReencodes(value: unknown, bytes: Uint8Array): void {
  const again = typeof value === 'string' ? Buffer.from(value, 'utf8') : value;
  expect(
    Buffer.isBuffer(again) && again.equals(bytes),
    `${JSON.stringify(value)} from ${Buffer.from(bytes).toString('hex')}`,
  ).toBe(true);
}

describe('identity decoding is injective (issue 32)', () => {
  it('AMQP 1.0 str and sym: a decoded name re-encodes to its bytes; two byte strings never give one identity or scope key', () => {
    fc.assert(
      fc.property(twoNames, stringCode, stringCode, ([a, b], ca, cb) => {
        const ha = amqp10Headers(amqpStringBytes(a, ca));
        const hb = amqp10Headers(amqpStringBytes(b, cb));
        expectReencodes(ha['x-dedup-producer'], a);
        expectReencodes(hb['x-dedup-producer'], b);
        expectApart(ha, hb);
        const r = readIdentity(ha);
        if (r.kind === 'ok') expectReencodes(r.identity.producerName, a);
      }),
      { numRuns: RUNS },
    );
  });

  it('AMQP 1.0 char: two code points, surrogates included, never give one identity, and process() would never see a name it cannot key', () => {
    const point = fc.oneof(fc.integer({ min: 0xd800, max: 0xdfff }), fc.integer({ min: 0, max: 0x10ffff }));
    fc.assert(
      fc.property(point, point, (p, q) => {
        fc.pre(p !== q);
        const ha = amqp10Headers(amqpChar(p));
        const hb = amqp10Headers(amqpChar(q));
        expect(ha['x-dedup-producer']).not.toBe(hb['x-dedup-producer']);
        expectApart(ha, hb);
        for (const h of [ha, hb]) {
          const r = readIdentity(h);
          // An accepted name is a valid scope component: encodeScopeKey must not throw.
          if (r.kind === 'ok')
            encodeScopeKey({ consumer: 'c', tenant: '', producer: r.identity.producerName });
        }
      }),
      { numRuns: RUNS },
    );
  });

  it('AMQP 0-9-1 longstr through amqplib (decoded lossily there): two byte strings never give one identity or scope key', () => {
    fc.assert(
      fc.property(twoNames, ([a, b]) => {
        expectApart(amqp091Headers(a), amqp091Headers(b));
      }),
      { numRuns: RUNS },
    );
  });
});
