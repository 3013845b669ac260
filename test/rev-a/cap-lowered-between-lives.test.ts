/**
 * REV-A (hostile review) — FAILING ON PURPOSE until fixed. See /work/wt/notes2/rev-a.md.
 *
 * lim33's cap (subEntry.maxUncompressedBytes) cuts new batches, but an outbox segment keeps the cut
 * it was written with, and the store does not record the cap. An operator who lowers the broker's
 * `stream.max_uncompressed_sub_entry_batch_size` and the option with it (as the README tells) and
 * restarts after a crash: the recovered batch declares more than the cap, the broker answers
 * publish error 17 for it (and the rest of its frame), the transport takes that for a lost
 * connection, reconnects and re-sends the same batch: for ever (REVIEW §5: a permanent refusal
 * retried as a transient one; lim33 notes "left alone"). Nothing refuses it at open().
 */
import { describe, expect, it } from 'vitest';
import { DedupError } from '../../src/errors.js';
import { DedupPublisherCore } from '../../src/publisher/core.js';
import { stampBytesOf } from '../../src/publisher/message.js';
import { memoryDisk, memoryStore } from '../support/memory-store.js';
import { ModelBroker, ModelTransport } from '../support/model-broker.js';

const each = 10 + stampBytesOf('p');

class CappedTransport extends ModelTransport {
  readonly maxBatchBytes = 2 * each;
}

describe('rev-a: the sub-entry cap lowered between two lives', () => {
  it('a recovered batch over the new cap is refused at open() with a typed error, or never sent over the cap', async () => {
    const broker = new ModelBroker();
    const disk = memoryDisk();
    // Life 1: cap 64 MiB (default), 7 messages cut as one batch, never confirmed (crash: closed at once).
    const t1 = new ModelTransport(broker, 'orders', 'p', 10);
    const life1 = await DedupPublisherCore.open(t1, {
      producerName: 'p',
      store: await memoryStore(disk),
      closeTimeoutMs: 0,
    });
    t1.faults.holdConfirms = true;
    for (let i = 0; i < 7; i++) life1.send(Buffer.alloc(10)).catch(() => undefined);
    while (t1.entries.length < 1) await new Promise((r) => setImmediate(r));
    expect(t1.entries.map((e) => e.length)).toEqual([7]);
    await life1.close();
    // The broker lost it (or refused it); life 2 runs with the lowered cap: 2 messages a batch.
    const fresh = new ModelBroker();
    const t2 = new CappedTransport(fresh, 'orders', 'p', 10);
    let refused: unknown;
    let life2: DedupPublisherCore | undefined;
    try {
      life2 = await DedupPublisherCore.open(t2, {
        producerName: 'p',
        store: await memoryStore(disk),
        reconnect: { initialDelayMs: 1, maxDelayMs: 2 },
      });
      for (let i = 0; i < 20 && t2.entries.length === 0; i++) await new Promise((r) => setImmediate(r));
    } catch (err) {
      refused = err;
    } finally {
      await life2?.close();
    }
    if (refused !== undefined) {
      expect(refused).toBeInstanceOf(DedupError);
      return;
    }
    // Today: the recovered batch goes out whole, 7 × each > the cap of 2 × each.
    for (const entry of t2.entries) expect(entry.length * each).toBeLessThanOrEqual(t2.maxBatchBytes);
  });
});
