import { join } from 'node:path';
import { describe, expect, it, vi } from 'vitest';
import { DedupError } from '../../src/errors.js';
import { ID_HEADER, PRODUCER_HEADER } from '../../src/identity/headers.js';
import { DedupStore } from '../../src/store/store.js';
import type { SuperStreamDedupPublisherOptions } from '../../src/superstream/options.js';
import { SuperStreamDedupPublisher } from '../../src/superstream/publisher.js';
import { readStreamToEnd, type StreamRecord } from '../../src/transport/stream-ops.js';
import { BROKER, STREAM_CONNECTION, uniqueName } from '../support/broker.js';
import { FaultProxy } from '../support/proxy.js';
import { useClient } from '../support/stream.js';
import { jsClientRouter, useSuperStreams } from '../support/superstream.js';
import { thrown } from '../support/thrown.js';
import { useTempDir } from '../support/tmp.js';

const client = useClient();
const tempDir = useTempDir();
const superStream = useSuperStreams(client);

async function setup(
  prefix: string,
  extra: Partial<SuperStreamDedupPublisherOptions> = {},
): Promise<{ name: string; options: SuperStreamDedupPublisherOptions }> {
  const name = await superStream(prefix);
  const store = join(await tempDir(), 'store');
  return {
    name,
    options: {
      connection: STREAM_CONNECTION,
      superStream: name,
      producerName: `${prefix}-producer`,
      store,
      routing: { kind: 'hash', key: (body) => Buffer.from(body).toString() },
      ...extra,
      // `extra` may switch to keyed IDs (routing undefined): open() checks the mix at run time.
    } as SuperStreamDedupPublisherOptions,
  };
}

async function readPartitions(partitions: readonly string[]): Promise<Map<string, StreamRecord[]>> {
  const out = new Map<string, StreamRecord[]>();
  for (const p of partitions) out.set(p, await readStreamToEnd(STREAM_CONNECTION, p));
  return out;
}

const idOf = (r: StreamRecord): bigint => BigInt(String(r.applicationProperties[ID_HEADER]));

