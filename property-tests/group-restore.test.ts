import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { encodeEntry, encodeGenesis, entryId, GENESIS_ID } from '../src/group/changelog-entry.js';
import { changelogProducerName, partitionNamespace } from '../src/group/consumer.js';
import { INITIAL_CREDITS, restorePartition } from '../src/group/restore.js';
import { effectKeyPrefix } from '../src/store/consumer-keys.js';
import { FakeChangelog, type ChangelogRecordSpec } from '../test/support/changelog-client.js';

// The changelog restore (src/group/restore.ts) against a changelog of arbitrary entry sizes, chunk
// sizes and store-write delays: what it holds (content delivered and not yet in the store) never
// exceeds its read-ahead bound, plus the chunks already asked for (at most INITIAL_CREDITS), plus
// the store write being prepared and one entry — whatever the sizes, however slow the store.

const NAMESPACE = partitionNamespace('billing', 'orders-0');
const PRODUCER = changelogProducerName('billing');

function changelogOf(sizes: readonly number[]): ChangelogRecordSpec[] {
  const records: ChangelogRecordSpec[] = [
    { producer: PRODUCER, id: GENESIS_ID, content: () => encodeGenesis(0n) },
  ];
  sizes.forEach((size, i) => {
    const last = BigInt(i);
    records.push({
      producer: PRODUCER,
      id: entryId(last),
      content: () =>
        encodeEntry({
          lastOffset: last,
          baseOffset: i === 0 ? undefined : last - 1n,
          ops: [{ type: 'put', key: `${effectKeyPrefix(NAMESPACE)}v`, value: Buffer.alloc(size) }],
        }),
    });
  });
  return records;
}

describe('group restore read-ahead (bytes held, whatever the entry sizes and store delays)', () => {
  it('never holds more than its bound + the chunks in flight + one write + one entry', async () => {
    await fc.assert(
      fc.asyncProperty(
        // Entry sizes: mostly small, some near the largest (a frame, here scaled down to 32 KiB).
        fc.array(
          fc.oneof(
            { arbitrary: fc.integer({ min: 0, max: 512 }), weight: 1 },
            { arbitrary: fc.integer({ min: 8_192, max: 32_768 }), weight: 3 },
          ),
          { minLength: 1, maxLength: 200, size: 'max' },
        ),
        fc.array(fc.integer({ min: 1, max: 4 }), { minLength: 1, maxLength: 8 }),
        // Store writes of 0 to 12 ms: a disk slower than the network, or not.
        fc.array(fc.integer({ min: 0, max: 12 }), { minLength: 1, maxLength: 8 }),
        fc.integer({ min: 1_024, max: 256 * 1_024 }),
        fc.integer({ min: 64 * 1_024, max: 256 * 1_024 }),
        async (sizes, chunkSizes, delays, readAheadBytes, bytesPerWrite) => {
          const changelog = new FakeChangelog(changelogOf(sizes), {
            chunkSize: (i) => chunkSizes[i % chunkSizes.length]!,
            storeDelayMs: (i) => delays[i % delays.length]!,
          });
          const report = await restorePartition({
            db: changelog.db(NAMESPACE),
            sync: false,
            namespace: NAMESPACE,
            changelog: 'orders-0.billing.changelog',
            producerName: PRODUCER,
            client: changelog.client(),
            stallMs: 5_000,
            timeoutMs: 30_000,
            isCurrent: () => true,
            readAheadBytes,
            bytesPerWrite,
          });
          expect(report.offset).toBe(BigInt(sizes.length - 1));
          const largestEntry = Math.max(...changelogOf(sizes).map((r) => r.content().length));
          const ceiling =
            readAheadBytes + INITIAL_CREDITS * changelog.largestChunkBytes + bytesPerWrite + largestEntry;
          expect(changelog.peakHeldBytes).toBeLessThanOrEqual(ceiling);
        },
      ),
      // A failure's shrinking runs restores too: bounded, the best counterexample so far is printed.
      { numRuns: 40, interruptAfterTimeLimit: 60_000, markInterruptAsFailure: true },
    );
  });
});
