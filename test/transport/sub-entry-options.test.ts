import { existsSync } from 'node:fs';
import { mkdtemp } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { HAS_ZSTD } from '../../src/transport/compression.js';
import { StreamDedupPublisher } from '../../src/transport/stream-publisher.js';
import { resolveSubEntry } from '../../src/transport/stream-options.js';
import { SuperStreamDedupPublisher } from '../../src/superstream/publisher.js';

// `subEntry` is checked before any I/O, with the options' one message shape (docs/design.md §10).
describe('subEntry option', () => {
  it('defaults to off, and fills in the codec', () => {
    const cap = 67_108_864;
    expect(resolveSubEntry(undefined)).toEqual({ size: 1, compression: 'none', maxUncompressedBytes: cap });
    expect(resolveSubEntry({ size: 100 })).toEqual({
      size: 100,
      compression: 'none',
      maxUncompressedBytes: cap,
    });
    expect(resolveSubEntry({ size: 65_535, compression: 'gzip', maxUncompressedBytes: 1 })).toEqual({
      size: 65_535,
      compression: 'gzip',
      maxUncompressedBytes: 1,
    });
  });

  const bad: Array<[unknown, typeof TypeError | typeof RangeError, string]> = [
    [5, TypeError, 'Expected subEntry to be an object, got 5'],
    [{}, RangeError, 'Expected subEntry.size to be an integer from 2 to 65535, got undefined'],
    [{ size: 1 }, RangeError, 'Expected subEntry.size to be an integer from 2 to 65535, got 1'],
    [{ size: 65_536 }, RangeError, 'Expected subEntry.size to be an integer from 2 to 65535, got 65536'],
    [{ size: 2.5 }, RangeError, 'Expected subEntry.size to be an integer from 2 to 65535, got 2.5'],
    [{ size: '10' }, TypeError, 'Expected subEntry.size to be an integer from 2 to 65535, got "10"'],
    [
      { size: 10, compression: 'lz4' },
      RangeError,
      `Expected subEntry.compression to be one of 'none', 'gzip', 'zstd', got "lz4"`,
    ],
    [
      { size: 10, maxUncompressedBytes: 0 },
      RangeError,
      'Expected subEntry.maxUncompressedBytes to be an integer from 1 to 4294967295, got 0',
    ],
    [
      { size: 10, maxUncompressedBytes: 2 ** 32 },
      RangeError,
      'Expected subEntry.maxUncompressedBytes to be an integer from 1 to 4294967295, got 4294967296',
    ],
    [
      { size: 10, maxUncompressedBytes: '64m' },
      TypeError,
      'Expected subEntry.maxUncompressedBytes to be an integer from 1 to 4294967295, got "64m"',
    ],
  ];
  for (const [value, type, message] of bad) {
    it(`refuses ${JSON.stringify(value)}: ${message}`, () => {
      expect(() => resolveSubEntry(value)).toThrow(type);
      expect(() => resolveSubEntry(value)).toThrow(message);
    });
  }

  it('zstd: taken where Node’s zlib has it, refused elsewhere naming the version it needs', () => {
    if (HAS_ZSTD) expect(resolveSubEntry({ size: 10, compression: 'zstd' }).compression).toBe('zstd');
    else
      expect(() => resolveSubEntry({ size: 10, compression: 'zstd' })).toThrow(
        /zstd needs Node's zlib from 22\.15/,
      );
  });

  it('a bad subEntry fails open() before the store folder exists or a connection is made', async () => {
    const store = join(await mkdtemp(join(tmpdir(), 'sub-entry-options-')), 'store');
    const common = { producerName: 'p', store, connection: { hostname: '127.0.0.1', port: 1 } };
    await expect(
      StreamDedupPublisher.open({ ...common, stream: 's', subEntry: { size: 0 } }),
    ).rejects.toThrow(RangeError);
    await expect(
      SuperStreamDedupPublisher.open({
        ...common,
        superStream: 's',
        routing: { kind: 'hash' },
        subEntry: { size: 3, compression: 'snappy' as 'gzip' },
      }),
    ).rejects.toThrow(RangeError);
    await expect(
      SuperStreamDedupPublisher.open({
        ...common,
        superStream: 's',
        routing: { kind: 'hash' },
        idMode: 'explicit',
        durability: 'reserve',
        subEntry: { size: 3 },
      }),
    ).rejects.toMatchObject({ code: 'DEDUP_UNSAFE_OPTIONS' });
    await expect(
      StreamDedupPublisher.open({ ...common, stream: 's', subEntry: { size: 3, maxUncompressedBytes: 0.5 } }),
    ).rejects.toThrow(RangeError);
    expect(existsSync(store)).toBe(false);
  });
});
