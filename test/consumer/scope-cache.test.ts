import { describe, expect, it } from 'vitest';
import { ScopeCache } from '../../src/consumer/scope-cache.js';
import { encodeScopeKey } from '../../src/identity/scope-key.js';
import type { KeyValueDb } from '../../src/store/store.js';
import { memoryDisk } from '../support/memory-store.js';

describe('scope cache', () => {
  it('keeps the scope-key cache bounded however many producers come and go, and keys stay right', () => {
    const cache = new ScopeCache(memoryDisk() as unknown as KeyValueDb, 'c', { kind: 'highest' }, 0);
    let most = 0;
    for (let i = 0; i < 200_000; i++) {
      const key = cache.key('t', `producer-${i}`);
      if (i % 9_973 === 0)
        expect(key).toBe(encodeScopeKey({ consumer: 'c', tenant: 't', producer: `producer-${i}` }));
      most = Math.max(most, cache.cachedKeyProducers);
    }
    expect(most).toBe(65_536);
    // An old producer after the cache started over: encoded again, the same key.
    expect(cache.key('t', 'producer-3')).toBe(
      encodeScopeKey({ consumer: 'c', tenant: 't', producer: 'producer-3' }),
    );
  });
});
