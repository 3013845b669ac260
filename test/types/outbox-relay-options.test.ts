import { describe, expect, expectTypeOf, it } from 'vitest';
import {
  resolveRelayOptions,
  type PgOutboxRelayOptions,
  type PgOutboxRelayStreamOptions,
  type PgOutboxRelaySuperStreamOptions,
} from '../../src/postgres/outbox/relay-options.js';
import { thrown } from '../support/thrown.js';

// Type tests (see publisher-options.test.ts): each `@ts-expect-error` fails the type check once the
// types accept what it marks, and each case also runs against open()'s own check.

const pool = { connect: () => Promise.reject(new Error('no I/O expected')) } as never;
const common = { pool, schema: 'app', producerName: 'p' } as const;

describe('types - PgOutboxRelayOptions: exactly one of stream and superStream', () => {
  it('refuses neither and both', () => {
    // @ts-expect-error no target
    const neither: PgOutboxRelayOptions = { ...common };
    expect(thrown(() => resolveRelayOptions(neither))).toBeInstanceOf(TypeError);
    // @ts-expect-error two targets
    const both: PgOutboxRelayOptions = { ...common, stream: 's', superStream: 't' };
    expect(thrown(() => resolveRelayOptions(both))).toBeInstanceOf(TypeError);
  });

  it('takes either one', () => {
    const stream: PgOutboxRelayOptions = { ...common, stream: 's' };
    expect(resolveRelayOptions(stream).target).toEqual({ kind: 'stream', name: 's' });
    const superStream: PgOutboxRelayOptions = { ...common, superStream: 't' };
    expect(resolveRelayOptions(superStream).target).toEqual({ kind: 'superStream', name: 't' });
    expectTypeOf<PgOutboxRelayOptions>().toEqualTypeOf<
      PgOutboxRelayStreamOptions | PgOutboxRelaySuperStreamOptions
    >();
    const name = (o: PgOutboxRelayOptions): string => o.stream ?? o.superStream; // a string either way
    expect(name(stream)).toBe('s');
  });
});
