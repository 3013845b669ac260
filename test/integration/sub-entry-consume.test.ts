import { join } from 'node:path';
import { Offset } from 'rabbitmq-stream-js-client';
import { CompressionType } from 'rabbitmq-stream-js-client/dist/compression.js';
import { afterAll, describe, expect, it } from 'vitest';
import { identityHeaders, readIdentity } from '../../src/identity/headers.js';
import { decodeDeliveriesOurselves } from '../../src/transport/stream-client-internals.js';
import { readStreamToEnd, StreamVerifyingConsumer } from '../../src/stream.js';
import { STREAM_CONNECTION, uniqueName } from '../support/broker.js';
import { connectClient, useClient } from '../support/stream.js';
import { useTempDir } from '../support/tmp.js';

// Streams written with sub-entry batches (the JS client's sendSubEntries, uncompressed and gzip)
// between plain sends, read back by readStreamToEnd and the verifying consumer: every message
// once, in order, at its offset — including a consumer that resumes inside a batch, for which the
// broker delivers the whole chunk from its start (docs/design.md §10).

const client = useClient();
const tempDir = useTempDir();
const streams: string[] = [];

afterAll(async () => {
  for (const stream of streams) {
    await client()
      .deleteStream({ stream })
      .catch(() => undefined);
  }
});

/** One entry as published: a plain send, or a sub-entry batch of consecutive IDs. */
type Entry =
  | { readonly kind: 'plain'; readonly id: number }
  | { readonly kind: 'batch'; readonly ids: number[]; readonly gzip: boolean };

/** Plain sends and batches (sizes 1 to 200, both codecs) interleaved; IDs 1..n in stream order. */
function plan(): { entries: Entry[]; total: number } {
  const entries: Entry[] = [];
  let next = 1;
  const ids = (n: number): number[] => Array.from({ length: n }, () => next++);
  for (let round = 0; round < 30; round++) {
    entries.push({ kind: 'plain', id: next++ });
    entries.push({ kind: 'batch', ids: ids((round % 7) + 2), gzip: false });
    entries.push({ kind: 'plain', id: next++ });
    entries.push({ kind: 'batch', ids: ids((round % 5) + 1), gzip: true });
    if (round % 10 === 9) entries.push({ kind: 'batch', ids: ids(200), gzip: round % 20 === 9 });
  }
  return { entries, total: next - 1 };
}

const body = (id: number): Buffer => Buffer.from(`payload-${id}`);

/**
 * Publishes the plan through an unnamed publisher: without a publisherRef the broker does not
 * deduplicate, so the client reusing its publishing ID for every batch (issue #19) loses nothing.
 * Nothing waits between entries, so the broker puts several entries, plain and batched, into one
 * chunk (checked by the first test).
 */
async function publish(stream: string, entries: readonly Entry[]): Promise<void> {
  const publisher = await client().declarePublisher({ stream });
  let confirmed = 0;
  const all = new Promise<void>((resolve) =>
    publisher.on('publish_confirm', (_e, ids) => {
      confirmed += ids.length;
      if (confirmed >= entries.length) resolve();
    }),
  );
  const message = (id: number) => ({
    content: body(id),
    applicationProperties: identityHeaders('sub', BigInt(id)),
  });
  const writes: Array<Promise<unknown>> = [];
  for (const entry of entries) {
    if (entry.kind === 'plain') {
      // send() queues synchronously and flush() writes the queue to the socket synchronously (the
      // client awaits only after the write): so the next batch goes out after it, in one burst.
      writes.push(
        publisher.send(body(entry.id), { applicationProperties: identityHeaders('sub', BigInt(entry.id)) }),
        publisher.flush(),
      );
    } else {
      writes.push(
        publisher.sendSubEntries(
          entry.ids.map(message),
          entry.gzip ? CompressionType.Gzip : CompressionType.None,
        ),
      );
    }
  }
  await Promise.all(writes);
  await all;
  await publisher.close();
}

async function subEntryStream(prefix: string): Promise<{ stream: string; total: number; entries: Entry[] }> {
  const stream = uniqueName(prefix);
  streams.push(stream);
  await client().createStream({ stream, arguments: {} });
  const { entries, total } = plan();
  await publish(stream, entries);
  return { stream, total, entries };
}

/**
 * The entries of every chunk the broker delivers for `stream` ('P' plain, 'B' batch), read off
 * the consumer connection's bytes: to check that the broker really mixed them in chunks.
 */
