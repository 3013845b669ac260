/**
 * A group member's proof that it still holds a partition, asked before each local write and each
 * commit report (docs/design.md §12, "After a pause"). A process stopped (SIGSTOP, a frozen VM, a
 * long GC) past its heartbeat loses its partitions without hearing it; when it runs again, what it
 * had decided before the stop — a batch whose changelog entry landed, a LevelDB write under way —
 * completes before the closed connection is read, and even a fresh last-ID check cannot tell: the
 * new holder writes the same IDs for the same batch cuts. So a batch is written, and reported, only
 * while the member has a *lease*: an answer, with no loss heard, to a round trip on the partition's
 * subscription connection sent less than `boundMs` ago. The broker moves the partition away from a
 * member only by a consumer update on that connection (read before the answer: the member drops the
 * partition first) or by closing it after its heartbeat time-out, at least one heartbeat (≥ 1 s)
 * after the last bytes it received — the round trip's request among them.
 */
import { errorText } from '../transport/util.js';
import { PartitionMoved } from './strategy.js';

/**
 * How long a lease lasts: half the shortest heartbeat the stream protocol can negotiate (1 s), so
 * that the broker cannot have moved the partition by a heartbeat time-out within it.
 *
 * @internal
 */
export const LEASE_MS = 500;

/**
 * How many round trips in a row may be answered later than the bound before the hold is taken as
 * lost (the member subscribes again, as after a failed round trip): one stale answer is a pause
 * between send and read, and the next round trip decides; a broker that answers every time slower
 * than the bound cannot keep a lease at all, and must not hold the gate for ever.
 *
 * @internal
 */
export const MAX_STALE_ANSWERS = 3;

/** @internal */
export interface HoldLeaseOptions {
  readonly partition: string;
  /** How long an answered round trip proves the hold, from when it was sent (default {@link LEASE_MS}). */
  readonly boundMs?: number;
  /** One round trip on the subscription's connection: resolves once answered, rejects when it cannot be. */
  readonly roundTrip: () => Promise<void>;
  /** True while the activation is the partition's current one (no loss heard). */
  readonly isCurrent: () => boolean;
  /** A round trip failed while current: the member lets the partition go and subscribes again. */
  readonly lost: (why: string) => void;
  /** Milliseconds, never going back (tests give a fake one; default {@link pauseClock}). */
  readonly clock?: () => number;
}

/** @internal */
export class HoldLease {
  readonly #o: HoldLeaseOptions;
  readonly #bound: number;
  readonly #clock: () => number;
  /** When the last answered round trip was sent: none yet at an activation. */
  #provenAt = Number.NEGATIVE_INFINITY;
  /** The round trip under way: batches that wait for one share it. */
  #proving: Promise<void> | undefined;

  constructor(options: HoldLeaseOptions) {
    this.#o = options;
    this.#bound = options.boundMs ?? LEASE_MS;
    this.#clock = options.clock ?? pauseClock();
  }

  /**
   * Whether a batch may be written (or its commit reported) now: `undefined` when the lease holds
   * (no await: the write starts in this call), else a promise of a new round trip that resolves when
   * it proves the hold and rejects with {@link PartitionMoved} when it does not (the batch is
   * dropped, and every later one). Past half the bound a round trip is started ahead, not waited for.
   */
  gate(): Promise<void> | undefined {
    if (!this.#o.isCurrent()) {
      return Promise.reject(new PartitionMoved(this.#o.partition, 'moved before its batch was written'));
    }
    const age = this.#clock() - this.#provenAt;
    if (age <= this.#bound / 2) return undefined;
    const proving = (this.#proving ??= this.#prove().finally(() => (this.#proving = undefined)));
    if (age > this.#bound) return proving;
    proving.catch(() => undefined);
    return undefined;
  }

  /**
   * Starts a round trip now, without waiting for it, unless the lease is fresh (within half the
   * bound) or one is under way: called as a batch is handed to the changelog, so that the proof
   * travels with the entry and the gate after the append finds it answered. Before, the first
   * batch of an activation (and any batch after a quiet half second) waited for its append, then
   * for a round trip. What it proves is the same: the hold at the round trip's sending.
   */
  proveAhead(): void {
    if (!this.#o.isCurrent() || this.#clock() - this.#provenAt <= this.#bound / 2) return;
    (this.#proving ??= this.#prove().finally(() => (this.#proving = undefined))).catch(() => undefined);
  }

  /**
   * Sends round trips until one is answered within the bound of its sending: an answer read later
   * (the process stopped between the send and the read, the answer first in the socket buffer)
   * proves nothing — the broker may have moved the partition since. After
   * {@link MAX_STALE_ANSWERS} such answers in a row the hold is taken as lost.
   */
  async #prove(): Promise<void> {
    for (let stale = 0; ;) {
      const sentAt = this.#clock();
      try {
        await this.#o.roundTrip();
      } catch (err) {
        if (this.#o.isCurrent()) {
          this.#o.lost(`could not show that it still holds the partition: ${errorText(err)}`);
        }
        throw new PartitionMoved(this.#o.partition, 'could not show that it still holds it', { cause: err });
      }
      if (!this.#o.isCurrent())
        throw new PartitionMoved(this.#o.partition, 'moved while its hold was checked');
      const took = this.#clock() - sentAt;
      if (took <= this.#bound) {
        this.#provenAt = Math.max(this.#provenAt, sentAt);
        return;
      }
      if (++stale >= MAX_STALE_ANSWERS) {
        const why = `${stale} round trips in a row answered after more than ${this.#bound} ms (last ${Math.round(took)} ms)`;
        this.#o.lost(`could not show that it still holds the partition: ${why}`);
        throw new PartitionMoved(this.#o.partition, `could not show that it still holds it: ${why}`);
      }
    }
  }
}

/**
 * A clock in ms for "how long since": it advances as the monotonic clock does, and also by the
 * wall clock's forward jumps — Linux's monotonic clock stops while the machine is suspended, the
 * broker's time does not. A wall clock set forward costs one needless round trip; set back, nothing.
 *
 * @internal
 */
export function pauseClock(): () => number {
  let mono = performance.now();
  let wall = Date.now();
  let value = 0;
  return () => {
    const m = performance.now();
    const w = Date.now();
    value += Math.max(m - mono, w - wall, 0);
    mono = m;
    wall = w;
    return value;
  };
}
