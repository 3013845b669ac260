/**
 * Sub-entry batches (docs/design.md §10): which messages of a group commit leave together in one
 * stream entry, whose publishing ID is the highest in it. The broker deduplicates by entry: it
 * stores or drops an entry whole. So the batches are decided once, when their group commit is
 * written, and kept with it (an outbox segment records their sizes): every later send of those
 * messages — a re-send after a lost connection, or the next process's after a crash — rebuilds the
 * same entries. Re-cut differently, an entry could straddle the broker's last ID and be dropped
 * with messages it never stored, or stored with messages it already had.
 */
import type { Headers } from '../store/codec.js';
import type { Entry } from './entry.js';
import { headersSize } from './message.js';
import type { BatchCodec } from './types.js';

/**
 * The most uncompressed bytes a sub-entry batch may declare: RabbitMQ's
 * `stream.max_uncompressed_sub_entry_batch_size` default (4.3.5 on). The broker refuses a batch
 * declaring more with publish error 17 (measured on 4.3.6: test/integration/broker-limits.test.ts),
 * and a batch is re-sent as it was cut (an outbox segment keeps its cut): over the cap it would be
 * refused at every re-send.
 */
export const DEFAULT_MAX_UNCOMPRESSED_BATCH_BYTES = 67_108_864;

// BatchCodec lives in types.ts (an option's type; no import cycle); its importers find it here.
export type { BatchCodec } from './types.js';

/**
 * An upper bound of the bytes `codec` makes of `raw` bytes, incompressible data included (where
 * compression expands it): zlib's `deflateBound` for its default parameters (what `gzipSync`
 * uses: ~0.03 % plus 7 bytes) and gzip's 18-byte wrapper; zstd's `ZSTD_COMPRESSBOUND` (~0.4 %
 * plus up to 64 bytes under 128 KiB). Without a codec: the larger of every codec's bound.
 */
export function compressedBound(raw: number, codec?: BatchCodec): number {
  if (codec === 'none') return raw;
  const gzip = raw + Math.floor(raw / 4096) + Math.floor(raw / 16384) + Math.floor(raw / 33554432) + 7 + 18;
  if (codec === 'gzip') return gzip;
  const zstd = raw + Math.floor(raw / 256) + (raw < 131072 ? Math.floor((131072 - raw) / 2048) : 0);
  return codec === 'zstd' ? zstd : Math.max(gzip, zstd);
}

/**
 * Cuts one group commit into runs of at most `size` consecutive messages whose bytes (bodies,
 * headers, `stampBytes` of identity stamps and framing each: an upper bound of the encoding,
 * compressed with `codec` — by default whichever compresses worst) fit `maxBytes`, and whose
 * uncompressed bytes (the same estimate: at least the length the encoder declares) fit
 * `maxUncompressedBytes`, and ties each message to its run. A batch never spans two group commits.
 * A message above `maxUncompressedBytes` by itself goes alone: an entry of its own, which the
 * broker does not hold to the sub-entry cap.
 *
 * A message whose ID is at or below `aloneUpTo` goes alone: the ceiling an earlier `reserve` life
 * left (docs/design.md §10). Its frames may still be on their way, one message per entry or cut
 * otherwise, and only with explicit IDs can this life send those IDs again (the caller replays its
 * source from the broker's last ID): alone, each is dropped or stored by itself, as before batches.
 *
 * @returns the runs' sizes in order, or `undefined` when every run is one message (then the
 *   segment is stored as before sub-entries, and each message is an entry of its own).
 */
