import { metrics } from '@opentelemetry/api';
import { MeterProvider, MetricReader, type ResourceMetrics } from '@opentelemetry/sdk-metrics';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { VerifyingConsumerCore } from '../../src/consumer/core.js';
import { identityHeaders } from '../../src/identity/headers.js';
import { DedupPublisherCore } from '../../src/publisher/core.js';
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
    const consumer = await VerifyingConsumerCore.open({
      consumerName: 'projection',
      store: await memoryStore(),
      commit: 'message',
      handler: () => undefined,
    });
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
    expect(got.get('stream_dedup.verifier.outcomes{consumer=projection,outcome=new}')).toBe(2);
    expect(got.get('stream_dedup.verifier.outcomes{consumer=projection,outcome=duplicate}')).toBe(1);
    expect(got.get('stream_dedup.verifier.commits{consumer=projection}')).toBe(3);
    await pub.close();
    await consumer.close();
  });
});
