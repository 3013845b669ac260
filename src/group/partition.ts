/**
 * One partition of a consumer group, as one member sees it (docs/design.md §12, §13): the member's
 * common part. A single-active subscription to the partition (the group's name as its reference,
 * the super stream's name so that the broker spreads partitions over members); when the broker
 * activates it, the partition's strategy brings its state here and opens a verifying consumer core
 * on it (strategy.ts: the changelog strategy for a member's own LevelDB store, the shared-database
 * strategy for a PostgresStore); when the broker deactivates it, its connection goes or its batch
 * is fenced, the partition is dropped at once: nothing more of it is applied or committed by this
 * member.
 */
import { Offset, type Client } from 'rabbitmq-stream-js-client';
import { DedupError } from '../errors.js';
import { VerifyingConsumerCore, type VerifyingConsumerOptions } from '../consumer/core.js';
import { isConsumerStoreProvider } from '../consumer/consumer-store.js';
import { Resubscriber, type Generation } from '../consumer/resubscribe.js';
import type { Logger } from '../telemetry/logger.js';
import {
  consumerCloseEvents,
  decodeDeliveriesOurselves,
  watchConsumerUpdates,
} from '../transport/stream-client-internals.js';
import {
  connectSubscriber,
  creditPolicyOf,
  OrderedDelivery,
  type ConsumerCreditPolicy,
  type StreamMessage,
} from '../transport/stream-delivery.js';
import { readerConnector } from '../transport/reader-connector.js';
import { lagOf, lastChunkId, type ConsumerLag } from '../transport/stream-lag.js';
import {
  EndpointRotation,
  errorText,
  explainDeclareFailure,
  StreamNotAvailableError,
  withTimeout,
} from '../transport/util.js';
import { ChangelogStrategy } from './changelog-strategy.js';
import { HoldLease } from './hold-lease.js';
import { PartitionWatch, type Subscribed } from './partition-watch.js';
import { ChangelogMissing, RestoreStoreError } from './restore.js';
import { permanentRefusal } from './refusal.js';
import { SharedDatabaseStrategy } from './shared-db-strategy.js';
import type { PartitionSettings } from './partition-settings.js';
import { PartitionMoved, type PartitionHost, type PartitionStrategy } from './strategy.js';
import type { AssignmentEvent } from './types.js';

/**
 * How long take-overs must keep hearing that the changelog does not exist before a member that holds
 * state from it believes it deleted and stops (DEDUP_CHANGELOG_INVALID): no member recreates it (a
 * member with state does not write before it restored), so waiting longer only repeats the warning.
 */
const MISSING_CHANGELOG_MS = 30_000;

/** One activation: the core and the deliveries of one period as the partition's active consumer. */
interface Activation {
  readonly epoch: number;
  readonly core: VerifyingConsumerCore;
  readonly delivery: OrderedDelivery;
  readonly isCurrent: () => boolean;
  /** The subscription that was activated: deliveries of any other are dropped. */
  readonly generation: Generation<Client>;
}

/** @internal */
export class GroupPartition {
  readonly #s: PartitionSettings;
  /** The commit hooks of the partition's cores: the group's, told the partition. */
  readonly #hooks: NonNullable<VerifyingConsumerOptions['hooks']>;
  readonly #log: Logger;
  readonly #endpoints: EndpointRotation;
  readonly #strategy: PartitionStrategy;
  readonly #subscriptions: Resubscriber<Client>;
  /** Bumped on every activation and every loss: what an older one started is dropped. */
  #epoch = 0;
  #active: Activation | undefined;
  /** The closing of the last core: the next activation waits for it (it holds the namespace). */
  #closingCore: Promise<void> = Promise.resolve();
  /** The last activation (its strategy's work and core opening), which the next one and close() wait for. */
  #activating: Promise<void> = Promise.resolve();
  /** Set by the consumer-update watch just before the client calls our listener. */
  #updateActive: boolean | undefined;
  #closed = false;
  /**
   * The first offset this member was delivered of the partition while nothing was committed (a
   * shared database's partition before its first commit has no stored start): a later activation
   * here starts there, not at startFrom 'next' again (review B, finding 1).
   */
  #firstDelivered: bigint | undefined;
  readonly #commitListeners = new Set<(offset: bigint) => void>();
  /** The current subscription attempt. */
  #generation: Generation<Client> | undefined;
  /** The subscription in place (its consumer declared), for the stalled-partition watch. */
  #subscribed: Subscribed | undefined;
  /** The highest offset delivered to any activation of this member (its `caughtUp`). */
  #delivered: bigint | undefined;
  /** Activations under way: the watch waits while there are any. */
  #activations = 0;
  readonly #watch: PartitionWatch | undefined;
  /** The reads that are not the subscription's (restore, genesis, watch): their own node rotation. */
  readonly #readers: () => Promise<Client>;
  /** Since when every take-over heard that the changelog does not exist (this member holding state). */
  #missingSince: number | undefined;

