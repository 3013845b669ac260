import { join } from 'node:path';
import { metrics } from '@opentelemetry/api';
import {
  AggregationTemporality,
  MeterProvider,
  MetricReader,
  type ResourceMetrics,
} from '@opentelemetry/sdk-metrics';
import { afterAll, describe, expect, it } from 'vitest';
import { DedupError } from '../../src/errors.js';
import { identityHeaders } from '../../src/identity/headers.js';
import { StreamVerifyingConsumer, SuperStreamVerifyingConsumer } from '../../src/stream.js';
import { STREAM_CONNECTION, uniqueName } from '../support/broker.js';
import { useClient } from '../support/stream.js';
import { useSuperStreams } from '../support/superstream.js';
import { useTempDir } from '../support/tmp.js';

const client = useClient();
const tempDir = useTempDir();
const superStream = useSuperStreams(client);
/** Streams of the tests (changelogs included): deleted after the file's tests. */
const streams: string[] = [];
afterAll(async () => {
  for (const stream of streams)
    await client()
      .deleteStream({ stream })
      .catch(() => undefined);
});

async function newStream(prefix: string): Promise<string> {
  const stream = uniqueName(prefix);
  await client().createStream({ stream, arguments: {} });
  streams.push(stream);
  return stream;
}

/** Publishes `count` messages of producer `p` from ID `from`, in one frame when `oneChunk`, else one confirmed chunk each. */
async function publish(stream: string, from: number, count: number, oneChunk: boolean): Promise<void> {
  const publisher = await client().declarePublisher({ stream });
  let confirmed = 0;
  let wake = (): void => undefined;
  publisher.on('publish_confirm', (_e, ids) => {
    confirmed += ids.length;
    wake();
  });
  const confirmedUpTo = (n: number): Promise<void> =>
    new Promise((resolve) => {
      wake = () => {
        if (confirmed >= n) resolve();
      };
      wake();
    });
  for (let i = 0; i < count; i++) {
    await publisher.send(Buffer.from(String(i)), {
      applicationProperties: identityHeaders('p', BigInt(from + i)),
    });
    if (!oneChunk) {
      await publisher.flush();
      await confirmedUpTo(i + 1);
    }
  }
  await publisher.flush();
  await confirmedUpTo(count);
  await publisher.close();
}

async function open(stream: string, handler: () => Promise<void> | void): Promise<StreamVerifyingConsumer> {
  return StreamVerifyingConsumer.open({
    connection: STREAM_CONNECTION,
    stream,
    consumerName: 'lagging',
    store: join(await tempDir(), 'store'),
    commit: 'message',
    handler,
  });
}

function aborted(error: unknown): boolean {
  return error instanceof DedupError && error.code === 'DEDUP_ABORTED';
}

