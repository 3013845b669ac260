import { randomUUID } from 'node:crypto';
import { connect, Offset, type Client } from 'rabbitmq-stream-js-client';
import { afterAll, beforeAll } from 'vitest';
import { STREAM_CONNECTION } from './broker.js';

/** A client connected to the test broker. */
export function connectClient(): Promise<Client> {
  return connect({ ...STREAM_CONNECTION, addressResolver: { enabled: false } });
}

/** A message as the client's consumer delivers it. */
export type Message = Parameters<Parameters<Client['declareConsumer']>[1]>[0];

const MARKER_HEADER = 'x-test-marker';

/**
 * Reads a stream from its first message up to an end marker that this function publishes first
 * with an unnamed publisher. Everything confirmed before the call is ahead of the marker, so the
 * read is complete without waiting for silence.
 */
export async function readAll(client: Client, stream: string, timeoutMs = 60_000): Promise<Message[]> {
  const marker = randomUUID();
  const publisher = await client.declarePublisher({ stream });
  const confirmed = new Promise<void>((resolve) => {
    publisher.on('publish_confirm', (err, ids) => {
      if (err === null && ids.length > 0) resolve();
    });
  });
  await publisher.send(Buffer.from(marker), { applicationProperties: { [MARKER_HEADER]: marker } });
  await confirmed;
  await publisher.close();

  const messages: Message[] = [];
  let consumerId = '';
  await new Promise<void>((resolve, reject) => {
    const timer = setTimeout(
      () => reject(new Error(`readAll(${stream}): marker not read within ${timeoutMs} ms`)),
      timeoutMs,
    );
    client
      .declareConsumer({ stream, offset: Offset.first() }, (message: Message) => {
        if (message.applicationProperties?.[MARKER_HEADER] === marker) {
          clearTimeout(timer);
          resolve();
        } else if (message.applicationProperties?.[MARKER_HEADER] === undefined) {
          messages.push(message);
        }
      })
      .then((consumer) => {
        consumerId = consumer.extendedId;
      })
      .catch((err: unknown) => {
        clearTimeout(timer);
        reject(err instanceof Error ? err : new Error(String(err)));
      });
  });
  if (consumerId !== '') await client.closeConsumer(consumerId);
  return messages;
}

/**
 * A client to the test broker for a test file: connected before its tests, closed after them.
 * Call the returned function inside a test to get it.
 */
export function useClient(): () => Client {
  let client: Client | undefined;
  beforeAll(async () => {
    client = await connectClient();
  });
  afterAll(async () => {
    await client?.close();
  });
  return () => {
    if (client === undefined) throw new Error('useClient(): the client is only there inside tests');
    return client;
  };
}
