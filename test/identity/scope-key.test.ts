import { describe, expect, it } from 'vitest';
import { isDedupError } from '../../src/errors.js';
import { decodeScopeKey, encodeScopeKey, scopeKeyPrefix, type Scope } from '../../src/identity/scope-key.js';

function scope(consumer: string, tenant: string, producer: string): Scope {
  return { consumer, tenant, producer };
}

function expectCorrupt(key: string): void {
  let thrown: unknown;
  try {
    decodeScopeKey(key);
  } catch (err) {
    thrown = err;
  }
  expect(isDedupError(thrown, 'DEDUP_STORE_CORRUPT'), `decoding ${JSON.stringify(key)}`).toBe(true);
}

describe('scope key', () => {
  it('scope key - encodes each component as <length>:<value>, consumer, tenant, producer', () => {
    expect(encodeScopeKey(scope('balance-projection', 'acme', 'orders-svc'))).toBe(
      '18:balance-projection4:acme10:orders-svc',
    );
    expect(encodeScopeKey(scope('a:b', '', 'c'))).toBe('3:a:b0:1:c');
  });

  it('scope key - tells apart triples that a plain join with ":" would confuse', () => {
    const keys = [
      encodeScopeKey(scope('a:b', 'c', 'd')),
      encodeScopeKey(scope('a', 'b:c', 'd')),
      encodeScopeKey(scope('a', 'b', 'c:d')),
      encodeScopeKey(scope('a', '', 'b:c:d')),
      encodeScopeKey(scope('1', '1:1', '1')),
      encodeScopeKey(scope('1:1', '1', '1')),
      encodeScopeKey(scope('1', '1', '1:1')),
      encodeScopeKey(scope('11', '', '1')),
      encodeScopeKey(scope('1', '', '11')),
    ];
    expect(new Set(keys).size).toBe(keys.length);
  });

  it('scope key - decodes what it encodes, including separators, digits, empty tenant and astral characters', () => {
    for (const s of [
      scope('c', '', 'p'),
      scope('a:b', '2:xy', '0:'),
      scope('__proto__', 'constructor', 'hasOwnProperty'),
      scope('consumer 🚀', 'tenant\u0000', 'p'),
    ]) {
      expect(decodeScopeKey(encodeScopeKey(s))).toEqual(s);
    }
  });

  it('scope key - measures lengths in UTF-16 code units', () => {
    expect(encodeScopeKey(scope('🚀', '', 'é'))).toBe('2:🚀0:1:é');
  });

  it('scope key - keys of __proto__ and constructor are safe as Map and object keys', () => {
    const key = encodeScopeKey(scope('__proto__', '', 'constructor'));
    expect(key).toBe('9:__proto__0:11:constructor');
    const record: Record<string, number> = {};
    record[key] = 1;
    expect(Object.getPrototypeOf(record)).toBe(Object.prototype);
    expect(Object.keys(record)).toEqual([key]);
  });

  it('scope key - gives every key of a consumer its prefix, and no key of another consumer', () => {
    const prefix = scopeKeyPrefix('a');
    expect(prefix).toBe('1:a');
    expect(encodeScopeKey(scope('a', 't', 'p')).startsWith(prefix)).toBe(true);
    expect(encodeScopeKey(scope('a', '', 'p')).startsWith(prefix)).toBe(true);
    for (const other of ['ab', 'a:', 'a1', 'b', '1:a']) {
      expect(encodeScopeKey(scope(other, '', 'p')).startsWith(prefix), other).toBe(false);
    }
  });

  it('scope key - a range scan from the prefix up to prefix + ":" over UTF-8 keys finds exactly one consumer', () => {
    const consumers = ['a', 'ab', 'a:', 'a1', 'b', '1:a', 'a\uffff', 'a🚀'];
    const keys = consumers.flatMap((c) =>
      ['', 't', '🚀'].map((t) => ({ c, key: encodeScopeKey(scope(c, t, 'p')) })),
    );
    const utf8 = (text: string) => Buffer.from(text, 'utf8');
    for (const consumer of consumers) {
      const prefix = scopeKeyPrefix(consumer);
      const inRange = keys.filter(
        ({ key }) =>
          Buffer.compare(utf8(key), utf8(prefix)) >= 0 && Buffer.compare(utf8(key), utf8(`${prefix}:`)) < 0,
      );
      expect(
        inRange.map(({ c }) => c),
        consumer,
      ).toEqual([consumer, consumer, consumer]);
    }
  });

  it('scope key - allows an empty tenant but rejects an empty consumer or producer with RangeError', () => {
    expect(() => encodeScopeKey(scope('c', '', 'p'))).not.toThrow();
    expect(() => encodeScopeKey(scope('', 't', 'p'))).toThrow(RangeError);
    expect(() => encodeScopeKey(scope('c', 't', ''))).toThrow(RangeError);
    expect(() => scopeKeyPrefix('')).toThrow(RangeError);
  });

  it('scope key - rejects a lone surrogate with RangeError (UTF-8 on disk would merge distinct keys)', () => {
    expect(() => encodeScopeKey(scope('c\uD800', '', 'p'))).toThrow(RangeError);
    expect(() => encodeScopeKey(scope('c', '\uDC00', 'p'))).toThrow(RangeError);
    expect(() => encodeScopeKey(scope('c', '', '\uDC00\uD800'))).toThrow(RangeError);
  });

  it('scope key - rejects non-string components and a non-object scope with TypeError', () => {
    expect(() => encodeScopeKey(scope(1 as unknown as string, '', 'p'))).toThrow(TypeError);
    expect(() => encodeScopeKey(scope('c', undefined as unknown as string, 'p'))).toThrow(TypeError);
    expect(() => encodeScopeKey(scope('c', '', null as unknown as string))).toThrow(TypeError);
    expect(() => encodeScopeKey(null as unknown as Scope)).toThrow(TypeError);
    expect(() => scopeKeyPrefix(7 as unknown as string)).toThrow(TypeError);
    expect(() => decodeScopeKey(7 as unknown as string)).toThrow(TypeError);
  });

  it('scope key - refuses malformed keys with DEDUP_STORE_CORRUPT', () => {
    for (const key of [
      '',
      '1:a',
      '1:a0:',
      'x:a0:1:p',
      '01:a0:1:p',
      '1:a00:1:p',
      '-1:a0:1:p',
      '1:a0:1:p ',
      '1:a0:1:pq',
      '0:0:1:p',
      '1:a0:0:',
      '5:a0:1:p',
      '1:a0:9:p',
      '1:a0:1',
      '99999999999999999999:a0:1:p',
      '1:\uD8000:1:p',
    ]) {
      expectCorrupt(key);
    }
  });
});