describe('super stream publisher - routing and per-partition IDs', () => {
  it('3 000 messages over 3 partitions: each once, in the JS client’s partition, IDs 1..n per partition in order', async () => {
    const { name, options } = await setup('ss-hash');
    const pub = await SuperStreamDedupPublisher.open(options);
    expect(pub.partitions).toEqual([`${name}-0`, `${name}-1`, `${name}-2`]);
    expect([...pub.openReports.values()]).toEqual(
      Array(3).fill({ localLastId: 0n, brokerLastId: 0n, resent: 0, reassigned: 0 }),
    );
    const keys = Array.from({ length: 3_000 }, (_, i) => `order-${i}`);
    const results = await Promise.all(keys.map((k) => pub.send(Buffer.from(k), { headers: { n: 7 } })));
    await pub.close();

    const route = await jsClientRouter(client(), name);
    const expected = new Map<string, string>();
    for (const k of keys) expected.set(k, await route(k));
    const sent = new Map<string, { partition: string; publishingId: bigint }>();
    keys.forEach((k, i) => sent.set(k, results[i]!));
    for (const k of keys) expect(sent.get(k)!.partition, k).toBe(expected.get(k));
    expect(results.every((r) => r.outcome === 'published')).toBe(true);

    const read = await readPartitions(pub.partitions);
    const seen = new Set<string>();
    for (const [partition, records] of read) {
      // Each partition has a fair share, numbered 1..n in stream order, with the identity stamps.
      expect(records.length).toBeGreaterThan(800);
      expect(records.map(idOf)).toEqual(records.map((_, i) => BigInt(i + 1)));
      for (const r of records) {
        const body = r.body.toString();
        expect(seen.has(body), body).toBe(false);
        seen.add(body);
        expect(expected.get(body), body).toBe(partition);
        expect(sent.get(body)!.publishingId).toBe(idOf(r));
        expect(r.applicationProperties).toMatchObject({ [PRODUCER_HEADER]: options.producerName, n: 7 });
      }
      expect(pub.lastPublishingIds.get(partition)).toBe(BigInt(records.length));
    }
    expect(seen.size).toBe(keys.length);
  });

  it('reopen after close resumes every partition at its own last ID; a shared Client stays open', async () => {
    const { options } = await setup('ss-resume', { connection: client() });
    const first = await SuperStreamDedupPublisher.open(options);
    for (let i = 0; i < 60; i++) await first.send(Buffer.from(`a-${i}`));
    const before = first.lastPublishingIds;
    await first.close();
    const again = await SuperStreamDedupPublisher.open(options);
    for (const [p, last] of before) {
      expect(last).toBeGreaterThan(0n);
      expect(again.openReports.get(p)).toMatchObject({ localLastId: last, brokerLastId: last, resent: 0 });
      expect(again.lastPublishingIds.get(p)).toBe(last);
    }
    const next = await Promise.all(Array.from({ length: 60 }, (_, i) => again.send(Buffer.from(`b-${i}`))));
    await again.close();
    for (const p of again.partitions) {
      const ids = next.filter((r) => r.partition === p).map((r) => r.publishingId);
      expect(ids).toEqual(ids.map((_, i) => before.get(p)! + BigInt(i + 1)));
    }
    const read = await readPartitions(again.partitions);
    for (const [, records] of read) expect(records.map(idOf)).toEqual(records.map((_, i) => BigInt(i + 1)));
    expect([...read.values()].flat()).toHaveLength(120);
    await expect(client().queryPartitions({ superStream: options.superStream })).resolves.toHaveLength(3);
  });

  it('keyed IDs: the domain key routes (the same hash), a repeat is a duplicate on the partition that holds it', async () => {
    const { name, options } = await setup('ss-keyed', { idMode: 'keyed', routing: undefined });
    const store = await DedupStore.open(options.store as string);
    const pub = await SuperStreamDedupPublisher.open({ ...options, store });
    const route = await jsClientRouter(client(), name);
    const first = await Promise.all(
      ['k1', 'k2', 'k3', 'k4'].map((key) => pub.send(Buffer.from(key), { key })),
    );
    for (const [i, r] of first.entries()) {
      expect(r).toMatchObject({ partition: await route(`k${i + 1}`), outcome: 'published' });
    }
    const repeat = await pub.send(Buffer.from('k3 again'), { key: 'k3' });
    expect(repeat).toEqual({ ...first[2], outcome: 'duplicate' });
    await expect(pub.send(Buffer.from('no key'))).rejects.toMatchObject({ code: 'DEDUP_ID_MODE_MISMATCH' });
    expect(() => pub.sendTo(pub.partitions[0]!, Buffer.from('x'), { key: 'k9' })).toThrow(TypeError);
    await pub.close();
    // The store was the application's: still open.
    expect(store.isClosed).toBe(false);
    await store.close();
    expect([...(await readPartitions(pub.partitions)).values()].flat()).toHaveLength(4);
  });

  it("key routing follows the exchange's bindings; an unbound key is refused, nothing sent", async () => {
    const name = await superStream('ss-bind', 3, ['eu', 'us', 'ap']);
    const pub = await SuperStreamDedupPublisher.open({
      connection: STREAM_CONNECTION,
      superStream: name,
      producerName: 'bind-producer',
      store: join(await tempDir(), 'store'),
      routing: { kind: 'key', key: (_body, headers) => String(headers?.region) },
    });
    expect(pub.partitions).toEqual([`${name}-eu`, `${name}-us`, `${name}-ap`]);
    const regions = ['eu', 'us', 'ap', 'us', 'us', 'eu'];
    const results = await Promise.all(
      regions.map((region, i) => pub.send(Buffer.from(`${i}`), { headers: { region } })),
    );
    expect(results.map((r) => r.partition)).toEqual(regions.map((r) => `${name}-${r}`));
    expect(results.map((r) => r.publishingId)).toEqual([1n, 1n, 1n, 2n, 3n, 2n]);
    await expect(pub.partitionFor(Buffer.from('x'), { headers: { region: 'ap' } })).resolves.toBe(
      `${name}-ap`,
    );
    await expect(pub.send(Buffer.from('nowhere'), { headers: { region: 'mars' } })).rejects.toMatchObject({
      code: 'DEDUP_BROKER_REFUSED',
      message: expect.stringContaining('no binding') as unknown,
    });
    await pub.close();
    expect(
      [...(await readPartitions(pub.partitions)).values()]
        .flat()
        .map((r) => r.body.toString())
        .sort(),
    ).toEqual(['0', '1', '2', '3', '4', '5']);
  });

  it('key routing rides out a broker outage: a new routing key waits for the broker instead of failing', async () => {
    const name = await superStream('ss-bind-outage', 3, ['eu', 'us', 'ap']);
    const proxy = await FaultProxy.start(BROKER.host, BROKER.streamPort);
    try {
      const pub = await SuperStreamDedupPublisher.open({
        // Every connection (route queries and partitions alike) goes through the proxy.
        connection: {
          ...STREAM_CONNECTION,
          port: proxy.port,
          addressResolver: { enabled: true, endpoint: { host: '127.0.0.1', port: proxy.port } },
        },
        superStream: name,
        producerName: 'outage-producer',
        store: join(await tempDir(), 'store'),
        routing: { kind: 'key', key: (_body, headers) => String(headers?.region) },
        reconnect: { initialDelayMs: 20, maxDelayMs: 100 },
        connectTimeoutMs: 1_000,
      });
      expect((await pub.send(Buffer.from('before'), { headers: { region: 'eu' } })).publishingId).toBe(1n);
      // The broker looks down: every connection cut, new ones refused.
      proxy.refuse(true);
      proxy.cut();
      const during = pub.send(Buffer.from('during'), { headers: { region: 'us' } });
      // The outage lasts until the route query (and the partitions) were refused a few times.
      await vi.waitFor(() => expect(proxy.refused).toBeGreaterThan(3), { timeout: 10_000 });
      proxy.refuse(false);
      await expect(during).resolves.toMatchObject({ partition: `${name}-us`, publishingId: 1n });
      await pub.close();
    } finally {
      await proxy.close();
    }
  });

  it('sends reach a partition in call order while a route query is under way (explicit IDs)', async () => {
    const name = await superStream('ss-order', 2, ['eu', 'us']);
    const pub = await SuperStreamDedupPublisher.open({
      connection: STREAM_CONNECTION,
      superStream: name,
      producerName: 'order-producer',
      store: join(await tempDir(), 'store'),
      idMode: 'explicit',
      routing: { kind: 'key', key: (_body, headers) => String(headers?.region) },
    });
    // 'eu' is not cached yet: the sendTo() behind it must not reach the partition first (ID 2
    // before 1 would make 1 a regression).
    const results = await Promise.all([
      pub.send(Buffer.from('1'), { headers: { region: 'eu' }, publishingId: 1n }),
      pub.sendTo(`${name}-eu`, Buffer.from('2'), { publishingId: 2n }),
      pub.send(Buffer.from('3'), { headers: { region: 'eu' }, publishingId: 3n }),
      pub.send(Buffer.from('4'), { headers: { region: 'us' }, publishingId: 4n }),
    ]);
    expect(results.map((r) => [r.partition, r.publishingId])).toEqual([
      [`${name}-eu`, 1n],
      [`${name}-eu`, 2n],
      [`${name}-eu`, 3n],
      [`${name}-us`, 4n],
    ]);
    await pub.close();
    await expect(pub.send(Buffer.from('5'), { publishingId: 5n })).rejects.toMatchObject({
      code: 'DEDUP_PUBLISHER_CLOSED',
    });
    const eu = (await readPartitions([`${name}-eu`])).get(`${name}-eu`)!;
    expect(eu.map((r) => r.body.toString())).toEqual(['1', '2', '3']);
  });

  it('explicit IDs per partition: sendTo names the partition, each partition refuses only its own regressions', async () => {
    const { options } = await setup('ss-explicit', { idMode: 'explicit' });
    const pub = await SuperStreamDedupPublisher.open(options);
    const [p0, p1] = pub.partitions as [string, string];
    await pub.sendTo(p0, Buffer.from('a'), { publishingId: 10n });
    await pub.sendTo(p1, Buffer.from('b'), { publishingId: 5n });
    await expect(pub.sendTo(p0, Buffer.from('c'), { publishingId: 7n })).rejects.toMatchObject({
      code: 'DEDUP_ID_REGRESSION',
    });
    expect(() => pub.sendTo('nope', Buffer.from('d'), { publishingId: 11n })).toThrow(RangeError);
    const routed = await pub.send(Buffer.from('e'), { publishingId: 20n });
    expect(routed.partition).toBe(await pub.partitionFor(Buffer.from('e')));
    await pub.close();
    const again = await SuperStreamDedupPublisher.open(options);
    expect(again.lastPublishingIds.get(p0)).toBe(routed.partition === p0 ? 20n : 10n);
    expect(again.lastPublishingIds.get(p1)).toBe(routed.partition === p1 ? 20n : 5n);
    await again.close();
  });
});

