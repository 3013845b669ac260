/**
 * The batch records one relay life sent to a target and has not deleted yet (docs/design.md §14):
 * which record a confirmed ID belongs to, and which records the broker confirmed in full.
 */

/** A batch record in flight: its IDs `first` … `last`; `sent` rows sent, `left` of them unconfirmed. */
export interface SentBatch {
  readonly first: bigint;
  readonly last: bigint;
  readonly sent: number;
  left: number;
}

/** @internal */
export class SentBatches {
  /** In ID order (records are numbered, and recovered, in ascending order). */
  #open: SentBatch[] = [];
  #done: SentBatch[] = [];

  /** A record of `size` IDs from `first`, `sent` of them (its last ones) sent by this life. */
  add(first: bigint, size: number, sent: number): void {
    this.#open.push({ first, last: first + BigInt(size) - 1n, sent, left: sent });
  }

  /** Counts the confirm of `id`; true when it completed its record. */
  confirm(id: bigint): boolean {
    let lo = 0;
    let hi = this.#open.length - 1;
    while (lo <= hi) {
      const mid = (lo + hi) >> 1;
      const b = this.#open[mid]!;
      if (id < b.first) hi = mid - 1;
      else if (id > b.last) lo = mid + 1;
      else {
        if (--b.left !== 0) return false;
        this.#done.push(b);
        return true;
      }
    }
    return false;
  }

  get hasDone(): boolean {
    return this.#done.length > 0;
  }

  /** The records confirmed in full, not yet deleted (taken out). */
  takeDone(): SentBatch[] {
    const done = this.#done;
    this.#done = [];
    return done;
  }

  /** `done` were deleted: forgets them; the rows they held and their highest ID. */
  deleted(done: readonly SentBatch[]): { count: number; lastId: bigint } {
    const gone = new Set(done);
    this.#open = this.#open.filter((b) => !gone.has(b));
    let count = 0;
    let lastId = 0n;
    for (const b of done) {
      count += b.sent;
      if (b.last > lastId) lastId = b.last;
    }
    return { count, lastId };
  }
}
