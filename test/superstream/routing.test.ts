import fc from 'fast-check';
import { createRequire } from 'node:module';
import { describe, expect, it } from 'vitest';
import { murmur3, partitionForKey } from '../../src/superstream/routing.js';

// The JavaScript client's own hash (rabbitmq-stream-js-client 1.0, dist/hash/murmur32.js), which its
// super stream publisher routes with: `murmur32(key) % partitions.length`.
const { murmur32 } = createRequire(import.meta.url)('rabbitmq-stream-js-client/dist/hash/murmur32.js') as {
  murmur32: (key: string) => number;
};

describe('super stream hash routing', () => {
  it('routes the cross-client test vectors as the Go, .NET and Python clients do', () => {
    // rabbitmq-stream-go-client pkg/stream/super_stream_producer_test.go, "Partitioning using Murmur3".
    const partitions = ['invoices-01', 'invoices-02', 'invoices-03'];
    const expected: Record<string, string> = {
      hello1: 'invoices-02',
      hello2: 'invoices-01',
      hello3: 'invoices-02',
      hello4: 'invoices-03',
      hello5: 'invoices-01',
      hello6: 'invoices-03',
      hello7: 'invoices-01',
      hello8: 'invoices-02',
      hello9: 'invoices-01',
      hello10: 'invoices-03',
      hello88: 'invoices-02',
    };
    for (const [key, partition] of Object.entries(expected)) {
      expect(partitionForKey(key, partitions), key).toBe(partition);
    }
  });

  it('hashes every key as the JavaScript client does (ASCII, any Unicode, every tail length)', () => {
    const keys = fc.oneof(
      fc.string({ maxLength: 40 }),
      fc.string({ unit: 'grapheme', maxLength: 20 }),
      fc.string({ unit: 'binary', maxLength: 20 }),
      fc.integer().map(String),
    );
    fc.assert(
      fc.property(keys, (key) => {
        expect(murmur3(Buffer.from(key, 'utf8'))).toBe(murmur32(key));
      }),
      { numRuns: 5_000 },
    );
  });

  it('refuses an empty partition list', () => {
    expect(() => partitionForKey('k', [])).toThrow(RangeError);
  });
});
