/**
 * An aborted parked send stays in the send queue until the queue's head or a compaction reaches it
 * (lazy deletion, issue 32 item 9), but it is never written nor sent: its body and headers are let
 * go at the abort (REVIEW §6: parked sends are bounded in bytes). Found by hostile review A (F3):
 * k large aborted sends among k + 1 small live ones stayed reachable while confirms were withheld.
 */
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { describe, expect, it } from 'vitest';
import { DedupPublisherCore } from '../../src/publisher/core.js';
import { memoryDisk, memoryStore } from '../support/memory-store.js';
import { ModelBroker, ModelTransport } from '../support/model-broker.js';

setFlagsFromString('--expose_gc');
const gc = runInNewContext('gc') as () => void;

/**
 * Parks k large sends (each with its own signal) after one small live one, with a small live one
 * after each large one when `smallBetween`, aborts the large ones and counts those still reachable
 * after two collections.
 */
async function reachableAfterAbort(k: number, smallBetween: boolean): Promise<number> {
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
  core.send(Buffer.from('s')).catch(() => undefined);
  const refs: WeakRef<Buffer>[] = [];
  const controllers: AbortController[] = [];
  // Each large body is made in a function of its own: no frame of the test keeps it.
  const sendLarge = (i: number): void => {
    const large = Buffer.alloc(900_000, i);
    refs.push(new WeakRef(large));
    const c = new AbortController();
    controllers.push(c);
    core.send(large, { signal: c.signal, headers: { n: String(i) } }).catch(() => undefined);
  };
  for (let i = 0; i < k; i++) {
    sendLarge(i);
    if (smallBetween) core.send(Buffer.from('s')).catch(() => undefined);
  }
  for (const c of controllers) c.abort();
  for (let i = 0; i < 5; i++) await new Promise((r) => setImmediate(r));
  gc();
  await new Promise((r) => setImmediate(r));
  gc();
  const reachable = refs.filter((r) => r.deref() !== undefined).length;
  expect(core.inFlight).toBe(smallBetween ? k + 2 : 2);
  await core.close();
  return reachable;
}

describe('publisher - aborted parked sends', () => {
  it('lets go of the body of an aborted send that stays parked among live ones (no compaction)', async () => {
    // 50 aborted among 51 live: fewer aborted than live, so no compaction takes them out.
    expect(await reachableAfterAbort(50, true)).toBe(0);
  });

  it('control: aborted sends taken out by a compaction are unreachable (the count measures the queue)', async () => {
    expect(await reachableAfterAbort(50, false)).toBe(0);
  });
});
