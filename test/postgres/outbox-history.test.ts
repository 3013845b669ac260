import { describe, expect, it } from 'vitest';
import { checkOutbox, type TruthRow } from '../support/outbox-app.js';

const body = (label: string, key: string): Buffer => Buffer.from(JSON.stringify({ label, key }));
const truth: TruthRow[] = [
  { label: 'a', key: 'k1', order: 1 },
  { label: 'b', key: 'k2', order: 1 },
  { label: 'c', key: 'k1', order: 2 },
];

// The outbox tests' judge must be able to fail: each defect it exists for, planted.
describe('outbox history check', () => {
  it('passes every committed row once, keys in commit order, keys interleaved', () => {
    const report = checkOutbox(truth, ['x'], [body('b', 'k2'), body('a', 'k1'), body('c', 'k1')]);
    expect(report.ok).toBe(true);
  });

  it('finds a lost row, a copy, a rolled-back row, a foreign body and a key out of commit order', () => {
    expect(checkOutbox(truth, [], [body('a', 'k1'), body('b', 'k2')]).lost).toEqual(['c']);
    const copy = checkOutbox(truth, [], [body('a', 'k1'), body('b', 'k2'), body('c', 'k1'), body('b', 'k2')]);
    expect(copy.duplicated).toEqual(['b']);
    expect(copy.ok).toBe(false);
    const rolled = checkOutbox(
      truth,
      ['x'],
      [body('a', 'k1'), body('b', 'k2'), body('c', 'k1'), body('x', 'k1')],
    );
    expect(rolled.rolledBackSeen).toEqual(['x']);
    expect(rolled.ok).toBe(false);
    expect(
      checkOutbox(truth, [], [body('a', 'k1'), body('b', 'k2'), body('c', 'k1'), Buffer.from('?')]).foreign,
    ).toBe(1);
    const swapped = checkOutbox(truth, [], [body('c', 'k1'), body('b', 'k2'), body('a', 'k1')]);
    expect(swapped.orderViolations).toHaveLength(1);
    expect(swapped.ok).toBe(false);
  });
});
