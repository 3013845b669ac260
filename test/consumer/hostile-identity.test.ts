import { describe, expect, it } from 'vitest';
import {
  VerifyingConsumerCore,
  type VerifyEvent,
  type VerifyingConsumerOptions,
} from '../../src/consumer/core.js';
import { decodeAmqp10Message } from '../../src/transport/amqp10-decode.js';
import { amqpBinary, amqpMap, amqpString, section } from '../support/chunks.js';
import { memoryDisk, memoryStore } from '../support/memory-store.js';

// Issue 32, items 1 and 2: header values from the wire (decoded by the stream consumer's own
// decoder) and the tenant function's values never merge two producers and never make process() throw.

/** The record of a message stamped with the producer name `nameValue` (encoded bytes) and ID `id`. */
function record(nameValue: Buffer, id: number, extra: Buffer[] = []): Buffer {
  return Buffer.concat([
    section(
      0x74,
      amqpMap([
        amqpString('x-dedup-producer'),
        nameValue,
        amqpString('x-dedup-id'),
        amqpString(String(id)),
        ...extra,
      ]),
    ),
    section(0x75, amqpBinary(Buffer.from('1'))),
  ]);
}
const str8 = (bytes: readonly number[]) => Buffer.from([0xa1, bytes.length, ...bytes]);
const char = (point: number) => {
  const b = Buffer.alloc(5);
  b[0] = 0x73;
  b.writeUInt32BE(point, 1);
  return b;
};
const at = (offset: number, bytes: Buffer) => ({ ...decodeAmqp10Message(bytes), offset: BigInt(offset) });

async function open(options: Partial<VerifyingConsumerOptions> = {}) {
  const events: VerifyEvent[] = [];
  const applied: bigint[] = [];
  const core = await VerifyingConsumerCore.open({
    consumerName: 'ledger',
    store: await memoryStore(memoryDisk()),
    commit: 'message',
    handler: (m) => void applied.push(m.offset),
    onEvent: (e) => events.push(e),
    ...options,
  });
  return { core, events, applied };
}

describe('verifying consumer - hostile identities', () => {
  it('two producers whose Latin-1 names differ are never one scope: both unidentified, neither a duplicate', async () => {
    const { core, events, applied } = await open({ unidentified: 'pass-through' });
    await core.process(at(0, record(str8([0x63, 0x61, 0x66, 0xe9]), 1))); // caf\xE9
    await core.process(at(1, record(str8([0x63, 0x61, 0x66, 0xe8]), 1))); // caf\xE8
    expect(core.stats).toMatchObject({ duplicate: 0, unidentified: 2 });
    expect(applied).toEqual([0n, 1n]);
    expect(events.map((e) => e.kind)).toEqual(['unidentified', 'unidentified']);
    await core.close();
  });

  it('a lone-surrogate name (an AMQP 1.0 char) is reported and passed, and the next message is processed', async () => {
    const { core, events, applied } = await open();
    expect(() => core.process(at(0, record(char(0xd800), 1)))).not.toThrow();
    await core.process(at(1, record(amqpString('orders'), 1)));
    await core.flush();
    expect(core.failure).toBeUndefined();
    expect(core.committedOffset).toBe(1n);
    expect(applied).toEqual([1n]);
    expect(events).toEqual([
      {
        kind: 'unidentified',
        offset: 0n,
        reason: expect.stringMatching(/lone UTF-16 surrogate/) as string,
        applied: false,
      },
    ]);
    await core.close();
  });

  it('a tenant function returning a lone surrogate, U+FFFD or a non-string: the message is unidentified, never a throw', async () => {
    const hostile: unknown[] = [
      't\uDFFF',
      'caf\uFFFD',
      undefined,
      null,
      7,
      Buffer.from('x'),
      { toString: () => 'x' },
    ];
    const { core, events, applied } = await open({
      tenant: (m) => (m.headers['t'] === 'bad' ? (hostile[Number(m.headers['i'])] as string) : 'acme'),
    });
    hostile.forEach((_, i) => {
      const bytes = record(amqpString('orders'), i + 1, [
        amqpString('t'),
        amqpString('bad'),
        amqpString('i'),
        amqpString(String(i)),
      ]);
      expect(() => core.process(at(i, bytes))).not.toThrow();
    });
    await core.process(at(hostile.length, record(amqpString('orders'), 1)));
    await core.flush();
    expect(core.failure).toBeUndefined();
    expect(applied).toEqual([BigInt(hostile.length)]);
    expect(events.map((e) => (e.kind === 'unidentified' ? e.reason : e.kind))).toEqual([
      'the tenant function returned a lone UTF-16 surrogate',
      expect.stringMatching(/^the tenant function returned U\+FFFD/) as string,
      'the tenant function returned undefined, not a string',
      'the tenant function returned null, not a string',
      'the tenant function returned number, not a string',
      'the tenant function returned object, not a string',
      'the tenant function returned object, not a string',
    ]);
    await core.close();
  });

  it('a tenant function that throws stops the consumer with its error, as a handler error does', async () => {
    const { core } = await open({
      tenant: () => {
        throw new Error('tenant bug');
      },
    });
    expect(() => core.process(at(0, record(amqpString('orders'), 1)))).toThrow('tenant bug');
    expect(core.failure?.message).toBe('tenant bug');
    await core.close();
  });

  it('a header in both application properties and annotations with different values: the application property wins, no throw', async () => {
    const bytes = Buffer.concat([
      section(0x72, amqpMap([amqpString('region'), amqpString('eu')])),
      section(
        0x74,
        amqpMap([
          amqpString('x-dedup-producer'),
          amqpString('orders'),
          amqpString('x-dedup-id'),
          amqpString('1'),
          amqpString('region'),
          amqpString('us'),
        ]),
      ),
    ]);
    let tenant = '';
    const { core } = await open({
      tenant: (m) => String(m.headers['region']),
      handler: (m) => void (tenant = m.tenant),
    });
    expect(() => core.process(at(0, bytes))).not.toThrow();
    await core.flush();
    expect(core.failure).toBeUndefined();
    expect(tenant).toBe('us');
    await core.close();
  });
});
