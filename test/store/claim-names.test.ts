import { describe, expect, it } from 'vitest';
import { VerifyingConsumerCore } from '../../src/consumer/core.js';
import { memoryStore } from '../support/memory-store.js';

// LevelDB keys are UTF-8: 'x\uD800' and 'x\uDC00' are both stored as 'x\uFFFD'. A claim compares JS
// strings, so without a check two such names would both be claimed and share one state on disk.
const TWINS = ['x\uD800', 'x\uDC00'] as const;

describe('store - claimed names', () => {
  it('claims refuse a target, producer or consumer name with a lone UTF-16 surrogate (RangeError)', async () => {
    const store = await memoryStore();
    for (const name of TWINS) {
      expect(() => store.claimProducer(name, 'p'), JSON.stringify(name)).toThrow(
        /target \(stream or queue name\) must not contain a lone UTF-16 surrogate/,
      );
      expect(() => store.claimProducer('ledger', name), JSON.stringify(name)).toThrow(RangeError);
      expect(() => store.claimConsumer(name), JSON.stringify(name)).toThrow(
        /consumerName must not contain a lone UTF-16 surrogate/,
      );
    }
    // Well-formed names, astral characters included, are claimed as before.
    expect(() => store.claimProducer('ledger-🚀', 'p-🚀')).not.toThrow();
    expect(() => store.claimConsumer('c-🚀')).not.toThrow();
    await store.close();
  });

  it('a verifying consumer whose name holds a lone surrogate is refused at open', async () => {
    const store = await memoryStore();
    for (const consumerName of TWINS) {
      await expect(
        VerifyingConsumerCore.open({ consumerName, store, handler: () => undefined }),
      ).rejects.toThrow(RangeError);
    }
    // The refusal gave nothing away: a well-formed name opens.
    const core = await VerifyingConsumerCore.open({ consumerName: 'x', store, handler: () => undefined });
    await core.close();
    await store.close();
  });
});
