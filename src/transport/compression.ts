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

/** zlib's zstd, where this Node has it (typed loosely: @types/node 20 does not declare it). */
const zstd = zlib as unknown as {
  zstdCompressSync?: (data: Uint8Array) => Buffer;
  zstdDecompressSync?: (data: Uint8Array) => Buffer;
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
