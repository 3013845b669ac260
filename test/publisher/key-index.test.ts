import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { KeyIndex } from '../../src/publisher/key-index.js';

interface Rec {
  readonly key: string;
  readonly n: number;
}

type Op =
  | { set: string; n: number }
  | { del: string }
  | { delIf: string; current: boolean }
  | { get: string }
  | { prune: number };

/** Runs ops against the index and a Map (the model), comparing every answer and the contents. */
function check(index: KeyIndex<Rec>, ops: readonly Op[]): void {
  const model = new Map<string, Rec>();
  /** Every record set so far, replaced or deleted since or not (what key segments hold). */
  const records: Rec[] = [];
  for (const op of ops) {
    if ('set' in op) {
      const r = { key: op.set, n: op.n };
      index.set(r);
      model.set(op.set, r);
      records.push(r);
    } else if ('del' in op) {
      expect(index.delete(op.del)).toBe(model.delete(op.del));
    } else if ('delIf' in op) {
      // Deletes only while the given record is the key's value (the publisher drops an old
      // segment's record, never a newer one of the same key).
      const held = model.get(op.delIf);
      const given = op.current && held !== undefined ? held : { key: op.delIf, n: -1 };
      expect(index.delete(op.delIf, given)).toBe(held === given && model.delete(op.delIf));
    } else if ('get' in op) {
      expect(index.get(op.get)).toBe(model.get(op.get));
    } else {
      // As the publisher drops key segments: each record they hold, only while still its key's value.
      for (const r of records) if (r.n < op.prune) index.delete(r.key, r);
      for (const [k, r] of model) if (r.n < op.prune) model.delete(k);
    }
    expect(index.size).toBe(model.size);
  }
  // Same size, and every model key holds the model's value: the same contents.
  for (const [k, r] of model) expect(index.get(k)).toBe(r);
}

const keyArb = fc.oneof(fc.constantFrom('a', 'b', 'c', 'ab', 'ba', 'abc', ''), fc.string({ maxLength: 6 }));
const opArb: fc.Arbitrary<Op> = fc.oneof(
  { arbitrary: fc.record({ set: keyArb, n: fc.nat(1_000) }), weight: 5 },
  { arbitrary: fc.record({ del: keyArb }), weight: 2 },
  { arbitrary: fc.record({ delIf: keyArb, current: fc.boolean() }), weight: 2 },
  { arbitrary: fc.record({ get: keyArb }), weight: 3 },
  { arbitrary: fc.record({ prune: fc.nat(1_000) }), weight: 1 },
);

describe('key index', () => {
  it('key index - answers as a Map does, through growth, shrinking, backward-shift deletes and segment-style drops', () => {
    fc.assert(
      fc.property(fc.array(opArb, { maxLength: 400, size: 'large' }), (ops) =>
        check(new KeyIndex<Rec>(), ops),
      ),
      { numRuns: 300 },
    );
  });

  it('key index - stays exact when every key collides (a hash of 1 to 3 values)', () => {
    fc.assert(
      fc.property(fc.array(opArb, { maxLength: 400, size: 'large' }), (ops) =>
        check(new KeyIndex<Rec>((k) => (k.length % 3) - 1), ops),
      ),
      { numRuns: 300 },
    );
  });

  it('key index - a steady window of keys (one added, the oldest dropped) never rebuilds the table', () => {
    // A keyed publisher at its retention: every send adds a key and pruning drops the oldest. With
    // tombstones this rebuilt the table every ~160 000 keys at a 100 000-key window, a synchronous
    // pause of 5-39 ms at 150 000 sends/s (issue 39); backward-shift deletes leave none.
    const index = new KeyIndex<Rec>();
    const window = 100_000;
    for (let i = 0; i < window; i++) index.set({ key: `order-${i}`, n: i });
    const grown = index.rebuilds;
    let deleted = 0;
    for (let i = window; i < 4 * window; i++) {
      index.set({ key: `order-${i}`, n: i });
      if (index.delete(`order-${i - window}`)) deleted++;
    }
    expect(deleted).toBe(3 * window);
    expect(index.rebuilds).toBe(grown);
    expect(index.size).toBe(window);
    expect(index.get(`order-${4 * window - 1}`)?.n).toBe(4 * window - 1);
    expect(index.get(`order-${3 * window - 1}`)).toBeUndefined();
  });

  it('key index - shrinks once most keys are gone, and still answers exactly', () => {
    const index = new KeyIndex<Rec>();
    for (let i = 0; i < 10_000; i++) index.set({ key: `k${i}`, n: i });
    const grown = index.rebuilds;
    for (let i = 0; i < 9_990; i++) index.delete(`k${i}`);
    expect(index.rebuilds).toBeGreaterThan(grown);
    for (let i = 9_990; i < 10_000; i++) expect(index.get(`k${i}`)?.n).toBe(i);
    expect(index.get('k0')).toBeUndefined();
    expect(index.size).toBe(10);
  });

  it('key index - holds 200 000 keys and drops them all', () => {
    const index = new KeyIndex<Rec>();
    for (let i = 0; i < 200_000; i++) index.set({ key: `order-${i}`, n: i });
    expect(index.size).toBe(200_000);
    expect(index.get('order-199999')?.n).toBe(199_999);
    expect(index.get('order-200000')).toBeUndefined();
    for (let i = 0; i < 200_000; i++) expect(index.delete(`order-${i}`)).toBe(true);
    expect(index.size).toBe(0);
    expect(index.get('order-0')).toBeUndefined();
    index.set({ key: 'again', n: 1 });
    expect(index.get('again')?.n).toBe(1);
  });
});
