import { describe, expect, it } from 'vitest';
import { encodeEntry, encodeGenesis, entryId, GENESIS_ID } from '../../src/group/changelog-entry.js';
import { changelogProducerName, partitionNamespace } from '../../src/group/consumer.js';
import { groupSettings, SETTINGS_HEADER } from '../../src/group/changelog-identity.js';
import { readGenesis } from '../../src/group/changelog-head.js';
import { BYTES_PER_WRITE, INITIAL_CREDITS, restorePartition } from '../../src/group/restore.js';
import { effectKeyPrefix } from '../../src/store/consumer-keys.js';
import { FakeChangelog, type ChangelogRecordSpec } from '../support/changelog-client.js';

const NAMESPACE = partitionNamespace('billing', 'orders-eu.west');
const OURS = changelogProducerName('billing');
/** Group `west.billing` on partition `orders-eu`: under 0.5.0's naming, the same changelog. */
const THEIRS = changelogProducerName('west.billing');

const genesis = (producer: string, start: bigint): ChangelogRecordSpec => ({
  producer,
  id: GENESIS_ID,
  content: () => encodeGenesis(start),
});

/** A batch entry ending at offset `last` that puts `bytes` bytes under one effect key. */
function entry(producer: string, last: bigint, base: bigint | undefined, bytes = 8): ChangelogRecordSpec {
  return {
    producer,
    id: entryId(last),
    content: () =>
      encodeEntry({
        lastOffset: last,
        baseOffset: base,
        ops: [{ type: 'put', key: `${effectKeyPrefix(NAMESPACE)}v`, value: Buffer.alloc(bytes, 1) }],
      }),
  };
}

function restore(changelog: FakeChangelog, readAheadBytes?: number, settings?: string) {
  return restorePartition({
    db: changelog.db(NAMESPACE),
    sync: false,
    namespace: NAMESPACE,
    changelog: 'orders-eu.west.billing.changelog',
    producerName: OURS,
    ...(settings === undefined ? {} : { settings }),
    client: changelog.client(),
    stallMs: 2_000,
    timeoutMs: 20_000,
    isCurrent: () => true,
    readAheadBytes,
  });
}

describe('group restore - whose records it reads', () => {
  it("refuses another group's genesis at the head of the changelog instead of beginning where it says", async () => {
    // The other group began first (offset 500 of its partition); ours wrote its own genesis after.
    const changelog = new FakeChangelog([genesis(THEIRS, 500n), genesis(OURS, 0n)]);
    const err: unknown = await readGenesis(
      changelog.client(),
      'orders-eu.west.billing.changelog',
      OURS,
      2_000,
    ).catch((e: unknown) => e);
    expect(err).toMatchObject({ code: 'DEDUP_CHANGELOG_INVALID' });
    expect((err as Error).message).toContain('stream-dedup.changelog.west.billing');
  });

  it("stops a restore at another group's genesis (DEDUP_CHANGELOG_INVALID) instead of adopting its start", async () => {
    // Ours was confirmed with ID 1 too: the broker keeps one last ID per producer name.
    const changelog = new FakeChangelog([genesis(THEIRS, 500n), genesis(OURS, 0n)]);
    const err: unknown = await restore(changelog).catch((e: unknown) => e);
    expect(err).toMatchObject({ code: 'DEDUP_CHANGELOG_INVALID' });
    expect((err as Error).message).toMatch(/written by "stream-dedup\.changelog\.west\.billing"/);
  });

  it("stops a restore at another writer's entry between the group's own", async () => {
    const changelog = new FakeChangelog([
      genesis(OURS, 0n),
      entry(OURS, 9n, undefined),
      entry(THEIRS, 4n, undefined),
      entry(OURS, 12n, 9n),
    ]);
    const err: unknown = await restore(changelog).catch((e: unknown) => e);
    expect(err).toMatchObject({ code: 'DEDUP_CHANGELOG_INVALID' });
  });

  it("restores a changelog of the group's own records", async () => {
    const changelog = new FakeChangelog([
      genesis(OURS, 3n),
      entry(OURS, 9n, undefined),
      entry(OURS, 12n, 9n),
    ]);
    const report = await restore(changelog);
    expect(report).toMatchObject({ offset: 12n, start: 3n, read: 3, applied: 2 });
  });
});

