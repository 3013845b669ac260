// Why "highest sequence wins" is unsafe under reordering, and what the window policy does instead.
// Pure: no broker needed.
//   npx tsx examples/out-of-order.ts
import { createTracker } from 'stream-dedup';

const arrivals = [1n, 2n, 4n, 3n, 5n, 3n, 9n, 6n]; // 3 arrives late, then again; 7 and 8 never
for (const policy of [{ kind: 'highest' } as const, { kind: 'window', size: 4 } as const]) {
  const tracker = createTracker(policy);
  const applied: bigint[] = [];
  const notes: string[] = [];
  for (const id of arrivals) {
    const verdict = tracker.check(id);
    if (verdict.outcome === 'new') {
      applied.push(id);
      for (const gap of tracker.record(id).confirmedGaps) notes.push(`gap ${gap.from}..${gap.to} confirmed`);
    } else {
      notes.push(`${id}: ${verdict.outcome}`);
    }
  }
  console.log(`${policy.kind.padEnd(7)} applied [${applied.join(', ')}]; ${notes.join('; ')}`);
}
// highest drops the late 3 as "stale" (a plain highest-wins consumer would have lost it silently);
// window(4) applies it once and drops its repeat as a duplicate.
