/**
 * REV-A (hostile review) — FAILING ON PURPOSE until fixed. See /work/wt/notes2/rev-a.md.
 *
 * pub32's lazy deletion keeps an aborted parked send in the queue until the head reaches it or the
 * aborted ones are at least as many as the live ones. Its body (and headers) stay reachable
 * meanwhile, though it will never be written: REVIEW §6 ("bound every buffer in bytes, not only in
 * entries … parked sends"). With k large aborted sends among k + 1 small live ones, k large bodies
 * stay in memory for as long as the broker withholds confirms — an application that aborts sends
 * (AbortSignal.timeout) to shed memory under back-pressure sheds nothing. Before pub32 the aborted
 * entries left the queue at the next microtask.
 */
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { describe, expect, it } from 'vitest';
import { DedupPublisherCore } from '../../src/publisher/core.js';
import { memoryDisk, memoryStore } from '../support/memory-store.js';
import { ModelBroker, ModelTransport } from '../support/model-broker.js';

setFlagsFromString('--expose_gc');
const gc = runInNewContext('gc') as () => void;
/** false: the control (every parked send but one aborted: compacted at once, all freed). */
const SMALL_BETWEEN = process.env.REVA_CONTROL !== '1';

describe('rev-a: aborted parked sends', () => {
  it('an aborted parked send does not keep its body reachable while later sends stay parked', async () => {
    const broker = new ModelBroker();
    const transport = new ModelTransport(broker, 'orders', 'p');
    const core = await DedupPublisherCore.open(transport, {
      producerName: 'p',
      store: await memoryStore(memoryDisk()),
      maxInFlight: 1,
      closeTimeoutMs: 0,
    });
    transport.faults.holdConfirms = true;
    core.send(Buffer.from('first')).catch(() => undefined);
    const k = 50;
    const refs: WeakRef<Buffer>[] = [];
    const controllers: AbortController[] = [];
    // Parked: small live, large aborted, small live, … (k large, k + 1 small).
    core.send(Buffer.from('s')).catch(() => undefined);
    // The large body is made in a function of its own: no frame of the test keeps it.
    const sendBig = (i: number): void => {
      const big = Buffer.alloc(900_000, i);
      refs.push(new WeakRef(big));
      const c = new AbortController();
      controllers.push(c);
      core.send(big, { signal: c.signal }).catch(() => undefined);
    };
    for (let i = 0; i < k; i++) {
      sendBig(i);
      if (SMALL_BETWEEN) core.send(Buffer.from('s')).catch(() => undefined);
    }
    for (const c of controllers) c.abort();
    for (let i = 0; i < 5; i++) await new Promise((r) => setImmediate(r));
    gc();
    await new Promise((r) => setImmediate(r));
    gc();
    const alive = refs.filter((r) => r.deref() !== undefined).length;
    // 45 MB of bodies that will never be written stay reachable.
    expect(alive).toBe(0);
    await core.close();
  });
});
