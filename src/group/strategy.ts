/**
 * The two strategies of a group member's partition (docs/design.md §12, §13), chosen by the store:
 * the changelog strategy (LevelDB: each member keeps its own state, a partition moves through its
 * changelog stream) and the shared-database strategy (PostgreSQL: the members share the database,
 * a partition moves with nothing to restore). The member's common part (partition.ts) subscribes,
 * follows the broker's activations and drops a partition it loses; a strategy opens the
 * partition's core on an activation and says where delivery starts.
 */
import type { Client } from 'rabbitmq-stream-js-client';
import { DedupError } from '../errors.js';
import type { Journal } from '../consumer/commit-pipeline.js';
import type { VerifyingConsumerCore } from '../consumer/core.js';
import type { GroupStats } from './types.js';
import type { Logger } from '../telemetry/logger.js';
import type { ChunkIdentity } from '../store/chunk-identity.js';
import { planResume, type ResumePlan } from '../transport/stream-resume.js';

/**
 * Thrown into a partition's core when the partition moved away while a batch was being appended
 * (or the append failed, or was fenced): the batch is not written to the store, and the core is
 * dropped. Expected: never logged as a consumer failure.
 *
 * @internal
 */
export class PartitionMoved extends Error {
  constructor(partition: string, why: string, options?: ErrorOptions) {
    super(`partition "${partition}" ${why}`, options);
    this.name = 'PartitionMoved';
  }
}

/**
 * What a strategy may ask of the member's common part.
 *
 * @internal
 */
export interface PartitionHost {
  readonly partition: string;
  readonly consumerName: string;
  readonly stats: GroupStats;
  readonly log: Logger;
  /** The current activation's number: bumped on every activation and every loss. */
  readonly epoch: number;
  /** Drops the partition and subscribes again (the broker decides who holds it next). */
  restart(why: string): void;
  /** Stops the whole member with `error`. */
  fail(error: Error): void;
  /** A connection for a read that is not the subscription, through the next node that answers. */
  connectReader(): Promise<Client>;
}

/**
 * A resumption's plan and the refusal its chunk check raises (see {@link planPartitionResume}).
 *
 * @internal
 */
export interface PartitionResume {
  readonly plan: ResumePlan;
  readonly refuse: (found: string) => DedupError;
}

/**
 * One activation as a strategy opened it.
 *
 * @internal
 */
export interface ActivationPlan {
  readonly core: VerifyingConsumerCore;
  /** A resumption after a commit: where, and the committed chunk to compare; `undefined`: none. */
  readonly resume: PartitionResume | undefined;
  /** The partition's committed offset as the activation found it (`undefined`: nothing yet). */
  readonly offset: bigint | undefined;
  /** Where delivery starts: an offset, or the subscription's `startFrom` when `undefined`. */
  readonly start: bigint | undefined;
  /** Changelog entries read and applied to the store (0 for the shared database). */
  readonly read: number;
  readonly applied: number;
  /** False for a delivered message that is not the partition's input (before a genesis' start). */
  readonly accept: (offset: bigint) => boolean;
}

/**
 * One activation's context: its number, whether it is still current, and the core's options.
 *
 * @internal
 */
export interface ActivationContext {
  readonly epoch: number;
  readonly current: () => boolean;
  /** Opens the partition's core over the member's store, with the strategy's journal, if any. */
  readonly openCore: (journal: Journal | undefined) => Promise<VerifyingConsumerCore>;
}

/**
 * A strategy of a member's partition.
 *
 * @internal
 */
export interface PartitionStrategy {
  /** Brings the partition's state here (if anything must be) and opens its core. */
  activate(context: ActivationContext): Promise<ActivationPlan>;
  /**
   * The stalled-partition watch's reading of what the group last wrote of the partition (the
   * changelog's last ID); `undefined` when the strategy has no such reading (the watch is off).
   */
  readonly lastWritten: ((client: Client, timeoutMs: number) => Promise<bigint>) | undefined;
  /** Gives up what is under way at once (close): an append in flight. */
  close(): Promise<void>;
}

/**
 * Where a partition resumes after the group committed `committed` of it (stream-resume.ts, as the
 * stream consumer): a partition that cannot be the one the group committed of — deleted and
 * recreated: empty, shorter, or another chunk where the committed one was (`chunk`, when stored) —
 * stops the member with `DEDUP_STREAM_REGRESSION`, at once or when the chunk is read again.
 *
 * @internal
 */
export async function planPartitionResume(
  client: Client,
  host: PartitionHost,
  committed: bigint,
  chunk: ChunkIdentity | undefined,
  where: string,
): Promise<PartitionResume> {
  const { partition } = host;
  const refuse = (found: string): DedupError =>
    new DedupError(
      'DEDUP_STREAM_REGRESSION',
      `partition "${partition}" ${found}, but group "${host.consumerName}" committed offset ${committed} of it ` +
        `(${where}): it was deleted and recreated. Resuming would skip its first ` +
        'messages; use a new consumerName to read it from the start',
    );
  return { plan: await planResume(client, partition, committed, chunk, refuse), refuse };
}
