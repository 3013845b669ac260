import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { isDedupError } from '../../src/errors.js';
import { identityHeaders } from '../../src/identity/headers.js';
import { changelogStreamName } from '../../src/group/consumer.js';
import { StreamVerifyingConsumer, SuperStreamVerifyingConsumer } from '../../src/stream.js';
import { ledgerHandler, publishLedger, type Sent } from '../support/group-ledger.js';
import { STREAM_CONNECTION, uniqueName } from '../support/broker.js';
import { useClient } from '../support/stream.js';
import { useTempDir } from '../support/tmp.js';

// Issue 32 ("also look at"): a stream deleted and recreated under the same name while a verifying
// consumer keeps its committed offset. Subscribing at committed + 1, it would never see the new
// stream's offsets 0..committed (the client drops messages below the offset asked for).

const client = useClient();
const tempDir = useTempDir();

async function publish(stream: string, ids: number[]): Promise<void> {
  const publisher = await client().declarePublisher({ stream });
  let confirmed = 0;
  const all = new Promise<void>((resolve) =>
    publisher.on('publish_confirm', (_e, got) => {
      confirmed += got.length;
      if (confirmed >= ids.length) resolve();
    }),
  );
  for (const id of ids) {
    await publisher.send(Buffer.from(String(id)), {
      applicationProperties: identityHeaders('p', BigInt(id)),
    });
  }
  await publisher.flush();
  await all;
  await publisher.close();
}

