import { connect as amqpConnect } from 'amqplib';
import { Offset } from 'rabbitmq-stream-js-client';
import { afterAll, describe, expect, it } from 'vitest';
import { readIdentity } from '../../src/identity/headers.js';
import { decodeDeliveriesOurselves } from '../../src/transport/stream-client-internals.js';
import { readStreamToEnd } from '../../src/stream.js';
import { AMQP_URL, STREAM_CONNECTION, uniqueName } from '../support/broker.js';
import { connectClient, useClient, type Message } from '../support/stream.js';

// Our chunk reader (src/transport/stream-chunks.ts, amqp10-decode.ts) on the messages RabbitMQ
// converts from AMQP 0-9-1 publishes into stream records: headers (x-… as message annotations),
// properties, header section. Where rabbitmq-stream-js-client decodes them, ours gives the same
// values; where it cannot (it throws in its socket handler: docs/design.md §3 rule 7), ours reads
// them.

const client = useClient();
const queues: string[] = [];

afterAll(async () => {
  for (const stream of queues)
    await client()
      .deleteStream({ stream })
      .catch(() => undefined);
});

async function publish(headers: Record<string, unknown>): Promise<string> {
  const queue = uniqueName('amqp091-decode');
  queues.push(queue);
  const connection = await amqpConnect(AMQP_URL);
  try {
    const channel = await connection.createConfirmChannel();
    await channel.assertQueue(queue, { durable: true, arguments: { 'x-queue-type': 'stream' } });
    channel.sendToQueue(queue, Buffer.from('hello'), {
      headers,
      contentType: 'text/plain',
      contentEncoding: 'utf8',
      messageId: 'm1',
      correlationId: 'c1',
      timestamp: 1_700_000_000,
      priority: 5,
      persistent: true,
      appId: 'app',
      type: 'created',
      replyTo: 'r',
      expiration: '60000',
    });
    await channel.waitForConfirms();
  } finally {
    await connection.close();
  }
  return queue;
}

/** The stream's first message as a client delivers it: decoded by our reader, or by the client's. */
async function firstMessage(stream: string, ours: boolean): Promise<Message> {
  const reader = await connectClient();
  try {
    return await new Promise<Message>((resolve, reject) => {
      if (ours) decodeDeliveriesOurselves(reader, reject);
      reader.declareConsumer({ stream, offset: Offset.first() }, resolve).catch(reject);
    });
  } finally {
    await reader.close();
  }
}

describe('chunk reader - messages converted from AMQP 0-9-1', () => {
  it('gives what the client gives: body, application properties, annotations, properties, header', async () => {
    const queue = await publish({
      'x-dedup-producer': 'p',
      'x-dedup-id': '1',
      kind: 'k',
      n: 100_000,
      'x-flag': true,
    });
    const ours = await firstMessage(queue, true);
    const theirs = await firstMessage(queue, false);
    expect(ours.offset).toBe(0n);
    expect(ours.offset).toBe(theirs.offset);
    expect(ours.content).toEqual(theirs.content);
    expect(ours.applicationProperties).toStrictEqual(theirs.applicationProperties);
    expect(ours.messageAnnotations).toStrictEqual(theirs.messageAnnotations);
    expect(ours.messageProperties).toEqual(theirs.messageProperties);
    expect(ours.messageHeader).toEqual(theirs.messageHeader);
    expect(ours.messageProperties).toMatchObject({ messageId: 'm1', contentType: 'text/plain' });
    expect(readIdentity(ours.applicationProperties, ours.messageAnnotations)).toEqual({
      kind: 'ok',
      identity: { producerName: 'p', publishingId: 1n },
    });
  });

  it('reads the header types the client cannot (long, zero, empty string, short, double, list, table, binary)', async () => {
    const queue = await publish({
      'x-dedup-producer': 'p',
      'x-dedup-id': '2',
      'x-long': 2 ** 40,
      'x-zero': 0,
      'x-empty': '',
      'x-short': 7,
      'x-float': 1.5,
      'x-list': [1, 'a'],
      'x-table': { a: 1 },
      'x-bin': Buffer.from([1, 2]),
      'x-false': false,
      plain: 2 ** 40,
    });
    const [record] = await readStreamToEnd(STREAM_CONNECTION, queue);
    expect(record!.messageAnnotations).toMatchObject({
      'x-dedup-id': '2',
      'x-long': 2n ** 40n,
      'x-zero': 0,
      'x-empty': '',
      'x-short': 7,
      'x-float': 1.5,
      'x-list': [1, 'a'],
      'x-table': { a: 1 },
      'x-bin': Buffer.from([1, 2]),
      'x-false': false,
    });
    expect(record!.applicationProperties).toEqual({ plain: 2n ** 40n });
    expect(readIdentity(record!.applicationProperties, record!.messageAnnotations)).toEqual({
      kind: 'ok',
      identity: { producerName: 'p', publishingId: 2n },
    });
  });
});
