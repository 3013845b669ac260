import { describe, expect, it } from 'vitest';
import { DedupPublisherCore } from '../../src/publisher/core.js';
import type { TransportHandlers } from '../../src/publisher/types.js';
import { memoryStore } from '../support/memory-store.js';
import { LossyTransport, ModelBroker } from '../support/model-broker.js';

/**
 * Its first connection dies right after the connect resolved, while open() still reads and
 * decides (before the publisher core exists): it says so once, and everything published on it
 * afterwards is lost without an error, as on a socket whose close the client reported.
 */
class LostDuringOpen extends LossyTransport {
  override async connect(handlers: TransportHandlers): Promise<bigint> {
    const last = await super.connect(handlers);
    this.losing = this.connects === 1;
    if (this.losing) queueMicrotask(() => handlers.disconnected(new Error('connection lost during open')));
    return last;
  }
}

describe('a connection lost during open (issue 32)', () => {
  it('a disconnect heard before the core exists is not dropped: the publisher reconnects at once, not after confirmTimeoutMs', async () => {
    // Before: the handler ignored it (no core yet), the publisher believed itself connected and
    // only the confirm watchdog (30 s by default) noticed that nothing was ever confirmed.
    const broker = new ModelBroker();
    const transport = new LostDuringOpen(broker, 'orders', 'p');
    const core = await DedupPublisherCore.open(transport, {
      producerName: 'p',
      store: await memoryStore(),
      reconnect: { initialDelayMs: 1, maxDelayMs: 2 },
      confirmTimeoutMs: 60_000,
    });
    const sent = core.send(Buffer.from('a'));
    let timer: NodeJS.Timeout | undefined;
    const stuck = new Promise<'stuck'>((resolve) => (timer = setTimeout(() => resolve('stuck'), 5_000)));
    const outcome = await Promise.race([sent, stuck]);
    clearTimeout(timer);
    expect(outcome).toEqual({ publishingId: 1n, outcome: 'published' });
    expect(transport.connects).toBe(2);
    expect(broker.messages('orders').map((m) => m.body)).toEqual(['a']);
    await core.close();
  });
});
