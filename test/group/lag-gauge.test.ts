import { metrics } from '@opentelemetry/api';
import {
  AggregationTemporality,
  MeterProvider,
  MetricReader,
  type ResourceMetrics,
} from '@opentelemetry/sdk-metrics';
import { afterEach, describe, expect, it } from 'vitest';
import { GroupLagGauge } from '../../src/group/lag-gauge.js';
import type { ConsumerLag } from '../../src/transport/stream-lag.js';

class TestReader extends MetricReader {
  constructor() {
    super({ aggregationTemporalitySelector: () => AggregationTemporality.DELTA });
  }
  protected override onForceFlush(): Promise<void> {
    return Promise.resolve();
  }
  protected override onShutdown(): Promise<void> {
    return Promise.resolve();
  }
}

async function reported(reader: TestReader): Promise<Record<string, number>> {
  const { resourceMetrics } = (await reader.collect()) as { resourceMetrics: ResourceMetrics };
  const out: Record<string, number> = {};
  for (const scope of resourceMetrics.scopeMetrics)
    for (const metric of scope.metrics)
      if (metric.descriptor.name === 'stream_dedup.verifier.lag')
        for (const p of metric.dataPoints) {
          expect(p.attributes.consumer).toBe('billing');
          out[String(p.attributes.stream)] = p.value as number;
        }
  return out;
}

const lagOf = (offsets: bigint): ConsumerLag => ({
  offsets,
  lastChunkId: offsets,
  committedOffset: undefined,
});

afterEach(() => metrics.disable());

describe('group lag gauge - the partitions a member holds, and no other', () => {
  it('reports each held partition once sampled, drops one lost (and a sample under way when it was lost)', async () => {
    const reader = new TestReader();
    metrics.setGlobalMeterProvider(new MeterProvider({ readers: [reader] }));
    const held = new Set(['p-0', 'p-1']);
    let answer!: (lag: ConsumerLag) => void;
    const source = {
      held: () => [...held],
      lag: (p: string) =>
        p === 'p-1' ? new Promise<ConsumerLag>((resolve) => (answer = resolve)) : Promise.resolve(lagOf(7n)),
    };
    // A long interval: the test samples by hand.
    const gauge = new GroupLagGauge('billing', 3_600_000, source);
    expect(await reported(reader)).toEqual({});
    let queries = 0;
    const counted = source.lag;
    source.lag = (p: string) => {
      queries++;
      return counted(p);
    };
    const sampling = gauge.sample();
    // A tick while p-1's query waits joins that sampling: no second query.
    expect(gauge.sample()).toBe(sampling);
    expect(queries).toBe(2);
    await new Promise((r) => setImmediate(r));
    expect(await reported(reader)).toEqual({ 'p-0': 7 });
    // p-1 is lost while its query is under way, then regained: the late answer belongs to the
    // earlier holding and is not reported.
    held.delete('p-1');
    gauge.lost('p-1');
    expect(await reported(reader)).toEqual({ 'p-0': 7 });
    held.add('p-1');
    answer(lagOf(3n));
    await sampling;
    expect(await reported(reader)).toEqual({ 'p-0': 7 });
    // Sampled again while held: reported again.
    const second = gauge.sample();
    answer(lagOf(2n));
    await second;
    expect(await reported(reader)).toEqual({ 'p-0': 7, 'p-1': 2 });
    held.delete('p-0');
    gauge.lost('p-0');
    expect(await reported(reader)).toEqual({ 'p-1': 2 });
    gauge.close();
    expect(await reported(reader)).toEqual({});
  });

  it('with interval 0 reports nothing', async () => {
    const reader = new TestReader();
    metrics.setGlobalMeterProvider(new MeterProvider({ readers: [reader] }));
    const gauge = new GroupLagGauge('billing', 0, {
      held: () => ['p-0'],
      lag: () => Promise.resolve(lagOf(1n)),
    });
    await gauge.sample();
    expect(await reported(reader)).toEqual({});
    gauge.close();
  });
});
