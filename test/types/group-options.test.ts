import { describe, expect, expectTypeOf, it } from 'vitest';
import type { ConsumerStoreProvider } from '../../src/consumer/consumer-store.js';
import { DedupError } from '../../src/errors.js';
import { resolveGroupOptions } from '../../src/group/options.js';
import type {
  SuperStreamChangelogConsumerOptions,
  SuperStreamSharedDatabaseConsumerOptions,
  SuperStreamVerifyingConsumerOptions,
} from '../../src/group/types.js';
import { thrown } from '../support/thrown.js';

// Type tests (see publisher-options.test.ts): each `@ts-expect-error` fails the type check once the
// types accept what it marks, and each case also runs against open()'s own check.

/** A PostgresStore as the group sees it; opening a consumer on it is I/O, which must not happen. */
const shared: ConsumerStoreProvider = {
  openConsumerStore: () => Promise.reject(new Error('no I/O expected')),
  commitLingerLimitMs: 15_000,
};
const base = { superStream: 'orders', consumerName: 'billing', handler: () => undefined } as const;
const refused = (options: SuperStreamVerifyingConsumerOptions): string | undefined => {
  const err = thrown(() => resolveGroupOptions(options));
  return err instanceof DedupError ? err.code : String(err);
};

describe('types - a group member on a PostgresStore takes no option of the changelog strategy', () => {
  it('refuses each changelog option with a shared store', () => {
    // @ts-expect-error no changelog to bound appends to
    expect(refused({ ...base, store: shared, appendTimeoutMs: 1_000 })).toBe('DEDUP_UNSAFE_OPTIONS');
    // @ts-expect-error no changelog to restore from
    expect(refused({ ...base, store: shared, restoreTimeoutMs: 1_000 })).toBe('DEDUP_UNSAFE_OPTIONS');
    // @ts-expect-error the stalled-partition watch reads the changelog
    expect(refused({ ...base, store: shared, stalledPartitionMs: 60_000 })).toBe('DEDUP_UNSAFE_OPTIONS');
    // @ts-expect-error the database commits: no fsync to ask for
    expect(refused({ ...base, store: shared, sync: true })).toBe('DEDUP_UNSAFE_OPTIONS');
    const tenant = (): string => '';
    // @ts-expect-error no changelog record carries it
    expect(refused({ ...base, store: shared, tenant, tenantVersion: 'v1' })).toBe('DEDUP_UNSAFE_OPTIONS');
    // @ts-expect-error no changelog to write snapshots into
    expect(refused({ ...base, store: shared, snapshotEveryEntries: 100 })).toBe('DEDUP_UNSAFE_OPTIONS');
    // @ts-expect-error no changelog to write snapshots into
    expect(refused({ ...base, store: shared, snapshotEveryBytes: 0 })).toBe('DEDUP_UNSAFE_OPTIONS');
    expect(
      // @ts-expect-error no changelog to keep a retention on
      refused({ ...base, store: shared, changelogRetention: { maxLengthBytes: 1 << 30 } }),
    ).toBe('DEDUP_UNSAFE_OPTIONS');
    // @ts-expect-error no changelog to tail
    expect(refused({ ...base, store: shared, standbyReplicas: 1 })).toBe('DEDUP_UNSAFE_OPTIONS');
  });

  it('takes them with a store of its own, and a watch of 0 with a shared store', () => {
    const own: SuperStreamVerifyingConsumerOptions = {
      ...base,
      store: '/tmp/never-opened',
      appendTimeoutMs: 1_000,
      restoreTimeoutMs: 1_000,
      stalledPartitionMs: 60_000,
      sync: true,
    };
    expect(resolveGroupOptions(own).strategy.kind).toBe('changelog');
    const db: SuperStreamVerifyingConsumerOptions = { ...base, store: shared, stalledPartitionMs: 0 };
    expect(resolveGroupOptions(db).strategy.kind).toBe('shared-database');
    expectTypeOf<SuperStreamVerifyingConsumerOptions>().toEqualTypeOf<
      SuperStreamChangelogConsumerOptions | SuperStreamSharedDatabaseConsumerOptions
    >();
    expectTypeOf<SuperStreamSharedDatabaseConsumerOptions['stalledPartitionMs']>().toEqualTypeOf<
      0 | undefined
    >();
  });
});