export function formBatches(
  batch: readonly Entry[],
  size: number,
  maxBytes: number,
  stampBytes: number,
  aloneUpTo = 0n,
  codec?: BatchCodec,
  maxUncompressedBytes: number = DEFAULT_MAX_UNCOMPRESSED_BATCH_BYTES,
): number[] | undefined {
  const sizes: number[] = [];
  let batched = false;
  for (let start = 0; start < batch.length;) {
    let end = start;
    let bytes = 0;
    const limit = batch[start]!.publishingId <= aloneUpTo ? 1 : size;
    while (end < batch.length && end - start < limit) {
      const b = estimatedBytes(batch[end]!, stampBytes);
      if (end > start && (compressedBound(bytes + b, codec) > maxBytes || bytes + b > maxUncompressedBytes))
        break;
      bytes += b;
      end++;
    }
    sizes.push(end - start);
    if (end - start > 1) batched = true;
    start = end;
  }
  if (!batched) return undefined;
  attachBatches(batch, sizes);
  return sizes;
}

/**
 * A message's share of a batch's bytes, uncompressed: body, headers and `stampBytes` of identity
 * stamps and framing (at least what the encoder declares for it).
 */
function estimatedBytes(
  m: { readonly body: Uint8Array; readonly headers: Headers | undefined },
  stampBytes: number,
): number {
  return m.body.length + headersSize(m.headers) + stampBytes;
}

/** A stored sub-entry batch above the cap it would be re-sent under. */
export interface OversizedBatch {
  readonly firstId: bigint;
  readonly lastId: bigint;
  readonly messages: number;
  /** Its estimated uncompressed bytes (as {@link formBatches} counts them). */
  readonly bytes: number;
}

/**
 * The first batch of an outbox segment (its messages in ID order, cut as `sizes` records) whose
 * uncompressed estimate is above `maxUncompressedBytes`: a batch cut under a higher cap in an
 * earlier life. It is re-sent as it was cut, so the broker would refuse it at every re-send.
 */
export function oversizedBatch(
  entries: readonly {
    readonly publishingId: bigint;
    readonly body: Uint8Array;
    readonly headers: Headers | undefined;
  }[],
  sizes: readonly number[],
  stampBytes: number,
  maxUncompressedBytes: number,
): OversizedBatch | undefined {
  let o = 0;
  for (const n of sizes) {
    if (n > 1) {
      let bytes = 0;
      for (let i = o; i < o + n; i++) bytes += estimatedBytes(entries[i]!, stampBytes);
      if (bytes > maxUncompressedBytes) {
        return {
          firstId: entries[o]!.publishingId,
          lastId: entries[o + n - 1]!.publishingId,
          messages: n,
          bytes,
        };
      }
    }
    o += n;
  }
  return undefined;
}

/**
 * Ties each message to its batch as `sizes` (from {@link formBatches}, or a stored segment) cut
 * them: every member of a batch of two or more holds the same array of its members, in ID order;
 * a message alone holds none.
 */
export function attachBatches(entries: readonly Entry[], sizes: readonly number[]): void {
  let o = 0;
  for (const n of sizes) {
    if (n > 1) {
      const members = entries.slice(o, o + n);
      for (const m of members) m.batch = members;
    }
    o += n;
  }
}

/** What {@link batcherFor} reads of a transport. @internal */
export interface BatchingTransport {
  readonly subEntrySize?: number | undefined;
  readonly maxMessageBytes: number;
  readonly subEntryCompression?: BatchCodec | undefined;
  readonly maxBatchBytes?: number | undefined;
}

/**
 * How a group commit is cut into sub-entry batches on `transport` (`undefined`: one message per
 * entry). IDs up to `aloneUpTo` (an earlier reserve life's) go alone; the transport's codec
 * bounds a batch's bytes ('none': exactly the estimate, 0.3–0.4 % more small messages per full
 * batch than the worst codec's bound). @internal
 */
export function batcherFor(
  transport: BatchingTransport,
  stampBytes: number,
  aloneUpTo: bigint,
): ((batch: readonly Entry[]) => number[] | undefined) | undefined {
  const size = transport.subEntrySize ?? 1;
  if (size <= 1) return undefined;
  const codec = transport.subEntryCompression;
  return (batch) =>
    formBatches(
      batch,
      size,
      transport.maxMessageBytes,
      stampBytes,
      aloneUpTo,
      codec,
      transport.maxBatchBytes,
    );
}
