/**
 * revR finding 3: the relay's `stream` / `superStream` option accepts U+0000 (and other control
 * characters, lone surrogates). PostgreSQL text cannot hold U+0000: the first statement naming the
 * target (the name lock's `pg_try_advisory_lock(hashtextextended($1, 0))` in open()) fails with
 * SQLSTATE 22021, which is not in PERMANENT_SQLSTATES, so open() rejects with the driver's untyped
 * error after I/O instead of a RangeError before any I/O (BRIEF: options validated before I/O).
 * The same value inlined by `escapeLiteral` into a simple query is cut at the NUL by the protocol
 * (a syntax error, not an injection).
 */
import { describe, expect, it } from 'vitest';
import { resolveRelayOptions } from '../../src/postgres/outbox/relay-options.js';

describe('revR: target names are checked before I/O', () => {
  it('refuses a stream name PostgreSQL cannot store', () => {
    const pool = { connect: () => undefined } as never;
    expect(() => resolveRelayOptions({ pool, schema: 'app', producerName: 'p', stream: 'a\u0000b' })).toThrow(
      RangeError,
    );
    expect(() => resolveRelayOptions({ pool, schema: 'app', producerName: 'p', stream: 'a\uD800' })).toThrow(
      RangeError,
    );
    expect(() =>
      resolveRelayOptions({ pool, schema: 'app', producerName: 'p', superStream: 'a\u0000' }),
    ).toThrow(RangeError);
    // A name the broker and PostgreSQL both hold passes.
    expect(resolveRelayOptions({ pool, schema: 'app', producerName: 'p', stream: 'a:é🚀' }).target.name).toBe(
      'a:é🚀',
    );
  });
});
