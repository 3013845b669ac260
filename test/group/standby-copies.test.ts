/**
 * Standby copies are deleted once they cannot be used (docs/design.md §12.3): moved (not copied)
 * by the take-over that adopts one; deleted when `standbyReplicas` is 0, or when their partition
 * has not been among those the member tails for `keepCopyMs` — never while a take-over claimed the
 * partition (it may adopt the copy). They stayed on disk forever (rev5's LOW note).
 */
import { describe, expect, it } from 'vitest';
import type { Client } from 'rabbitmq-stream-js-client';
import { RestoreAbandoned } from '../../src/group/restore.js';
import { restoreWithSnapshots } from '../../src/group/snapshot-restore.js';
import { adoptStandbyCopy, deleteStandbyCopy, standbyView } from '../../src/group/standby-copy.js';
import { StandbyTailer } from '../../src/group/standby-tail.js';
import { snapshotProducerName } from '../../src/group/snapshot-entry.js';
import { partitionNamespace } from '../../src/group/consumer.js';
import { offsetKey } from '../../src/store/consumer-keys.js';
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

const SNAP = snapshotProducerName(OURS);
const quiet = {
  debug: () => undefined,
  info: () => undefined,
  error: () => undefined,
  warn: () => undefined,
};

/** A copy of `partition` in `db` as the tail writes it: the restore into the standby view. */
async function tailInto(db: KeyValueDb, partition: string, n: number, isCurrent = () => true): Promise<void> {
  const changelog = new FakeChangelog(history(partition, n));
  await restoreWithSnapshots(
    {
      db: standbyView(db),
      sync: false,
      namespace: namespaceOf(partition),
      changelog: changelogOf(partition),
      producerName: OURS,
      client: Object.assign(changelog.client(), { close: () => Promise.resolve() }),
      stallMs: 2_000,
      timeoutMs: 20_000,
      isCurrent,
      bytesPerWrite: 1,
    },
    { reference: SNAP, producerName: SNAP },
    () => undefined,
  );
}

/** Every key of `db`. */
function keysOf(db: KeyValueDb): Promise<string[]> {
  return (async () => {
    const out: string[] = [];
    for await (const [k] of db.iterator({ gte: '', lt: '\uffff' })) out.push(k);
    return out;
  })();
}

function tailer(
  db: KeyValueDb,
  o: { replicas: number; keepCopyMs?: number; isActive?: (p: string) => boolean; deleted?: string[] },
): StandbyTailer {
  const changelogs = new Map(partitions.map((p) => [changelogOf(p), new FakeChangelog(history(p, 8))]));
  return new StandbyTailer({
    db,
    sync: false,
    consumerName: 'billing',
    partitions: partitions.map((p) => ({
      partition: p,
      namespace: namespaceOf(p),
      changelog: changelogOf(p),
    })),
    replicas: o.replicas,
    producerName: OURS,
    settings: undefined,
    isActive: o.isActive ?? (() => false),
    connect: (): Promise<Client> => Promise.resolve(multiClient(changelogs, new Set(), new Map())),
    restoreTimeoutMs: 5_000,
    log: quiet,
    intervalMs: 5,
    ...(o.keepCopyMs === undefined ? {} : { keepCopyMs: o.keepCopyMs }),
    onDeleted: (p) => o.deleted?.push(p),
  });
}

