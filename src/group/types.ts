/**
 * The consumer group's public types: its options, its handler, its assignment events and its
 * counters.
 */
import type {
  EffectTransaction,
  SubscriptionOptions,
  VerifiedMessage,
  VerifyingConsumerOptions,
} from '../consumer/types.js';
import type { ConsumerStoreProvider } from '../consumer/consumer-store.js';
import type { DedupStore } from '../store/store.js';
import type { StreamConnectionOptions } from '../transport/util.js';

/**
 * Processes one new message of `partition`; whatever it writes through `tx` commits atomically
 * with the partition's dedup state and offset, and goes to the partition's changelog with them.
 * With a member's own store (the changelog strategy) it must be a deterministic function of the
 * message and of what it reads through `tx` (no clock, no randomness, no outside state): during a
 * hand-over two members may process the same messages, and the changelog keeps the values of one
 * of them (docs/design.md §12). With a `PostgresStore` (`tx` is then its `PostgresTransaction`) it
 * need not be: the effect and the fence are one transaction (docs/design.md §13.1; since 0.6.0).
 *
 * @remarks Since 0.5.0
 */
export type GroupMessageHandler = (
  message: VerifiedMessage,
  tx: EffectTransaction,
  partition: string,
) => void | Promise<void>;

/**
 * A partition came to this member (its state restored from the changelog) or left it.
 *
 * @remarks Since 0.5.0
 */
export type AssignmentEvent =
  | {
      /** The partition came to this member (restored from its changelog, subscribed). */
      readonly kind: 'assigned';
      /** The partition's stream name. */
      readonly partition: string;
      /** The partition's last committed offset after the restore (`undefined`: nothing yet). */
      readonly offset: bigint | undefined;
      /** Changelog entries applied to this member's store by the restore. */
      readonly restored: number;
      /** How long the take-over took, from the broker's activation to the first delivery asked for. */
      readonly ms: number;
    }
  | {
      /** The partition left this member. */
      readonly kind: 'revoked';
      /** The partition's stream name. */
      readonly partition: string;
      /** Why: given to another member, a lost connection, a fenced changelog write, close. */
      readonly reason: string;
    };

/**
 * The options of `SuperStreamVerifyingConsumer.open` whatever the store: those of a verifying
 * consumer (they apply to every partition), and the super stream. See
 * {@link SuperStreamVerifyingConsumerOptions}, which adds the store and the options of its strategy.
 *
 * @remarks Since 0.6.0 (before, these were part of `SuperStreamVerifyingConsumerOptions`).
 */
export interface SuperStreamVerifyingConsumerCommonOptions
  extends
    Omit<VerifyingConsumerOptions, 'handler' | 'scopeTtlMs' | 'hooks' | 'store' | 'sync'>,
    SubscriptionOptions {
  /** The super stream whose partitions the group shares. */
  readonly superStream: string;
  /**
   * The group's name: every member of one group uses the same. It is the single-active-consumer
   * reference on each partition, part of each partition's changelog name
   * (`<partition>.<consumerName>.changelog`) and of the keys in the member's store. It may not
   * hold a '.' (`DEDUP_UNSAFE_OPTIONS`): with one, two groups could share a changelog.
   */
  readonly consumerName: string;
  /** The handler, applied once per new message of the partitions this member holds. */
  readonly handler: GroupMessageHandler;
  /**
   * Connection parameters; defaults as for `StreamDedupPublisher`.
   * @defaultValue `{ hostname: 'localhost', port: 5552, username: 'guest', password: 'guest', vhost: '/' }`
   */
  readonly connection?: StreamConnectionOptions;
  /**
   * Observation hooks around each commit of a partition this member holds (for example fault
   * injection in tests): `beforeCommit` before the batch goes to the changelog, `afterCommit` once
   * it is in the changelog and in this member's store, before its messages are settled. A hook
   * that throws stops the member, as in `VerifyingConsumerOptions.hooks`.
   * @defaultValue none
   */
  readonly hooks?: {
    /** Before the batch goes to the changelog. @defaultValue none */
    readonly beforeCommit?: (info: CommitInfo) => void;
    /** Once the batch is in the changelog and in this member's store. @defaultValue none */
    readonly afterCommit?: (info: CommitInfo) => void;
  };
  /** Observation: partitions coming to this member and leaving it. @defaultValue none */
  readonly onAssignment?: (event: AssignmentEvent) => void;
  /**
   * How often the member reads the lag of each partition it holds for the
   * `stream_dedup.verifier.lag` gauge (attributes `consumer` = the group's name, `stream` = the
   * partition), in ms: one stream stats query per held partition each time; `0`: never (the gauge
   * is not reported). A partition the member loses is no longer reported from that moment.
   * @defaultValue 30000
   * @remarks Since 0.6.0
   */
  readonly lagIntervalMs?: number;
  /**
   * Not supported in a group: an eviction would not be in the changelog. Must be absent or 0.
   * @defaultValue 0
   */
  readonly scopeTtlMs?: 0;
}

