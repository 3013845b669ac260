/**
 * What every partition of one group member shares (partition.ts, and the strategy that brings its
 * state: changelog-strategy.ts, shared-db-strategy.ts). A file of its own so that the strategies
 * need not import the partition that uses them.
 */
import type { ConsumerStoreProvider } from '../consumer/consumer-store.js';
import type { ResolvedSubscriptionOptions, ResolvedVerifyingConsumerOptions } from '../consumer/options.js';
import type { DedupStore } from '../store/store.js';
import type { ChangelogRetention } from './changelog-retention.js';
import type { SnapshotPolicy } from './snapshot-writer.js';
import type { StreamConnectionOptions } from '../transport/util.js';
import type {
  AssignmentEvent,
  GroupMessageHandler,
  GroupStats,
  SuperStreamVerifyingConsumerOptions,
} from './types.js';

/**
 * What every partition of one member shares.
 *
 * @internal
 */
export interface PartitionSettings {
  readonly superStream: string;
  readonly consumerName: string;
  readonly partition: string;
  /** The partition's namespace in the store: the name its core's keys are kept under. */
  readonly namespace: string;
  /** The changelog strategy's stream and producer name (unused with a shared database). */
  readonly changelog: string;
  readonly changelogProducer: string;
  /** The member's store: its own LevelDB store (changelog strategy) or a shared database. */
  readonly store: DedupStore | ConsumerStoreProvider;
  readonly consumer: ResolvedVerifyingConsumerOptions;
  /** The name of the `tenant` function that members compare (`tenantVersion`), if given. */
  readonly tenantVersion?: string | undefined;
  readonly handler: GroupMessageHandler;
  readonly hooks: SuperStreamVerifyingConsumerOptions['hooks'];
  readonly subscription: ResolvedSubscriptionOptions;
  readonly connection: StreamConnectionOptions;
  readonly appendTimeoutMs: number;
  /** Changelog appends of the partition that may be in flight at once (`appendsInFlight`; default 4). */
  readonly appendsInFlight?: number;
  readonly restoreTimeoutMs: number;
  /** When the changelog strategy writes snapshots (§12.1); absent: never. */
  readonly snapshots?: SnapshotPolicy | undefined;
  /** The retention changelogs are created with (§12.2); absent: none. */
  readonly retention?: ChangelogRetention | undefined;
  /** The member's standby tail (§12.3), when `standbyReplicas` > 0: a take-over claims its partition. */
  readonly standby?:
    { claim(partition: string): Promise<void>; release(partition: string): void } | undefined;
  /** `stalledPartitionMs`: 0 turns the stalled-partition watch off. */
  readonly stalledMs: number;
  readonly onAssignment: ((event: AssignmentEvent) => void) | undefined;
  readonly stats: GroupStats;
  /** Stops the whole member with `error` (a handler threw, a changelog is invalid). */
  readonly fail: (error: Error) => void;
}
