import { describe, expect, it } from 'vitest';
import { createTracker, decodeTracker, ScopedVerifier } from '../../src/verifier/index.js';

const A = '1:a0:1:p';
const B = '1:b0:1:p';

describe('scoped verifier', () => {
  it('scoped - answers new for a scope it has never seen, without creating it', () => {
    const verifier = new ScopedVerifier({ kind: 'window', size: 8 });
    expect(verifier.check(A, 100n)).toEqual({ outcome: 'new' });
    expect(verifier.size).toBe(0);
    expect(verifier.get(A)).toBeUndefined();
  });

  it('scoped - keeps one tracker per scope: the same id is new in each scope', () => {
    const verifier = new ScopedVerifier({ kind: 'highest' });
    verifier.record(A, 5n, 1_000);
    expect(verifier.check(A, 5n)).toEqual({ outcome: 'duplicate' });
    expect(verifier.check(B, 5n)).toEqual({ outcome: 'new' });
    verifier.record(B, 5n, 1_000);
    expect(verifier.size).toBe(2);
  });

  it('scoped - returns the confirmed gaps of the scope tracker', () => {
    const verifier = new ScopedVerifier({ kind: 'highest' });
    verifier.record(A, 1n, 0);
    expect(verifier.check(A, 4n)).toEqual({ outcome: 'new', skipped: { from: 2n, to: 3n } });
    expect(verifier.record(A, 4n, 0).confirmedGaps).toEqual([{ from: 2n, to: 3n }]);
  });

  it('scoped - a failed record changes nothing: no scope created, last-seen time kept', () => {
    const verifier = new ScopedVerifier({ kind: 'window', size: 8 });
    expect(() => verifier.record(A, 0n, 1)).toThrow(RangeError);
    expect(verifier.size).toBe(0);
    verifier.record(A, 5n, 1);
    expect(() => verifier.record(A, 5n, 99)).toThrow(/duplicate/);
    expect([...verifier.entries()]).toEqual([[A, { tracker: verifier.get(A), lastSeenMs: 1 }]]);
  });

  it('scoped - evicts only scopes idle longer than the TTL and returns how many', () => {
    const verifier = new ScopedVerifier({ kind: 'highest' });
    verifier.record(A, 1n, 1_000);
    verifier.record(B, 1n, 1_500);
    expect(verifier.evictIdle(2_000, 1_000)).toBe(0); // A idle exactly the TTL: kept
    expect(verifier.evictIdle(2_001, 1_000)).toBe(1);
    expect(verifier.get(A)).toBeUndefined();
    expect(verifier.get(B)?.highest).toBe(1n);
    expect(verifier.evictIdle(10_000, 0)).toBe(1);
    expect(verifier.size).toBe(0);
  });

  it('scoped - a duplicate arriving after its scope was evicted takes effect again (retention is finite)', () => {
    const verifier = new ScopedVerifier({ kind: 'window', size: 1024 });
    verifier.record(A, 17n, 0);
    expect(verifier.check(A, 17n).outcome).toBe('duplicate');
    verifier.evictIdle(60_000, 30_000);
    expect(verifier.check(A, 17n).outcome).toBe('new');
  });

  it('scoped - a record refreshes the last-seen time', () => {
    const verifier = new ScopedVerifier({ kind: 'highest' });
    verifier.record(A, 1n, 0);
    verifier.record(A, 2n, 900);
    expect(verifier.evictIdle(1_000, 500)).toBe(0);
  });

  it('scoped - installs a decoded or committed tracker with set, and refuses one of another policy', () => {
    const verifier = new ScopedVerifier({ kind: 'window', size: 8 });
    const stored = createTracker({ kind: 'window', size: 8 });
    stored.record(40n);
    verifier.set(A, decodeTracker(stored.encode()), 5);
    expect(verifier.check(A, 40n)).toEqual({ outcome: 'duplicate' });
    expect(() => verifier.set(B, createTracker({ kind: 'window', size: 16 }), 5)).toThrow(RangeError);
    expect(() => verifier.set(B, createTracker({ kind: 'highest' }), 5)).toThrow(RangeError);
  });

  it('scoped - transactional use: record on a clone, swap it in after the commit', () => {
    const verifier = new ScopedVerifier({ kind: 'window', size: 8 });
    verifier.record(A, 1n, 0);
    const next = verifier.get(A)!.clone();
    next.record(2n);
    expect(verifier.check(A, 2n).outcome).toBe('new'); // not committed yet
    verifier.set(A, next, 1);
    expect(verifier.check(A, 2n).outcome).toBe('duplicate');
  });

  it('scoped - a record after check uses the scope it names, whatever was checked before', () => {
    const verifier = new ScopedVerifier({ kind: 'highest' });
    verifier.record(A, 1n, 0);
    verifier.record(B, 10n, 0);
    expect(verifier.check(A, 2n).outcome).toBe('new');
    verifier.record(B, 11n, 0); // checked A, records B
    expect(verifier.get(A)?.highest).toBe(1n);
    expect(verifier.get(B)?.highest).toBe(11n);
    expect(verifier.check('1:c0:1:p', 5n).outcome).toBe('new'); // an unknown scope
    verifier.record('1:c0:1:p', 5n, 0);
    verifier.record('1:c0:1:p', 6n, 0);
    expect(verifier.get('1:c0:1:p')?.highest).toBe(6n);
  });

  it('scoped - a record after check still sees evictions and replacements in between', () => {
    const verifier = new ScopedVerifier({ kind: 'highest' });
    verifier.record(A, 1n, 0);
    expect(verifier.check(A, 2n).outcome).toBe('new');
    verifier.evictIdle(100, 10);
    verifier.record(A, 2n, 100); // a fresh tracker, not the evicted one
    expect(verifier.size).toBe(1);
    expect(verifier.get(A)?.highest).toBe(2n);
    expect(verifier.check(A, 3n).outcome).toBe('new');
    const replacement = createTracker({ kind: 'highest' });
    replacement.record(50n);
    verifier.set(A, replacement, 100);
    expect(() => verifier.record(A, 3n, 100)).toThrow(/stale/);
    expect(verifier.get(A)).toBe(replacement);
  });

  it('scoped - lists entries in insertion order', () => {
    const verifier = new ScopedVerifier({ kind: 'highest' });
    verifier.record(B, 1n, 1);
    verifier.record(A, 1n, 2);
    expect([...verifier.entries()].map(([key, entry]) => [key, entry.lastSeenMs])).toEqual([
      [B, 1],
      [A, 2],
    ]);
  });

  it('scoped - handles keys like __proto__ and constructor as plain scopes', () => {
    const verifier = new ScopedVerifier({ kind: 'highest' });
    verifier.record('__proto__', 1n, 0);
    verifier.record('constructor', 2n, 0);
    expect(verifier.check('__proto__', 1n).outcome).toBe('duplicate');
    expect(verifier.get('constructor')?.highest).toBe(2n);
    expect(verifier.get('toString')).toBeUndefined();
  });

  it('scoped - rejects bad arguments with TypeError or RangeError', () => {
    expect(() => new ScopedVerifier({ kind: 'window', size: 0 })).toThrow(RangeError);
    const verifier = new ScopedVerifier({ kind: 'highest' });
    expect(() => verifier.check(1 as unknown as string, 1n)).toThrow(TypeError);
    expect(() => verifier.record(A, 1n, '0' as unknown as number)).toThrow(TypeError);
    expect(() => verifier.record(A, 1n, Number.NaN)).toThrow(RangeError);
    expect(() => verifier.evictIdle(0, -1)).toThrow(RangeError);
    expect(() => verifier.evictIdle(Infinity, 1)).toThrow(RangeError);
    expect(verifier.size).toBe(0);
  });

  it('scoped - passes a declared skip to the scope tracker, for new and existing scopes', () => {
    const verifier = new ScopedVerifier({ kind: 'highest' });
    expect(verifier.record(A, 10n, 0, 2n).confirmedGaps).toEqual([]); // a new scope: nothing below is a gap
    expect(verifier.record(A, 20n, 0, 15n).confirmedGaps).toEqual([{ from: 11n, to: 14n }]);
    expect(() => verifier.record(A, 30n, 0, 30n)).toThrow(RangeError);
    expect(verifier.get(A)?.highest).toBe(20n);
  });
});
