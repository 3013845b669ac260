/**
 * `SuperStreamVerifyingConsumer`: one member of a consumer group over a super stream
 * (docs/design.md §12). The broker's single active consumer spreads the partitions over the
 * members; each member keeps the partitions it holds in its own store, and every committed batch
 * of a partition goes first to that partition's changelog stream, from which the next holder
 * restores before it applies anything.
 */
import { DedupError } from '../errors.js';
import type { ConsumerStoreProvider } from '../consumer/consumer-store.js';
import { effectKeyPrefix } from '../store/consumer-keys.js';
import { DedupStore } from '../store/store.js';
import { Locator } from '../superstream/partitions.js';
import { EndpointRotation, openThroughEndpoints } from '../transport/util.js';
import { readerConnector } from '../transport/reader-connector.js';
import {
  bounded,
  resolveCaughtUpOptions,
  type CaughtUpOptions,
  type ConsumerLag,
} from '../transport/stream-lag.js';
import type { Logger } from '../telemetry/logger.js';
import { checkChangelogWritable } from './changelog-writer.js';
import { changelogProducerName, resolveGroupOptions } from './options.js';
import { GroupLagGauge } from './lag-gauge.js';
import { GroupPartition } from './partition.js';
import { sharedPartitionName } from './shared-db-strategy.js';
import { groupSettings } from './changelog-identity.js';
import { StandbyTailer } from './standby-tail.js';
import type { AssignmentEvent, GroupStats, SuperStreamVerifyingConsumerOptions } from './types.js';

export { changelogProducerName, checkGroupName } from './options.js';
export type {
  AssignmentEvent,
  GroupMessageHandler,
  GroupStats,
  SuperStreamVerifyingConsumerOptions,
} from './types.js';

/** Stream names are queue names: at most 255 bytes. */
const MAX_STREAM_NAME_BYTES = 255;

/** Partitions a member subscribes to at once in `open()` (each subscription is a connection). */
const SUBSCRIBE_AT_ONCE = 8;

/**
 * The changelog stream of `partition` for group `consumerName`. Injective only because a group's
 * name holds no '.' ({@link checkGroupName}): the name is then the text between the last two
 * dots, and the partition all before. With a dot allowed, group `billing` on partition
 * `orders-eu.west` and group `west.billing` on partition `orders-eu` shared one stream.
 */
export function changelogStreamName(partition: string, consumerName: string): string {
  return `${partition}.${consumerName}.changelog`;
}

/**
 * The namespace of `partition` in a member's store: the consumer name its core keeps its offset,
 * verifier state and effects under. NUL cannot appear in a stream name, so no plain consumer's
 * name and no other partition's is the same.
 */
export function partitionNamespace(consumerName: string, partition: string): string {
  return `${consumerName}\u0000${partition}`;
}

/**
 * One member of a consumer group over a super stream, with exactly-once effects when partitions
 * move between members that have separate stores.
 *
 * Each partition is consumed through a single active consumer (reference `consumerName`): at any
 * moment the broker delivers it to one member. That member keeps the partition's offset, verifier
 * state and the handler's effects in its own store, as a `StreamVerifyingConsumer` does for a
 * stream, and appends every batch to the partition's changelog stream before it commits it. A
 * member that becomes active for a partition first restores it from the changelog; a member that
 * loses it stops applying it at once. With a `PostgresStore` (since 0.6.0) the members share the
 * database instead: no changelog, nothing restored, each batch a transaction fenced on the
 * partition's offset row (docs/design.md §13.1). See the README's "Consumer groups" for the
 * guarantees and their limits (with LevelDB handlers must be deterministic; effects outside the
 * store are the application's).
 *
 * @example
 * ```ts
 * const member = await SuperStreamVerifyingConsumer.open({
 *   superStream: 'ledger',
 *   consumerName: 'balance-projection',
 *   store: './.dedup',
 *   handler: async (message, tx) => {
 *     const balance = Number((await tx.get('balance'))?.toString() ?? 0);
 *     tx.put('balance', String(balance + Number(message.body)));
 *   },
 * });
 * ```
 *
 * @remarks Since 0.5.0
 */
