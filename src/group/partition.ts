/**
 * One partition of a consumer group, as one member sees it (docs/design.md §12): a single-active
 * subscription to the partition (the group's name as its reference, the super stream's name so
 * that the broker spreads partitions over members); when the broker activates it, the partition's
 * state is restored from its changelog and a verifying consumer core opened on it; each of that
 * core's batches is appended to the changelog before it is written to the store; when the broker
 * deactivates it, its connection goes or its changelog write is fenced, the partition is dropped
 * at once: nothing more of it is applied or committed by this member.
 */
import { Offset, type Client } from 'rabbitmq-stream-js-client';
import { DedupError } from '../errors.js';
import { VerifyingConsumerCore, type VerifyingConsumerOptions } from '../consumer/core.js';
import type { ResolvedSubscriptionOptions, ResolvedVerifyingConsumerOptions } from '../consumer/options.js';
import { Resubscriber, type Generation } from '../consumer/resubscribe.js';
import type { JournalEntry } from '../consumer/commit-pipeline.js';
import type { DedupStore } from '../store/store.js';
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
import { connectStreamClient } from '../transport/stream-probe.js';
import { planResume, storedChunk, type ResumePlan } from '../transport/stream-resume.js';
import {
  EndpointRotation,
  errorText,
  openThroughEndpoints,
  explainDeclareFailure,
  StreamNotAvailableError,
  withTimeout,
  type StreamConnectionOptions,
} from '../transport/util.js';
import { encodeEntry, encodeGenesis, entryId, GENESIS_ID } from './changelog-entry.js';
import { ChangelogWriter, type AppendOutcome } from './changelog-writer.js';
import {
  ChangelogMissing,
  changelogLastId,
  firstMessage,
  groupSettings,
  readGenesis,
  restorePartition,
  RestoreStoreError,
  SETTINGS_HEADER,
} from './restore.js';
import { permanentRefusal } from './refusal.js';
import { StallWatch } from './stall-watch.js';
import type {
  AssignmentEvent,
  GroupMessageHandler,
  GroupStats,
  SuperStreamVerifyingConsumerOptions,
} from './types.js';

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
  readonly changelog: string;
  readonly changelogProducer: string;
  readonly store: DedupStore;
  readonly consumer: ResolvedVerifyingConsumerOptions;
  /** The name of the `tenant` function that members compare (`tenantVersion`), if given. */
  readonly tenantVersion?: string | undefined;
  readonly handler: GroupMessageHandler;
  readonly hooks: SuperStreamVerifyingConsumerOptions['hooks'];
  readonly subscription: ResolvedSubscriptionOptions;
  readonly connection: StreamConnectionOptions;
  readonly appendTimeoutMs: number;
  readonly restoreTimeoutMs: number;
  /** `stalledPartitionMs`: 0 turns the stalled-partition watch off. */
  readonly stalledMs: number;
  readonly onAssignment: ((event: AssignmentEvent) => void) | undefined;
  readonly stats: GroupStats;
  /** Stops the whole member with `error` (a handler threw, a changelog is invalid). */
  readonly fail: (error: Error) => void;
}

/**
 * How long take-overs must keep hearing that the changelog does not exist before a member that holds
 * state from it believes it deleted and stops (DEDUP_CHANGELOG_INVALID): no member recreates it (a
 * member with state does not write before it restored), so waiting longer only repeats the warning.
 */
const MISSING_CHANGELOG_MS = 30_000;

/** How long the restore may wait for the next changelog entry before asking for the end again. */
const RESTORE_STALL_MS = 5_000;
/** How long the stalled-partition watch waits for one query's answer, or for a message it looks for. */
const WATCH_QUERY_MS = 5_000;
const WATCH_PROBE_MS = 2_000;

/**
 * How often the stalled-partition watch reads the broker (a sixth of `stalledMs`, 1 to 10 s), and
 * how long a member stays out of a stalled group the first time. A member in a stuck group leaves
 * it at most `checkMs + stalledMs + checkMs` (its first reading, the wait, the reading that sees
 * the wait over) plus the probe (well under 5 s) after it joined: staying out longer than that,
 * a member is out when the other member of a pair leaves, whatever their phases, and the group is
 * empty then. More members, or slower probes, are met by doubling (StallWatch.leaving).
 *
 * @internal
 */
