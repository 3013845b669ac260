import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { assertProducerName, MAX_PRODUCER_NAME_BYTES } from '../../src/identity/producer-name.js';
import { measureUtf8 } from '../../src/identity/utf8.js';
import { DedupPublisherCore } from '../../src/publisher/core.js';
import { memoryDisk, memoryStore } from '../support/memory-store.js';
import { ModelBroker, ModelTransport } from '../support/model-broker.js';

describe('producer name', () => {
  it('producer name - accepts names up to 256 UTF-8 bytes, astral characters included', () => {
    for (const name of ['orders-svc', 'é', '🚀', 'a'.repeat(MAX_PRODUCER_NAME_BYTES), '🚀'.repeat(64)]) {
      expect(() => assertProducerName(name), name).not.toThrow();
    }
  });

  it('producer name - rejects a non-string with TypeError; empty, too long and control characters with RangeError', () => {
    expect(() => assertProducerName(7)).toThrow(TypeError);
    expect(() => assertProducerName('')).toThrow(RangeError);
    expect(() => assertProducerName('é'.repeat(129))).toThrow(/258 UTF-8 bytes/);
    expect(() => assertProducerName('a\u0000b')).toThrow(/control/);
  });

  it('producer name - rejects a lone UTF-16 surrogate with RangeError (UTF-8 would merge distinct names)', () => {
    for (const name of ['p\uD800', 'p\uDC00', '\uDC00\uD800', 'a\uD83Db', '🚀\uDE00']) {
      expect(() => assertProducerName(name), JSON.stringify(name)).toThrow(RangeError);
      expect(() => assertProducerName(name), JSON.stringify(name)).toThrow(/lone UTF-16 surrogate/);
    }
    // Why: both names are the same bytes on disk and at the broker.
    expect(Buffer.from('p\uD800', 'utf8').equals(Buffer.from('p\uDC00', 'utf8'))).toBe(true);
  });

  it('producer name - rejects U+FFFD with RangeError (a lossy decoder writes it: consumers would report the name unidentified)', () => {
    for (const name of ['caf\uFFFD', '\uFFFD']) {
      expect(() => assertProducerName(name), JSON.stringify(name)).toThrow(RangeError);
      expect(() => assertProducerName(name), JSON.stringify(name)).toThrow(/U\+FFFD/);
    }
  });

  it('producer name - two names differing in a lone surrogate cannot open on one store (they would share its state)', async () => {
    const broker = new ModelBroker();
    const store = await memoryStore(memoryDisk());
    for (const name of ['p\uD800', 'p\uDC00']) {
      await expect(
        DedupPublisherCore.open(new ModelTransport(broker, 'ledger', name), { producerName: name, store }),
        JSON.stringify(name),
      ).rejects.toThrow(/producerName must not contain a lone UTF-16 surrogate/);
    }
    await store.close();
  });
});

describe('measureUtf8', () => {
  it('measureUtf8 - agrees with Buffer.byteLength and the lone-surrogate regex on any string', () => {
    const units = fc.constantFrom(
      'a',
      'é',
      '€',
      '\uD83D\uDE00',
      '\uD800',
      '\uDBFF',
      '\uDC00',
      '\uDFFF',
      '\u07FF',
      '\u0800',
    );
    fc.assert(
      fc.property(
        fc.oneof(
          fc.string({ unit: 'binary', maxLength: 300 }),
          fc.array(units, { maxLength: 200 }).map((xs) => xs.join('')),
        ),
        (text) => {
          expect(measureUtf8(text)).toEqual({
            bytes: Buffer.byteLength(text, 'utf8'),
            loneSurrogate: /[\uD800-\uDFFF]/u.test(text),
          });
        },
      ),
      { numRuns: 2_000 },
    );
  });
});
