/**
 * A caller's `AbortSignal` on its sends: a send still parked (waiting for room) is withdrawn and
 * leaves no hole in the IDs; one already written or sent may be published anyway, and only its
 * caller stops waiting.
 */
import type { DedupError } from '../errors.js';
import type { IdMode } from '../store/codec.js';
import { AbortGroups } from './abort-groups.js';
import type { Entry } from './entry.js';
import { abortError } from './errors.js';
import type { KeyedIds } from './keyed.js';
import type { SendQueue } from './send-queue.js';

/** What a withdrawal changes in the publisher: the last ID handed out. @internal */
export interface SendAbortsHost {
  readonly idMode: IdMode;
  readonly queue: SendQueue;
  readonly keyed: KeyedIds | undefined;
  lastAssigned(): bigint;
  setLastAssigned(id: bigint): void;
}

/** The publisher's sends that passed a signal. @internal */
export class SendAborts {
  readonly #host: SendAbortsHost;
  /** Waiting sends by abort signal: one listener per signal. */
  readonly #groups = new AbortGroups<Entry>((entries, signal) => this.#aborted(entries, signal));
  /** A check whether aborted parked sends are worth compacting is due at the next microtask. */
  #compactScheduled = false;

  constructor(host: SendAbortsHost) {
    this.#host = host;
  }

  /** `entry` (whose ID followed `prevAssigned`) waits on `signal`. */
  join(entry: Entry, signal: AbortSignal, prevAssigned: bigint): void {
    // Its extra may hold the send of its key it took over (set when its key was accepted).
    const extra = (entry.extra ??= {});
    extra.prevAssigned = prevAssigned;
    extra.abortGroup = this.#groups.join(signal, entry);
  }

  /** A signal aborted: its waiting sends, in ID order, with one error for them all. */
  #aborted(entries: readonly Entry[], signal: AbortSignal): void {
    const error = abortError(signal);
    for (const e of entries) this.#abort(e, error);
  }

  #abort(entry: Entry, error: DedupError): void {
    const host = this.#host;
    const extra = entry.extra!;
    extra.abortGroup = undefined;
    // Still waiting for room, and nobody else waits for it (repeats of its key that passed no
    // signal): it never reaches the store or the wire, and its key is free again. When its ID is
    // the last handed out, the next send gets it (explicit IDs: the caller may send it again).
    if (host.queue.isParked(entry) && (extra.keyWaiters?.length ?? 0) === 0) {
      host.keyed?.forget(entry, error);
      // O(1) here, whether one shared signal aborts every parked send in one dispatch or each
      // send's own signal (AbortSignal.timeout) fires on its own: the queue skips aborted entries
      // when they reach its head and compacts only once they are at least half of it, not one
      // O(n) pass per abort (issue 32, item 9: 20 000 per-send signals visited 200 M entries).
      host.queue.drop(entry);
      if (host.idMode === 'explicit') {
        // The caller's IDs: only the last can be handed back (an earlier one is below later IDs).
        if (entry.publishingId === host.lastAssigned() && extra.prevAssigned !== undefined) {
          host.setLastAssigned(extra.prevAssigned);
        }
      } else {
        // Automatic and keyed IDs of sends still waiting are unwritten, unsent and unseen by any
        // caller: the later ones move down, so an abort leaves no hole in the stream, and the
        // last parked ID (the last handed out) is one lower. A skip it declared moves to the
        // entry that then has its ID, or waits for the next send.
        host.setLastAssigned(host.lastAssigned() - 1n);
      }
      if (!this.#compactScheduled) {
        this.#compactScheduled = true;
        queueMicrotask(() => {
          this.#compactScheduled = false;
          host.queue.compactIfWorthIt();
        });
      }
    }
    // Otherwise the message may be published anyway; only the caller stops waiting.
    entry.settle(error);
  }
}
