import { join } from 'node:path';
import { gzipSync } from 'node:zlib';
import type { Client } from 'rabbitmq-stream-js-client';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { StreamDedupPublisher } from '../../src/transport/stream-publisher.js';
import { uniqueName } from '../support/broker.js';
import { RawStreamConnection } from '../support/raw-stream.js';
import { connectClient } from '../support/stream.js';
import { useTempDir } from '../support/tmp.js';

// The RabbitMQ 4.3 limits (issue 33, item 6), measured on the broker the run points at with bare
// stream-protocol frames: what the broker answers at the 257th publisher and subscription of one
// connection, to a sub-entry batch declaring more uncompressed bytes than
// `stream.max_uncompressed_sub_entry_batch_size`, and to a super stream of more partitions than
// `stream.max_super_stream_partitions`. Each test prints `[broker-limit] …` with what it saw: the
// figures of the README's "Supported brokers" and design §3. On 4.3.6 (defaults) every limit
// answers response code 17 (precondition failed) and leaves the connection open.
let client: Client;
let version = '?';
let stream: string;
beforeAll(async () => {
  client = await connectClient();
  version = client.rabbitManagementVersion;
  stream = uniqueName('limits');
  await client.createStream({ stream, arguments: {} });
});
afterAll(async () => {
  await client.deleteStream({ stream });
  await client.close();
});

const tempDir = useTempDir();

function report(limit: string, seen: string): void {
  console.log(`[broker-limit] ${limit} on RabbitMQ ${version}: ${seen}`);
}

/** Response code 17: precondition failed. */
const PRECONDITION_FAILED = 17;
const MiB = 1_048_576;

/** `count` records (u32 length, then that many zero bytes) of `size` bytes each. */
function records(count: number, size: number): Buffer {
  const data = Buffer.alloc(count * (4 + size));
  for (let i = 0; i < count; i++) data.writeUInt32BE(size, i * (4 + size));
  return data;
}

