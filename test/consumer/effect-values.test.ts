import { describe, expect, it } from 'vitest';
import { VerifyingConsumerCore, type MessageHandler } from '../../src/consumer/core.js';
import { identityHeaders } from '../../src/identity/headers.js';
import { memoryDisk, memoryStore } from '../support/memory-store.js';

// The handler's read type (issue 22, item 5): tx.get and readEffect give Buffers, whatever was put
// and wherever it is read from, so `Number((await tx.get(k))?.toString() ?? 0)` is right; bytes
// that were put are copied, so a handler reusing its buffer changes nothing stored.

const message = (offset: number, id: number, body: string) => ({
  offset: BigInt(offset),
  content: Buffer.from(body),
  applicationProperties: identityHeaders('p', BigInt(id)),
});

async function open(handler: MessageHandler, disk = memoryDisk(), commit: 'message' | 'batch' = 'message') {
  return VerifyingConsumerCore.open({
    consumerName: 'c',
    store: await memoryStore(disk),
    handler,
    commit,
    commitEvery: 100,
  });
}

describe('effect values', () => {
  it('tx.get gives a Buffer for a Uint8Array put in the same batch, and for one read back after the commit', async () => {
    const reads: unknown[] = [];
    const disk = memoryDisk();
    const core = await open(async (m, tx) => {
      const before = await tx.get('balance');
      reads.push(before);
      const balance = Number(before?.toString() ?? 0) + Number(m.body.toString());
      tx.put('balance', new TextEncoder().encode(String(balance))); // a plain Uint8Array
      reads.push(await tx.get('balance'));
    }, disk);
    await core.process(message(0, 1, '5'));
    await core.process(message(1, 2, '7'));
    await core.close();
    expect(reads.every((r) => r === undefined || Buffer.isBuffer(r))).toBe(true);
    expect(reads.map((r) => (r as Buffer | undefined)?.toString())).toEqual([undefined, '5', '5', '12']);
    const reopened = await open(() => undefined, disk);
    const stored = await reopened.readEffect('balance');
    expect(Buffer.isBuffer(stored)).toBe(true);
    expect(stored?.toString()).toBe('12');
    await reopened.close();
  });

  it('bytes are copied at put(): a handler reusing one buffer for every message stores each value', async () => {
    const scratch = new Uint8Array(1);
    const core = await open(
      (m, tx) => {
        scratch[0] = m.body[0]!;
        tx.put(`v:${m.body.toString()}`, scratch);
      },
      memoryDisk(),
      'batch', // both messages in one batch: the first value waits for the commit
    );
    await core.process(message(0, 1, 'a'));
    await core.process(message(1, 2, 'b'));
    await core.close();
    expect((await core.readEffect('v:a'))?.toString()).toBe('a');
    expect((await core.readEffect('v:b'))?.toString()).toBe('b');
  });

  it('put() refuses a value that is neither a string nor bytes', async () => {
    let thrown: unknown;
    const core = await open((_m, tx) => {
      try {
        tx.put('k', 5 as unknown as string);
      } catch (err) {
        thrown = err;
      }
    });
    await core.process(message(0, 1, 'x'));
    await core.close();
    expect(thrown).toBeInstanceOf(TypeError);
  });
});
