/**
 * The shared-database strategy of a group member's partition (docs/design.md §13), for members
 * whose store is one database they all reach (a `PostgresStore`): the partition's offset, verifier
 * state and the handlers' effects are rows every member sees, so a partition moves with nothing to
 * restore and no changelog. An activation reads the partition's offset row and delivery starts
 * after it; each batch is one transaction whose first statement locks that row and compares it
 * with what this member last committed (the store's fence): the late batch of a member that lost
 * the partition while paused rolls back.
 */
import { PARTITION_SEPARATOR, type ConsumerStoreProvider } from '../consumer/consumer-store.js';
import { withTimeout } from '../transport/util.js';
import {
  planPartitionResume,
  PartitionMoved,
  type ActivationContext,
  type ActivationPlan,
  type PartitionHost,
  type PartitionResume,
  type PartitionStrategy,
} from './strategy.js';

/**
 * The partition's name in a shared database: the consumer name its offset and verifier state are
 * kept under, `<group>` U+001F `<partition>`. Neither a group's name nor a plain consumer's on such
 * a store may hold U+001F (checkPlainName, before any I/O), so the first U+001F ends the group's
 * name (no two pairs share a name) and no plain consumer's name is a partition's (it would share
 * the partition's offset row and scopes: review A's finding 2 with '.'). PostgreSQL's text holds
 * no NUL, which the changelog strategy's LevelDB namespace uses.
 *
 * @internal
 */
export function sharedPartitionName(consumerName: string, partition: string): string {
  return `${consumerName}${PARTITION_SEPARATOR}${partition}`;
}

/** @internal */
export class SharedDatabaseStrategy implements PartitionStrategy {
  readonly #host: PartitionHost;

  constructor(_store: ConsumerStoreProvider, host: PartitionHost) {
    this.#host = host;
  }

  /** No changelog: the stalled-partition watch, which compares it with the partition, is off. */
  readonly lastWritten = undefined;

  close(): Promise<void> {
    return Promise.resolve();
  }

  async activate({ current, openCore }: ActivationContext): Promise<ActivationPlan> {
    // The core's store reads the partition's offset row (creating it when missing): the whole
    // take-over, whatever the history.
    const core = await openCore(undefined);
    const offset = core.committedOffset;
    let resume: PartitionResume | undefined;
    try {
      if (offset !== undefined) {
        const client = await this.#host.connectReader();
        try {
          resume = await planPartitionResume(
            client,
            this.#host,
            offset,
            core.committedChunk,
            'in the database',
          );
        } finally {
          await withTimeout(client.close(), 5_000, 'closing').catch(() => undefined);
        }
      }
      if (!current()) throw new PartitionMoved(this.#host.partition, 'moved');
    } catch (err) {
      await core.close().catch(() => undefined);
      throw err;
    }
    return {
      core,
      resume,
      offset,
      start: resume !== undefined ? resume.plan.offset : offset === undefined ? undefined : offset + 1n,
      read: 0,
      applied: 0,
      accept: () => true,
    };
  }
}
