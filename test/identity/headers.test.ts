import { describe, expect, it } from 'vitest';
import { identityHeaders, readIdentity } from '../../src/identity/headers.js';

// readIdentity is the one identity check of the consumer and of `audit`: a name the publisher
// would refuse is malformed, so that no two producers share a scope and no name breaks a scope key.

const named = (name: unknown) => ({ 'x-dedup-producer': name, 'x-dedup-id': '1' });

describe('readIdentity - producer names', () => {
  it('a name a lossy decoder wrote (U+FFFD) or the bytes of one that is not UTF-8 (a Buffer) is malformed', () => {
    // amqplib's longstr and Buffer#toString('utf8') turn Latin-1 `caf\xE9` and `caf\xE8` into one name.
    const lossy = Buffer.from([0x63, 0x61, 0x66, 0xe9]).toString('utf8');
    expect(lossy).toBe(Buffer.from([0x63, 0x61, 0x66, 0xe8]).toString('utf8'));
    expect(readIdentity(named(lossy))).toEqual({
      kind: 'malformed',
      reason: expect.stringMatching(/U\+FFFD/) as string,
    });
    expect(readIdentity(named(Buffer.from([0x63, 0x61, 0x66, 0xe9])))).toEqual({
      kind: 'malformed',
      reason: 'x-dedup-producer must be a non-empty string, got bytes that are not UTF-8',
    });
  });

  it('a name with a lone UTF-16 surrogate (an AMQP 1.0 char) or a control character is malformed, never a throw', () => {
    for (const name of ['p\uD800', '\uDC00', 'a\uD83Db', 'p\u0000', 'p\u009f']) {
      const reading = readIdentity(named(name));
      expect(reading.kind, JSON.stringify(name)).toBe('malformed');
    }
    // The same name checked twice in a row (the last name checked is cached) is malformed twice.
    expect(readIdentity(named('q\uD800')).kind).toBe('malformed');
    expect(readIdentity(named('q\uD800')).kind).toBe('malformed');
  });

  it('a name over 256 UTF-8 bytes is malformed; well-formed names, astral characters included, are read', () => {
    expect(readIdentity(named('é'.repeat(129))).kind).toBe('malformed');
    for (const name of ['orders', 'café', '🚀'.repeat(64)]) {
      expect(readIdentity(identityHeaders(name, 7n))).toEqual({
        kind: 'ok',
        identity: { producerName: name, publishingId: 7n },
      });
    }
  });
});
