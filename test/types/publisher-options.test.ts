import { describe, expect, expectTypeOf, it } from 'vitest';
import { DedupError } from '../../src/errors.js';
import {
  resolveSuperStreamOptions,
  type SuperStreamDedupPublisherOptions,
  type SuperStreamKeyedPublisherOptions,
  type SuperStreamRoutedPublisherOptions,
} from '../../src/superstream/options.js';
import { thrown } from '../support/thrown.js';

// Type tests: `tsc -p tsconfig.json` (npm run typecheck) checks this file, and every
// `@ts-expect-error` below fails the type check once the types accept what it marks. Each case also
// runs: what the types refuse, open()'s own checks refuse at run time, for callers the types do not
// reach (JavaScript, casts).

const common = { superStream: 'invoices', producerName: 'p', store: '/tmp/never-opened' } as const;
const key = (): string => 'k';

describe('types - super stream publisher options say what open() requires', () => {
  it('routing is required unless idMode is keyed', () => {
    // @ts-expect-error routing left out with automatic IDs
    const auto: SuperStreamDedupPublisherOptions = { ...common };
    expect(thrown(() => resolveSuperStreamOptions(auto))).toBeInstanceOf(TypeError);
    // @ts-expect-error routing left out with explicit IDs
    const explicit: SuperStreamDedupPublisherOptions = { ...common, idMode: 'explicit' };
    expect(thrown(() => resolveSuperStreamOptions(explicit))).toBeInstanceOf(TypeError);

    const routed: SuperStreamDedupPublisherOptions = { ...common, routing: { kind: 'key', key } };
    expect(resolveSuperStreamOptions(routed).routing.kind).toBe('key');
    const keyed: SuperStreamDedupPublisherOptions = { ...common, idMode: 'keyed' };
    expect(resolveSuperStreamOptions(keyed).routing).toEqual({ kind: 'hash', key: undefined });
  });

  it('keyed IDs route by the domain key: no routing function, no routing by bindings', () => {
    const withFunction = {
      ...common,
      idMode: 'keyed',
      routing: { kind: 'hash', key },
    } as const;
    // @ts-expect-error a routing function with keyed IDs
    const a: SuperStreamDedupPublisherOptions = withFunction;
    expect(thrown(() => resolveSuperStreamOptions(a))).toBeInstanceOf(RangeError);
    const byBindings = { ...common, idMode: 'keyed', routing: { kind: 'key', key } } as const;
    // @ts-expect-error routing by the super stream's bindings with keyed IDs
    const b: SuperStreamDedupPublisherOptions = byBindings;
    expect(thrown(() => resolveSuperStreamOptions(b))).toBeInstanceOf(RangeError);

    const hash: SuperStreamDedupPublisherOptions = { ...common, idMode: 'keyed', routing: { kind: 'hash' } };
    expect(resolveSuperStreamOptions(hash).routing.kind).toBe('hash');
  });

  it("keyed IDs need durability 'outbox'", () => {
    // @ts-expect-error keyed IDs with 'reserve'
    const reserve: SuperStreamDedupPublisherOptions = { ...common, idMode: 'keyed', durability: 'reserve' };
    const err = thrown(() => resolveSuperStreamOptions(reserve));
    expect(err).toBeInstanceOf(DedupError);
    expect((err as DedupError).code).toBe('DEDUP_UNSAFE_OPTIONS');

    const outbox: SuperStreamDedupPublisherOptions = { ...common, idMode: 'keyed', durability: 'outbox' };
    expect(resolveSuperStreamOptions(outbox).publisher.durability).toBe('outbox');
  });

  it('the union narrows on idMode', () => {
    expectTypeOf<SuperStreamDedupPublisherOptions>().toEqualTypeOf<
      SuperStreamRoutedPublisherOptions | SuperStreamKeyedPublisherOptions
    >();
    expectTypeOf<SuperStreamRoutedPublisherOptions['routing']>().not.toBeNullable();
    expectTypeOf<SuperStreamKeyedPublisherOptions['durability']>().toEqualTypeOf<'outbox' | undefined>();
    const narrow = (o: SuperStreamDedupPublisherOptions): string =>
      o.idMode === 'keyed' ? 'hash' : o.routing.kind; // routing is there once idMode is not keyed
    expect(narrow({ ...common, routing: { kind: 'key', key } })).toBe('key');
  });
});