describe('warm standbys - copies deleted once unusable (§12.3)', () => {
  it('an adopted copy is moved: the namespace holds it, no key of the copy is left', async () => {
    const db = memoryDb();
    const p = partitions[0]!;
    await tailInto(db, p, 12);
    const copy = await copyOf(db, p);
    const outcome = await adoptStandbyCopy({
      db,
      sync: false,
      namespace: namespaceOf(p),
      changelog: changelogOf(p),
      client: new FakeChangelog(history(p, 12)).client(),
      timeoutMs: 2_000,
      isCurrent: () => true,
    });
    expect(outcome).toMatchObject({ kind: 'adopted', offset: 11n });
    expect(await copyOf(db, p)).toEqual({});
    expect((await keysOf(db)).filter((k) => k.startsWith('w:'))).toEqual([]);
    expect(Object.keys(copy).length).toBeGreaterThan(1);
    expect(await db.get(offsetKey(namespaceOf(p)))).toBeDefined();
  });

  it('standbyReplicas 0: every copy of the group goes at open, nothing else (another group, the namespaces, the member ID)', async () => {
    const db = memoryDb();
    for (const p of partitions.slice(0, 2)) await tailInto(db, p, 6);
    // Another group's copy in the same store, and this group's own state of a partition.
    await db.batch(
      [
        {
          type: 'put',
          key: `w:${offsetKey(partitionNamespace('other', 'orders-0'))}`,
          value: Buffer.from([1]),
        },
        { type: 'put', key: offsetKey(namespaceOf(partitions[3]!)), value: Buffer.from([2]) },
        { type: 'put', key: 'w;member', value: Buffer.from('id') },
      ],
      {},
    );
    const deleted: string[] = [];
    const t = tailer(db, { replicas: 0, deleted });
    await expect.poll(() => deleted.length, { timeout: 5_000 }).toBe(2);
    await t.close();
    expect(deleted.sort()).toEqual(partitions.slice(0, 2));
    expect((await keysOf(db)).sort()).toEqual(
      [
        `w:${offsetKey(partitionNamespace('other', 'orders-0'))}`,
        offsetKey(namespaceOf(partitions[3]!)),
        'w;member',
      ].sort(),
    );
  });

  it('copies of partitions the member no longer tails go after keepCopyMs; the tailed one stays', async () => {
    const db = memoryDb();
    for (const p of partitions) await tailInto(db, p, 6);
    const deleted: string[] = [];
    const t = tailer(db, { replicas: 1, keepCopyMs: 100, deleted });
    await expect.poll(() => t.chosen.length, { timeout: 5_000 }).toBe(1);
    // Kept meanwhile (a rebalance may bring them back).
    expect(deleted).toEqual([]);
    await expect.poll(() => deleted.length, { timeout: 5_000 }).toBe(3);
    const chosen = t.chosen[0]!;
    await t.close();
    expect(deleted).not.toContain(chosen);
    for (const p of partitions) expect(Object.keys(await copyOf(db, p)).length > 0).toBe(p === chosen);
  });

  it('a copy whose partition a take-over claimed is not deleted while claimed; after release it goes', async () => {
    const db = memoryDb();
    for (const p of partitions) await tailInto(db, p, 6);
    const deleted: string[] = [];
    const claimed = partitions[1]!;
    // Claimed before the first round: a take-over under way from the start.
    const t = tailer(db, { replicas: 0, deleted });
    await t.claim(claimed);
    await expect.poll(() => deleted.length, { timeout: 5_000 }).toBe(3);
    await new Promise((resolve) => setTimeout(resolve, 50));
    expect(deleted).not.toContain(claimed);
    expect(Object.keys(await copyOf(db, claimed)).length).toBeGreaterThan(0);
    t.release(claimed);
    await expect.poll(() => deleted.length, { timeout: 5_000 }).toBe(4);
    await t.close();
  });

  it('a deletion stopped between two batches leaves a copy never adopted (no offset record), and a tail makes it whole again', async () => {
    const db = memoryDb();
    const p = partitions[2]!;
    await tailInto(db, p, 20);
    const whole = await copyOf(db, p);
    let batches = 0;
    const gone = await deleteStandbyCopy(db, false, namespaceOf(p), () => batches++ < 2, 1);
    expect(gone).toBe(false);
    expect(Object.keys(await copyOf(db, p)).length).toBeGreaterThan(0);
    const outcome = await adoptStandbyCopy({
      db,
      sync: false,
      namespace: namespaceOf(p),
      changelog: changelogOf(p),
      client: new FakeChangelog(history(p, 20)).client(),
      timeoutMs: 2_000,
      isCurrent: () => true,
    });
    expect(outcome).toEqual({ kind: 'none' });
    await tailInto(db, p, 20);
    expect(await copyOf(db, p)).toEqual(whole);
    // An abandoned tail writes nothing more (the claim's rule is unchanged).
    await expect(tailInto(db, p, 25, () => false)).rejects.toBeInstanceOf(RestoreAbandoned);
  });
});