async function chunkShapes(stream: string, total: number): Promise<string[]> {
  const reader = await connectClient();
  const shapes: string[] = [];
  let pending = Buffer.alloc(0);
  const capture = (data: Buffer): void => {
    pending = Buffer.concat([pending, data]);
    while (pending.length >= 4 && pending.length >= 4 + pending.readUInt32BE(0)) {
      const frame = pending.subarray(4, 4 + pending.readUInt32BE(0));
      pending = pending.subarray(4 + frame.length);
      if (frame.readUInt16BE(0) !== 0x0008) continue;
      let o = 5 + (frame.readUInt16BE(2) === 2 ? 8 : 0);
      const entries = frame.readUInt16BE(o + 2);
      o += 48;
      let shape = '';
      for (let e = 0; e < entries; e++) {
        const batch = (frame[o]! & 0x80) !== 0;
        shape += batch ? 'B' : 'P';
        o += batch ? 11 + frame.readUInt32BE(o + 7) : 4 + frame.readUInt32BE(o);
      }
      shapes.push(shape);
    }
  };
  try {
    let failure: Error | undefined;
    decodeDeliveriesOurselves(reader, (err) => (failure = err));
    // Around our hook: see the bytes before our reader does.
    const internals = reader as unknown as { getConnection: (...args: unknown[]) => Promise<unknown> };
    const hooked = internals.getConnection.bind(reader);
    internals.getConnection = async (...args) => {
      const connection = (await hooked(...args)) as { decoder: { add: (d: Buffer, g: unknown) => void } };
      const add = connection.decoder.add;
      connection.decoder.add = (data, g) => {
        capture(data);
        add(data, g);
      };
      return connection;
    };
    let seen = 0;
    await new Promise<void>((resolve, reject) => {
      reader
        .declareConsumer({ stream, offset: Offset.first() }, () => {
          if (++seen === total) resolve();
        })
        .catch(reject);
    });
    expect(failure).toBeUndefined();
    return shapes;
  } finally {
    await reader.close();
  }
}

describe('sub-entry batches - read back by readStreamToEnd and the verifying consumer', () => {
  it('readStreamToEnd returns every message once, in order, at offsets 0..n-1', async () => {
    const { stream, total } = await subEntryStream('sub-read');
    // What this test is about: the broker put plain entries and batches together in chunks.
    const shapes = await chunkShapes(stream, total);
    console.log(`[sub-entry] ${total} messages in ${shapes.length} chunks: ${shapes.join(' ')}`);
    expect(shapes.some((s) => s.includes('P') && s.includes('B'))).toBe(true);
    expect(shapes.some((s) => s.split('B').length > 2)).toBe(true);
    const records = await readStreamToEnd(STREAM_CONNECTION, stream);
    expect(records).toHaveLength(total);
    records.forEach((r, i) => {
      expect(r.offset).toBe(BigInt(i));
      expect(r.body.toString()).toBe(`payload-${i + 1}`);
      const identity = readIdentity(r.applicationProperties, r.messageAnnotations);
      expect(identity).toEqual({
        kind: 'ok',
        identity: { producerName: 'sub', publishingId: BigInt(i + 1) },
      });
    });
  });

  it('the verifying consumer applies each message exactly once, also when closed and reopened at an offset inside a batch', async () => {
    const { stream, total, entries } = await subEntryStream('sub-consume');
    // Stop after the second member of a batch of 8: the next life resumes at its third.
    const batch = entries.find(
      (e): e is Extract<Entry, { kind: 'batch' }> => e.kind === 'batch' && e.ids.length === 8,
    )!;
    const stopAt = batch.ids[1]!;
    const store = join(await tempDir(), 'store');
    const applied: number[] = [];
    let reached!: () => void;
    const reachedStop = new Promise<void>((resolve) => (reached = resolve));
    let release!: () => void;
    const gate = new Promise<void>((resolve) => (release = resolve));
    const open = (handler: (id: number) => Promise<void> | void) =>
      StreamVerifyingConsumer.open({
        connection: STREAM_CONNECTION,
        stream,
        consumerName: 'sub-entries',
        store,
        commit: 'message',
        handler: async (message, tx) => {
          const id = Number(message.identity!.publishingId);
          expect(message.offset).toBe(BigInt(id - 1));
          expect(message.body.toString()).toBe(`payload-${id}`);
          applied.push(id);
          tx.put(`applied/${id}`, '1');
          await handler(id);
        },
      });

    const first = await open(async (id) => {
      if (id === stopAt) {
        reached();
        await gate;
      }
    });
    await reachedStop;
    const closing = first.close();
    release();
    await closing;
    expect(await first.closed()).toBeUndefined();
    expect(first.committedOffset).toBe(BigInt(stopAt - 1));
    expect(applied).toEqual(Array.from({ length: stopAt }, (_, i) => i + 1));

    const second = await open(() => undefined);
    try {
      await second.waitForOffset(BigInt(total - 1));
      // The broker sent the resumed chunk from its start; nothing before the resume offset reached
      // the verifier (no duplicate), nothing after it was missed.
      expect(second.stats).toMatchObject({ new: total - stopAt, duplicate: 0, stale: 0, unidentified: 0 });
      expect(second.stats.gapsReported + second.stats.gapsConfirmed).toBe(0);
      expect(applied).toEqual(Array.from({ length: total }, (_, i) => i + 1));
      expect(await second.readEffect(`applied/${total}`)).toEqual(Buffer.from('1'));
    } finally {
      await second.close();
    }
  });
});
