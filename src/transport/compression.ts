/**
 * The compression codecs of sub-entry batches (stream protocol codes: 0 none, 1 gzip, 2 snappy,
 * 3 lz4, 4 zstd), with what Node's own zlib provides: gzip everywhere, zstd where zlib has it
 * (Node 22.15 on). Snappy and lz4 would need a native or hand-written codec: not offered, and a
 * stream holding them is reported by name rather than misread.
 */
import * as zlib from 'node:zlib';

/** The protocol's code of each codec stream-dedup writes. */
export const CODEC_CODES: Readonly<Record<'none' | 'gzip' | 'zstd', number>> = Object.freeze({
  none: 0,
  gzip: 1,
  zstd: 4,
});

/** The protocol's codec names by code (3 bits). */
export const CODEC_NAMES: readonly string[] = [
  'none',
  'gzip',
  'snappy',
  'lz4',
  'zstd',
  'codec 5',
  'codec 6',
  'codec 7',
];

/** One-shot decompression of a whole buffer, output capped at `maxOutputLength` bytes. */
export type Inflate = (data: Uint8Array, options: { maxOutputLength: number }) => Buffer;

/** zlib's zstd, where this Node has it (typed loosely: @types/node 20 does not declare it). */
const zstd = zlib as unknown as {
  zstdCompressSync?: (data: Uint8Array) => Buffer;
  zstdDecompressSync?: Inflate;
};

/** Whether this Node's zlib compresses and decompresses zstd. */
export const HAS_ZSTD: boolean =
  typeof zstd.zstdCompressSync === 'function' && typeof zstd.zstdDecompressSync === 'function';

/** Compresses a sub-entry batch's data with `codec` ('none' returns it as it is). */
export function compress(codec: 'none' | 'gzip' | 'zstd', data: Buffer): Buffer {
  if (codec === 'none') return data;
  if (codec === 'gzip') return zlib.gzipSync(data);
  return zstd.zstdCompressSync!(data);
}

/** The decompression of a codec code: gzip, zstd where this Node has it; `undefined` otherwise. */
export function inflateOf(code: number): Inflate | undefined {
  if (code === CODEC_CODES.gzip) return zlib.gunzipSync;
  if (code === CODEC_CODES.zstd) return zstd.zstdDecompressSync;
  return undefined;
}
