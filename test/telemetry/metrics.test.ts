import { metrics } from '@opentelemetry/api';
import { MeterProvider, MetricReader, type ResourceMetrics } from '@opentelemetry/sdk-metrics';
import { readFileSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { VerifyingConsumerCore } from '../../src/consumer/core.js';
import { identityHeaders } from '../../src/identity/headers.js';
import { DedupPublisherCore } from '../../src/publisher/core.js';
import { histogramRecorder, INSTRUMENTS, observeLag } from '../../src/telemetry/metrics.js';
import { memoryStore } from '../support/memory-store.js';
import { ModelBroker, ModelTransport } from '../support/model-broker.js';

class TestReader extends MetricReader {
  protected override onForceFlush(): Promise<void> {
    return Promise.resolve();
  }
  protected override onShutdown(): Promise<void> {
    return Promise.resolve();
  }
}

const reader = new TestReader();
beforeAll(() => {
  metrics.setGlobalMeterProvider(new MeterProvider({ readers: [reader] }));
});
afterAll(() => {
  metrics.disable();
});

async function points(): Promise<Map<string, number>> {
  const { resourceMetrics } = (await reader.collect()) as { resourceMetrics: ResourceMetrics };
  const out = new Map<string, number>();
  for (const scope of resourceMetrics.scopeMetrics) {
    for (const metric of scope.metrics) {
      for (const p of metric.dataPoints) {
        const attrs = Object.entries(p.attributes)
          .map(([k, v]) => `${k}=${String(v)}`)
          .sort()
          .join(',');
        out.set(`${metric.descriptor.name}{${attrs}}`, p.value as number);
      }
    }
  }
  return out;
}

describe('metrics through @opentelemetry/api', () => {
  it('a publisher reports sent, confirmed and key duplicates; a consumer its outcomes and commits', async () => {
    const pub = await DedupPublisherCore.open(new ModelTransport(new ModelBroker(), 'orders', 'p'), {
      producerName: 'p',
      store: await memoryStore(),
      idMode: 'keyed',
    });
    await Promise.all(['a', 'b', 'a'].map((k) => pub.send(Buffer.from(k), { key: k })));
    const consumer = await VerifyingConsumerCore.open(
      {
        consumerName: 'projection',
        store: await memoryStore(),
        commit: 'message',
        handler: () => undefined,
      },
      { destination: 'orders' },
    );
    for (const [offset, id] of [1, 2, 2].entries()) {
      await consumer.process({
        offset: BigInt(offset),
        content: Buffer.from('x'),
        applicationProperties: identityHeaders('p', BigInt(id)),
      });
    }
    const got = await points();
    expect(got.get('stream_dedup.publisher.sent{producer=p,target=orders}')).toBe(2);
    expect(got.get('stream_dedup.publisher.confirmed{producer=p,target=orders}')).toBe(2);
    expect(got.get('stream_dedup.publisher.key_duplicates{producer=p,target=orders}')).toBe(1);
    expect(got.get('stream_dedup.verifier.outcomes{consumer=projection,outcome=new,stream=orders}')).toBe(2);
    expect(
      got.get('stream_dedup.verifier.outcomes{consumer=projection,outcome=duplicate,stream=orders}'),
    ).toBe(1);
    expect(got.get('stream_dedup.verifier.commits{consumer=projection,stream=orders}')).toBe(3);
    await pub.close();
    await consumer.close();
  });

  it("the meter's scope version is package.json's; every instrument emitted is in INSTRUMENTS with its unit and attributes, and each is emitted", async () => {
    const transport = new ModelTransport(new ModelBroker(), 'orders', 'q');
    const pub = await DedupPublisherCore.open(transport, {
      producerName: 'q',
      store: await memoryStore(),
      maxInFlight: 1,
    });
    transport.faults.holdConfirms = true;
    const sends = [pub.send(Buffer.from('a')), pub.send(Buffer.from('b'))];
    await until(() => pub.inFlight === 2 && transport.published.length === 1);
    const held = await points();
    // One written and sent (the outbox), one parked behind it (maxInFlight 1).
    expect(held.get('stream_dedup.publisher.in_flight{producer=q,target=orders}')).toBe(2);
    expect(held.get('stream_dedup.publisher.outbox{producer=q,target=orders}')).toBe(1);
    expect(held.get('stream_dedup.publisher.parked{producer=q,target=orders}')).toBe(1);
    transport.faults.holdConfirms = false;
    transport.releaseConfirms();
    await Promise.all(sends);
    const consumer = await VerifyingConsumerCore.open(
      {
        consumerName: 'histo',
        store: await memoryStore(),
        commit: 'message',
        handler: () => undefined,
      },
      { destination: 'orders' },
    );
    await consumer.process({
      offset: 0n,
      content: Buffer.from('x'),
      applicationProperties: identityHeaders('q', 1n),
    });
    await consumer.flush();
    // The stream consumer's lag gauge (its sampling: test/integration/consumer-lag.test.ts) and a
    // group's restore (src/group/changelog-strategy.ts).
    const lag: { value?: bigint } = {};
    const stopLag = observeLag('histo', 'orders', () => lag.value);
    expect([...(await points()).keys()].some((k) => k.startsWith('stream_dedup.verifier.lag'))).toBe(false);
    lag.value = 3n;
    expect((await points()).get('stream_dedup.verifier.lag{consumer=histo,stream=orders}')).toBe(3);
    histogramRecorder('restoreDuration', { group: 'g', partition: 'orders-0' })(12);

    const { resourceMetrics } = (await reader.collect()) as { resourceMetrics: ResourceMetrics };
    const scopes = resourceMetrics.scopeMetrics.filter((s) => s.scope.name === 'stream-dedup');
    const { version } = JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8')) as {
      version: string;
    };
    expect(scopes.map((s) => s.scope.version)).toEqual([version]);
    const known = new Map(INSTRUMENTS.map((i) => [i.name, i]));
    const seen = new Set<string>();
    for (const metric of scopes[0]!.metrics) {
      const info = known.get(metric.descriptor.name);
      expect(info, metric.descriptor.name).toBeDefined();
      expect(metric.descriptor.unit).toBe(info!.unit);
      for (const p of metric.dataPoints)
        expect(Object.keys(p.attributes).sort()).toEqual([...info!.attributes].sort());
      if (metric.dataPoints.length > 0) seen.add(metric.descriptor.name);
    }
    expect([...seen].sort()).toEqual([...known.keys()].sort());
    const latency = scopes[0]!.metrics.find(
      (m) => m.descriptor.name === 'stream_dedup.publisher.confirm_latency',
    );
    expect(latency!.dataPoints.find((p) => p.attributes.producer === 'q')!.value).toMatchObject({ count: 2 });
    stopLag();
    await pub.close();
    await consumer.close();
  });
});

async function until(condition: () => boolean): Promise<void> {
  for (let i = 0; !condition(); i++) {
    if (i > 1_000) throw new Error('condition not reached within 1 000 turns');
    await new Promise((resolve) => setImmediate(resolve));
  }
}
