import { describe, expect, it } from 'vitest';
import { DedupPublisherCore } from '../../src/publisher/core.js';
import { Entry } from '../../src/publisher/entry.js';
import { stampBytesOf } from '../../src/publisher/message.js';
import { formBatches } from '../../src/publisher/sub-entries.js';
import { PublishFrameEncoder } from '../../src/transport/stream-frames.js';
import { memoryStore } from '../support/memory-store.js';
import { ModelBroker, ModelTransport } from '../support/model-broker.js';

// RabbitMQ 4.3.5 caps the uncompressed bytes a sub-entry batch declares
// (`stream.max_uncompressed_sub_entry_batch_size`, 64 MiB by default): 4.3.6 answers a batch above
// it with publish error 17 (test/integration/broker-limits.test.ts). A batch is re-sent as it was
// first cut (its outbox segment keeps the cut), and the transport takes a publish error for a lost
// connection: a batch over the cap would be refused again at every reconnect, for good. Batches
// were cut only to the frame size, so a broker whose frame_max is above the cap, or whose cap was
// lowered below its frame_max, got such batches.

const MiB = 1_048_576;
const cap = 64 * MiB;
const stamps = stampBytesOf('p');

/** Entries sharing one body buffer: formBatches reads only its length. */
const entriesOf = (n: number, body: Buffer): Entry[] =>
  Array.from({ length: n }, (_, i) => new Entry(BigInt(i + 1), body, undefined, undefined));

describe('sub-entry batches within the uncompressed cap (issue 33, item 6)', () => {
  it('a frame size above 64 MiB: batches stop at 64 MiB uncompressed by default', () => {
    // 8 messages of 20 MiB, a 256 MiB frame: one batch of 160 MiB before.
    const sizes = formBatches(entriesOf(8, Buffer.alloc(20 * MiB)), 100, 256 * MiB, stamps);
    expect(sizes).toEqual([3, 3, 2]);
    expect(3 * (20 * MiB + stamps)).toBeLessThanOrEqual(cap);
  });

  it('a cap below the frame size cuts batches to it', () => {
    // 110 bytes each (10 of body + 100 of stamps): 3 fit 350, the 4th would not.
    expect(formBatches(entriesOf(7, Buffer.alloc(10)), 100, 1_000_000, 100, 0n, undefined, 350)).toEqual([
      3, 3, 1,
    ]);
  });

  it('a message above the cap by itself goes alone: an entry of its own, which the broker does not hold to the cap', () => {
    const entries = [
      new Entry(1n, Buffer.alloc(10), undefined, undefined),
      new Entry(2n, Buffer.alloc(5_000), undefined, undefined),
      new Entry(3n, Buffer.alloc(10), undefined, undefined),
      new Entry(4n, Buffer.alloc(10), undefined, undefined),
    ];
    expect(formBatches(entries, 100, 1_000_000, stamps, 0n, undefined, 1_000)).toEqual([1, 1, 2]);
    expect(entries[1]!.batch).toBeUndefined();
    const [frame] = new PublishFrameEncoder(1, 'p', 1_048_576).encode(entries);
    // Entries: 1 (plain), 2 (plain: the top bit of its length is 0), then the batch [3, 4].
    let o = 13;
    const kinds: string[] = [];
    for (let e = 0; e < 3; e++) {
      const batched = (frame![o + 8]! & 0x80) !== 0;
      kinds.push(batched ? 'batch' : 'plain');
      o += batched ? 19 + frame!.readUInt32BE(o + 15) : 12 + frame!.readUInt32BE(o + 8);
    }
    expect(kinds).toEqual(['plain', 'plain', 'batch']);
    expect(o).toBe(frame!.length);
  });

  it('the publisher cuts its batches to the transport’s cap', async () => {
    class CappedTransport extends ModelTransport {
      readonly maxBatchBytes = 2 * (10 + stampBytesOf('p'));
    }
    const transport = new CappedTransport(new ModelBroker(), 'orders', 'p', 10);
    const core = await DedupPublisherCore.open(transport, {
      producerName: 'p',
      store: await memoryStore(),
      reconnect: { initialDelayMs: 1, maxDelayMs: 2 },
    });
    await Promise.all(Array.from({ length: 7 }, () => core.send(Buffer.alloc(10))));
    // Before: one entry [1..7].
    expect(transport.entries.map((e) => e.map(Number))).toEqual([[1, 2], [3, 4], [5, 6], [7]]);
    await core.close();
  });
});