describe('group restore - members with other settings', () => {
  const settingsOf = (kind: 'highest' | 'window') =>
    groupSettings({
      policy: kind === 'window' ? { kind, size: 64 } : { kind },
      unidentified: 'reject',
      tenant: undefined,
    });
  const withSettings = (record: ChangelogRecordSpec, settings: string): ChangelogRecordSpec => ({
    ...record,
    headers: { [SETTINGS_HEADER]: settings },
  });

  it('refuses an entry written by a member with another verifier policy (DEDUP_UNSAFE_OPTIONS): their histories would mix per key', async () => {
    const changelog = new FakeChangelog([
      withSettings(genesis(OURS, 0n), settingsOf('highest')),
      withSettings(entry(OURS, 9n, undefined), settingsOf('window')),
    ]);
    const err: unknown = await restore(changelog, undefined, settingsOf('highest')).catch((e: unknown) => e);
    expect(err).toMatchObject({ code: 'DEDUP_UNSAFE_OPTIONS' });
    expect((err as Error).message).toContain('policy=window:64');
  });

  it('accepts a group that changed its settings together: older records of other settings before the first of ours', async () => {
    // Every member stopped, switched, started again: the changelog keeps the older records for
    // good, and refusing them refused every later take-over (hostile review of issue 32's change).
    const changelog = new FakeChangelog([
      withSettings(genesis(OURS, 0n), settingsOf('window')),
      withSettings(entry(OURS, 9n, undefined), settingsOf('window')),
      withSettings(entry(OURS, 12n, 9n), settingsOf('highest')),
    ]);
    const report = await restore(changelog, undefined, settingsOf('highest'));
    expect(report).toMatchObject({ offset: 12n, applied: 2 });
  });

  it('accepts records without settings (written by 0.5.0) and records with the same', async () => {
    const changelog = new FakeChangelog([
      genesis(OURS, 0n),
      withSettings(entry(OURS, 9n, undefined), settingsOf('highest')),
    ]);
    const report = await restore(changelog, undefined, settingsOf('highest'));
    expect(report).toMatchObject({ offset: 9n, applied: 1 });
  });

  it('refuses an entry written under another tenantVersion (DEDUP_UNSAFE_OPTIONS): two tenant functions are told apart by their names', async () => {
    // Two members with a tenant function each, one by region, one by customer: their scopes differ
    // for the same message. Before tenantVersion both wrote `tenant=function` and mixed unseen.
    const byName = (version: string | undefined) =>
      groupSettings({ policy: { kind: 'highest' }, unidentified: 'reject', tenant: () => '' }, version);
    expect(byName('by-region')).not.toBe(byName('by-customer'));
    // Without a name: 0.6.0's first form, so records written before still match.
    expect(byName(undefined)).toBe('policy=highest;unidentified=reject;tenant=function');
    const changelog = new FakeChangelog([
      withSettings(genesis(OURS, 0n), byName('by-region')),
      withSettings(entry(OURS, 9n, undefined), byName('by-customer')),
    ]);
    const err: unknown = await restore(changelog, undefined, byName('by-region')).catch((e: unknown) => e);
    expect(err).toMatchObject({ code: 'DEDUP_UNSAFE_OPTIONS' });
    expect((err as Error).message).toContain('tenant=function:\\"by-customer\\"');
  });
});

describe('group restore - read-ahead', () => {
  it('holds at most its byte bound plus the chunks in flight and one write, however large the entries and slow the store', async () => {
    // 64 KiB entries, one per chunk, a store write of 100 ms: the network is far faster than the disk.
    const entryBytes = 64 * 1024;
    const records: ChangelogRecordSpec[] = [genesis(OURS, 0n)];
    for (let last = 0n; last < 600n; last++)
      records.push(entry(OURS, last, last === 0n ? undefined : last - 1n, entryBytes));
    const changelog = new FakeChangelog(records, { storeDelayMs: () => 100 });
    const bound = 1024 * 1024;
    const report = await restore(changelog, bound);
    expect(report).toMatchObject({ offset: 599n, applied: 600 });
    // Before: up to 4 096 entries whatever their size (measured: 35 MiB held against a 7.4 MiB ceiling).
    const ceiling =
      bound + INITIAL_CREDITS * changelog.largestChunkBytes + BYTES_PER_WRITE + changelog.largestChunkBytes;
    expect(changelog.peakHeldBytes).toBeLessThanOrEqual(ceiling);
  });
});
