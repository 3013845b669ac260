/**
 * Which pending entries a confirm settles: an entry of that ID alone, or a whole sub-entry batch
 * confirmed by its last ID.
 */
import type { Entry } from './entry.js';
import type { PendingQueue } from './pending.js';

/**
 * Takes the entries `ids` confirm out of `pending` and calls `settle` on each, in ID order. An ID
 * not pending (confirmed before, or re-sent and confirmed twice) settles nothing. @internal
 */
export function takeConfirmed(
  pending: PendingQueue<Entry>,
  ids: readonly bigint[],
  settle: (entry: Entry) => void,
): void {
  for (const id of ids) {
    // The common case, a batch at the head confirmed: its members leave from the head, in order.
    const head = pending.first?.batch;
    if (head !== undefined && head[head.length - 1]!.publishingId === id) {
      for (const member of head) {
        if (pending.take(member.publishingId) !== undefined) settle(member);
      }
      continue;
    }
    const e = pending.get(id);
    if (e === undefined) continue;
    const batch = e.batch;
    if (batch === undefined) {
      pending.take(id);
      settle(e);
      continue;
    }
    // A sub-entry batch is one entry, confirmed by its last ID: stored or dropped whole
    // (docs/design.md §10). Its members settle in ID order on that confirm only: a member's own
    // ID confirmed means an entry of that ID alone, not this batch (issue 32, item 6).
    if (batch[batch.length - 1] !== e) continue;
    for (const member of batch) {
      if (pending.take(member.publishingId) !== undefined) settle(member);
    }
  }
}