describe('super stream publisher - refusals', () => {
  it('a super stream that does not exist is DEDUP_BROKER_REFUSED, saying so', async () => {
    const store = join(await tempDir(), 'store');
    const err = await SuperStreamDedupPublisher.open({
      connection: STREAM_CONNECTION,
      superStream: uniqueName('ss-missing'),
      producerName: 'p',
      store,
      routing: { kind: 'hash', key: () => 'k' },
    }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(DedupError);
    expect(err).toMatchObject({
      code: 'DEDUP_BROKER_REFUSED',
      message: expect.stringMatching(/does not exist/) as unknown,
    });
  });

  it('a store that saw another partition count refuses with DEDUP_PARTITIONS_CHANGED, nothing sent', async () => {
    const { name, options } = await setup('ss-changed');
    const pub = await SuperStreamDedupPublisher.open(options);
    await pub.send(Buffer.from('before'));
    await pub.close();
    await client().deleteSuperStream({ streamName: name });
    await client().createSuperStream({ streamName: name, arguments: {} }, undefined, 2);
    const err = await SuperStreamDedupPublisher.open(options).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(DedupError);
    expect(err).toMatchObject({ code: 'DEDUP_PARTITIONS_CHANGED' });
    expect((err as Error).message).toContain(`has 2 partitions [${name}-0, ${name}-1]`);
    expect([...(await readPartitions([`${name}-0`, `${name}-1`])).values()].flat()).toHaveLength(0);
  });

  it('a routing function that throws or returns a non-string: a TypeError at send(), nothing sent, no ID used', async () => {
    const { options } = await setup('ss-badroute', {
      routing: {
        kind: 'hash',
        key: (body) => {
          const text = Buffer.from(body).toString();
          if (text === 'throw') throw new Error('no customer in this message');
          return (text === 'number' ? 42 : text) as string;
        },
      },
    });
    const pub = await SuperStreamDedupPublisher.open(options);
    const threw = thrown(() => pub.send(Buffer.from('throw')));
    expect(threw).toBeInstanceOf(TypeError);
    expect((threw as Error).message).toContain(
      'routing.key threw (nothing was sent): no customer in this message',
    );
    expect((threw as Error).cause).toBeInstanceOf(Error);
    expect(() => pub.send(Buffer.from('number'))).toThrow(
      new TypeError('Expected routing.key to return a string, got 42 (nothing was sent)'),
    );
    expect(() => pub.send('text' as unknown as Uint8Array)).toThrow(TypeError);
    await expect(pub.partitionFor(Buffer.from('throw'))).rejects.toBeInstanceOf(TypeError);
    const ok = await pub.send(Buffer.from('fine'));
    expect(ok.publishingId).toBe(1n);
    await pub.close();
    const all = [...(await readPartitions(pub.partitions)).values()].flat();
    expect(all.map((r) => r.body.toString())).toEqual(['fine']);
  });

  it('a partition that stops on an error closes the whole publisher, the error naming the partition', async () => {
    const { options } = await setup('ss-conflict', { watchIntervalMs: 50 });
    const pub = await SuperStreamDedupPublisher.open(options);
    const victim = pub.partitions[1]!;
    // Another writer under our name on one partition, ahead of us.
    const raw = await client().declarePublisher({ stream: victim, publisherRef: options.producerName });
    await raw.basicSend(100n, Buffer.from('intruder'));
    await raw.flush();
    const reason = await pub.closed();
    await client().deletePublisher(raw.extendedId);
    expect(reason).toBeInstanceOf(DedupError);
    expect(reason).toMatchObject({ code: 'DEDUP_NAME_CONFLICT' });
    expect(reason!.message).toContain(`partition "${victim}"`);
    expect(pub.isClosed).toBe(true);
    await expect(pub.send(Buffer.from('after'))).rejects.toMatchObject({ code: 'DEDUP_NAME_CONFLICT' });
    // Everything was closed, the store included: it opens again.
    await (await DedupStore.open(options.store as string)).close();
  });

  it('a partition deleted while open: the publisher stops with DEDUP_BROKER_REFUSED naming it, the other partitions keep what they confirmed', async () => {
    const { options } = await setup('ss-deleted');
    const pub = await SuperStreamDedupPublisher.open(options);
    const keys = ['a', 'b', 'c', 'd', 'e', 'f', 'g', 'h'];
    const first = await Promise.all(keys.map((k) => pub.send(Buffer.from(k))));
    const victim = pub.partitions[0]!;
    await client().deleteStream({ stream: victim });
    // The next send to the deleted partition (or the deletion itself) makes it reconnect, and the
    // reconnect finds no stream: it stops at once rather than retrying for giveUpAfterMs.
    const late = pub.sendTo(victim, Buffer.from('late')).catch((err: unknown) => err);
    const reason = await pub.closed();
    expect(reason).toMatchObject({ code: 'DEDUP_BROKER_REFUSED' });
    expect(reason!.message).toContain(`partition "${victim}"`);
    expect(reason!.message).toContain('no longer exists');
    expect(await late).toMatchObject({ code: 'DEDUP_BROKER_REFUSED' });
    const survivors = pub.partitions.slice(1);
    const stored = [...(await readPartitions(survivors)).values()].flat().map((r) => r.body.toString());
    const confirmedThere = keys.filter((_, i) => first[i]!.partition !== victim);
    expect(confirmedThere.length).toBeGreaterThan(0);
    expect(stored.sort()).toEqual(confirmedThere.sort());
  });
});