describe('broker limits (RabbitMQ 4.3)', () => {
  it('the 257th publisher declared on one connection is refused with code 17; the connection and its 256 publishers stay usable', async () => {
    const c = await RawStreamConnection.open();
    try {
      const codes: number[] = [];
      for (let id = 0; id < 256; id++) codes.push(await c.declarePublisher(id, stream));
      expect(codes.every((code) => code === 1)).toBe(true);
      // A publisher ID is one byte on the wire: the 257th must reuse one, and the broker checks
      // the count first (4.3.5, rabbitmq-server #17123).
      const code = await c.declarePublisher(0, stream);
      const after = await c.publishPlain(255, 1n, Buffer.from([0x00, 0x53, 0x75, 0xa0, 0x00]));
      report(
        'publishers per connection',
        `256 declared (code 1); the 257th answered code ${code}; connection ${c.closed ?? 'open'}; ` +
          `publisher 255 then ${after.confirmed ? 'confirmed a message' : `got publish error ${after.code}`}`,
      );
      expect(code).toBe(PRECONDITION_FAILED);
      expect(c.closed).toBeUndefined();
      expect(after.confirmed).toBe(true);
    } finally {
      c.close();
    }
  });

  it('the 257th subscription on one connection is refused with code 17; the connection stays open', async () => {
    const c = await RawStreamConnection.open();
    try {
      const codes: number[] = [];
      for (let id = 0; id < 256; id++) codes.push(await c.subscribe(id, stream));
      expect(codes.every((code) => code === 1)).toBe(true);
      const code = await c.subscribe(0, stream);
      const declared = await c.declarePublisher(0, stream);
      report(
        'subscriptions per connection',
        `256 subscribed (code 1); the 257th answered code ${code}; connection ${c.closed ?? 'open'}; ` +
          `a publisher declared after it: code ${declared}`,
      );
      expect(code).toBe(PRECONDITION_FAILED);
      expect(c.closed).toBeUndefined();
      expect(declared).toBe(1);
    } finally {
      c.close();
    }
  });

  it('a sub-entry batch declaring more than 64 MiB uncompressed is refused with publish error 17; one of exactly 64 MiB is stored', async () => {
    const c = await RawStreamConnection.open();
    try {
      expect(await c.declarePublisher(0, stream)).toBe(1);
      // gzip (codec 1) of zeros: 64 MiB in ~65 KB, within the 1 MiB frame the broker tunes to.
      const at = records(64, MiB - 4);
      const over = records(65, MiB - 4);
      const atCap = await c.publishSubEntry(0, 1n, 1, 64, at.length, gzipSync(at));
      const overCap = await c.publishSubEntry(0, 2n, 1, 65, over.length, gzipSync(over));
      // The same batch uncompressed cannot be sent at all: its frame is above the frame size.
      const next = await c.publishSubEntry(0, 3n, 1, 1, 8, gzipSync(records(1, 4)));
      report(
        'uncompressed sub-entry batch size',
        `frame_max ${c.frameMax}; ${at.length} bytes (gzip ${gzipSync(at).length}): ` +
          `${atCap.confirmed ? 'confirmed' : `error ${atCap.code}`}; ${over.length} bytes: ` +
          `${overCap.confirmed ? 'confirmed' : `publish error ${overCap.code}`}; connection ${c.closed ?? 'open'}; ` +
          `the next batch ${next.confirmed ? 'confirmed' : `error ${next.code}`}`,
      );
      expect(at.length).toBe(64 * MiB);
      expect(atCap.confirmed).toBe(true);
      expect(overCap).toEqual({ confirmed: false, code: PRECONDITION_FAILED });
      expect(c.closed).toBeUndefined();
      expect(next.confirmed).toBe(true);
    } finally {
      c.close();
    }
  });

  it('through the application’s client: a publisher opened and closed 260 times beside a long-lived one keeps opening', async () => {
    // The client numbers a connection's publishers from a counter it never winds back (a u8 on
    // the wire), and the long-lived publisher keeps that connection in its pool: before, the
    // 256th open threw ERR_OUT_OF_RANGE inside the client (measured: 255 of 300 opened), for good.
    const shared = await connectClient();
    const store = join(await tempDir(), 'store');
    try {
      // Holds the pooled connection for the whole test, as an application's own publisher would.
      await shared.declarePublisher({ stream });
      let opened = 0;
      let failure: unknown;
      try {
        for (; opened < 260; opened++) {
          const pub = await StreamDedupPublisher.open({
            producerName: 'cycling',
            stream,
            store,
            connection: shared,
          });
          await pub.close();
        }
      } catch (err) {
        failure = err;
      }
      report(
        'producers opened through one shared client',
        `${opened} of 260 opened beside a long-lived publisher` +
          (failure instanceof Error
            ? `; then: ${(failure.cause as Error | undefined)?.message ?? failure.message}`
            : ''),
      );
      expect(failure).toBeUndefined();
      expect(opened).toBe(260);
    } finally {
      await shared.close();
    }
  });

  it('a super stream of 1 001 partitions is refused, and nothing of it is created', async () => {
    const name = uniqueName('limits-super');
    let refusal: unknown;
    try {
      await client.createSuperStream({ streamName: name }, undefined, 1001);
      // Not expected: do not leave 1 001 streams on a shared broker.
      await client.deleteSuperStream({ streamName: name });
    } catch (err) {
      refusal = err;
    }
    const partitions = await client
      .queryPartitions({ superStream: name })
      .then((p) => p.length)
      .catch((err: unknown) => (err instanceof Error ? err.message : String(err)));
    const [metadata] = await client.queryMetadata({ streams: [`${name}-0`] });
    report(
      'super stream partitions',
      `1001 partitions: ${refusal instanceof Error ? refusal.message : 'created'}; partitions query then: ` +
        `${partitions}; "${name}-0" metadata code ${metadata?.responseCode}`,
    );
    expect(refusal).toBeInstanceOf(Error);
    expect((refusal as Error).message).toMatch(/code 17\b/);
    expect(metadata?.responseCode).toBe(2);
  });
});