/**
 * A member that keeps its own store (a LevelDB folder or a `DedupStore`) and restores a partition
 * from the partition's changelog when it takes the partition over: the changelog strategy.
 *
 * @remarks Since 0.6.0 (before, these were part of `SuperStreamVerifyingConsumerOptions`).
 */
export interface SuperStreamChangelogConsumerOptions extends SuperStreamVerifyingConsumerCommonOptions {
  /** This member's LevelDB folder (opened and closed by the member) or an opened `DedupStore`. */
  readonly store: string | DedupStore;
  /** fsync every commit; only when `store` is a path. @defaultValue false */
  readonly sync?: boolean;
  /**
   * How long appending one batch to its changelog may take, reconnections included (an integer
   * ≥ 1). After it, the member drops the partition and subscribes to it again.
   * @defaultValue 30000
   */
  readonly appendTimeoutMs?: number;
  /**
   * How many batches of a partition may be on their way to its changelog at once (an integer from
   * 1 to 32). Batch n + 1 is appended while batch n waits for its confirm and the broker's last
   * ID; each batch is written to this member's store only after its own entry was confirmed and
   * checked, in order, and a batch whose entry was fenced (another member wrote past it) or failed
   * takes every later batch with it: none of them is written here. 1 appends one batch at a time
   * (each waits for the one before it to be written). At any depth, a batch is written and
   * reported only while the member can show it still holds the partition (a round trip on its
   * subscription's connection within the last 500 ms): a batch decided before the process was
   * paused (SIGSTOP, a long GC) is dropped after it, not written, once the partition moved. Each
   * batch in flight holds its writes in memory; `hooks.beforeCommit` of batch n + 1 may run before
   * `hooks.afterCommit` of batch n.
   *
   * @remarks Since 0.6.0
   * @defaultValue 4
   */
  readonly appendsInFlight?: number;
  /** How long restoring a partition from its changelog may take (an integer ≥ 1). @defaultValue 300000 */
  readonly restoreTimeoutMs?: number;
  /**
   * The stalled-partition watch (an integer ≥ 0; 0 turns it off). RabbitMQ can leave a
   * partition's single-active-consumer group with members but no active one, for good (seen with
   * RabbitMQ 4.0 when a node dies; docs/design.md §12). A member subscribed to a partition it is
   * not active on checks, every `stalledPartitionMs / 6` (1 to 10 s), whether the partition has
   * input that no member has appended to the changelog; once such input has waited this long, it
   * leaves the partition's group for a while and joins again (`stats.rejoins`), as every member of
   * a stuck group does, which starts the group again. A healthy group whose active member takes
   * longer than this over one chunk (a slow restore or handler) is rebalanced: exact, but slower.
   * Must be more than `commitLingerMs`.
   * @defaultValue 60000
   */
  readonly stalledPartitionMs?: number;
  /**
   * A name for the `tenant` function, which every member of the group compares (a non-empty string
   * of at most 64 UTF-8 bytes; only with `tenant`). Members must compute the same tenants, but a
   * function cannot be compared: without a name only its presence is. Change the name whenever the
   * function's result changes; a member that then restores a record of another name after one of
   * its own stops with `DEDUP_UNSAFE_OPTIONS`.
   *
   * @remarks Since 0.6.0
   * @defaultValue none: only whether `tenant` is given is compared
   */
  readonly tenantVersion?: string;
  /**
   * Write a snapshot of a partition's state into its changelog once this many entries (an integer
   * ≥ 0; 0: not by entries) were appended since the last one. A member that takes the partition
   * over with an empty store reads the latest complete snapshot and the entries after it instead
   * of the whole changelog (docs/design.md §12.1). Each snapshot writes every key of the
   * partition once; the batch it goes before waits for it.
   *
   * @remarks Since 0.6.0
   * @defaultValue 10000
   */
  readonly snapshotEveryEntries?: number;
  /**
   * Write a snapshot once the entries appended since the last one hold this many bytes (an
   * integer ≥ 0; 0: not by bytes). Both options 0: no snapshots.
   *
   * @remarks Since 0.6.0
   * @defaultValue 67108864 (64 MiB)
   */
  readonly snapshotEveryBytes?: number;
  /**
   * A retention policy the library gives each changelog it creates (docs/design.md §12.2):
   * `maxLengthBytes` (stream argument `max-length-bytes`, at least 65536) and `segmentBytes`
   * (`stream-max-segment-size-bytes`, default `maxLengthBytes / 8`). Refused with
   * `DEDUP_UNSAFE_OPTIONS` before any I/O unless a complete snapshot stays inside what the broker
   * keeps: `snapshotEveryBytes > 0`, `snapshotEveryBytes ≤ maxLengthBytes / 4`,
   * `segmentBytes ≤ maxLengthBytes / 8`; `maxAge` is refused (snapshots are written by volume, not
   * time). An existing changelog keeps the arguments it was created with (a member whose differ
   * logs a warning). A take-over whose latest snapshot was trimmed away stops with
   * `DEDUP_CHANGELOG_INVALID`.
   *
   * @remarks Since 0.6.0
   * @defaultValue none: changelogs keep every entry
   */
  readonly changelogRetention?: {
    /** The changelog's `max-length-bytes`: an integer ≥ 65536. */
    readonly maxLengthBytes: number;
    /**
     * The changelog's `stream-max-segment-size-bytes` (the broker trims whole segments): at most
     * `maxLengthBytes / 8`.
     *
     * @defaultValue `maxLengthBytes / 8`
     */
    readonly segmentBytes?: number;
  };
  /**
   * Warm standbys (docs/design.md §12.3): how many partitions this member does not hold it keeps a
   * copy of (an integer from 0 to 1000; 0: none). The copy is the state a take-over's restore
   * would write, brought up to the changelog's end every 250 ms under keys of its own in this
   * member's store (never an effect, never the consumer's offset, never read by the handler). A
   * take-over of a partition this member has a copy of starts from it and reads only the entries
   * after it; a copy that cannot be used (older than the store, before what retention kept) is
   * ignored. Each member picks the partitions it does not hold that rank highest for its own ID:
   * members do not know each other, so a partition may have no standby, or several. Each copy costs
   * a reader connection 4 times a second and the partition's state on disk.
   *
   * @remarks Since 0.6.0
   * @defaultValue 0
   */
  readonly standbyReplicas?: number;
}

