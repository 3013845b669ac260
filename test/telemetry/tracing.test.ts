import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { DedupPublisher } from '../../src/publisher/facade.js';
import { DedupPublisherCore } from '../../src/publisher/core.js';
import { memoryStore } from '../support/memory-store.js';
import { ModelBroker, ModelTransport } from '../support/model-broker.js';
import { installTracing } from '../support/tracing.js';

class Publisher extends DedupPublisher {}

let tracing: ReturnType<typeof installTracing>;
beforeEach(() => {
  tracing = installTracing();
});
afterEach(async () => {
  await tracing.uninstall();
});

async function publisher(options: { tracing?: boolean } = {}): Promise<[Publisher, ModelTransport]> {
  const transport = new ModelTransport(new ModelBroker(), 'orders', 'p');
  const core = await DedupPublisherCore.open(transport, {
    producerName: 'p',
    store: await memoryStore(),
    ...options,
  });
  return [new Publisher(core), transport];
}

describe('tracing option of the publishers', () => {
  it('by default a send span ends at the confirm and its context is in the message headers', async () => {
    const [pub, transport] = await publisher();
    await pub.send(Buffer.from('a'), { headers: { kind: 'x' } });
    const [span] = tracing.exporter.getFinishedSpans();
    expect(span?.name).toBe('send orders');
    const { traceId, spanId } = span!.spanContext();
    expect(transport.published[0]!.headers).toEqual({ kind: 'x', traceparent: `00-${traceId}-${spanId}-01` });
    await pub.close();
  });

  it("a caller's own traceparent travels unchanged", async () => {
    const [pub, transport] = await publisher();
    const traceparent = `00-${'b'.repeat(32)}-${'c'.repeat(16)}-01`;
    await pub.send(Buffer.from('a'), { headers: { traceparent } });
    expect(transport.published[0]!.headers).toEqual({ traceparent });
    await pub.close();
  });

  it('tracing: false: no span and no trace headers, with an SDK installed', async () => {
    const [pub, transport] = await publisher({ tracing: false });
    await pub.send(Buffer.from('a'));
    expect(tracing.exporter.getFinishedSpans()).toEqual([]);
    expect(transport.published[0]!.headers).toBeUndefined();
    await pub.close();
  });

  it('tracing must be a boolean, checked before any I/O', async () => {
    await expect(publisher({ tracing: 'no' as unknown as boolean })).rejects.toThrow(TypeError);
  });
});
