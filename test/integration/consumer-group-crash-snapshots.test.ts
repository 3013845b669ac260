import { describe, expect, it } from 'vitest';
import type { Sent } from '../support/group-ledger.js';
import { crashRun, describeReached, useGroups, type Line } from '../support/group-members.js';
import { useClient } from '../support/stream.js';
import { useTempDir } from '../support/tmp.js';

// The crash test of consumer-group-crash.test.ts (the same rig: test/support/group-members.ts) with
// changelog snapshots every few entries and a retention small enough that the broker trims every
// changelog during the run (issue 37's fault test; docs/design.md §12.1, §12.2): members SIGKILLed
// at random, some losing their store, take partitions over from snapshots inside what retention
// kept; every partition's holder ends with the exact fold.

const client = useClient();
const tempDir = useTempDir();
const group = useGroups(client, tempDir);

/** A snapshot after every entry (or 16 KiB of entries); changelogs of 256 KiB (segments of 32 KiB). */
const ENV = {
  SNAPSHOT_EVERY: '1',
  SNAPSHOT_EVERY_BYTES: String(16 * 1024),
  RETENTION_BYTES: String(256 * 1024),
};

/** The sum over member processes of a count each process's lines carry (its last value in each). */
function total(lines: readonly Line[], field: 'snapshotsWritten' | 'snapshotRestores'): number {
  const last = new Map<unknown, number>();
  for (const l of lines) {
    const value = l[field];
    if (typeof value === 'number') last.set(l.pid, value);
  }
  return [...last.values()].reduce((a, b) => a + b, 0);
}

describe('consumer group under faults with snapshots and changelog retention', () => {
  it('members killed at random (some with their store lost) while snapshots are written and the broker trims the changelogs: exact folds', async () => {
    const started = performance.now();
    const g = await group('group-crash-snap', () => ENV);
    const sent = new Map<string, Sent>();
    const { kills, lostStores, reached } = await crashRun(g, sent);
    const stats = await Promise.all(
      g.partitions.map((p) => client().streamStatsRequest(`${p}.balance-projection.changelog`)),
    );
    const written = total(g.lines, 'snapshotsWritten');
    const restores = total(g.lines, 'snapshotRestores');
    console.log(
      `[group crash, snapshots + retention] kills=${kills} (${lostStores} with the store lost) ` +
        `snapshots written=${written} take-overs from a snapshot=${restores} changelogs first/end offsets ` +
        `${stats.map((s) => `${s.firstChunkId}/${s.committedChunkId}`).join(' ')} ` +
        `${describeReached(g, reached)}; ${Math.round(performance.now() - started)} ms`,
    );
    expect(kills).toBeGreaterThanOrEqual(12);
    expect(lostStores).toBeGreaterThanOrEqual(3);
    // The broker trimmed every changelog during the run: its genesis and first entries are gone.
    for (const s of stats) expect(s.firstChunkId).toBeGreaterThan(0n);
    // Snapshots were written and take-overs began at one (counted by the lines of processes that
    // lived past open(): a lower bound).
    expect(written).toBeGreaterThan(0);
    expect(restores).toBeGreaterThan(0);
    // No member stopped, no snapshot outgrew the retention (an error), no take-over refused.
    expect(g.lines.filter((l) => typeof l.error === 'string' || typeof l.failed === 'string')).toEqual([]);
  }, 90_000);
});
