import { describe, expect, it } from 'vitest';
import * as root from '../../src/index.js';
import * as testing from '../../src/testing.js';

describe('stream-dedup/testing', () => {
  it('exports the history checker, and the root still exports the very same functions (deprecated)', () => {
    expect(Object.keys(testing).sort()).toEqual(['checkHistory', 'formatReport']);
    expect(root.checkHistory).toBe(testing.checkHistory);
    expect(root.formatReport).toBe(testing.formatReport);
  });

  it('checkHistory reports a lost and a duplicated message; formatReport sums it up in one line', () => {
    const report = testing.checkHistory({
      attempted: ['a', 'b', 'c'],
      acknowledged: ['a', 'b', 'c'],
      observed: [{ label: 'a' }, { label: 'b' }, { label: 'b' }],
    });
    expect(report).toMatchObject({ ok: false, lost: ['c'], duplicated: ['b'], extraCopies: 1 });
    expect(testing.formatReport(report)).toMatch(/^lost=1 \[c\] duplicated=1 \[b\] \(extra copies 1\)/);
  });
});
