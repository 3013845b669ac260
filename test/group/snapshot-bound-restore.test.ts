/**
 * revG's review of mend37: the snapshot writer's one-read bound (src/group/snapshot-writer.ts,
 * `#known`) survives a take-over of the same partition. The writer lives as long as the partition's
 * strategy (changelog-strategy.ts: one per GroupPartition, across activations), and `noteEntry` is
 * called when an entry is *handed* to the changelog, before it landed. An entry handed and never
 * landed (the member paused or was fenced: `append` → not 'landed'), then another member's entry
 * for the same batch cut (same base and last offset, other effects: a larger value) written into
 * this store by the restore of the next activation (restorePartition writes the db directly, never
 * through noteEntry): the chain `known.end === baseOffset` still holds, so the bound counts the
 * lost small entry, not the larger one in the store. The snapshot then skips counting, sends its
 * parts, and finds the state past the cap only while reading: parts without a marker go out —
 * exactly what the count-first rule was there to prevent (REVIEW.md §1/§7: every writer of the
 * store through the same gate; an estimate must be an upper bound). The strategy now calls
 * `forgetBound()` as an activation begins and after its restore; this test makes those calls where
 * changelog-strategy.ts does.
 */
import type { Client } from 'rabbitmq-stream-js-client';
import { describe, expect, it } from 'vitest';
import { encodeEntry, entryId } from '../../src/group/changelog-entry.js';
import { changelogProducerName, partitionNamespace } from '../../src/group/consumer.js';
import { snapshotProducerName } from '../../src/group/snapshot-entry.js';
import { SnapshotWriter } from '../../src/group/snapshot-writer.js';
import { effectKeyPrefix, encodeOffset, offsetKey } from '../../src/store/consumer-keys.js';
import { FakeChangelog } from '../support/changelog-client.js';

const NAMESPACE = partitionNamespace('billing', 'orders');
const OURS = changelogProducerName('billing');
const SNAP = snapshotProducerName(OURS);
const CAP = 4_000;

type Put = { type: 'put'; key: string; value: Uint8Array };

describe('snapshot bound after a take-over of the same partition (revG)', () => {
  it('a state over the cap after a restore at the noted offset sends no part', async () => {
    const db = new FakeChangelog([]).db(NAMESPACE);
    let offset = 0n;
    await db.batch([{ type: 'put', key: offsetKey(NAMESPACE), value: encodeOffset(0n) }]);
    let sent = 0;
    const writer = new SnapshotWriter({
      db,
      namespace: NAMESPACE,
      changelog: 'orders.billing.changelog',
      entryProducer: OURS,
      producer: SNAP,
      policy: { everyEntries: 1, everyBytes: 0 },
      writer: {
        maxEntryBytes: 1_000,
        append: () => {
          sent++;
          return Promise.resolve('landed');
        },
      },
      timeoutMs: 1_000,
      maxBytes: CAP,
    });
    const client = {
      locatorConnection: {
        queryPublisherSequence: ({ publisherRef }: { publisherRef: string }) =>
          Promise.resolve(publisherRef === SNAP ? 0n : entryId(offset)),
        storeOffset: () => Promise.resolve(),
      },
      streamStatsRequest: () => Promise.resolve({ firstChunkId: 0n, committedChunkId: 0n, lastChunkId: 0n }),
    } as unknown as Client;

    // Activation 1: a snapshot at offset 0 (the bound becomes known there).
    expect((await writer.write(client, () => true)).kind).toBe('written');

    // Activation 1 hands the entry 0 → 1 (small effect) to the changelog; it never lands and is
    // never written to this store (the member was paused / fenced, the batch dropped).
    const ours: Put[] = [
      { type: 'put', key: `${effectKeyPrefix(NAMESPACE)}e`, value: Buffer.alloc(10, 0x61) },
      { type: 'put', key: offsetKey(NAMESPACE), value: encodeOffset(1n) },
    ];
    writer.noteEntry(encodeEntry({ baseOffset: 0n, lastOffset: 1n, ops: ours }).length, {
      baseOffset: 0n,
      lastOffset: 1n,
    });

    // Another member took the partition over and journaled the same batch cut 0 → 1 with its own
    // (larger) effect; activation 2 of this member restores it into the store (not noted).
    const theirs: Put[] = [
      { type: 'put', key: `${effectKeyPrefix(NAMESPACE)}e`, value: Buffer.alloc(5_000, 0x62) },
      { type: 'put', key: offsetKey(NAMESPACE), value: encodeOffset(1n) },
    ];
    writer.forgetBound(); // activation 2 begins (changelog-strategy.ts `activate`)
    await db.batch(theirs);
    offset = 1n;
    writer.forgetBound(); // after its restore

    // Activation 2's first batch, 1 → 2, chains onto the noted (lost) entry.
    const next: Put[] = [{ type: 'put', key: offsetKey(NAMESPACE), value: encodeOffset(2n) }];
    writer.noteEntry(encodeEntry({ baseOffset: 1n, lastOffset: 2n, ops: next }).length, {
      baseOffset: 1n,
      lastOffset: 2n,
    });
    await db.batch(next);
    offset = 2n;

    // The state (> 5 000 bytes) is over the 4 000-byte cap: refused before anything is sent.
    sent = 0;
    const outcome = await writer.write(client, () => true);
    expect({ kind: outcome.kind, sent }).toEqual({ kind: 'too-large', sent: 0 });
  });
});