export class SuperStreamVerifyingConsumer {
  /** The super stream's partitions, in the broker's order. */
  readonly partitions: readonly string[];
  /** Counters since open. */
  readonly stats: Readonly<GroupStats>;
  readonly #members: ReadonlyMap<string, GroupPartition>;
  readonly #store: DedupStore | ConsumerStoreProvider;
  readonly #ownedStore: boolean;
  readonly #consumerName: string;
  readonly #release: () => void;
  #stopping: Promise<void> | undefined;
  #resolveClosed!: (error: Error | undefined) => void;
  readonly #closed: Promise<Error | undefined>;
  #failure: Error | undefined;
  readonly #logger: Logger;
  /** The lag gauge of the partitions held (set once the member exists). */
  #lagGauge: GroupLagGauge | undefined;
  /** The standby tail (§12.3), with `standbyReplicas` > 0 once the member joined. */
  #standby: StandbyTailer | undefined;

  private constructor(
    partitions: readonly string[],
    members: ReadonlyMap<string, GroupPartition>,
    store: DedupStore | ConsumerStoreProvider,
    ownedStore: boolean,
    consumerName: string,
    release: () => void,
    stats: GroupStats,
    logger: Logger,
  ) {
    this.#logger = logger;
    this.partitions = Object.freeze([...partitions]);
    this.#members = members;
    this.#store = store;
    this.#ownedStore = ownedStore;
    this.#consumerName = consumerName;
    this.#release = release;
    this.stats = stats;
    this.#closed = new Promise((resolve) => (this.#resolveClosed = resolve));
  }

