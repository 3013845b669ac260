import { existsSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { DedupError } from '../../src/errors.js';
import { ID_HEADER, PRODUCER_HEADER } from '../../src/identity/headers.js';
import { DedupStore } from '../../src/store/store.js';
import {
  StreamDedupPublisher,
  StreamVerifyingConsumer,
  type StreamDedupPublisherOptions,
} from '../../src/stream.js';
import { STREAM_CONNECTION, uniqueName } from '../support/broker.js';
import { connectClient, readAll, useClient } from '../support/stream.js';
import { useTempDir } from '../support/tmp.js';

const client = useClient();
const tempDir = useTempDir();

async function setup(
  name: string,
): Promise<{ stream: string; store: string; options: StreamDedupPublisherOptions }> {
  const stream = uniqueName(name);
  await client().createStream({ stream, arguments: {} });
  const store = join(await tempDir(), 'store');
  return {
    stream,
    store,
    options: { connection: STREAM_CONNECTION, stream, producerName: `${name}-producer`, store },
  };
}

/** Publishes IDs through the raw client under `publisherRef`, as another writer would. */
async function rawPublish(stream: string, publisherRef: string, ids: bigint[]): Promise<void> {
  const publisher = await client().declarePublisher({ stream, publisherRef });
  const confirmed = new Set<bigint>();
  const done = new Promise<void>((resolve) =>
    publisher.on('publish_confirm', (_err, got) => {
      for (const id of got) confirmed.add(id);
      if (ids.every((id) => confirmed.has(id))) resolve();
    }),
  );
  for (const id of ids) await publisher.basicSend(id, Buffer.from(`raw-${id}`));
  await publisher.flush();
  await done;
  await client().deletePublisher(publisher.extendedId);
}

function identities(messages: Awaited<ReturnType<typeof readAll>>): Array<[string, string, string]> {
  return messages.map((m) => [
    m.content.toString(),
    String(m.applicationProperties?.[PRODUCER_HEADER]),
    String(m.applicationProperties?.[ID_HEADER]),
  ]);
}

describe('publisher - ids and identity stamps', () => {
  it('numbers messages from 1, stamps producer and id as decimal strings, and resumes after reopen', async () => {
    const { stream, options } = await setup('stamps');
    const pub = await StreamDedupPublisher.open(options);
    expect(pub.openReport).toMatchObject({ localLastId: 0n, brokerLastId: 0n, resent: 0 });
    const a = await pub.send(Buffer.from('a'), { headers: { kind: 'x', n: 7 } });
    // Long values take the str32 / vbin32 encodings.
    const b = await pub.send(Buffer.from('b'), { headers: { long: 'é'.repeat(300), neg: -5 } });
    const big = Buffer.alloc(70_000, 0x62);
    expect((await pub.send(big)).publishingId).toBe(3n);
    expect([a, b]).toEqual([
      { publishingId: 1n, outcome: 'published' },
      { publishingId: 2n, outcome: 'published' },
    ]);
    await pub.close();
    const again = await StreamDedupPublisher.open(options);
    expect(again.openReport).toMatchObject({ localLastId: 3n, brokerLastId: 3n, resent: 0 });
    expect((await again.send(Buffer.from('c'))).publishingId).toBe(4n);
    await again.close();
    const messages = await readAll(client(), stream);
    expect(identities(messages)).toEqual([
      ['a', options.producerName, '1'],
      ['b', options.producerName, '2'],
      [big.toString(), options.producerName, '3'],
      ['c', options.producerName, '4'],
    ]);
    expect(messages[0]!.applicationProperties).toMatchObject({ kind: 'x', n: 7 });
    expect(messages[1]!.applicationProperties).toMatchObject({ long: 'é'.repeat(300), neg: -5 });
  });
});

describe('publisher - reconciliation on open', () => {
  it('local ahead: re-sends the pending outbox in id order with the original ids', async () => {
    const { stream, store, options } = await setup('local-ahead');
    // A crash after the group commit and before the send leaves this outbox behind.
    const s = await DedupStore.open(store);
    const state = s.claimProducer(stream, options.producerName);
    await state.commit({
      meta: { idMode: 'auto', lastId: 3n, reservedUpTo: 0n },
      segment: [1n, 2n, 3n].map((id) => ({
        publishingId: id,
        body: Buffer.from(`o-${id}`),
        headers: { h: 'v' },
      })),
    });
    state.release();
    await s.close();

    const pub = await StreamDedupPublisher.open(options);
    expect(pub.openReport).toMatchObject({ localLastId: 3n, brokerLastId: 0n, resent: 3, reassigned: 0 });
    expect((await pub.send(Buffer.from('new'))).publishingId).toBe(4n);
    await pub.close();
    const messages = await readAll(client(), stream);
    expect(identities(messages).map(([body, , id]) => `${body}@${id}`)).toEqual([
      'o-1@1',
      'o-2@2',
      'o-3@3',
      'new@4',
    ]);
    expect(messages[0]!.applicationProperties).toMatchObject({ h: 'v' });

    // Confirmed segments were deleted: a further open re-sends nothing.
    const third = await StreamDedupPublisher.open(options);
    expect(third.openReport.resent).toBe(0);
    await third.close();
  });

  it('broker ahead: refuses with DEDUP_SEQUENCE_REGRESSION naming both causes, and sends nothing', async () => {
    const { stream, options } = await setup('broker-ahead');
    await rawPublish(stream, options.producerName, [1n, 2n, 3n, 4n, 5n]);
    const err = await StreamDedupPublisher.open(options).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(DedupError);
    expect((err as DedupError).code).toBe('DEDUP_SEQUENCE_REGRESSION');
    expect((err as DedupError).message).toMatch(/another process publishes under this name/);
    expect((err as DedupError).message).toMatch(/lost, replaced or restored/);
    expect((await readAll(client(), stream)).length).toBe(5);
    // The refused open released the store and the name: adopting works right after.
    const adopted = await StreamDedupPublisher.open({ ...options, onBrokerAhead: 'adopt' });
    expect(adopted.openReport).toMatchObject({ localLastId: 0n, brokerLastId: 5n });
    expect((await adopted.send(Buffer.from('after-adopt'))).publishingId).toBe(6n);
    await adopted.close();
    const bodies = (await readAll(client(), stream)).map((m) => m.content.toString());
    expect(bodies).toEqual(['raw-1', 'raw-2', 'raw-3', 'raw-4', 'raw-5', 'after-adopt']);
  });

  it('broker ahead with adopt: outbox messages are re-sent under new ids above the broker, none lost', async () => {
    const { stream, store, options } = await setup('adopt-outbox');
    await rawPublish(stream, options.producerName, [1n, 2n, 3n, 4n, 5n]);
    const s = await DedupStore.open(store);
    const state = s.claimProducer(stream, options.producerName);
    await state.commit({
      meta: { idMode: 'auto', lastId: 2n, reservedUpTo: 0n },
      segment: [1n, 2n].map((id) => ({ publishingId: id, body: Buffer.from(`o-${id}`), headers: undefined })),
    });
    state.release();
    await s.close();
    const pub = await StreamDedupPublisher.open({ ...options, onBrokerAhead: 'adopt' });
    expect(pub.openReport).toMatchObject({ localLastId: 2n, brokerLastId: 5n, resent: 0, reassigned: 2 });
    expect((await pub.send(Buffer.from('next'))).publishingId).toBe(8n);
    await pub.close();
    const tail = identities(await readAll(client(), stream)).slice(5);
    expect(tail.map(([body, , id]) => `${body}@${id}`)).toEqual(['o-1@6', 'o-2@7', 'next@8']);
  });
});

describe('publisher - bad input', () => {
  it('rejects bad producer names, bodies, headers and oversized messages with TypeError/RangeError', async () => {
    const { options } = await setup('bad-input');
    await expect(StreamDedupPublisher.open({ ...options, producerName: '' })).rejects.toThrow(RangeError);
    await expect(StreamDedupPublisher.open({ ...options, producerName: 'é'.repeat(129) })).rejects.toThrow(
      /258 UTF-8 bytes/,
    );
    await expect(StreamDedupPublisher.open({ ...options, producerName: 'a\nb' })).rejects.toThrow(/control/);
    await expect(
      StreamDedupPublisher.open({ ...options, producerName: 42 as unknown as string }),
    ).rejects.toThrow(TypeError);
    const pub = await StreamDedupPublisher.open(options);
    expect(() => pub.send('text' as unknown as Buffer)).toThrow(TypeError);
    expect(() => pub.send(Buffer.from('x'), { headers: { 'x-dedup-id': '5' } })).toThrow(/reserved/);
    expect(() => pub.send(Buffer.from('x'), { headers: { bad: {} as unknown as string } })).toThrow(
      TypeError,
    );
    expect(() => pub.send(Buffer.alloc(2 * 1024 * 1024))).toThrow(RangeError);
    await expect(pub.send(Buffer.from('x'), { publishingId: 9n })).rejects.toMatchObject({
      code: 'DEDUP_ID_MODE_MISMATCH',
    });
    // Nothing above consumed an id.
    expect((await pub.send(Buffer.from('ok'))).publishingId).toBe(1n);
    await pub.close();
    await pub.close(); // idempotent
    await expect(pub.send(Buffer.from('late'))).rejects.toMatchObject({ code: 'DEDUP_PUBLISHER_CLOSED' });
  });

  it('a missing stream is DEDUP_BROKER_REFUSED; an unreachable broker is DEDUP_BROKER_UNREACHABLE', async () => {
    const store = join(await tempDir(), 'store');
    const base = { stream: uniqueName('missing'), producerName: 'p', store };
    const refusal = await StreamDedupPublisher.open({ ...base, connection: STREAM_CONNECTION }).catch(
      (err: unknown) => err,
    );
    expect(refusal).toMatchObject({ code: 'DEDUP_BROKER_REFUSED' });
    // The refusal says how to get the stream (issue 38).
    expect((refusal as Error).message).toMatch(
      /does not exist \(pass `createStream: true` to create it at open, or create it first\)$/,
    );
    const consumerRefusal = await StreamVerifyingConsumer.open({
      ...base,
      consumerName: 'c',
      handler: () => undefined,
      connection: STREAM_CONNECTION,
    }).catch((err: unknown) => err);
    expect(consumerRefusal).toMatchObject({ code: 'DEDUP_BROKER_REFUSED' });
    expect((consumerRefusal as Error).message).toMatch(
      /does not exist \(a consumer does not create it: create it first\)$/,
    );
    await expect(
      StreamDedupPublisher.open({
        ...base,
        connection: { ...STREAM_CONNECTION, port: 1 },
        connectTimeoutMs: 2_000,
      }),
    ).rejects.toMatchObject({ code: 'DEDUP_BROKER_UNREACHABLE' });
    // Both failures released the store: it opens again.
    const s = await DedupStore.open(store);
    await s.close();
  });

  it('a missing stream: the refusal names createStream, and the store folder the open created is removed', async () => {
    const dir = await tempDir();
    const fresh = join(dir, 'fresh');
    const stream = uniqueName('missing');
    const started = performance.now();
    const refusal = await StreamDedupPublisher.open({
      stream,
      producerName: 'p',
      store: fresh,
      connection: STREAM_CONNECTION,
    }).catch((e: unknown) => e);
    const ms = performance.now() - started;
    expect(refusal).toMatchObject({ code: 'DEDUP_BROKER_REFUSED' });
    expect((refusal as Error).message).toMatch(/does not exist \(pass `createStream: true`/);
    expect(existsSync(fresh)).toBe(false);
    expect(readdirSync(dir)).toEqual([]);
    // A folder that was there before the open is the application's: left, even empty.
    const kept = join(dir, 'kept');
    await (await DedupStore.open(kept)).close();
    await expect(
      StreamDedupPublisher.open({ stream, producerName: 'p', store: kept, connection: STREAM_CONNECTION }),
    ).rejects.toMatchObject({ code: 'DEDUP_BROKER_REFUSED' });
    expect(existsSync(kept)).toBe(true);
    // MissingStreamCheck believes one node's "does not exist" after 2 s (src/transport/util.ts).
    expect(ms).toBeLessThan(10_000);
  });

  it('explicit ids: an id not above the last accepted one is DEDUP_ID_REGRESSION before reaching the broker', async () => {
    const { stream, options } = await setup('explicit');
    const pub = await StreamDedupPublisher.open({ ...options, idMode: 'explicit' });
    expect((await pub.send(Buffer.from('ten'), { publishingId: 10n })).publishingId).toBe(10n);
    await expect(pub.send(Buffer.from('ten-again'), { publishingId: 10n })).rejects.toMatchObject({
      code: 'DEDUP_ID_REGRESSION',
    });
    await expect(pub.send(Buffer.from('five'), { publishingId: 5n })).rejects.toMatchObject({
      code: 'DEDUP_ID_REGRESSION',
    });
    expect(() => pub.send(Buffer.from('zero'), { publishingId: 0n })).toThrow(RangeError);
    expect(() => pub.send(Buffer.from('big'), { publishingId: 1n << 64n })).toThrow(RangeError);
    await expect(pub.send(Buffer.from('none'))).rejects.toMatchObject({ code: 'DEDUP_ID_MODE_MISMATCH' });
    expect((await pub.send(Buffer.from('eleven'), { publishingId: 11n })).publishingId).toBe(11n);
    await pub.close();
    await expect(StreamDedupPublisher.open(options)).rejects.toMatchObject({
      code: 'DEDUP_ID_MODE_MISMATCH',
    });
    expect((await readAll(client(), stream)).map((m) => m.content.toString())).toEqual(['ten', 'eleven']);
  });
});

describe('publisher - one live producer per name', () => {
  it('a second publisher for the same name on one store is DEDUP_STORE_LOCKED', async () => {
    const { store, options } = await setup('claim');
    const shared = await DedupStore.open(store);
    const first = await StreamDedupPublisher.open({ ...options, store: shared });
    await expect(StreamDedupPublisher.open({ ...options, store: shared })).rejects.toMatchObject({
      code: 'DEDUP_STORE_LOCKED',
    });
    await first.close();
    // close() gave the claim back; the shared store stays open for its owner.
    const second = await StreamDedupPublisher.open({ ...options, store: shared });
    await second.close();
    await shared.close();
  });

  it('the name-conflict watch stops the publisher with DEDUP_NAME_CONFLICT when another writer uses the name', async () => {
    const { stream, options } = await setup('conflict');
    const pub = await StreamDedupPublisher.open({ ...options, watchIntervalMs: 50 });
    await pub.send(Buffer.from('mine'));
    await rawPublish(stream, options.producerName, [100n]);
    const reason = await pub.closed();
    expect(reason?.code).toBe('DEDUP_NAME_CONFLICT');
    await expect(pub.send(Buffer.from('after'))).rejects.toMatchObject({ code: 'DEDUP_NAME_CONFLICT' });
  });
});

describe('publisher - on an existing Client', () => {
  it("shares the application's client and connection: own confirms only, resumes on reopen, leaves the client open", async () => {
    const { stream, store } = await setup('shared');
    const shared = await connectClient();
    try {
      // The application's own named producer on the same client (and so the same connection).
      const own = await shared.declarePublisher({ stream, publisherRef: 'app-own' });
      let ownConfirms = 0;
      own.on('publish_confirm', (_err, ids) => (ownConfirms += ids.length));
      const options = { connection: shared, stream, producerName: 'shared-producer', store };
      const pub = await StreamDedupPublisher.open(options);
      const sends: Array<Promise<{ publishingId: bigint }>> = [];
      for (let i = 1; i <= 500; i++) {
        sends.push(pub.send(Buffer.from(`dedup-${i}`)));
        // Its publishing IDs overlap ours (1..500): confirms must be told apart by producer.
        await own.send(Buffer.from(`own-${i}`));
      }
      await own.flush();
      const ids = (await Promise.all(sends)).map((r) => r.publishingId);
      expect(ids).toEqual(Array.from({ length: 500 }, (_, i) => BigInt(i + 1)));
      await pub.close();
      // close() freed the name but left the application's client and its producer working.
      await own.send(Buffer.from('own-after-close'));
      await own.flush();
      await expect(shared.queryMetadata({ streams: [stream] })).resolves.toHaveLength(1);
      const again = await StreamDedupPublisher.open(options);
      expect((await again.send(Buffer.from('dedup-501'))).publishingId).toBe(501n);
      await again.close();
      const bodies = (await readAll(client(), stream)).map((m) => m.content.toString());
      expect(bodies.filter((b) => b.startsWith('dedup-'))).toHaveLength(501);
      expect(bodies.filter((b) => b.startsWith('own-'))).toHaveLength(501);
      // docs/design.md §3's pitfall, on this shared connection: the client's own listener hears every
      // producer's confirms (501 of its own + 501 of ours); the library filters by producer id.
      expect(ownConfirms).toBe(1002);
    } finally {
      await shared.close();
    }
  });
});
