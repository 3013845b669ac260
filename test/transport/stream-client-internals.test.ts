import { EventEmitter } from 'node:events';
import { Socket } from 'node:net';
import type { Client, Consumer, Publisher } from 'rabbitmq-stream-js-client';
import { describe, expect, it } from 'vitest';
import { ChunkDecodeError } from '../../src/transport/amqp10-decode.js';
import {
  consumerCloseEvents,
  decodeDeliveriesOurselves,
  metadataUpdateStream,
  publisherConnection,
  publisherSocket,
} from '../../src/transport/stream-client-internals.js';
import {
  clientCodecs,
  clientResponseDecoder,
  deliverFrame,
  encodeChunk,
  encodeMessage,
  type ClientResponseDecoder,
} from '../support/chunks.js';
import { thrown } from '../support/thrown.js';

// The probes of rabbitmq-stream-js-client 1.0's private fields: what they find where the client
// keeps them, and the clear refusal when a client version moved them.

const publisher = (connection: unknown): Publisher => ({ connection }) as unknown as Publisher;

describe('stream client internals', () => {
  it("finds the publisher's socket and connection where the 1.0 client keeps them", () => {
    const socket = new Socket();
    const connection = Object.assign(new EventEmitter(), { socket });
    expect(publisherSocket(publisher(connection))).toBe(socket);
    expect(publisherConnection(publisher(connection))).toBe(connection);
    socket.destroy();
  });

  it('refuses with DEDUP_BROKER_REFUSED, naming the pinned client line, when a client version moved them', () => {
    for (const moved of [undefined, {}, { socket: {} }]) {
      expect(thrown(() => publisherSocket(publisher(moved)))).toMatchObject({
        code: 'DEDUP_BROKER_REFUSED',
        message: /1\.0\.x line pinned in package\.json/,
      });
    }
    expect(thrown(() => publisherConnection(publisher({})))).toMatchObject({ code: 'DEDUP_BROKER_REFUSED' });
  });

  it("reads a consumer's close events and a metadata update's stream, or undefined when they moved", () => {
    const emitter = new EventEmitter();
    expect(consumerCloseEvents({ connection: { closeEventsEmitter: emitter } } as unknown as Consumer)).toBe(
      emitter,
    );
    expect(consumerCloseEvents({} as unknown as Consumer)).toBeUndefined();
    expect(metadataUpdateStream({ response: { metadataInfo: { stream: 'orders' } } })).toBe('orders');
    expect(metadataUpdateStream({ code: 6 })).toBeUndefined();
    expect(metadataUpdateStream(undefined)).toBeUndefined();
  });
});

/** A publish-confirm frame (key 0x0003) of publisher 1 for `id`, its size included. */
function confirmFrame(id: bigint): Buffer {
  const f = Buffer.alloc(4 + 2 + 2 + 1 + 4 + 8);
  f.writeUInt32BE(f.length - 4, 0);
  f.writeUInt16BE(0x0003, 4);
  f.writeUInt16BE(1, 6);
  f[8] = 1;
  f.writeUInt32BE(1, 9);
  f.writeBigUInt64BE(id, 13);
  return f;
}

/** A client whose getConnection returns a connection with the client's real response decoder. */
function fakeClient(): { client: Client; decoder: ClientResponseDecoder; log: string[] } {
  const decoder = clientResponseDecoder();
  const log: string[] = [];
  decoder.emitter.on('publish_confirm', (c: { publishingIds: bigint[] }) =>
    log.push(`confirm ${c.publishingIds[0]}`),
  );
  for (const event of ['deliverV1', 'deliverV2']) {
    decoder.emitter.on(event, (d: { subscriptionId: number; messages: Array<{ offset: bigint }> }) =>
      log.push(`${event} ${d.subscriptionId} ${d.messages.map((m) => m.offset).join(',')}`),
    );
  }
  const connection = { decoder };
  const client = { getConnection: () => Promise.resolve(connection) } as unknown as Client;
  return { client, decoder, log };
}