describe('stream verifying consumer - lag and caughtUp()', () => {
  it('an empty stream: lag 0 and caught up at once', async () => {
    const stream = await newStream('lag-empty');
    const consumer = await open(stream, () => undefined);
    try {
      expect(await consumer.lag()).toEqual({
        offsets: 0n,
        lastChunkId: undefined,
        committedOffset: undefined,
      });
      await consumer.caughtUp({ timeoutMs: 1_000 });
    } finally {
      await consumer.close();
    }
  });

  it('a consumer behind by 5 messages reports lag ≥ 5; caughtUp() times out or aborts with DEDUP_ABORTED while the handler waits, and resolves once it committed the end', async () => {
    const stream = await newStream('lag-behind');
    let release!: () => void;
    const gate = new Promise<void>((resolve) => (release = resolve));
    const consumer = await open(stream, () => gate);
    try {
      await publish(stream, 1, 5, false);
      const lag = await consumer.lag();
      expect(lag.offsets).toBeGreaterThanOrEqual(5n);
      expect(lag.committedOffset).toBeUndefined();
      const started = Date.now();
      const timedOut = await consumer.caughtUp({ timeoutMs: 200 }).catch((e: unknown) => e);
      expect(aborted(timedOut), String(timedOut)).toBe(true);
      expect(Date.now() - started).toBeLessThan(2_000);
      const controller = new AbortController();
      const waiting = consumer.caughtUp({ signal: controller.signal }).catch((e: unknown) => e);
      controller.abort();
      expect(aborted(await waiting)).toBe(true);
      const caughtUp = consumer.caughtUp({ timeoutMs: 10_000 });
      release();
      await caughtUp;
      expect(consumer.committedOffset).toBe(4n);
      expect((await consumer.lag()).offsets).toBe(0n);
    } finally {
      release();
      await consumer.close();
    }
  });

  it("caughtUp() waits for the last chunk's every message, not only its first: 50 in one chunk", async () => {
    const stream = await newStream('lag-chunk');
    await publish(stream, 1, 50, true);
    // Slow enough that the first message's commit comes well before the chunk's last.
    const consumer = await open(stream, () => new Promise((r) => setTimeout(r, 2)));
    try {
      await consumer.caughtUp({ timeoutMs: 10_000 });
      expect(consumer.committedOffset).toBe(49n);
    } finally {
      await consumer.close();
    }
  });

  it('refuses a bad option before any I/O', async () => {
    const stream = await newStream('lag-options');
    const consumer = await open(stream, () => undefined);
    try {
      await expect(consumer.caughtUp({ timeoutMs: 0 })).rejects.toThrow(RangeError);
      await expect(consumer.caughtUp({ signal: {} as AbortSignal })).rejects.toThrow(TypeError);
      await expect(
        StreamVerifyingConsumer.open({
          connection: STREAM_CONNECTION,
          stream,
          consumerName: 'x',
          store: join(await tempDir(), 'store2'),
          handler: () => undefined,
          lagIntervalMs: -1,
        }),
      ).rejects.toThrow(RangeError);
    } finally {
      await consumer.close();
    }
  });
});

class TestReader extends MetricReader {
  protected override onForceFlush(): Promise<void> {
    return Promise.resolve();
  }
  protected override onShutdown(): Promise<void> {
    return Promise.resolve();
  }
}

/** The lag gauge's value for `stream`, if reported. */
async function lagGauge(reader: TestReader, stream: string): Promise<number | undefined> {
  const { resourceMetrics } = (await reader.collect()) as { resourceMetrics: ResourceMetrics };
  for (const scope of resourceMetrics.scopeMetrics)
    for (const metric of scope.metrics)
      if (metric.descriptor.name === 'stream_dedup.verifier.lag')
        for (const p of metric.dataPoints) if (p.attributes.stream === stream) return p.value as number;
  return undefined;
}

describe('stream verifying consumer - the lag gauge', () => {
  it('samples the lag every lagIntervalMs, and lag() is refused after close', async () => {
    const reader = new TestReader();
    metrics.setGlobalMeterProvider(new MeterProvider({ readers: [reader] }));
    const stream = await newStream('lag-gauge');
    let release!: () => void;
    const gate = new Promise<void>((resolve) => (release = resolve));
    const consumer = await StreamVerifyingConsumer.open({
      connection: STREAM_CONNECTION,
      stream,
      consumerName: 'gauged',
      store: join(await tempDir(), 'store'),
      handler: () => gate,
      lagIntervalMs: 20,
    });
    try {
      await publish(stream, 1, 3, false);
      // The timer's sample has no event to wait for: polled, every 20 ms, for at most 5 s.
      const deadline = Date.now() + 5_000;
      let seen: number | undefined;
      while ((seen = await lagGauge(reader, stream)) !== 3 && Date.now() < deadline)
        await new Promise((r) => setTimeout(r, 20));
      expect(seen).toBe(3);
    } finally {
      release();
      await consumer.close();
    }
    await expect(consumer.lag()).rejects.toMatchObject({ code: 'DEDUP_CONSUMER_CLOSED' });
    metrics.disable();
  });
});

