import { Offset, type Client } from 'rabbitmq-stream-js-client';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { readerConnector } from '../../src/transport/reader-connector.js';
import { STREAM_CONNECTION, uniqueName } from '../support/broker.js';
import { connectClient } from '../support/stream.js';

// The reader client the standby tail keeps (src/transport/stream-reader-connections.ts), against
// the real broker: rabbitmq-stream-js-client opens a connection per stream read and closes it with
// the read; kept, one connection serves every stream of a node until it issued 256 subscription IDs
// or closed, and the client's close() closes it.
let admin: Client;
const streams = [uniqueName('reader-a'), uniqueName('reader-b')];
beforeAll(async () => {
  admin = await connectClient();
  for (const stream of streams) await admin.createStream({ stream, arguments: {} });
});
afterAll(async () => {
  for (const stream of streams) await admin.deleteStream({ stream }).catch(() => undefined);
  await admin.close();
});

/** Counts the subscription connections `client` opens (1.0: `getConnectionOnChosenNode`). */
function countConnections(client: Client): { opened: number; sockets: Array<{ destroyed: boolean }> } {
  const c = client as unknown as { getConnectionOnChosenNode: (...a: unknown[]) => Promise<unknown> };
  const open = c.getConnectionOnChosenNode.bind(client);
  const counted = { opened: 0, sockets: [] as Array<{ destroyed: boolean }> };
  c.getConnectionOnChosenNode = async (...a) => {
    counted.opened++;
    const connection = (await open(...a)) as { socket: { destroyed: boolean } };
    counted.sockets.push(connection.socket);
    return connection;
  };
  return counted;
}

async function read(client: Client, stream: string, onClosed?: () => void): Promise<void> {
  const consumer = await client.declareConsumer(
    {
      stream,
      offset: Offset.first(),
      ...(onClosed === undefined ? {} : { connectionClosedListener: onClosed }),
    },
    () => undefined,
  );
  await client.closeConsumer(consumer.extendedId);
}

describe('reader connections kept across reads', () => {
  it('one connection for 300 reads of two streams, replaced after 256 subscription IDs, closed with the client', async () => {
    const connect = readerConnector(STREAM_CONNECTION, { connectTimeoutMs: 5_000, keepConnections: true });
    const client = await connect();
    const counted = countConnections(client);
    const started = performance.now();
    for (let i = 0; i < 300; i++) await read(client, streams[i % 2]!);
    const ms = performance.now() - started;
    console.log(`[reader-connections] 300 reads in ${ms.toFixed(0)} ms, ${counted.opened} connections`);
    // 256 IDs on the first, the rest on the second.
    expect(counted.opened).toBe(2);
    await client.close();
    await expect.poll(() => counted.sockets.every((s) => s.destroyed), { timeout: 6_000 }).toBe(true);
  });

  it('a kept connection that closes tells the read on it (not the first read), and the next read opens another', async () => {
    const connect = readerConnector(STREAM_CONNECTION, { connectTimeoutMs: 5_000, keepConnections: true });
    const client = await connect();
    const counted = countConnections(client);
    try {
      let firstHeard = 0;
      await read(client, streams[0]!, () => firstHeard++);
      let heard = 0;
      const consumer = await client.declareConsumer(
        { stream: streams[1]!, offset: Offset.first(), connectionClosedListener: () => heard++ },
        () => undefined,
      );
      (counted.sockets[0] as unknown as { destroy(): void }).destroy();
      await expect.poll(() => heard, { timeout: 5_000 }).toBe(1);
      expect(firstHeard).toBe(0);
      await client.closeConsumer(consumer.extendedId).catch(() => undefined);
      await read(client, streams[0]!);
      expect(counted.opened).toBe(2);
    } finally {
      await client.close();
    }
  });
});
