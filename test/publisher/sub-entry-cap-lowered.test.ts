/**
 * The sub-entry cap (subEntry.maxUncompressedBytes, the transport's `maxBatchBytes`) lowered
 * between two lives. A batch is re-sent as it was first cut (its outbox segment keeps the cut), so a
 * batch cut under the old cap would be refused by the broker (publish error 17) at every re-send,
 * taken for a lost connection and retried for ever (REVIEW §5, §7). open() refuses such an outbox
 * with DEDUP_UNSAFE_OPTIONS before connecting. Found by hostile review A (F4).
 */
import { describe, expect, it } from 'vitest';
import { DedupError } from '../../src/errors.js';
import { DedupPublisherCore } from '../../src/publisher/core.js';
import { stampBytesOf } from '../../src/publisher/message.js';
import type { DedupPublisherOptions } from '../../src/publisher/types.js';
import { memoryDisk, memoryStore } from '../support/memory-store.js';
import { ModelBroker, ModelTransport } from '../support/model-broker.js';

type MemoryDisk = ReturnType<typeof memoryDisk>;

/** One 10-byte message's share of a batch (body and stamps). */
const each = 10 + stampBytesOf('p');

/** The stream transport with `subEntry.maxUncompressedBytes` of `cap`. */
class CappedTransport extends ModelTransport {
  constructor(
    broker: ModelBroker,
    readonly maxBatchBytes: number,
  ) {
    super(broker, 'orders', 'p', 10);
  }
}

/** Life 1 (default cap): 7 messages cut as one batch, written to the outbox, never confirmed. */
async function crashWithOneBatchOfSeven(): Promise<MemoryDisk> {
  const disk = memoryDisk();
  const t1 = new ModelTransport(new ModelBroker(), 'orders', 'p', 10);
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
  return disk;
}

async function openError(
  transport: ModelTransport,
  disk: MemoryDisk,
  extra: Partial<DedupPublisherOptions> = {},
): Promise<unknown> {
  try {
    const core = await DedupPublisherCore.open(transport, {
      producerName: 'p',
      store: await memoryStore(disk),
      ...extra,
    });
    await core.close();
  } catch (err) {
    return err;
  }
  return undefined;
}

describe('publisher - the sub-entry cap lowered between two lives', () => {
  it('refuses a recovered batch above the new cap at open(), before connecting, naming its size and the setting', async () => {
    const disk = await crashWithOneBatchOfSeven();
    // The broker lost the batch (or refused it); life 2 runs with a cap of 2 messages a batch.
    const t2 = new CappedTransport(new ModelBroker(), 2 * each);
    const err = await openError(t2, disk);
    expect(err).toBeInstanceOf(DedupError);
    expect((err as DedupError).code).toBe('DEDUP_UNSAFE_OPTIONS');
    expect((err as DedupError).message).toContain(`(IDs 1..7) of about ${7 * each} bytes`);
    expect((err as DedupError).message).toContain('subEntry.maxUncompressedBytes');
    expect(t2.connects).toBe(0);
    expect(t2.entries).toEqual([]);
  });

  it('with the cap raised back for one life, the batch goes out whole and is confirmed; the next life opens under the low cap', async () => {
    const disk = await crashWithOneBatchOfSeven();
    const broker = new ModelBroker();
    const t2 = new CappedTransport(broker, 7 * each);
    const life2 = await DedupPublisherCore.open(t2, { producerName: 'p', store: await memoryStore(disk) });
    while (life2.inFlight > 0 || t2.entries.length === 0) await new Promise((r) => setImmediate(r));
    await life2.close();
    expect(t2.entries).toEqual([[1n, 2n, 3n, 4n, 5n, 6n, 7n]]);
    const t3 = new CappedTransport(broker, 2 * each);
    expect(await openError(t3, disk)).toBeUndefined();
  });

  it("onBrokerAhead 'adopt' and a broker not ahead (resume): refused after connecting, before any publish", async () => {
    const disk = await crashWithOneBatchOfSeven();
    const t2 = new CappedTransport(new ModelBroker(), 2 * each);
    const err = await openError(t2, disk, { onBrokerAhead: 'adopt' });
    expect((err as DedupError).code).toBe('DEDUP_UNSAFE_OPTIONS');
    expect(t2.connects).toBe(1);
    expect(t2.entries).toEqual([]);
  });

  it("onBrokerAhead 'adopt' and a broker ahead: the outbox is re-cut under new IDs within the new cap", async () => {
    const disk = await crashWithOneBatchOfSeven();
    const broker = new ModelBroker();
    for (let id = 1n; id <= 20n; id++) broker.publish('orders', 'p', id, 'other');
    const t2 = new CappedTransport(broker, 2 * each);
    const life2 = await DedupPublisherCore.open(t2, {
      producerName: 'p',
      store: await memoryStore(disk),
      onBrokerAhead: 'adopt',
    });
    while (life2.inFlight > 0 || t2.entries.length === 0) await new Promise((r) => setImmediate(r));
    await life2.close();
    expect(t2.entries.map((e) => e.length)).toEqual([2, 2, 2, 1]);
    expect(t2.entries.flat()).toEqual([21n, 22n, 23n, 24n, 25n, 26n, 27n]);
  });
});