describe('consumer group member - lag and caughtUp() per partition', () => {
  it('reports each held partition behind by what was sent; caughtUp() resolves once every partition committed its end', async () => {
    const reader = new TestReader();
    metrics.setGlobalMeterProvider(new MeterProvider({ readers: [reader] }));
    const name = await superStream('lag-group', 2);
    const partitions = await client().queryPartitions({ superStream: name });
    streams.push(...partitions.map((p) => `${p}.lagging.changelog`));
    let release!: () => void;
    const gate = new Promise<void>((resolve) => (release = resolve));
    let assigned!: () => void;
    const allAssigned = new Promise<void>((resolve) => (assigned = resolve));
    let held = 0;
    const member = await SuperStreamVerifyingConsumer.open({
      superStream: name,
      consumerName: 'lagging',
      store: await tempDir(),
      connection: STREAM_CONNECTION,
      commitEvery: 1,
      handler: () => gate,
      onAssignment: (e) => {
        if (e.kind === 'assigned' && ++held === partitions.length) assigned();
      },
    });
    try {
      await allAssigned;
      await publish(partitions[0]!, 1, 3, false);
      await publish(partitions[1]!, 1, 40, true);
      const lags = await member.lag();
      expect([...lags.keys()].sort()).toEqual([...partitions].sort());
      expect(lags.get(partitions[0]!)!.offsets).toBeGreaterThanOrEqual(3n);
      expect(lags.get(partitions[1]!)!.offsets).toBeGreaterThanOrEqual(1n);
      const timedOut = await member.caughtUp({ timeoutMs: 200 }).catch((e: unknown) => e);
      expect(aborted(timedOut), String(timedOut)).toBe(true);
      const caughtUp = member.caughtUp({ timeoutMs: 20_000 });
      release();
      await caughtUp;
      expect(member.committedOffset(partitions[0]!)).toBe(2n);
      expect(member.committedOffset(partitions[1]!)).toBe(39n);
      // One restore per partition assigned (nothing to restore: an empty changelog).
      const { resourceMetrics } = (await reader.collect()) as { resourceMetrics: ResourceMetrics };
      const restores: [string, number][] = [];
      for (const scope of resourceMetrics.scopeMetrics)
        for (const metric of scope.metrics)
          if (metric.descriptor.name === 'stream_dedup.group.restore_duration')
            for (const p of metric.dataPoints)
              restores.push([String(p.attributes.partition), (p.value as { count: number }).count]);
      expect(restores.sort()).toEqual(partitions.map((p) => [p, 1]).sort());
    } finally {
      release();
      await member.close();
      metrics.disable();
    }
  });
});

/**
 * Every `stream_dedup.verifier.lag` point of group `consumer` a reader collects, by stream. Delta
 * temporality: only what the callbacks observed in this collection (a cumulative reader keeps the
 * last value of an attribute set no longer observed, whatever the library does).
 */
async function groupLags(reader: TestReader, consumer: string): Promise<Map<string, number>> {
  const { resourceMetrics } = (await reader.collect()) as { resourceMetrics: ResourceMetrics };
  const lags = new Map<string, number>();
  for (const scope of resourceMetrics.scopeMetrics)
    for (const metric of scope.metrics)
      if (metric.descriptor.name === 'stream_dedup.verifier.lag')
        for (const p of metric.dataPoints)
          if (p.attributes.consumer === consumer) lags.set(String(p.attributes.stream), p.value as number);
  return lags;
}

/** Collects until `done` holds (the gauge's timer has no event to wait for): every 20 ms, at most 10 s. */
async function collectUntil(
  reader: TestReader,
  consumer: string,
  done: (lags: Map<string, number>) => boolean,
): Promise<Map<string, number>> {
  const deadline = Date.now() + 10_000;
  let lags = await groupLags(reader, consumer);
  while (!done(lags) && Date.now() < deadline) {
    await new Promise((r) => setTimeout(r, 20));
    lags = await groupLags(reader, consumer);
  }
  return lags;
}