  constructor(settings: PartitionSettings) {
    this.#s = settings;
    const { hooks, partition } = settings;
    this.#hooks = {
      beforeCommit: hooks?.beforeCommit && ((info) => hooks.beforeCommit!({ partition, ...info })),
      afterCommit: hooks?.afterCommit && ((info) => hooks.afterCommit!({ partition, ...info })),
    };
    this.#log = settings.consumer.logger;
    this.#endpoints = new EndpointRotation(settings.connection);
    this.#readers = readerConnector(settings.connection, {
      connectTimeoutMs: settings.subscription.connectTimeoutMs,
    });
    const host = this.#host();
    // The strategy is the store's: members that share a database need no changelog.
    this.#strategy = isConsumerStoreProvider(settings.store)
      ? new SharedDatabaseStrategy(settings.store, host)
      : new ChangelogStrategy(settings, settings.store, host);
    const lastWritten = this.#strategy.lastWritten;
    this.#watch =
      lastWritten === undefined
        ? undefined
        : new PartitionWatch({
            partition,
            consumerName: settings.consumerName,
            stalledMs: settings.stalledMs,
            log: this.#log,
            stats: settings.stats,
            lastWritten,
            connectReader: () => this.#connectReader(),
            subscribed: () => this.#subscribed,
            mayWatch: (generation) => this.#mayWatch(generation),
            leave: (generation, ms) => {
              this.#subscribed = undefined;
              this.#subscriptions.leave(generation, ms);
            },
          });
    const committed = (): bigint | undefined => this.#active?.core.committedOffset;
    this.#subscriptions = new Resubscriber<Client>({
      subscribe: (generation) => this.#subscribe(generation),
      core: {
        consumerName: settings.consumerName,
        get committedOffset() {
          return committed();
        },
        discardPending: () => undefined,
      },
      reconnect: settings.subscription.reconnect,
      logger: this.#log,
      target: { stream: settings.partition },
      // A new subscription: whatever the old one had is gone (the broker may give it to another member).
      onNewGeneration: () => this.#lose(this.#closed ? 'closed' : 'lost its subscription'),
    });
  }

  get name(): string {
    return this.#s.partition;
  }

  /** True while this member is the partition's active consumer (its state restored). */
  get isActive(): boolean {
    return this.#active !== undefined;
  }

  /** The partition's committed offset in this member's store while active. */
  get committedOffset(): bigint | undefined {
    return this.#active?.core.committedOffset;
  }

  /** The highest offset delivered to this member's activations of the partition. */
  get delivered(): bigint | undefined {
    return this.#delivered;
  }

  /**
   * The partition's lag while this member holds it (one stats query through the subscription's
   * connection, bounded: 5 s; see stream-lag.ts).
   *
   * @throws DedupError `DEDUP_BROKER_UNREACHABLE` when this member does not hold the partition or
   *   is between subscriptions; `DEDUP_BROKER_REFUSED` when the query fails.
   */
  async lag(): Promise<ConsumerLag> {
    const client = this.#subscribed?.client;
    if (client === undefined || this.#active === undefined) {
      throw new DedupError(
        'DEDUP_BROKER_UNREACHABLE',
        `partition "${this.#s.partition}" is not held by this member at the moment`,
      );
    }
    return lagOf(await lastChunkId(client, this.#s.partition), this.committedOffset);
  }

  /**
   * Calls `listener` with the partition's committed offset after every commit this member makes
   * (in any later activation too); returns the unsubscribe function.
   */
  onCommitted(listener: (offset: bigint) => void): () => void {
    this.#commitListeners.add(listener);
    return () => this.#commitListeners.delete(listener);
  }

  /** Subscribes for the first time. Rejects with the broker's answer when that fails. */
  subscribe(): Promise<void> {
    if (this.#closed) {
      return Promise.reject(new DedupError('DEDUP_CONSUMER_CLOSED', 'the consumer group member closed'));
    }
    this.#watch?.start();
    return this.#subscriptions.subscribe();
  }

  /** Drops the partition, closes the subscription and the changelog writer. Idempotent. */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    const watchClosed = this.#watch?.close();
    // Nothing more is processed or committed. An append in flight gives up now instead of
    // waiting for its confirm (up to appendTimeoutMs with the broker gone): its batch is not
    // written here, and whoever holds the partition next restores it from the changelog if it
    // landed (a handler waiting for that commit is released too).
    this.#lose('closed');
    const strategyClosed = this.#strategy.close().catch(() => undefined);
    await this.#subscriptions.shutdown(async () => {
      // An activation under way sees the loss and closes the core it may have opened.
      await this.#activating;
      await this.#closingCore;
    }, false);
    await strategyClosed;
    // A reading under way ends soon (its probe connection was closed above): not waited for longer
    // than a query, even through a dead node.
    await watchClosed;
  }

  /** What the strategy may ask of this partition. */
  #host(): PartitionHost {
    // eslint-disable-next-line @typescript-eslint/no-this-alias
    const self = this;
    return {
      partition: this.#s.partition,
      consumerName: this.#s.consumerName,
      stats: this.#s.stats,
      log: this.#log,
      get epoch() {
        return self.#epoch;
      },
      restart: (why) => this.#restart(why),
      fail: (error) => this.#s.fail(error),
      connectReader: () => this.#connectReader(),
    };
  }

  async #subscribe(generation: Generation<Client>): Promise<void> {
    this.#generation = generation;
    // A cluster: each attempt goes through the next node, in case the last one is down.
    const params = this.#endpoints.next();
    const client = await connectSubscriber(
      params,
      this.#s.partition,
      generation,
      this.#s.subscription.connectTimeoutMs,
    );
    try {
      decodeDeliveriesOurselves(client, (error) => {
        if (!generation.isCurrent()) return;
        this.#s.fail(
          new DedupError(
            'DEDUP_STREAM_UNREADABLE',
            `cannot read stream "${this.#s.partition}": ${error.message}`,
            { cause: error },
          ),
        );
      });
      watchConsumerUpdates(client, (active) => (this.#updateActive = active));
      const consumer = await withTimeout(
        client.declareConsumer(
          {
            stream: this.#s.partition,
            // Ignored: a single active consumer starts where its activation answers.
            offset: Offset.next(),
            singleActive: true,
            consumerRef: this.#s.consumerName,
            consumerUpdateListener: () => this.#onConsumerUpdate(generation),
            connectionClosedListener: () => generation.lost(),
            creditPolicy: this.#creditPolicy(generation),
          },
          (message) => this.#deliver(generation, message),
          // The client's third argument only carries the super stream's name, sent as the
          // subscription's `super-stream` property: the broker then spreads the group's partitions.
          { superStream: this.#s.superStream } as unknown as Parameters<Client['declareConsumer']>[2],
        ),
        10_000,
        'subscribing',
        (message) => new StreamNotAvailableError(message),
      );
      consumerCloseEvents(consumer)?.removeAllListeners(`close_consumer_${consumer.extendedId}`);
      this.#subscribed = { generation, client };
    } catch (caught) {
      const err = await explainDeclareFailure(client, this.#s.partition, caught);
      await withTimeout(client.close(), 5_000, 'closing').catch(() => undefined);
      throw new DedupError(
        'DEDUP_BROKER_REFUSED',
        `cannot consume partition "${this.#s.partition}" of super stream "${this.#s.superStream}": ${errorText(err)}`,
        { cause: err },
      );
    }
  }

  /** The client's consumer-update listener: never throws (the client would answer with its own offset). */
  async #onConsumerUpdate(generation: Generation<Client>): Promise<Offset> {
    const active = this.#updateActive;
    this.#updateActive = undefined;
    if (active === undefined) {
      this.#s.fail(
        new DedupError(
          'DEDUP_BROKER_REFUSED',
          'this rabbitmq-stream-js-client version does not say whether a consumer update activates; ' +
            'use the 1.0.x line pinned in package.json',
        ),
      );
      return Offset.next();
    }
    if (!active) {
      // Only the current subscription's deactivation ends the period (an old connection's is late).
      // A deactivation that comes while the period's activation is still restoring does not end
      // it: the activation goes on and answers the broker with its offset. Ending it there (tried:
      // members then reported partitions correctly) left a partition without a consumer for good
      // in one CI run of the cluster test — the broker seems to act on the activation's late
      // answer — and the member then reports a partition it may not be delivered (docs §12).
      // The partition is another member's: a run of "changelog does not exist" hearings ends here.
      this.#missingSince = undefined;
      if (this.#active?.generation === generation) this.#lose('was given to another member');
      // The broker activates the next member once we answer: let a commit under way end first, so
      // that its restore finds our last entry (ours is dropped locally either way).
      await withTimeout(this.#closingCore, 5_000, 'handing over').catch(() => undefined);
      return Offset.next();
    }
    if (!generation.isCurrent() || this.#closed) return Offset.next();
    // Active again without having been told otherwise: the older period ends first.
    this.#lose('was activated again');
    const epoch = ++this.#epoch;
    try {
      return await this.#activate(epoch, generation);
    } catch (err) {
      // Only consecutive take-overs that each heard "does not exist" count towards believing it.
      if (!(err instanceof ChangelogMissing) || epoch !== this.#epoch || !generation.isCurrent()) {
        this.#missingSince = undefined;
      }
      if (epoch === this.#epoch && generation.isCurrent()) {
        if (err instanceof RestoreStoreError) {
          // As a failed commit's write: the store is not usable, and a take-over tried again would
          // meet the same failure, forever, in warnings.
          this.#s.fail(err.cause instanceof Error ? err.cause : err);
        } else if (
          err instanceof DedupError &&
          (err.code === 'DEDUP_CHANGELOG_INVALID' ||
            err.code === 'DEDUP_STORE_CORRUPT' ||
            err.code === 'DEDUP_UNSAFE_OPTIONS' ||
            err.code === 'DEDUP_STREAM_REGRESSION')
        ) {
          this.#s.fail(err);
        } else if (err instanceof ChangelogMissing && this.#believeMissing()) {
          this.#s.fail(
            new DedupError(
              'DEDUP_CHANGELOG_INVALID',
              `changelog "${this.#s.changelog}" of partition "${this.#s.partition}" has not existed for ` +
                `${MISSING_CHANGELOG_MS / 1_000} s of take-overs, but this member holds state from it: it was ` +
                'deleted, and no member recreates it. Restore it, or clear the partition from the members’ stores',
              { cause: err },
            ),
          );
        } else if (permanentRefusal(err) !== undefined) {
          // No read permission on the changelog, say: every take-over would fail the same way.
          this.#s.fail(
            new DedupError(
              'DEDUP_BROKER_REFUSED',
              `cannot take over partition "${this.#s.partition}" from changelog "${this.#s.changelog}": ` +
                `${permanentRefusal(err)}: ${errorText(err)}`,
              { cause: err },
            ),
          );
        } else {
          this.#log.warn(
            { consumer: this.#s.consumerName, partition: this.#s.partition, err: errorText(err) },
            'stream-dedup: cannot take over partition; subscribing again',
          );
          generation.lost();
        }
      }
      return Offset.next();
    }
  }

  /** Brings the partition's state here and opens its core (its strategy); answers where delivery starts. */
  #activate(epoch: number, generation: Generation<Client>): Promise<Offset> {
    // One activation at a time per partition: an older one (still restoring) ends before this one
    // starts, and close() waits for the last.
    this.#activations++;
    const run = this.#activating
      .then(() => this.#activateNow(epoch, generation))
      .finally(() => this.#activations--);
    this.#activating = run.then(
      () => undefined,
      () => undefined,
    );
    return run;
  }

  async #activateNow(epoch: number, generation: Generation<Client>): Promise<Offset> {
    const started = performance.now();
    await this.#closingCore;
    const current = (): boolean => epoch === this.#epoch && generation.isCurrent() && !this.#closed;
    if (!current()) throw new PartitionMoved(this.#s.partition, 'moved');
    const partition = this.#s.partition;
    const handler = this.#s.handler;
    // Before each local write and commit report: still the holder, proven by a round trip on the
    // activated subscription's connection (§12, "After a pause").
    const lease = new HoldLease({
      partition,
      isCurrent: current,
      roundTrip: async () => {
        const subscribed = this.#subscribed;
        if (subscribed?.generation !== generation) throw new Error('its subscription is gone');
        await lastChunkId(subscribed.client, partition);
      },
      lost: (why) => {
        if (current()) this.#restart(why);
      },
    });
    const plan = await this.#strategy.activate({
      epoch,
      current,
      openCore: (journal) =>
        VerifyingConsumerCore.open(
          {
            ...this.#s.consumer,
            consumerName: this.#s.namespace,
            store: this.#s.store,
            handler: (message, tx) => handler(message, tx, partition),
            hooks: this.#hooks,
          },
          {
            // The hold's round trip travels with the entry, not after it (hold-lease.ts).
            journal:
              journal &&
              ((entry) => {
                lease.proveAhead();
                return journal(entry);
              }),
            journalDepth: this.#s.appendsInFlight,
            gate: () => lease.gate(),
            groupPartition: true,
            // Its spans and metrics: the group's, on the partition (the core's name is its namespace).
            destination: partition,
            telemetryName: this.#s.consumerName,
            expectedStop: (error) => error instanceof PartitionMoved,
            // Any failure (a failed linger commit too, not only one a delivery sees) stops the member.
            onStop: (error, cause) => {
              if (!(cause instanceof PartitionMoved) && current()) this.#s.fail(error);
            },
          },
        ),
    });
    this.#missingSince = undefined;
    const { core } = plan;
    if (!current()) {
      await core.close();
      throw new PartitionMoved(this.#s.partition, 'moved');
    }
    // A partition resumed after a commit: its committed chunk is read again and compared before any
    // handler runs (stream-resume.ts: a partition recreated under its name is refused).
    if (plan.resume !== undefined) core.expectChunk(plan.resume.plan.expect, plan.resume.refuse);
    const isCurrent = current;
    // A shared database's fence (another member moved the offset), deadlock or lost connection:
    // the batch is rolled back; the partition is dropped and subscribed again, and whoever the
    // broker activates next reads the offset row afresh.
    let fences = core.stats.fences;
    core.onRewind(() => {
      if (!isCurrent()) return;
      const fenced = core.stats.fences > fences;
      fences = core.stats.fences;
      if (fenced) this.#s.stats.fenced++;
      this.#restart(
        fenced
          ? 'was fenced: its batch rolled back (another member moved the partition’s offset, or the database ended a paused batch)'
          : 'must run its batch again (a transient failure of the database)',
      );
    });
    const delivery = new OrderedDelivery({
      process: (message) => {
        if (!isCurrent()) return undefined;
        if (!plan.accept(message.offset)) return undefined;
        return core.process(message);
      },
      get stopped() {
        return !isCurrent() || core.failure !== undefined;
      },
      stop: (error) => {
        // A moved partition was handled where it was seen; anything else stops the member.
        if (!(error instanceof PartitionMoved) && isCurrent()) this.#s.fail(error);
      },
      enqueue: (task) => this.#subscriptions.enqueue(task),
    });
    core.onCommitted((offset) => {
      for (const listener of this.#commitListeners) listener(offset);
    });
    this.#active = { epoch, core, delivery, isCurrent, generation };
    if (plan.offset !== undefined) {
      for (const listener of this.#commitListeners) listener(plan.offset);
    }
    this.#s.stats.restores++;
    this.#s.stats.entriesRestored += plan.applied;
    const ms = Math.round(performance.now() - started);
    this.#log.info(
      {
        consumer: this.#s.consumerName,
        partition,
        offset: plan.offset?.toString(),
        changelogRead: plan.read,
        changelogApplied: plan.applied,
        ms,
      },
      'stream-dedup: consumer group member took over partition',
    );
    this.#emit({ kind: 'assigned', partition, offset: plan.offset, restored: plan.applied, ms });
    if (plan.start !== undefined) return Offset.offset(plan.start);
    if (plan.offset === undefined && this.#firstDelivered !== undefined)
      return Offset.offset(this.#firstDelivered);
    return this.#s.subscription.startFrom === 'next' ? Offset.next() : Offset.first();
  }

  /**
   * A connection for a read that is not the subscription (restore, genesis, stalled-partition
   * watch): through the next node that answers, so that a dead node does not fail the read.
   */
  #connectReader(): Promise<Client> {
    return this.#readers();
  }

  /** Subscribed through `generation` (still current), not active, no activation under way, open. */
  #mayWatch(generation: Generation<Client> | undefined): boolean {
    return (
      generation !== undefined &&
      generation.isCurrent() &&
      this.#active === undefined &&
      this.#activations === 0 &&
      !this.#closed
    );
  }

  /** A take-over heard the changelog does not exist: true once that has lasted MISSING_CHANGELOG_MS. */
  #believeMissing(): boolean {
    const now = performance.now();
    this.#missingSince ??= now;
    return now - this.#missingSince >= MISSING_CHANGELOG_MS;
  }

  /** Drops the partition and subscribes again (the activation then restores from the changelog). */
  #restart(why: string): void {
    this.#lose(why);
    this.#generation?.lost();
  }

  /** Drops the active period, if any: nothing more is processed or committed; the core closes. */
  #lose(why: string): void {
    const active = this.#active;
    this.#epoch++;
    if (active === undefined) return;
    this.#active = undefined;
    active.delivery.release();
    active.core.discardPending();
    if (active.core.committedOffset === undefined) this.#firstDelivered ??= active.core.startOffset;
    const closing = this.#closingCore.then(() => active.core.close()).catch(() => undefined);
    this.#closingCore = closing;
    this.#emit({ kind: 'revoked', partition: this.#s.partition, reason: why });
    this.#log.info(
      { consumer: this.#s.consumerName, partition: this.#s.partition, reason: why },
      'stream-dedup: consumer group member dropped partition',
    );
  }

  /** A delivery of subscription `generation`: to the current activation if it is that subscription's. */
  #deliver(generation: Generation<Client>, message: StreamMessage): void {
    const active = this.#active;
    const at = message.offset;
    if (active?.generation === generation && at !== undefined && (this.#delivered ?? -1n) < at) {
      this.#delivered = at;
    }
    if (active?.generation === generation) active.delivery.deliver(active.isCurrent, message);
  }

  /** One chunk of credit at a time, held back by the current activation's buffer (OrderedDelivery). */
  #creditPolicy(generation: Generation<Client>): ConsumerCreditPolicy {
    return creditPolicyOf((request) => {
      if (!generation.isCurrent()) return Promise.resolve();
      const active = this.#active;
      if (active?.generation !== generation) return request(1).catch(() => undefined);
      return active.delivery.onChunkCompleted(active.isCurrent, request);
    });
  }

  #emit(event: AssignmentEvent): void {
    try {
      this.#s.onAssignment?.(event);
    } catch {
      // An observer's bug changes nothing.
    }
  }
}