  /**
   * Checks the options (before any I/O), opens the store, finds the super stream's partitions
   * and joins the group on each of them.
   *
   * @throws TypeError, RangeError for a bad option ("Expected <option> to be <what>, got <value>").
   * @throws DedupError `DEDUP_UNSAFE_OPTIONS` for `scopeTtlMs` (an eviction would not be in the
   *   changelog), a `consumerName` with a '.' (two groups could share a changelog), or an option of
   *   the changelog strategy with a `PostgresStore` (since 0.6.0: the members then share the
   *   database, docs/design.md §13.1); `DEDUP_STORE_LOCKED`, `DEDUP_STORE_CORRUPT`, `DEDUP_BROKER_UNREACHABLE`,
   *   `DEDUP_BROKER_REFUSED` (for example a missing super stream, or a changelog that exists and may
   *   not be written by this user).
   */
  static async open(options: SuperStreamVerifyingConsumerOptions): Promise<SuperStreamVerifyingConsumer> {
    const o = resolveGroupOptions(options);
    const { consumer, consumerName, superStream, connection, subscription, strategy } = o;
    const changelogs = strategy.kind === 'changelog' ? strategy : undefined;
    // The strategy is the store's: its own LevelDB store (a partition moves through its changelog),
    // or a database the members share (a partition moves with nothing to restore).
    const owned = typeof strategy.store === 'string';
    const store: DedupStore | ConsumerStoreProvider =
      typeof strategy.store === 'string'
        ? await DedupStore.open(strategy.store, { sync: consumer.sync })
        : strategy.store;
    let release: (() => void) | undefined;
    const members = new Map<string, GroupPartition>();
    const opened: { member?: SuperStreamVerifyingConsumer; lagGauge?: GroupLagGauge } = {};
    // A partition that leaves the member leaves its lag gauge at once (then the application hears).
    const onAssignment = (event: AssignmentEvent): void => {
      if (event.kind === 'revoked') opened.lagGauge?.lost(event.partition);
      o.onAssignment?.(event);
    };
    try {
      // One member per LevelDB store: two in one store would share the partitions' namespaces. The
      // claim is the namespace of a partition with an empty name, which no stream has. A shared
      // database is shared by design: each partition's core claims its name while it holds it.
      release =
        store instanceof DedupStore
          ? store.claimConsumer(partitionNamespace(consumerName, ''))
          : () => undefined;
      const locator = new Locator(connection, subscription.connectTimeoutMs);
      let partitions: string[];
      let existingChangelogs = new Set<string>();
      try {
        partitions = await locator.partitions(superStream);
        if (changelogs !== undefined) {
          existingChangelogs = await locator
            .existing(partitions.map((p) => changelogStreamName(p, consumerName)))
            // The check is a courtesy: a metadata query that fails leaves it to the first append.
            .catch(() => new Set<string>());
        }
      } finally {
        await locator.close();
      }
      const stats: GroupStats = {
        restores: 0,
        entriesRestored: 0,
        fenced: 0,
        rejoins: 0,
        snapshotsWritten: 0,
        snapshotRestores: 0,
        standbyTakeOvers: 0,
      };
      // Take-overs claim their partition from the standby tail, which starts once the member joined.
      const standbyRef: { tailer?: StandbyTailer } = {};
      const standbyHook =
        changelogs !== undefined && changelogs.standbyReplicas > 0 && store instanceof DedupStore
          ? {
              claim: (p: string): Promise<void> => standbyRef.tailer?.claim(p) ?? Promise.resolve(),
              release: (p: string): void => standbyRef.tailer?.release(p),
            }
          : undefined;
      const fail = (error: Error): void => {
        if (opened.member !== undefined) void opened.member.#stop(error);
      };
      for (const partition of partitions) {
        const changelog = changelogStreamName(partition, consumerName);
        if (changelogs !== undefined && Buffer.byteLength(changelog, 'utf8') > MAX_STREAM_NAME_BYTES) {
          throw new RangeError(
            `Expected consumerName to be short enough for changelog stream "${changelog}" (at most 255 bytes)`,
          );
        }
        members.set(
          partition,
          new GroupPartition({
            superStream,
            consumerName,
            partition,
            namespace:
              store instanceof DedupStore
                ? partitionNamespace(consumerName, partition)
                : sharedPartitionName(consumerName, partition),
            changelog,
            changelogProducer: changelogProducerName(consumerName),
            store,
            consumer,
            tenantVersion: changelogs?.tenantVersion,
            handler: o.handler,
            hooks: o.hooks,
            subscription,
            connection,
            appendTimeoutMs: changelogs?.appendTimeoutMs ?? 0,
            appendsInFlight: changelogs?.appendsInFlight ?? 1,
            restoreTimeoutMs: changelogs?.restoreTimeoutMs ?? 0,
            snapshots: changelogs?.snapshots,
            retention: changelogs?.retention,
            standby: standbyHook,
            stalledMs: o.stalledMs,
            onAssignment,
            stats,
            fail,
          }),
        );
      }
      const member = new SuperStreamVerifyingConsumer(
        partitions,
        members,
        store,
        owned,
        consumerName,
        release,
        stats,
        consumer.logger,
      );
      opened.member = member;
      member.#lagGauge = opened.lagGauge = new GroupLagGauge(consumerName, o.lagIntervalMs, {
        held: () => member.activePartitions(),
        lag: (partition) => member.#member(partition).lag(),
      });
      // Before any handler runs: a member that may not write its changelogs is refused now, not at
      // its first append (issue 32). Only the changelogs that exist (see checkChangelogWritable).
      // Eight at a time: each check is a connection of its own, and a super stream may have a
      // thousand partitions.
      for (let i = 0; changelogs !== undefined && i < partitions.length; i += 8) {
        await Promise.all(
          partitions.slice(i, i + 8).map((partition) =>
            checkChangelogWritable({
              stream: changelogStreamName(partition, consumerName),
              exists: existingChangelogs.has(changelogStreamName(partition, consumerName)),
              producerName: changelogs.producer,
              connection,
              connectTimeoutMs: subscription.connectTimeoutMs,
            }),
          ),
        );
      }
      // SUBSCRIBE_AT_ONCE at a time (each its own connection): one after the other, a member's
      // later partitions began up to (n − 1) subscriptions and activations after its first one
      // (measured, 3 partitions: the third 0.57–1.15 s after the first, on a loaded machine). Each
      // partition's single active consumer is decided on its own: the order does not matter. All of
      // a group are settled before a failure is thrown, so that closing finds no subscribe under way.
      const endpoints = new EndpointRotation(connection).size;
      const all = [...members.values()];
      for (let i = 0; i < all.length; i += SUBSCRIBE_AT_ONCE) {
        const subscribed = await Promise.allSettled(
          all
            .slice(i, i + SUBSCRIBE_AT_ONCE)
            .map((partition) => openThroughEndpoints(endpoints, () => partition.subscribe())),
        );
        const refused = subscribed.find((s) => s.status === 'rejected');
        if (refused !== undefined) throw refused.reason;
        // A partition's activation may have stopped the member meanwhile (an invalid changelog).
        if (member.failure !== undefined) throw member.failure;
      }
      // With standbyReplicas 0 too: it then only deletes the copies an earlier life left (§12.3).
      if (changelogs !== undefined && store instanceof DedupStore) {
        member.#standby = standbyRef.tailer = new StandbyTailer({
          db: store.db,
          sync: store.sync,
          consumerName,
          partitions: partitions.map((partition) => ({
            partition,
            namespace: partitionNamespace(consumerName, partition),
            changelog: changelogStreamName(partition, consumerName),
          })),
          replicas: changelogs.standbyReplicas,
          producerName: changelogs.producer,
          settings: groupSettings(consumer, changelogs.tenantVersion),
          isActive: (partition) => members.get(partition)?.isActive === true,
          // One client for every copy, its subscription connections kept between steps.
          connect: readerConnector(connection, {
            connectTimeoutMs: subscription.connectTimeoutMs,
            keepConnections: true,
          }),
          restoreTimeoutMs: changelogs.restoreTimeoutMs,
          log: consumer.logger,
        });
      }
      consumer.logger.info(
        { consumer: consumerName, superStream, partitions, strategy: strategy.kind },
        'stream-dedup: consumer group member joined',
      );
      return member;
    } catch (err) {
      const member = opened.member;
      if (member !== undefined) await member.close();
      else {
        for (const partition of members.values()) await partition.close().catch(() => undefined);
        release?.();
        if (owned && store instanceof DedupStore) await store.close();
      }
      throw err;
    }
  }

  /** The partitions this member holds now (active, state restored), in the super stream's order. */
  activePartitions(): string[] {
    return this.partitions.filter((p) => this.#members.get(p)!.isActive);
  }

  /** The last offset of `partition` committed by this member while it holds it; `undefined` otherwise. */
  committedOffset(partition: string): bigint | undefined {
    return this.#member(partition).committedOffset;
  }

  /**
   * The lag of each partition this member holds (as {@link StreamVerifyingConsumer.lag}: offsets
   * to the first offset of the partition's last chunk, a lower bound), one stats query each.
   *
   * @throws DedupError `DEDUP_BROKER_UNREACHABLE` when a partition is lost or between
   *   subscriptions during the call, `DEDUP_BROKER_REFUSED` when a query fails.
   * @remarks Since 0.6.0
   */
  async lag(): Promise<Map<string, ConsumerLag>> {
    const held = this.activePartitions();
    const lags = await Promise.all(
      held.map(async (p) => {
        const losses = this.#lagGauge?.lossesOf(p) ?? 0;
        const lag = await this.#member(p).lag();
        // What the application reads, the gauge reports too (as a stream consumer's).
        this.#lagGauge?.record(p, lag, losses);
        return lag;
      }),
    );
    return new Map(held.map((p, i) => [p, lags[i]!]));
  }

  /**
   * Resolves once every partition this member holds at the call has committed its end as of the
   * call (as {@link StreamVerifyingConsumer.caughtUp}, per partition). A partition lost during
   * the wait keeps it waiting until `timeoutMs`.
   *
   * @throws TypeError, RangeError for a bad option, before any I/O.
   * @throws DedupError `DEDUP_ABORTED` when `timeoutMs` passes or `signal` aborts first; what
   *   {@link SuperStreamVerifyingConsumer.lag} throws; the error that stops the member (or
   *   `DEDUP_CONSUMER_CLOSED` after `close()`).
   * @remarks Since 0.6.0
   */
  async caughtUp(options?: CaughtUpOptions): Promise<void> {
    const { signal, timeoutMs } = resolveCaughtUpOptions(options);
    const wait = Promise.all(
      this.activePartitions().map(async (partition) => {
        const member = this.#member(partition);
        const { lastChunkId: last } = await member.lag();
        if (last === undefined) return;
        await this.waitForOffset(partition, last);
        // The whole last chunk was delivered with its first message.
        const delivered = member.delivered;
        if (delivered !== undefined && delivered > last) await this.waitForOffset(partition, delivered);
      }),
    );
    await bounded(wait, `a member of group "${this.#consumerName}" catching up`, signal, timeoutMs);
  }

  /**
   * Resolves once this member holds `partition` with every message up to `offset` committed (by
   * itself, or restored from the changelog when it took the partition over); rejects when the
   * member stops first (with the error that stopped it, or `DEDUP_CONSUMER_CLOSED` after `close()`).
   */
  async waitForOffset(partition: string, offset: bigint): Promise<void> {
    const member = this.#member(partition);
    const committed = member.committedOffset;
    if (committed !== undefined && committed >= offset) return;
    let unsubscribe = (): void => undefined;
    try {
      await Promise.race([
        new Promise<void>((resolve) => {
          unsubscribe = member.onCommitted((at) => {
            if (at >= offset) resolve();
          });
        }),
        this.#closed.then((error) => {
          throw (
            error ??
            new DedupError(
              'DEDUP_CONSUMER_CLOSED',
              'the consumer group member closed before reaching the offset',
            )
          );
        }),
      ]);
    } finally {
      unsubscribe();
    }
  }

  /**
   * Reads a value the handler committed for `partition` in this member's store. Current only while
   * this member holds the partition: afterwards it is what this member last restored or committed.
   */
  async readEffect(partition: string, key: string): Promise<Buffer | undefined> {
    this.#member(partition);
    if (!(this.#store instanceof DedupStore)) {
      throw new TypeError(
        'readEffect reads LevelDB effects: with a PostgresStore the handlers write their own tables (query them)',
      );
    }
    const raw = await this.#store.db.get(
      effectKeyPrefix(partitionNamespace(this.#consumerName, partition)) + key,
    );
    return raw === undefined ? undefined : Buffer.from(raw);
  }

  /** The error that stopped the member, if any. */
  get failure(): Error | undefined {
    return this.#failure;
  }

  /** Resolves when the member stopped: with the error that stopped it, or `undefined` after `close()`. */
  closed(): Promise<Error | undefined> {
    return this.#closed;
  }

  /**
   * Leaves the group: every partition is dropped (what is processed and not yet committed is
   * processed again by the next holder), subscriptions and changelog writers close, the store is
   * released. Idempotent.
   */
  close(): Promise<void> {
    return this.#stop(undefined);
  }

  /** Calls {@link SuperStreamVerifyingConsumer.close}: `await using member = await …open(…)`. */
  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }

  #member(partition: string): GroupPartition {
    const member = this.#members.get(partition);
    if (member === undefined) {
      throw new RangeError(
        `Expected partition to be one of ${this.partitions.join(', ')}, got ${JSON.stringify(partition)}`,
      );
    }
    return member;
  }

  #stop(error: Error | undefined): Promise<void> {
    this.#stopping ??= (async () => {
      this.#failure = error;
      if (error !== undefined) {
        try {
          this.#logger.error(
            { consumer: this.#consumerName, err: error },
            'stream-dedup: consumer group member stopped; its partitions go to the other members',
          );
        } catch {
          // A logger's bug must not keep the member from stopping.
        }
      }
      this.#lagGauge?.close();
      await Promise.all([
        ...[...this.#members.values()].map((m) => m.close().catch(() => undefined)),
        this.#standby?.close(),
      ]);
      this.#release();
      if (this.#ownedStore && this.#store instanceof DedupStore)
        await this.#store.close().catch(() => undefined);
      this.#resolveClosed(error);
    })();
    return this.#stopping;
  }
}
