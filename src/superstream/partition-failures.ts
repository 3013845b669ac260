/**
 * Hears every partition's fatal error from the moment its publisher core exists: while other
 * partitions are still opening (the open then fails with it) and after (the publisher stops).
 * Not part of the public API.
 */
import type { DedupError } from '../errors.js';
import type { DedupPublisherCore } from '../publisher/core.js';

/** Where a partition's fatal error goes once the super stream publisher exists. */
export type PartitionFailed = (partition: string, error: DedupError) => void;

/**
 * Watches the cores of a super stream's partitions. A failure heard before {@link
 * PartitionFailures.forward} is kept (the first one), for the open to throw; after it, each is
 * handed on.
 *
 * @internal
 */
export class PartitionFailures {
  #first: { readonly partition: string; readonly error: DedupError } | undefined;
  #forward: PartitionFailed | undefined;

  /**
   * Watches `core` from now on: its failure listener hears a fatal error at the moment it
   * happens; its `closed()` is the backstop for one that happened before the listener was
   * attached (the core then closed itself with it). Call it as soon as the core exists.
   */
  watch(partition: string, core: DedupPublisherCore): void {
    core.onFailure((error) => this.#failed(partition, error));
    void core.closed().then((error) => {
      if (error !== undefined) this.#failed(partition, error);
    });
  }

  /** The first failure heard so far, if any (before {@link PartitionFailures.forward}). */
  get first(): { readonly partition: string; readonly error: DedupError } | undefined {
    return this.#first;
  }

  /** From now on every failure goes to `to` (the publisher ignores a second one). */
  forward(to: PartitionFailed): void {
    this.#forward = to;
  }

  #failed(partition: string, error: DedupError): void {
    if (this.#forward !== undefined) this.#forward(partition, error);
    else this.#first ??= { partition, error };
  }
}