const record = (i: number): Buffer => encodeMessage({ body: Buffer.from(`m${i}`) });
const stream = Buffer.concat([
  confirmFrame(1n),
  deliverFrame(
    encodeChunk([{ records: [record(1)] }, { records: [record(2), record(3)], codec: 1 }], {
      firstOffset: 10n,
    }),
  ),
  confirmFrame(2n),
  deliverFrame(encodeChunk([{ records: [record(4)], codec: 0 }], { firstOffset: 13n }), {
    version: 2,
    subscriptionId: 3,
    committedChunkId: 13n,
  }),
  confirmFrame(3n),
]);
const expectedLog = ['confirm 1', 'deliverV1 0 10,11,12', 'confirm 2', 'deliverV2 3 13', 'confirm 3'];
const getConnection = (client: Client): Promise<unknown> =>
  (client as unknown as { getConnection: (...a: unknown[]) => Promise<unknown> }).getConnection(
    's',
    'consumer',
  );

describe('stream client internals - our Deliver decoding on our clients', () => {
  it('decodes Deliver frames however the socket cuts the bytes, and hands every other frame whole to the client, in order', async () => {
    for (const step of [1, 2, 3, 7, 64, stream.length]) {
      const { client, decoder, log } = fakeClient();
      decodeDeliveriesOurselves(client, (err) => {
        throw err;
      });
      await getConnection(client);
      for (let o = 0; o < stream.length; o += step) decoder.add(stream.subarray(o, o + step), clientCodecs);
      expect(log, `cut every ${step} bytes`).toEqual(expectedLog);
    }
  });

  it('takes over the bytes the client kept from a frame not yet complete, and hooks each client and connection once', async () => {
    const { client, decoder, log } = fakeClient();
    decoder.lastData = stream.subarray(0, 5);
    decodeDeliveriesOurselves(client, () => undefined);
    decodeDeliveriesOurselves(client, () => undefined);
    await getConnection(client);
    const add = decoder.add;
    await getConnection(client);
    expect(decoder.add).toBe(add);
    expect(decoder.lastData.length).toBe(0);
    decoder.add(stream.subarray(5), clientCodecs);
    expect(log).toEqual(expectedLog);
  });

  it('a chunk that does not decode calls onDecodeError once, drops every later Deliver frame, and still passes other frames', async () => {
    const { client, decoder, log } = fakeClient();
    const errors: unknown[] = [];
    decodeDeliveriesOurselves(client, (err) => errors.push(err));
    await getConnection(client);
    const bad = deliverFrame(encodeChunk([{ records: [record(1)], codec: 3 }]));
    decoder.add(Buffer.concat([bad, stream]), clientCodecs);
    expect(errors).toHaveLength(1);
    expect(errors[0]).toBeInstanceOf(ChunkDecodeError);
    expect((errors[0] as Error).message).toMatch(/lz4/);
    expect(log).toEqual(['confirm 1', 'confirm 2', 'confirm 3']);
  });

  it('decodes with the ceiling it was given: a chunk whose gzip batches announce more is an onDecodeError (issue 32 item 4)', async () => {
    const big = encodeMessage({ body: Buffer.alloc(40_000) });
    const frame = deliverFrame(encodeChunk([{ records: [big, big], codec: 1 }], { firstOffset: 5n }));
    for (const [limit, outcome] of [
      [80_100, 'deliverV1 0 5,6'],
      [80_000, 'refused'],
    ] as const) {
      const { client, decoder, log } = fakeClient();
      const errors: unknown[] = [];
      decodeDeliveriesOurselves(client, (err) => errors.push(err), { maxInflatedBytes: limit });
      await getConnection(client);
      decoder.add(frame, clientCodecs);
      if (outcome === 'refused') {
        expect(log).toEqual([]);
        expect(errors[0]).toBeInstanceOf(ChunkDecodeError);
        expect((errors[0] as Error).message).toMatch(/may inflate to 80000 bytes together/);
      } else {
        expect(errors).toEqual([]);
        expect(log).toEqual([outcome]);
      }
    }
  });

  it('refuses with DEDUP_BROKER_REFUSED, naming the pinned client line, when a client version moved getConnection or the decoder', async () => {
    expect(thrown(() => decodeDeliveriesOurselves({} as Client, () => undefined))).toMatchObject({
      code: 'DEDUP_BROKER_REFUSED',
      message: /getConnection.*1\.0\.x line pinned in package\.json/,
    });
    for (const connection of [undefined, {}, { decoder: { add: () => undefined } }]) {
      const client = { getConnection: () => Promise.resolve(connection) } as unknown as Client;
      decodeDeliveriesOurselves(client, () => undefined);
      await expect(getConnection(client)).rejects.toMatchObject({
        code: 'DEDUP_BROKER_REFUSED',
        message: /response decoder.*1\.0\.x line/,
      });
    }
  });
});