export function watchTimings(stalledMs: number): { checkMs: number; leaveMs: number } {
  const checkMs = Math.min(10_000, Math.max(1_000, Math.round(stalledMs / 6)));
  return { checkMs, leaveMs: stalledMs + 3 * checkMs + 5_000 };
}

/** One activation: the core and the deliveries of one period as the partition's active consumer. */
interface Activation {
  readonly epoch: number;
  readonly core: VerifyingConsumerCore;
  readonly delivery: OrderedDelivery;
  readonly isCurrent: () => boolean;
  /** The subscription that was activated: deliveries of any other are dropped. */
  readonly generation: Generation<Client>;
  readonly lineage: Lineage;
}

/** Where an activation's state begins when the store had nothing of the partition. */
interface Lineage {
  /** No genesis in the changelog yet: the first batch writes one first (§12). */
  needsGenesis: boolean;
  /** The genesis' start: messages before it are not the partition's input (dropped). */
  readonly floor: bigint | undefined;
  /** The first offset processed in this activation: the start a genesis of ours says. */
  firstOffset: bigint | undefined;
}

/** @internal */
export class GroupPartition {
  readonly #s: PartitionSettings;
  /** The commit hooks of the partition's cores: the group's, told the partition. */
  readonly #hooks: NonNullable<VerifyingConsumerOptions['hooks']>;
  readonly #log: Logger;
  readonly #endpoints: EndpointRotation;
  readonly #writer: ChangelogWriter;
  readonly #subscriptions: Resubscriber<Client>;
  /** Bumped on every activation and every loss: what an older one started is dropped. */
  #epoch = 0;
  #active: Activation | undefined;
  /** The closing of the last core: the next activation waits for it (it holds the namespace). */
  #closingCore: Promise<void> = Promise.resolve();
  /** The last activation (restore and core opening), which the next one and close() wait for. */
  #activating: Promise<void> = Promise.resolve();
  /** Set by the consumer-update watch just before the client calls our listener. */
  #updateActive: boolean | undefined;
  #closed = false;
  readonly #commitListeners = new Set<(offset: bigint) => void>();
  /** The current subscription attempt. */
  #generation: Generation<Client> | undefined;
  /** The subscription in place (its consumer declared), for the stalled-partition watch. */
  #subscribed: { readonly generation: Generation<Client>; readonly client: Client } | undefined;
  /** Activations (restore and core opening) under way: the watch waits while there are any. */
  #activations = 0;
  readonly #watch: StallWatch;
  #watchTimer: NodeJS.Timeout | undefined;
  /** The watch's reading under way, which close() waits for. */
  #watching: Promise<void> | undefined;
  /** The watch's probe connection while open, which close() closes at once. */
  #watchReader: Client | undefined;
  /** The reads that are not the subscription's (restore, genesis, watch): their own node rotation. */
  readonly #readers: EndpointRotation;
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
    this.#readers = new EndpointRotation(settings.connection);
    this.#watch = new StallWatch(settings.stalledMs);
    this.#writer = new ChangelogWriter({
      stream: settings.changelog,
      producerName: settings.changelogProducer,
      connection: settings.connection,
      connectTimeoutMs: settings.subscription.connectTimeoutMs,
      appendTimeoutMs: settings.appendTimeoutMs,
      reconnect: settings.subscription.reconnect,
      logger: this.#log,
      headers: { [SETTINGS_HEADER]: groupSettings(settings.consumer, settings.tenantVersion) },
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
    this.#startWatch();
    return this.#subscriptions.subscribe();
  }

  /** Drops the partition, closes the subscription and the changelog writer. Idempotent. */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    clearInterval(this.#watchTimer);
    const watchReader = this.#watchReader;
    if (watchReader !== undefined)
      void withTimeout(watchReader.close(), 5_000, 'closing').catch(() => undefined);
    // Nothing more is processed or committed. An append in flight gives up now instead of
    // waiting for its confirm (up to appendTimeoutMs with the broker gone): its batch is not
    // written here, and whoever holds the partition next restores it from the changelog if it
    // landed (a handler waiting for that commit is released too).
    this.#lose('closed');
    const writerClosed = this.#writer.close().catch(() => undefined);
    await this.#subscriptions.shutdown(async () => {
      // An activation under way sees the loss and closes the core it may have opened.
      await this.#activating;
      await this.#closingCore;
    }, false);
    await writerClosed;
    // A reading under way ends soon (its probe connection was closed above, or is closed once
    // its connect returns): not waited for longer than a query, even through a dead node.
    await withTimeout(this.#watching ?? Promise.resolve(), WATCH_QUERY_MS, 'closing').catch(() => undefined);
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

  /**
   * Where to subscribe after a restore to `committed` (stream-resume.ts): a partition that cannot
   * be the one the group committed of (deleted and recreated: empty, shorter, or another chunk where
   * the committed one was) stops the member with `DEDUP_STREAM_REGRESSION`, as the stream consumer.
   */
  async #planResume(client: Client, committed: bigint): Promise<[ResumePlan, (found: string) => DedupError]> {
    const { partition } = this.#s;
    const refuse = (found: string): DedupError =>
      new DedupError(
        'DEDUP_STREAM_REGRESSION',
        `partition "${partition}" ${found}, but group "${this.#s.consumerName}" committed offset ${committed} of it ` +
          `(changelog "${this.#s.changelog}"): it was deleted and recreated. Resuming would skip its first ` +
          'messages; use a new consumerName to read it from the start',
      );
    const chunk = await storedChunk(this.#s.store.db, this.#s.namespace);
    return [await planResume(client, partition, committed, chunk, refuse), refuse];
  }

  /** Restores the partition from its changelog and opens its core; answers where delivery starts. */
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
    const client = await this.#connectReader();
    let report;
    let resume: [ResumePlan, (found: string) => DedupError] | undefined;
    try {
      report = await restorePartition({
        db: this.#s.store.db,
        sync: this.#s.store.sync,
        namespace: this.#s.namespace,
        changelog: this.#s.changelog,
        producerName: this.#s.changelogProducer,
        settings: groupSettings(this.#s.consumer, this.#s.tenantVersion),
        client,
        stallMs: RESTORE_STALL_MS,
        timeoutMs: this.#s.restoreTimeoutMs,
        isCurrent: current,
      });
      if (report.offset !== undefined) resume = await this.#planResume(client, report.offset);
    } finally {
      await withTimeout(client.close(), 5_000, 'closing').catch(() => undefined);
    }
    this.#missingSince = undefined;
    if (epoch !== this.#epoch || !generation.isCurrent())
      throw new PartitionMoved(this.#s.partition, 'moved');
    // The changelog writer connects while the core opens and the first batch is processed: that
    // batch need not wait for it. Only to a changelog that exists: the writer creates a missing
    // one, and a restore of another member asking for the last ID of a stream being created got no
    // answer for 5 s (measured; it then retried the take-over). A new changelog is created by its
    // first append, as before.
    if (report.changelogLastId > 0n) this.#writer.warmUp();
    const partition = this.#s.partition;
    const handler = this.#s.handler;
    const core = await VerifyingConsumerCore.open(
      {
        ...this.#s.consumer,
        consumerName: this.#s.namespace,
        store: this.#s.store,
        handler: (message, tx) => handler(message, tx, partition),
        hooks: this.#hooks,
      },
      {
        journal: (entry) => this.#journal(epoch, entry),
        expectedStop: (error) => error instanceof PartitionMoved,
        // Any failure (a failed linger commit too, not only one a delivery sees) stops the member.
        onStop: (error, cause) => {
          if (!(cause instanceof PartitionMoved) && current()) this.#s.fail(error);
        },
      },
    );
    if (!current()) {
      await core.close();
      throw new PartitionMoved(this.#s.partition, 'moved');
    }
    if (resume !== undefined) core.expectChunk(resume[0].expect, resume[1]);
    const isCurrent = current;
    const lineage: Lineage = {
      needsGenesis: report.offset === undefined && report.start === undefined,
      floor: report.offset === undefined ? report.start : undefined,
      firstOffset: undefined,
    };
    const delivery = new OrderedDelivery({
      process: (message) => {
        if (!isCurrent()) return undefined;
        // A chunk begins before the offset asked for: what lies before the genesis' start is not input.
        if (lineage.floor !== undefined && message.offset < lineage.floor) return undefined;
        lineage.firstOffset ??= message.offset;
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
    this.#active = { epoch, core, delivery, isCurrent, generation, lineage };
    if (report.offset !== undefined) {
      for (const listener of this.#commitListeners) listener(report.offset);
    }
    this.#s.stats.restores++;
    this.#s.stats.entriesRestored += report.applied;
    const ms = Math.round(performance.now() - started);
    this.#log.info(
      {
        consumer: this.#s.consumerName,
        partition,
        offset: report.offset?.toString(),
        changelogRead: report.read,
        changelogApplied: report.applied,
        ms,
      },
      'stream-dedup: consumer group member took over partition',
    );
    this.#emit({ kind: 'assigned', partition, offset: report.offset, restored: report.applied, ms });
    if (resume !== undefined) return Offset.offset(resume[0].offset);
    if (report.start !== undefined) return Offset.offset(report.start);
    return this.#s.subscription.startFrom === 'next' ? Offset.next() : Offset.first();
  }

  /**
   * Appends a batch to the changelog; the batch is written to the store only once this resolves.
   * The partition's first batch ever is preceded by the genesis (§12).
   */
  async #journal(epoch: number, entry: JournalEntry): Promise<void> {
    const partition = this.#s.partition;
    if (epoch !== this.#epoch) throw new PartitionMoved(partition, 'moved before its batch was appended');
    const active = this.#active;
    const lineage = active?.epoch === epoch ? active.lineage : undefined;
    if (entry.baseOffset === undefined && lineage?.needsGenesis === true) {
      const start = lineage.firstOffset;
      if (start === undefined) throw new Error('a first batch without a first offset');
      await this.#append(epoch, 'its genesis', () => this.#appendGenesis(epoch, start));
      lineage.needsGenesis = false;
    }
    await this.#append(epoch, 'its batch', () =>
      this.#writer.append(
        encodeEntry({ lastOffset: entry.lastOffset, baseOffset: entry.baseOffset, ops: entry.ops }),
        entryId(entry.lastOffset),
        () => epoch === this.#epoch,
      ),
    );
  }

  /** One changelog append of the activation `epoch`: resolves once it is the changelog's latest. */
  async #append(epoch: number, what: string, write: () => Promise<AppendOutcome>): Promise<void> {
    const partition = this.#s.partition;
    let outcome;
    try {
      outcome = await write();
    } catch (err) {
      if (epoch === this.#epoch) {
        if (
          err instanceof DedupError &&
          (err.code === 'DEDUP_BROKER_REFUSED' ||
            err.code === 'DEDUP_CHANGELOG_INVALID' ||
            err.code === 'DEDUP_UNSAFE_OPTIONS')
        ) {
          this.#s.fail(err);
        } else {
          this.#restart(`could not append to its changelog: ${errorText(err)}`);
        }
      }
      throw new PartitionMoved(partition, `could not append ${what} to the changelog`, { cause: err });
    }
    // Moved while the entry was on its way: it may be in the changelog (where it is a consistent
    // state, §12), but nothing more of this partition is applied here.
    if (epoch !== this.#epoch) throw new PartitionMoved(partition, `moved while ${what} was appended`);
    if (outcome === 'fenced') {
      this.#s.stats.fenced++;
      this.#log.warn(
        { consumer: this.#s.consumerName, partition, what },
        'stream-dedup: another member wrote past this one in the changelog; dropping the batch and taking the partition over again',
      );
      this.#restart('was fenced: another member wrote past this one in its changelog');
      throw new PartitionMoved(partition, 'was fenced');
    }
  }

  /**
   * Writes the genesis "the partition begins at `start`" with ID 1. Of two members beginning the
   * partition at once the broker keeps the first genesis and drops the other (confirming both):
   * with the last ID at 1, the genesis itself says whose it is. Another member's is a fence: this
   * member takes the partition over again, and its restore starts where that genesis says.
   */
  async #appendGenesis(epoch: number, start: bigint): Promise<AppendOutcome> {
    const outcome = await this.#writer.append(encodeGenesis(start), GENESIS_ID, () => epoch === this.#epoch);
    if (outcome !== 'landed') return outcome;
    // Moved meanwhile: #append drops the batch anyway; no reading back (close() would wait for it).
    if (epoch !== this.#epoch) return outcome;
    const client = await this.#connectReader();
    try {
      const winner = await readGenesis(
        client,
        this.#s.changelog,
        this.#s.changelogProducer,
        RESTORE_STALL_MS,
        groupSettings(this.#s.consumer, this.#s.tenantVersion),
      );
      if (winner === start) return 'landed';
      this.#log.warn(
        {
          consumer: this.#s.consumerName,
          partition: this.#s.partition,
          start: start.toString(),
          genesis: winner.toString(),
        },
        'stream-dedup: another member began the partition at another offset first; starting again from its',
      );
      return 'fenced';
    } finally {
      await withTimeout(client.close(), 5_000, 'closing').catch(() => undefined);
    }
  }

  /**
   * A connection for a read that is not the subscription (restore, genesis, stalled-partition
   * watch): through the next node that answers, so that a dead node does not fail the read.
   */
  #connectReader(): Promise<Client> {
    return openThroughEndpoints(this.#readers.size, () =>
      connectStreamClient(this.#readers.next(), this.#s.subscription.connectTimeoutMs),
    );
  }

  /** Starts the stalled-partition watch (design §12), unless it is off or running. */
  #startWatch(): void {
    if (this.#s.stalledMs === 0 || this.#watchTimer !== undefined) return;
    this.#watchTimer = setInterval(() => void this.#checkStall(), watchTimings(this.#s.stalledMs).checkMs);
    this.#watchTimer.unref();
  }

  /**
   * One reading of the watch. RabbitMQ can leave a partition's single-active-consumer group with
   * members and none of them active, for good (design §12: seen with 4.0 when a node dies); only
   * an emptied group starts again. While this member is subscribed but not active, it compares
   * the partition's last chunk with the changelog's last entry; input that waits `stalledMs` with
   * the changelog unchanged, and a message there to prove it, makes it leave the group for a
   * while and join again. Every member of a stuck group does the same, so the group empties.
   * Never throws: a reading that fails is skipped.
   */
  async #checkStall(): Promise<void> {
    if (this.#watching !== undefined || this.#closed) return;
    const subscribed = this.#subscribed;
    if (!this.#mayWatch(subscribed?.generation)) {
      this.#watch.reset();
      return;
    }
    const run = this.#readStall(subscribed!).catch((err: unknown) => {
      try {
        this.#log.debug(
          { consumer: this.#s.consumerName, partition: this.#s.partition, err: errorText(err) },
          'stream-dedup: stalled-partition watch could not read the broker',
        );
      } catch {
        // A logger that throws changes nothing.
      }
    });
    this.#watching = run;
    await run;
    this.#watching = undefined;
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

  async #readStall({
    client,
    generation,
  }: {
    client: Client;
    generation: Generation<Client>;
  }): Promise<void> {
    const { changelog, changelogProducer, partition } = this.#s;
    const lastId = await changelogLastId(client, changelog, changelogProducer, WATCH_QUERY_MS, true);
    const stats = await withTimeout(client.streamStatsRequest(partition), WATCH_QUERY_MS, 'reading stats');
    if (!this.#mayWatch(generation)) return;
    const from = this.#watch.observe({
      lastId,
      committedChunkId: stats.committedChunkId,
      at: performance.now(),
    });
    if (from === undefined) return;
    // The proof, on a connection of its own (close() closes it at once).
    const reader = await this.#connectReader();
    this.#watchReader = reader;
    let found;
    try {
      if (this.#closed) return;
      ({ message: found } = await firstMessage(reader, partition, from, WATCH_PROBE_MS));
    } finally {
      this.#watchReader = undefined;
      await withTimeout(reader.close(), 5_000, 'closing').catch(() => undefined);
    }
    if (found === undefined) {
      this.#watch.foundNothing(performance.now());
      return;
    }
    // Checked again after the last await, and nothing awaited from here to the leave: an
    // activation cannot begin in between.
    if (!this.#mayWatch(generation)) return;
    const leaveMs = watchTimings(this.#s.stalledMs).leaveMs * this.#watch.leaving();
    this.#s.stats.rejoins++;
    this.#log.warn(
      {
        consumer: this.#s.consumerName,
        partition,
        waitingFrom: from.toString(),
        stalledMs: this.#s.stalledMs,
        leaveMs,
      },
      'stream-dedup: partition has input no member applies (a RabbitMQ single-active-consumer group ' +
        'left without an active consumer); leaving the group for a while and joining again',
    );
    this.#subscribed = undefined;
    this.#subscriptions.leave(generation, leaveMs);
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
