import { describe, expect, it } from 'vitest';
import { VerifyingConsumerCore } from '../../src/consumer/core.js';
import { identityHeaders } from '../../src/identity/headers.js';
import { DedupStore } from '../../src/store/store.js';
import { ProcessDisk } from '../../property-tests/support/disk.js';
import { memoryDisk } from '../support/memory-store.js';
import type { IncomingMessage } from '../../src/consumer/types.js';

// Found by the consumer racing model (property-tests/consumer-model.test.ts): after a lost
// connection (`discardPending()`, then delivery again from `resumeOffset`) while a commit is being
// written, the messages of that commit came again and were processed a second time.

const number = (raw: Uint8Array | undefined) => Number(raw === undefined ? '0' : Buffer.from(raw).toString());
const turns = async (n = 20) => {
  for (let i = 0; i < n; i++) await new Promise((resolve) => setImmediate(resolve));
};

async function open(disk: ReturnType<typeof memoryDisk>) {
  const processDisk = new ProcessDisk(disk);
  const core = await VerifyingConsumerCore.open({
    consumerName: 'balance-projection',
    store: await DedupStore.wrap(processDisk),
    commitEvery: 2,
    commitLingerMs: 60_000,
    unidentified: 'pass-through',
    handler: async (message, tx) => {
      tx.put('balance', String(number(await tx.get('balance')) + Number(message.body.toString())));
    },
  });
  return { disk: processDisk, core };
}

describe('redelivery after a lost connection while a commit is written', () => {
  it('messages of the write in flight are not processed again: a pass-through message takes effect once, and the committed offset never moves back', async () => {
    const disk = memoryDisk();
    const { disk: life, core } = await open(disk);
    const settled: bigint[] = [];
    const messages: IncomingMessage[] = [
      { offset: 0n, content: Buffer.from('10'), applicationProperties: {} }, // no identity: passed through
      { offset: 1n, content: Buffer.from('20'), applicationProperties: identityHeaders('a', 1n) },
    ].map((m) => ({ ...m, settle: () => settled.push(m.offset) }));
    life.hold(); // a slow disk
    await core.process(messages[0]!);
    await core.process(messages[1]!); // the batch is full: its write starts, and is held
    await turns();
    core.discardPending(); // the connection is lost meanwhile ...
    const offsets: bigint[] = [];
    core.onCommitted((offset) => offsets.push(offset));
    for (const m of messages.slice(Number(core.resumeOffset ?? 0n))) await core.process(m); // ... and delivers again
    await life.release();
    await core.flush();
    expect(number(await core.readEffect('balance'))).toBe(30);
    expect(offsets).toEqual([1n]);
    expect(core.committedOffset).toBe(1n);
    // Each delivery is settled (acked) once durable: the first ones by their commit, the repeats after it.
    expect(settled.sort()).toEqual([0n, 0n, 1n, 1n]);
    await core.close();
    const again = await open(disk);
    expect(again.core.resumeOffset).toBe(2n);
    expect(number(await again.core.readEffect('balance'))).toBe(30);
    await again.core.close();
  });
});
