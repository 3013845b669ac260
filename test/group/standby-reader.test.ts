/**
 * The standby tail's reader client (docs/design.md §12.3): one client for every copy and step,
 * replaced only after a failed step. It opened a new reader connection per copy per 250 ms step
 * (rev5 S1): past ~5 copies a round outgrew the interval (copies lagged n × ~50 ms) and the broker
 * saw 4 connections a second per copy. A frame that does not decode on one changelog must still be
 * reported, fail only that copy's step, and never be read past.
 */
import { describe, expect, it } from 'vitest';
import type { Client } from 'rabbitmq-stream-js-client';
import { StandbyTailer } from '../../src/group/standby-tail.js';
import type { KeyValueDb } from '../../src/store/store.js';
import { FakeChangelog } from '../support/changelog-client.js';
import {
  changelogOf,
  copyOf,
  history,
  memoryDb,
  multiClient,
  namespaceOf,
  OURS,
  partitions,
} from '../support/standby-fixtures.js';

function tailer(o: {
  db: KeyValueDb;
  connect: () => Promise<Client>;
  warnings?: string[];
  intervalMs?: number;
}): StandbyTailer {
  return new StandbyTailer({
    db: o.db,
    sync: false,
    consumerName: 'billing',
    partitions: partitions.map((p) => ({
      partition: p,
      namespace: namespaceOf(p),
      changelog: changelogOf(p),
    })),
    replicas: partitions.length,
    producerName: OURS,
    settings: undefined,
    isActive: () => false,
    connect: o.connect,
    restoreTimeoutMs: 5_000,
    log: {
      debug: () => undefined,
      info: () => undefined,
      error: () => undefined,
      warn: (fields, m) => o.warnings?.push(`${m ?? ''} ${JSON.stringify(fields)}`),
    },
    intervalMs: o.intervalMs ?? 2,
  });
}

describe('warm standbys - the tail keeps one reader client (§12.3)', () => {
  it('reads 4 copies for 25 steps each on one client (was: a client per copy per step)', async () => {
    const db = memoryDb();
    const changelogs = new Map(
      partitions.map((p, i) => [changelogOf(p), new FakeChangelog(history(p, 5 + i))]),
    );
    const steps = new Map<string, number>();
    let connects = 0;
    let closes = 0;
    const t = tailer({
      db,
      connect: () => {
        connects++;
        const client = multiClient(changelogs, new Set(), steps);
        return Promise.resolve(Object.assign(client, { close: () => Promise.resolve(void closes++) }));
      },
    });
    await expect
      .poll(() => Math.min(...partitions.map((p) => steps.get(changelogOf(p)) ?? 0)), { timeout: 20_000 })
      .toBeGreaterThanOrEqual(25);
    await t.close();
    expect(connects).toBe(1);
    expect(closes).toBe(1);
    for (const p of partitions) {
      const alone = memoryDb();
      const single = tailer({
        db: alone,
        connect: () => Promise.resolve(multiClient(changelogs, new Set(), new Map())),
      });
      await expect
        .poll(async () => Object.keys(await copyOf(alone, p)).length, { timeout: 5_000 })
        .toBeGreaterThan(0);
      await single.close();
      expect(await copyOf(db, p)).toEqual(await copyOf(alone, p));
    }
  });

  it('a frame that does not decode on one changelog fails that copy only, is reported, replaces the client and is never read past', async () => {
    const db = memoryDb();
    const changelogs = new Map(partitions.map((p) => [changelogOf(p), new FakeChangelog(history(p, 6))]));
    const bad = changelogOf(partitions[2]!);
    const steps = new Map<string, number>();
    const warnings: string[] = [];
    let connects = 0;
    const t = tailer({
      db,
      warnings,
      intervalMs: 5,
      connect: () => {
        connects++;
        return Promise.resolve(multiClient(changelogs, new Set([bad]), steps));
      },
    });
    // Two failures of the hostile copy (the second after its backoff), the others tailed meanwhile.
    await expect.poll(() => warnings.length, { timeout: 10_000 }).toBeGreaterThanOrEqual(2);
    await expect
      .poll(() => Math.min(...partitions.map((p) => steps.get(changelogOf(p)) ?? 0)), { timeout: 10_000 })
      .toBeGreaterThanOrEqual(3);
    await t.close();
    for (const w of warnings) {
      expect(w).toContain('tailing a standby copy failed');
      expect(w).toContain(`cannot read changelog \\"${bad}\\"`);
      expect(w).toContain(`"partition":"${partitions[2]}"`);
    }
    // A client replaced after each failed step only: one per failure, plus the first.
    expect(connects).toBe(warnings.length + 1);
    // The hostile copy holds nothing read past the bad frame; the others are whole.
    expect(await copyOf(db, partitions[2]!)).toEqual({});
    for (const p of partitions.filter((q) => changelogOf(q) !== bad))
      expect(Object.keys(await copyOf(db, p)).length).toBeGreaterThan(0);
  });
});