describe('stream verifying consumer - a stream recreated under the same name', () => {
  it('refuses to resume on an empty stream past a committed offset: DEDUP_STREAM_REGRESSION, at open', async () => {
    const stream = uniqueName('recreated');
    await client().createStream({ stream, arguments: {} });
    await publish(stream, [1, 2, 3]);
    const store = join(await tempDir(), 'store');
    const options = {
      connection: STREAM_CONNECTION,
      stream,
      consumerName: 'ledger',
      store,
      handler: () => undefined,
    };
    const first = await StreamVerifyingConsumer.open(options);
    await first.waitForOffset(2n);
    await first.close();

    await client().deleteStream({ stream });
    await client().createStream({ stream, arguments: {} });
    const refused = await StreamVerifyingConsumer.open(options).then(
      () => undefined,
      (err: unknown) => err,
    );
    expect(isDedupError(refused, 'DEDUP_STREAM_REGRESSION'), String(refused)).toBe(true);
    expect(String(refused)).toMatch(/committed offset 2/);

    // The store was released: a consumer of another name reads the new stream from its start.
    await publish(stream, [1]);
    const fresh = await StreamVerifyingConsumer.open({ ...options, consumerName: 'ledger-2' });
    await fresh.waitForOffset(0n);
    expect(fresh.stats.new).toBe(1);
    await fresh.close();
    await client().deleteStream({ stream });
  });

  it('a running consumer whose stream is deleted and recreated stops with DEDUP_STREAM_REGRESSION when it subscribes again', async () => {
    const stream = uniqueName('recreated-live');
    await client().createStream({ stream, arguments: {} });
    await publish(stream, [1, 2, 3]);
    const consumer = await StreamVerifyingConsumer.open({
      connection: STREAM_CONNECTION,
      stream,
      consumerName: 'ledger',
      store: join(await tempDir(), 'store'),
      handler: () => undefined,
      commit: 'message',
    });
    await consumer.waitForOffset(2n);
    await client().deleteStream({ stream });
    await client().createStream({ stream, arguments: {} });
    const stopped = await consumer.closed();
    expect(isDedupError(stopped, 'DEDUP_STREAM_REGRESSION'), String(stopped)).toBe(true);
    await consumer.close();
    await client().deleteStream({ stream });
  });

  it('a stream that keeps its messages resumes as before (the check costs one stats query)', async () => {
    const stream = uniqueName('kept');
    await client().createStream({ stream, arguments: {} });
    await publish(stream, [1, 2]);
    const store = join(await tempDir(), 'store');
    const options = {
      connection: STREAM_CONNECTION,
      stream,
      consumerName: 'ledger',
      store,
      handler: () => undefined,
    };
    const first = await StreamVerifyingConsumer.open(options);
    await first.waitForOffset(1n);
    await first.close();
    await publish(stream, [3]);
    const again = await StreamVerifyingConsumer.open(options);
    await again.waitForOffset(2n);
    expect(again.stats.new).toBe(1);
    await again.close();
    await client().deleteStream({ stream });
  });

  it('a stream recreated with more messages than the committed offset: the restarted consumer stops with DEDUP_STREAM_REGRESSION within 5 s, no handler runs', async () => {
    const stream = uniqueName('recreated-full');
    await client().createStream({ stream, arguments: {} });
    await publish(stream, [1, 2, 3]);
    const applied: bigint[] = [];
    const options = {
      connection: STREAM_CONNECTION,
      stream,
      consumerName: 'ledger',
      store: join(await tempDir(), 'store'),
      handler: (message: { offset: bigint }) => void applied.push(message.offset),
    };
    try {
      const first = await StreamVerifyingConsumer.open(options);
      await first.waitForOffset(2n);
      await first.close();
      expect(applied).toEqual([0n, 1n, 2n]);

      // Deleted and recreated; ten messages written, in chunks of their own: offset 2 exists again.
      await client().deleteStream({ stream });
      await client().createStream({ stream, arguments: {} });
      await publish(stream, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
      applied.length = 0;
      const started = performance.now();
      const error = await StreamVerifyingConsumer.open(options).then(
        (consumer) => consumer.closed(),
        (err: unknown) => err,
      );
      const ms = performance.now() - started;
      expect(isDedupError(error, 'DEDUP_STREAM_REGRESSION'), String(error)).toBe(true);
      expect(String(error)).toMatch(/committed offset 2/);
      expect(applied).toEqual([]);
      expect(ms).toBeLessThan(5_000);
    } finally {
      await client()
        .deleteStream({ stream })
        .catch(() => undefined);
    }
  });

  it('a stream whose committed chunk retention trimmed away is not refused: the consumer goes on after its offset', async () => {
    const stream = uniqueName('trimmed');
    // Small segments, a small bound: retention deletes the oldest segments as new ones begin.
    await client().createStream({
      stream,
      arguments: { 'max-length-bytes': 20_000, 'stream-max-segment-size-bytes': 5_000 },
    });
    await publish(stream, [1, 2, 3]);
    const applied: bigint[] = [];
    const options = {
      connection: STREAM_CONNECTION,
      stream,
      consumerName: 'ledger',
      store: join(await tempDir(), 'store'),
      handler: (message: { offset: bigint }) => void applied.push(message.offset),
    };
    try {
      const first = await StreamVerifyingConsumer.open(options);
      await first.waitForOffset(2n);
      await first.close();

      // Enough to roll many segments: the chunk of offset 2 is gone.
      const more = Array.from({ length: 600 }, (_, i) => i + 4);
      await publish(stream, more);
      await expect
        .poll(async () => (await client().streamStatsRequest(stream)).firstChunkId, { timeout: 10_000 })
        .toBeGreaterThan(2n);
      // Retention runs on its own after each roll-over, so the first chunk can move on again
      // between this read and the consumer's attach: bound the consumer's start by the first
      // chunk before it opened and after it finished, not by one read.
      const firstBefore = (await client().streamStatsRequest(stream)).firstChunkId;
      applied.length = 0;
      const again = await StreamVerifyingConsumer.open(options);
      await again.waitForOffset(602n);
      expect(await Promise.race([again.closed(), Promise.resolve('running')])).toBe('running');
      await again.close();
      const firstAfter = (await client().streamStatsRequest(stream)).firstChunkId;
      const start = applied[0]!;
      expect(start).toBeGreaterThan(2n);
      expect(start).toBeGreaterThanOrEqual(firstBefore);
      expect(start).toBeLessThanOrEqual(firstAfter);
      // From where it started, nothing skipped: every offset up to the last, once.
      expect(applied).toEqual(Array.from({ length: Number(602n - start) + 1 }, (_, i) => start + BigInt(i)));
    } finally {
      await client()
        .deleteStream({ stream })
        .catch(() => undefined);
    }
  });

  it('a group member whose partition was deleted and recreated empty stops with DEDUP_STREAM_REGRESSION at its take-over', async () => {
    // The super stream is deleted and created again under the same name (its partitions empty);
    // the group's changelogs, streams of their own, still say where the group got to.
    const name = uniqueName('recreated-group');
    await client().createSuperStream({ streamName: name, arguments: {} }, undefined, 1);
    const [partition] = await client().queryPartitions({ superStream: name });
    const sent = new Map<string, Sent>();
    await publishLedger(client(), [partition!], 1, 5, sent);
    const options = {
      superStream: name,
      consumerName: 'recreated',
      store: join(await tempDir(), 'store'),
      connection: STREAM_CONNECTION,
      startFrom: 'first' as const,
      commitLingerMs: 10,
      handler: ledgerHandler,
    };
    try {
      const first = await SuperStreamVerifyingConsumer.open(options);
      await first.waitForOffset(partition!, sent.get(partition!)!.lastOffset);
      await first.close();
      await client().deleteSuperStream({ streamName: name });
      await client().createSuperStream({ streamName: name, arguments: {} }, undefined, 1);
      const error = await SuperStreamVerifyingConsumer.open(options).then(
        (member) => member.closed(),
        (err: unknown) => err,
      );
      expect(isDedupError(error) && error.code).toBe('DEDUP_STREAM_REGRESSION');
      expect((error as Error).message).toContain(`partition "${partition}" is empty`);
    } finally {
      await client()
        .deleteSuperStream({ streamName: name })
        .catch(() => undefined);
      await client()
        .deleteStream({ stream: changelogStreamName(partition!, 'recreated') })
        .catch(() => undefined);
    }
  }, 60_000);
  it('a group member whose partition was deleted and recreated with more messages than it committed stops with DEDUP_STREAM_REGRESSION, no handler run', async () => {
    // The super stream is deleted and created again under the same name (its partitions empty);
    // the group's changelogs, streams of their own, still say where the group got to.
    const name = uniqueName('recreated-group-full');
    await client().createSuperStream({ streamName: name, arguments: {} }, undefined, 1);
    const [partition] = await client().queryPartitions({ superStream: name });
    const sent = new Map<string, Sent>();
    await publishLedger(client(), [partition!], 1, 5, sent);
    const options = {
      superStream: name,
      consumerName: 'recreated',
      store: join(await tempDir(), 'store'),
      connection: STREAM_CONNECTION,
      startFrom: 'first' as const,
      commitLingerMs: 10,
      handler: ledgerHandler,
    };
    try {
      const first = await SuperStreamVerifyingConsumer.open(options);
      await first.waitForOffset(partition!, sent.get(partition!)!.lastOffset);
      await first.close();
      await client().deleteSuperStream({ streamName: name });
      await client().createSuperStream({ streamName: name, arguments: {} }, undefined, 1);
      // Offsets 0..9 of the new partition: the committed offset 4 exists again.
      await publishLedger(client(), [partition!], 1, 10, new Map<string, Sent>());
      let handled = 0;
      const error = await SuperStreamVerifyingConsumer.open({
        ...options,
        handler: (...args: Parameters<typeof ledgerHandler>) => {
          handled++;
          return ledgerHandler(...args);
        },
      }).then(
        (member) => member.closed(),
        (err: unknown) => err,
      );
      expect(isDedupError(error) && error.code).toBe('DEDUP_STREAM_REGRESSION');
      expect((error as Error).message).toMatch(
        new RegExp(`partition "${partition}" holds chunk 0 written at`),
      );
      expect(handled).toBe(0);
    } finally {
      await client()
        .deleteSuperStream({ streamName: name })
        .catch(() => undefined);
      await client()
        .deleteStream({ stream: changelogStreamName(partition!, 'recreated') })
        .catch(() => undefined);
    }
  }, 60_000);
});
