import { join } from 'node:path';
import { connect as amqpConnect } from 'amqplib';
import { describe, expect, it } from 'vitest';
import { ID_HEADER, PRODUCER_HEADER, readIdentity } from '../../src/identity/headers.js';
import { AmqpDedupPublisher } from '../../src/amqp.js';
import { AMQP_URL, uniqueName } from '../support/broker.js';
import { readAll, useClient } from '../support/stream.js';
import { useTempDir } from '../support/tmp.js';

const client = useClient();
const tempDir = useTempDir();

describe('amqp publisher', () => {
  it('declares the stream queue, stamps string identity headers a stream consumer reads back (as annotations), and resumes ids', async () => {
    const queue = uniqueName('amqp-pub');
    const store = join(await tempDir(), 'store');
    const options = { url: AMQP_URL, queue, declareQueue: true, producerName: 'amqp-producer', store };
    const pub = await AmqpDedupPublisher.open(options);
    expect(pub.openReport).toMatchObject({ localLastId: 0n, brokerLastId: undefined, resent: 0 });
    const results = await Promise.all(
      Array.from({ length: 500 }, (_, i) => pub.send(Buffer.from(`a-${i + 1}`), { headers: { kind: 'k' } })),
    );
    expect(results.map((r) => r.publishingId)).toEqual(Array.from({ length: 500 }, (_, i) => BigInt(i + 1)));
    await pub.close();
    const again = await AmqpDedupPublisher.open(options);
    expect((await again.send(Buffer.from('a-501'))).publishingId).toBe(501n);
    await again.close();

    const messages = await readAll(client(), queue);
    expect(messages.map((m) => m.content.toString())).toEqual(
      Array.from({ length: 501 }, (_, i) => `a-${i + 1}`),
    );
    const ids = messages.map((m) => {
      const r = readIdentity(m.applicationProperties, m.messageAnnotations);
      if (r.kind !== 'ok') throw new Error(`identity ${r.kind}`);
      expect(r.identity.producerName).toBe('amqp-producer');
      return r.identity.publishingId;
    });
    expect(ids).toEqual(Array.from({ length: 501 }, (_, i) => BigInt(i + 1)));
    // RabbitMQ 4.0 turns AMQP 0-9-1 headers named x-… into message annotations, others into
    // application properties.
    expect(messages[0]!.messageAnnotations?.[ID_HEADER]).toBe('1');
    expect(messages[0]!.messageAnnotations?.[PRODUCER_HEADER]).toBe('amqp-producer');
    expect(messages[0]!.applicationProperties?.kind).toBe('k');
  });

  it('a missing queue is DEDUP_BROKER_REFUSED, an unreachable broker DEDUP_BROKER_UNREACHABLE', async () => {
    const store = join(await tempDir(), 'store');
    await expect(
      AmqpDedupPublisher.open({ url: AMQP_URL, queue: uniqueName('missing'), producerName: 'p', store }),
    ).rejects.toMatchObject({ code: 'DEDUP_BROKER_REFUSED' });
    await expect(
      AmqpDedupPublisher.open({
        url: 'amqp://guest:guest@127.0.0.1:1',
        queue: 'q',
        producerName: 'p',
        store,
      }),
    ).rejects.toMatchObject({ code: 'DEDUP_BROKER_UNREACHABLE' });
  });

  it('a queue deleted while open: the publisher stops with DEDUP_BROKER_REFUSED, and declareQueue does not re-create it', async () => {
    const queue = uniqueName('amqp-deleted');
    const url = AMQP_URL;
    const pub = await AmqpDedupPublisher.open({
      url,
      queue,
      declareQueue: true,
      producerName: 'amqp-deleted-producer',
      store: join(await tempDir(), 'store'),
      reconnect: { initialDelayMs: 20, maxDelayMs: 100, giveUpAfterMs: 120_000 },
    });
    expect((await pub.send(Buffer.from('m-1'))).publishingId).toBe(1n);
    const model = await amqpConnect(url);
    const channel = await model.createChannel();
    channel.on('error', () => undefined); // the 404 below closes it: expected
    await channel.deleteQueue(queue);
    // Deleting the queue closes the publisher's channel: it reconnects, and finds no queue.
    const late = pub.send(Buffer.from('m-2')).catch((err: unknown) => err);
    const closedWith = await pub.closed();
    expect(closedWith?.code).toBe('DEDUP_BROKER_REFUSED');
    expect(closedWith?.message).toContain(`queue "${queue}" no longer exists`);
    expect(await late).toMatchObject({ code: 'DEDUP_BROKER_REFUSED' });
    // Not re-created: checking it closes the channel with 404.
    await expect(channel.checkQueue(queue)).rejects.toMatchObject({ code: 404 });
    await model.close().catch(() => undefined);
  });
});
