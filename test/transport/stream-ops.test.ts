import { describe, expect, it, vi } from 'vitest';
import { readStreamToEnd } from '../../src/transport/stream-ops.js';
import {
  clientCodecs,
  clientResponseDecoder,
  deliverFrame,
  encodeChunk,
  encodeMessage,
} from '../support/chunks.js';

// readStreamToEnd over a stand-in client whose consumer connection has the client's own response
// decoder: what our chunk reader emits, and how a chunk that does not decode fails the read.

const record = (id: number): Buffer =>
  encodeMessage({
    body: Buffer.from(`m${id}`),
    properties: { 'x-dedup-producer': 'p', 'x-dedup-id': String(id) },
  });

/** The Deliver frames the stand-in broker sends once the consumer subscribed. */
let frames: Buffer[] = [];
let closed = 0;

vi.mock(import('../../src/transport/stream-probe.js'), async (importOriginal) => ({
  ...(await importOriginal()),
  connectStreamClient: () => {
    const decoder = clientResponseDecoder();
    const client = {
      streamStatsRequest: () => Promise.resolve({ committedChunkId: 1n }),
      getConnection: () => Promise.resolve({ decoder }),
      async declareConsumer(_params: unknown, handle: (message: unknown) => Promise<void>) {
        await client.getConnection();
        // What the client's delivery callback does with a deliverV1 event: each message to the handler.
        decoder.emitter.on('deliverV1', (d: { messages: unknown[] }) => {
          for (const m of d.messages) void handle(m);
        });
        setImmediate(() => {
          for (const frame of frames) decoder.add(frame, clientCodecs);
        });
        return {};
      },
      close: () => {
        closed++;
        return Promise.resolve();
      },
    };
    return Promise.resolve(client) as never;
  },
}));

describe('readStreamToEnd - with our chunk reader', () => {
  it('reads plain entries and sub-entry batches at their offsets', async () => {
    frames = [
      deliverFrame(encodeChunk([{ records: [record(1)] }, { records: [record(2), record(3)], codec: 1 }])),
    ];
    const records = await readStreamToEnd({}, 'ledger');
    expect(records.map((r) => [r.offset, r.body.toString(), r.applicationProperties['x-dedup-id']])).toEqual([
      [0n, 'm1', '1'],
      [1n, 'm2', '2'],
      [2n, 'm3', '3'],
    ]);
  });

  it('fails with DEDUP_STREAM_UNREADABLE, naming the stream and the cause, and closes its client', async () => {
    closed = 0;
    frames = [deliverFrame(encodeChunk([{ records: [record(1)], codec: 2 }]))];
    await expect(readStreamToEnd({}, 'ledger')).rejects.toMatchObject({
      code: 'DEDUP_STREAM_UNREADABLE',
      message: expect.stringMatching(/cannot read stream "ledger": .*snappy/) as unknown,
    });
    expect(closed).toBe(1);
  });
});
