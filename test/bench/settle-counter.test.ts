// bench:latency's wait for a run's sends (issue 39 profile, prof39): it resolves after exactly
// `count` settled, rejects at the first failure, and holds no promise (a Promise.all over 1.3 M
// sends blocked the event loop for 0.5–0.9 s after the last send: the dedup cases' max).
import { describe, expect, it } from 'vitest';
import { settleCounter } from '../../bench/settle-counter.js';

describe('settleCounter', () => {
  it('resolves once count promises resolved, not before', async () => {
    const c = settleCounter(3);
    let done = false;
    void c.all.then(() => (done = true));
    const resolvers: Array<() => void> = [];
    for (let i = 0; i < 3; i++) c.add(new Promise<void>((resolve) => resolvers.push(resolve)));
    resolvers[0]!();
    resolvers[1]!();
    await new Promise((resolve) => setImmediate(resolve));
    expect(done).toBe(false);
    resolvers[2]!();
    await c.all;
    expect(done).toBe(true);
  });

  it('rejects with the first failure', async () => {
    const c = settleCounter(2);
    c.add(Promise.reject(new Error('first')));
    c.add(Promise.resolve());
    await expect(c.all).rejects.toThrow('first');
  });

  it('resolves at once for a count of 0', async () => {
    await expect(settleCounter(0).all).resolves.toBeUndefined();
  });
});
