import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { StreamDedupPublisher, StreamVerifyingConsumer } from '../../src/stream.js';
import { BROKER, STREAM_CONNECTION, uniqueName } from '../support/broker.js';
import { useClient } from '../support/stream.js';
import { useTempDir } from '../support/tmp.js';

const client = useClient();
const tempDir = useTempDir();

// A cluster node that is down when a process starts must not fail its open(): the first endpoint
// here is a port nothing listens on (connection refused), the second the test broker.
const dead = { hostname: BROKER.host, port: 1 };
const live = { hostname: BROKER.host, port: BROKER.streamPort };

describe('connection endpoints - open() goes round the list once', () => {
  it('the publisher and the consumer open through the second endpoint when the first is down', async () => {
    const stream = uniqueName('endpoints');
    await client().createStream({ stream, arguments: {} });
    const connection = { ...STREAM_CONNECTION, endpoints: [dead, live] };
    const store = join(await tempDir(), 'store');
    const publisher = await StreamDedupPublisher.open({ connection, stream, producerName: 'p', store });
    const { publishingId } = await publisher.send(Buffer.from('one'));
    await publisher.close();
    expect(publishingId).toBe(1n);
    let applied = 0;
    const consumer = await StreamVerifyingConsumer.open({
      connection,
      stream,
      consumerName: 'c',
      store,
      handler: () => void applied++,
    });
    await consumer.waitForOffset(0n);
    await consumer.close();
    expect(applied).toBe(1);
  });

  it('when every endpoint is down, open() fails with DEDUP_BROKER_UNREACHABLE and the store is released', async () => {
    const connection = { ...STREAM_CONNECTION, endpoints: [dead, { hostname: BROKER.host, port: 2 }] };
    const store = join(await tempDir(), 'store');
    await expect(
      StreamDedupPublisher.open({ connection, stream: 'any', producerName: 'p', store }),
    ).rejects.toMatchObject({ code: 'DEDUP_BROKER_UNREACHABLE' });
    await expect(
      StreamVerifyingConsumer.open({
        connection,
        stream: 'any',
        consumerName: 'c',
        store,
        handler: () => undefined,
      }),
    ).rejects.toMatchObject({ code: 'DEDUP_BROKER_UNREACHABLE' });
    // Nothing holds the store: a third open gets as far as the broker again.
    await expect(
      StreamDedupPublisher.open({ connection, stream: 'any', producerName: 'p', store }),
    ).rejects.toMatchObject({ code: 'DEDUP_BROKER_UNREACHABLE' });
  });
});
