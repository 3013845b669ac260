/**
 * A declared skip (docs/design.md §4.5) from the open that decides it to the confirm of the
 * message that declares it: the first new automatic or keyed ID carries `x-dedup-skip-from`; the
 * store keeps the skip (meta.skipFrom) until that message is confirmed, so that a crash in between
 * declares it again; an abort of the declaring message while it is parked moves the declaration to
 * the message that takes its ID.
 */
import type { Headers } from '../store/codec.js';
import type { Entry } from './entry.js';
import { withSkip } from './message.js';

export class SkipDeclaration {
  /** The first skipped ID, while no message carries the declaration yet. */
  #toDeclare: bigint | undefined;
  /** The skip the store keeps until its declaration is confirmed. */
  #persisted: bigint | undefined;
  /** The ID of the message that declares it. */
  #declaringId: bigint | undefined;
  /** The declaration was confirmed: the next group commit writes the meta without it. */
  metaDirty = false;

  constructor(skipFrom: bigint | undefined) {
    this.#toDeclare = skipFrom;
    this.#persisted = skipFrom;
  }

  /** What the store's meta records (`skipFrom`). */
  get persisted(): bigint | undefined {
    return this.#persisted;
  }

  /** The headers of a new automatic or keyed message: with the declaration if it is the first. */
  stamp(publishingId: bigint, headers: Headers | undefined): Headers | undefined {
    if (this.#toDeclare === undefined) return headers;
    const declared = withSkip(headers, this.#toDeclare);
    this.#toDeclare = undefined;
    this.#declaringId = publishingId;
    return declared;
  }

  /**
   * A parked message with ID `abortedId` was aborted and the later parked ones moved down: `heir`
   * now has its ID (or there is none). A declaration it carried goes with the ID.
   */
  moved(abortedId: bigint, heir: Entry | undefined): void {
    if (this.#declaringId !== abortedId) return;
    const from = this.#persisted!;
    if (heir === undefined) {
      this.#toDeclare = from;
      this.#declaringId = undefined;
    } else {
      heir.headers = withSkip(heir.headers, from);
    }
  }

  /** A confirm: when it is the declaring message's, the store no longer needs the skip. */
  confirmed(publishingId: bigint): void {
    if (publishingId !== this.#declaringId) return;
    this.#declaringId = undefined;
    this.#persisted = undefined;
    this.metaDirty = true;
  }
}