/**
 * Members that share a `PostgresStore` (`stream-dedup/postgres`): a partition's state is in the
 * database, no changelog is kept, and the options of the changelog strategy are refused
 * (`DEDUP_UNSAFE_OPTIONS` at run time, for a caller the types do not reach).
 *
 * @remarks Since 0.6.0
 */
export interface SuperStreamSharedDatabaseConsumerOptions extends SuperStreamVerifyingConsumerCommonOptions {
  /** The `PostgresStore` every member of the group opens on the same database and schema. */
  readonly store: ConsumerStoreProvider;
  /** Left out: the database commits. @defaultValue none */
  readonly sync?: undefined;
  /** Left out: no changelog. @defaultValue none */
  readonly appendTimeoutMs?: undefined;
  /** Left out: no changelog. @defaultValue none */
  readonly appendsInFlight?: undefined;
  /** Left out: no changelog. @defaultValue none */
  readonly restoreTimeoutMs?: undefined;
  /** Absent or 0: the stalled-partition watch reads the changelog. @defaultValue 0 */
  readonly stalledPartitionMs?: 0;
  /** Left out: no changelog records carry it. @defaultValue none */
  readonly tenantVersion?: undefined;
  /** Left out: no changelog. @defaultValue none */
  readonly snapshotEveryEntries?: undefined;
  /** Left out: no changelog. @defaultValue none */
  readonly snapshotEveryBytes?: undefined;
  /** Left out: no changelog. @defaultValue none */
  readonly changelogRetention?: undefined;
  /** Left out: no changelog to tail. @defaultValue none */
  readonly standbyReplicas?: undefined;
}

/**
 * Options of `SuperStreamVerifyingConsumer.open`. With a `PostgresStore` the options of the
 * changelog strategy (`sync`, `appendTimeoutMs`, `restoreTimeoutMs`, `stalledPartitionMs`,
 * `tenantVersion`) are left out: the types say what `open()` checks at run time.
 *
 * @remarks Since 0.5.0; a union of {@link SuperStreamChangelogConsumerOptions} and
 *   {@link SuperStreamSharedDatabaseConsumerOptions} since 0.6.0 (before, one interface).
 */
export type SuperStreamVerifyingConsumerOptions =
  SuperStreamChangelogConsumerOptions | SuperStreamSharedDatabaseConsumerOptions;

/**
 * What the commit hooks of a group member are told.
 *
 * @remarks Since 0.5.0
 */
export interface CommitInfo {
  /** The partition of the batch. */
  readonly partition: string;
  /** Messages in the batch. */
  readonly messages: number;
  /** The batch's last offset. */
  readonly lastOffset: bigint;
}

/**
 * A member's counters since open.
 *
 * @remarks Since 0.5.0
 */
export interface GroupStats {
  /** Take-overs: each restored a partition from its changelog and opened it. */
  restores: number;
  /** Changelog entries applied to this member's store by those restores. */
  entriesRestored: number;
  /** Batches dropped because another member had written past them in the changelog. */
  fenced: number;
  /**
   * Times this member left a partition's group and joined again because the partition had input
   * no member applied (`stalledPartitionMs`).
   */
  rejoins: number;
  /**
   * Changelog snapshots this member wrote (`snapshotEveryEntries`, `snapshotEveryBytes`).
   * @remarks Since 0.6.0
   */
  snapshotsWritten: number;
  /**
   * Take-overs that began at a changelog snapshot instead of the changelog's head.
   * @remarks Since 0.6.0
   */
  snapshotRestores: number;
  /**
   * Take-overs that began from this member's standby copy of the partition (`standbyReplicas`).
   * @remarks Since 0.6.0
   */
  standbyTakeOvers: number;
}
