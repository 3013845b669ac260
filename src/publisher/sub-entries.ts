/**
 * Sub-entry batches (docs/design.md §10): which messages of a group commit leave together in one
 * stream entry, whose publishing ID is the highest in it. The broker deduplicates by entry: it
 * stores or drops an entry whole. So the batches are decided once, when their group commit is
 * written, and kept with it (an outbox segment records their sizes): every later send of those
 * messages — a re-send after a lost connection, or the next process's after a crash — rebuilds the
 * same entries. Re-cut differently, an entry could straddle the broker's last ID and be dropped
 * with messages it never stored, or stored with messages it already had.
 */
import type { Entry } from './entry.js';
import { headersSize } from './message.js';

/**
 * Cuts one group commit into runs of at most `size` consecutive messages whose bytes (bodies,
 * headers, `stampBytes` of identity stamps and framing each: an upper bound of the encoding) fit
 * `maxBytes`, and ties each message to its run. A batch never spans two group commits.
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
): number[] | undefined {
  const sizes: number[] = [];
  let batched = false;
  for (let start = 0; start < batch.length;) {
    let end = start;
    let bytes = 0;
    const limit = batch[start]!.publishingId <= aloneUpTo ? 1 : size;
    while (end < batch.length && end - start < limit) {
      const m = batch[end]!;
      const b = m.body.length + headersSize(m.headers) + stampBytes;
      if (end > start && bytes + b > maxBytes) break;
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
