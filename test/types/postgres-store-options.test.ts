import pg from 'pg';
import { describe, expect, expectTypeOf, it } from 'vitest';
import {
  PostgresStore,
  type PostgresStoreOptions,
  type PostgresStorePoolOptions,
  type PostgresStoreUrlOptions,
} from '../../src/postgres/store.js';

// Type tests (see publisher-options.test.ts): each `@ts-expect-error` fails the type check once the
// types accept what it marks, and each case also runs against open()'s own check (before any I/O:
// a pg.Pool connects only when asked to).

describe('types - PostgresStoreOptions: pool or connectionString, not both', () => {
  it('refuses neither and both', async () => {
    const pool = new pg.Pool({ connectionString: 'postgres://127.0.0.1:1/never' });
    try {
      // @ts-expect-error neither
      const neither: PostgresStoreOptions = { schema: 'app' };
      await expect(PostgresStore.open(neither)).rejects.toBeInstanceOf(TypeError);
      // @ts-expect-error both
      const both: PostgresStoreOptions = { schema: 'app', pool, connectionString: 'postgres://x/y' };
      await expect(PostgresStore.open(both)).rejects.toBeInstanceOf(TypeError);
      const ok: PostgresStoreOptions[] = [
        { schema: 'app', pool },
        { schema: 'app', connectionString: 'postgres://x/y' },
      ];
      expect(ok).toHaveLength(2);
      expectTypeOf<PostgresStoreOptions>().toEqualTypeOf<
        PostgresStorePoolOptions | PostgresStoreUrlOptions
      >();
    } finally {
      await pool.end();
    }
  });
});