describe('consumer group member - the lag gauge per partition', () => {
  it('reports the lag of each partition it holds (stream = the partition) and stops reporting a partition it lost', async () => {
    const deltaReader = (): TestReader =>
      new TestReader({ aggregationTemporalitySelector: () => AggregationTemporality.DELTA });
    // Member A reports to readerA's provider, member B (opened after the switch) to readerB's: the
    // library makes its instruments from the global provider of the moment it opens.
    const readerA = deltaReader();
    metrics.setGlobalMeterProvider(new MeterProvider({ readers: [readerA] }));
    const name = await superStream('lag-gauge-group', 3);
    const partitions = (await client().queryPartitions({ superStream: name })).sort();
    streams.push(...partitions.map((p) => `${p}.gauged.changelog`));
    let release!: () => void;
    const gate = new Promise<void>((resolve) => (release = resolve));
    const heldByA = new Set<string>();
    const lostByA: string[] = [];
    let allAssigned!: () => void;
    const assignedToA = new Promise<void>((resolve) => (allAssigned = resolve));
    const a = await SuperStreamVerifyingConsumer.open({
      superStream: name,
      consumerName: 'gauged',
      store: await tempDir(),
      connection: STREAM_CONNECTION,
      commitEvery: 1,
      handler: () => gate,
      lagIntervalMs: 20,
      onAssignment: (e) => {
        if (e.kind === 'assigned') heldByA.add(e.partition);
        else if (heldByA.delete(e.partition)) lostByA.push(e.partition);
        if (heldByA.size === partitions.length) allAssigned();
      },
    });
    let b: SuperStreamVerifyingConsumer | undefined;
    try {
      await assignedToA;
      // 1, 2 and 3 single-message chunks: lags 1, 2, 3 while the handler waits (nothing committed).
      for (const [i, partition] of partitions.entries()) await publish(partition, 1, i + 1, false);
      const expected = new Map(partitions.map((p, i) => [p, i + 1]));
      const before = await collectUntil(
        readerA,
        'gauged',
        (l) => l.size === 3 && [...l].every(([p, v]) => expected.get(p) === v),
      );
      expect(before).toEqual(expected);

      // B joins: the broker moves a partition to it (A's commits go on: the gate opens).
      release();
      const readerB = deltaReader();
      // The API keeps the first provider registered until it is disabled.
      metrics.disable();
      metrics.setGlobalMeterProvider(new MeterProvider({ readers: [readerB] }));
      let tookOver!: (partition: string) => void;
      const assignedToB = new Promise<string>((resolve) => (tookOver = resolve));
      b = await SuperStreamVerifyingConsumer.open({
        superStream: name,
        consumerName: 'gauged',
        store: await tempDir(),
        connection: STREAM_CONNECTION,
        commitEvery: 1,
        handler: () => undefined,
        lagIntervalMs: 20,
        onAssignment: (e) => {
          if (e.kind === 'assigned') tookOver(e.partition);
        },
      });
      const moved = await assignedToB;
      expect(lostByA).toContain(moved);
      // From the loss on, A reports exactly the partitions it holds, and B the one it took.
      const afterA = await groupLags(readerA, 'gauged');
      expect([...afterA.keys()].sort()).toEqual(a.activePartitions());
      expect(afterA.has(moved)).toBe(false);
      expect(a.activePartitions()).toHaveLength(partitions.length - lostByA.length);
      const afterB = await collectUntil(readerB, 'gauged', (l) => l.get(moved) === 0);
      expect([...afterB.keys()]).toEqual([moved]);
      // B's verifier metrics: the group's name, one series for the partition it took (not the
      // partition's store namespace, "<group>\0<partition>").
      const { resourceMetrics } = (await readerB.collect()) as { resourceMetrics: ResourceMetrics };
      const commits = resourceMetrics.scopeMetrics
        .flatMap((scope) => scope.metrics)
        .filter((m) => m.descriptor.name === 'stream_dedup.verifier.commits')
        .flatMap((m) => m.dataPoints.map((p) => p.attributes));
      expect(commits).toEqual([{ consumer: 'gauged', stream: moved }]);
      // A's partitions drain to 0 once their handler runs.
      const drained = await collectUntil(
        readerA,
        'gauged',
        (l) => [...l.values()].every((v) => v === 0) && l.size > 0,
      );
      expect([...drained.keys()].sort()).toEqual(a.activePartitions());
      expect([...drained.values()].every((v) => v === 0)).toBe(true);
    } finally {
      release();
      await b?.close();
      await a.close();
      metrics.disable();
    }
  });
});
