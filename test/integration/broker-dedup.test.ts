import type { Client } from 'rabbitmq-stream-js-client';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { uniqueName } from '../support/broker.js';
import { connectClient, readAll } from '../support/stream.js';

// The broker rule everything else rests on (docs/design.md §3), checked against the real broker:
// per (stream, producer name) a message is stored only if its ID is above the highest stored.
describe('broker - named producer deduplication', () => {
  let client: Client;
  beforeAll(async () => {
    client = await connectClient();
  });
  afterAll(async () => {
    await client.close();
  });

  it('stores each publishing id once and drops re-sent ids, still confirming them', async () => {
    const stream = uniqueName('broker-dedup');
    await client.createStream({ stream, arguments: {} });
    try {
      const publisherRef = 'broker-dedup-producer';
      const publisher = await client.declarePublisher({ stream, publisherRef });
      const confirmed = new Set<bigint>();
      let allConfirmed: () => void = () => undefined;
      const done = new Promise<void>((resolve) => (allConfirmed = resolve));
      const sends: bigint[] = [1n, 2n, 3n, 4n, 5n, 2n, 4n, 5n, 6n, 3n];
      publisher.on('publish_confirm', (err, ids) => {
        expect(err).toBeNull();
        for (const id of ids) confirmed.add(id);
        if (confirmed.size === 6) allConfirmed();
      });
      for (const id of sends) {
        await publisher.send(Buffer.from(`m-${id}`), { publishingId: id });
      }
      await publisher.flush();
      await done;
      expect(await publisher.getLastPublishingId()).toBe(6n);
      await publisher.close();

      const bodies = (await readAll(client, stream)).map((m) => m.content.toString());
      expect(bodies).toEqual(['m-1', 'm-2', 'm-3', 'm-4', 'm-5', 'm-6']);
    } finally {
      await client.deleteStream({ stream });
    }
  });
});
