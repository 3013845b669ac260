/**
 * What stopping does with the messages in each stage of the queue: after a fatal error every
 * caller is told and the outbox keeps what it holds; at close, accepted sends are still written
 * to the outbox (outbox durability) and the callers learn which of them will be re-sent.
 */
import type { DedupError } from '../errors.js';
import type { GroupCommitter } from './commit.js';
import type { Entry } from './entry.js';
import { closedUnconfirmedError, closedUnwrittenError } from './errors.js';
import type { KeyedIds } from './keyed.js';
import type { SendQueue } from './send-queue.js';
import type { Durability } from './types.js';

/** A fatal error: every message in the queue (and `extra`, a batch in hand) rejects with it. */
export function letGoAll(
  queue: SendQueue,
  commits: GroupCommitter,
  keyed: KeyedIds | undefined,
  error: DedupError,
  extra: readonly Entry[],
): void {
  for (const e of [...extra, ...queue.takeParked(), ...queue.takeBatch(), ...queue.pending.values()]) {
    commits.letGo(e);
    keyed?.settled(e, error);
    e.settle(error);
  }
  queue.pending.clear();
}

/**
 * Closing, once nothing more is sent: unsent messages go to the outbox in one last group commit
 * (outbox durability, no fatal error), and every caller still waiting is told what became of its
 * message. Then confirmed segments and a confirmed skip declaration are cleared from the store.
 */
export async function settleAtClose(
  queue: SendQueue,
  commits: GroupCommitter,
  keyed: KeyedIds | undefined,
  life: {
    readonly producerName: string;
    readonly durability: Durability;
    /** The error that stopped the publisher, if any: read after each await (a reconnect may fail meanwhile). */
    fatal(): DedupError | undefined;
  },
): Promise<void> {
  const { producerName, durability } = life;
  let unsent = [...queue.takeBatch(), ...queue.takeParked()];
  if (unsent.length > 0 && durability === 'outbox' && life.fatal() === undefined) {
    try {
      await commits.write(unsent);
      queue.endCommit(unsent, true);
      unsent = [];
    } catch {
      // Not written: they are reported as never sent.
    }
  }
  const unwritten = life.fatal() ?? closedUnwrittenError(producerName);
  for (const e of unsent) {
    keyed?.forget(e, unwritten);
    e.settle(unwritten);
  }
  const unconfirmed = life.fatal() ?? closedUnconfirmedError(producerName, durability);
  for (const e of queue.pending.values()) {
    keyed?.settled(e, unconfirmed);
    e.settle(unconfirmed);
  }
  // The next open re-sends less (a reserve life that recovered an outbox has segments too).
  if (commits.hasConfirmWork) await commits.write([]).catch(() => undefined);
}
