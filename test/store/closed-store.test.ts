import { describe, expect, it } from 'vitest';
import { DedupPublisherCore } from '../../src/publisher/core.js';
import { memoryStore } from '../support/memory-store.js';
import { ModelBroker, ModelTransport } from '../support/model-broker.js';
import { thrown } from '../support/thrown.js';

const meta = { idMode: 'auto' as const, lastId: 1n, reservedUpTo: 0n };

describe('store - closed', () => {
  it('a closed store refuses producer and consumer claims with DEDUP_STORE_CLOSED, not DEDUP_STORE_CORRUPT', async () => {
    const store = await memoryStore();
    await store.close();
    expect(store.isClosed).toBe(true);
    expect(thrown(() => store.claimProducer('orders', 'p'))).toMatchObject({
      code: 'DEDUP_STORE_CLOSED',
      message: /producer "p" on "orders".*closed/,
    });
    expect(thrown(() => store.claimConsumer('c'))).toMatchObject({ code: 'DEDUP_STORE_CLOSED' });
    await expect(store.listProducers()).rejects.toMatchObject({ code: 'DEDUP_STORE_CLOSED' });
  });

  it("a producer's state whose store was closed rejects reads and writes with DEDUP_STORE_CLOSED", async () => {
    const store = await memoryStore();
    const state = store.claimProducer('orders', 'p');
    await state.commit({ meta });
    await store.close();
    for (const operation of [
      () => state.commit({ meta }),
      () => state.load(),
      () => state.loadKeySegments(),
      () => state.rewriteKeySegments([1n], []),
    ]) {
      await expect(operation()).rejects.toMatchObject({ name: 'DedupError', code: 'DEDUP_STORE_CLOSED' });
    }
    state.release();
  });

  it('a write asked for while the store is still closing fails with DEDUP_STORE_CLOSED too', async () => {
    const store = await memoryStore();
    const state = store.claimProducer('orders', 'p');
    const closing = store.close();
    await expect(state.commit({ meta })).rejects.toMatchObject({ code: 'DEDUP_STORE_CLOSED' });
    await closing;
  });

  it('publisher - open() on a shared store that was closed is DEDUP_STORE_CLOSED', async () => {
    const store = await memoryStore();
    await store.close();
    const transport = new ModelTransport(new ModelBroker(), 'orders', 'p');
    await expect(DedupPublisherCore.open(transport, { producerName: 'p', store })).rejects.toMatchObject({
      code: 'DEDUP_STORE_CLOSED',
    });
  });

  it('publisher - a shared store closed under a running publisher stops it with DEDUP_STORE_CLOSED', async () => {
    const store = await memoryStore();
    const transport = new ModelTransport(new ModelBroker(), 'orders', 'p');
    const core = await DedupPublisherCore.open(transport, { producerName: 'p', store });
    await core.send(Buffer.from('before'));
    await store.close();
    await expect(core.send(Buffer.from('after'))).rejects.toMatchObject({ code: 'DEDUP_STORE_CLOSED' });
    await expect(core.closed()).resolves.toMatchObject({ code: 'DEDUP_STORE_CLOSED' });
  });
});
