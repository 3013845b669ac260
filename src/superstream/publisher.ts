/**
 * `SuperStreamDedupPublisher`: one dedup publisher core per partition of a RabbitMQ super stream,
 * one store and one routing in front of them (issue 18).
 */
import { DedupError } from '../errors.js';
import { DedupPublisherCore } from '../publisher/core.js';
import { assertBody } from '../publisher/message.js';
import type { OpenReport, SendOptions } from '../publisher/types.js';
import { DedupStore } from '../store/store.js';
import type { PublisherCounters } from '../telemetry/metrics.js';
import { StreamTransport } from '../transport/stream-transport.js';
import { errorText } from '../transport/util.js';
import { describeValue, outOfRange } from '../util/options.js';
import {
  resolveSuperStreamOptions,
  type ResolvedSuperStreamOptions,
  type RoutingKeyFunction,
  type SuperStreamDedupPublisherOptions,
  type SuperStreamSendResult,
} from './options.js';
import { PartitionFailures } from './partition-failures.js';
import { checkRecordedPartitions, KeyRoutes, Locator } from './partitions.js';
import { partitionForKey } from './routing.js';
import { traceSend } from '../telemetry/tracing.js';

const NO_OPTIONS: SendOptions = Object.freeze({});

/**
 * A dedup publisher for one producer name on a RabbitMQ super stream: every partition has its own
 * publishing IDs, outbox (or reserved blocks) and, in keyed mode, key index — each partition is a
 * publisher core of its own (what a `StreamDedupPublisher` is made of) under the same name, all in one store — and a routing in front
 * chooses the partition of every message.
 *
 * - `open()` discovers the partitions (the broker's partitions query), refuses a list that differs
 *   from the one the store recorded at the last open (`DEDUP_PARTITIONS_CHANGED`), then opens every
 *   partition at once: the broker's last ID is queried and reconciled for each, and each re-sends
 *   its own outbox in ID order before anything new reaches it.
 * - Partitions pipeline independently: a send to one never waits for another's confirms, and a
 *   partition whose leader is being replaced reconnects while the others keep publishing.
 *   `maxInFlight` and `maxBatch` apply per partition.
 * - A partition that stops on an error (`DEDUP_NAME_CONFLICT`, `DEDUP_BROKER_UNREACHABLE` after
 *   `reconnect.giveUpAfterMs`, …) closes the whole publisher: `closed()` resolves with that error,
 *   its message naming the partition; every outbox keeps what it holds.
 *
 * IDs per mode: `auto` numbers each partition 1, 2, 3, …; `keyed` routes by the domain key (its
 * hash), so a repeated key reaches the partition that knows it; `explicit` takes the caller's ID
 * for the partition the routing chooses (or {@link SuperStreamDedupPublisher.sendTo} names), which
 * must be above that partition's last — an increasing source ID (an offset + 1) is increasing in
 * every partition. After a restart a source resumes per partition: a record is already accepted
 * when its ID is at or below `lastPublishingIds.get(await partitionFor(record))`.
 *
 * @example
 * ```ts
 * await using pub = await SuperStreamDedupPublisher.open({
 *   connection: { hostname: '127.0.0.1', port: 5552 },
 *   superStream: 'invoices',
 *   producerName: 'billing',
 *   store: './.dedup',
 *   routing: { kind: 'hash', key: (_body, headers) => String(headers?.customer) },
 * });
 * const { partition, publishingId } = await pub.send(Buffer.from('{"total":17}'), { headers: { customer: 'c-42' } });
 * ```
 */
export class SuperStreamDedupPublisher {
  /** The super stream's name. */
  readonly superStream: string;
  /** The producer name, the same on every partition. */
  readonly producerName: string;
  /** The partitions, in the order the broker lists them (the order hash routing uses). */
  readonly partitions: readonly string[];
  readonly #cores: ReadonlyMap<string, DedupPublisherCore>;
  readonly #route: (body: Uint8Array, options: SendOptions) => string | Promise<string>;
  readonly #keyed: boolean;
  readonly #locator: Locator;
  readonly #ownedStore: DedupStore | undefined;
  /** Sends waiting for a route query: later sends queue behind them, so each core sees call order. */
  #waiting = 0;
  #tail: Promise<void> = Promise.resolve();
  #fatal: DedupError | undefined;
  #closing: Promise<void> | undefined;
  readonly #closedPromise: Promise<DedupError | undefined>;
  #resolveClosed!: (error: DedupError | undefined) => void;

  private constructor(
    opts: ResolvedSuperStreamOptions,
    cores: ReadonlyMap<string, DedupPublisherCore>,
    locator: Locator,
    ownedStore: DedupStore | undefined,
    failures: PartitionFailures,
  ) {
    this.superStream = opts.superStream;
    this.producerName = opts.publisher.producerName;
    this.partitions = Object.freeze([...cores.keys()]);
    this.#cores = cores;
    this.#keyed = opts.publisher.idMode === 'keyed';
    this.#locator = locator;
    this.#ownedStore = ownedStore;
    this.#route = makeRouter(opts, this.partitions, locator);
    this.#closedPromise = new Promise((resolve) => (this.#resolveClosed = resolve));
    // At the failure itself, not once that partition has closed: the others stop taking sends now.
    // The watch began when each core came to exist (open() checked that none failed meanwhile).
    failures.forward((partition, error) => this.#partitionFailed(partition, error));
  }

  /**
   * Checks the options (before any I/O), opens the store when `store` is a path, discovers the
   * partitions, checks them against the store's record (recording them at the first open), and
   * opens every partition's publisher: connect, declare the producer, reconcile with the broker's
   * last ID, queue the outbox for re-sending. If one partition fails — its open, or its publisher
   * after it opened while another partition is still opening — those opened are closed and the
   * error names the partition.
   *
   * @throws DedupError `DEDUP_BROKER_REFUSED` (the super stream does not exist, or a partition is
   *   refused), `DEDUP_PARTITIONS_CHANGED`, and every error of `StreamDedupPublisher.open` for a
   *   partition (`DEDUP_SEQUENCE_REGRESSION`, `DEDUP_STORE_LOCKED`, …), its code kept.
   * @throws TypeError or RangeError for invalid options.
   */
  static async open(options: SuperStreamDedupPublisherOptions): Promise<SuperStreamDedupPublisher> {
    const opts = resolveSuperStreamOptions(options);
    const { publisher } = opts;
    // Before the store: it checks TLS options, which may throw.
    const locator = new Locator(opts.connection, opts.connectTimeoutMs, publisher.reconnect);
    const ownedStore =
      typeof publisher.store === 'string'
        ? await DedupStore.open(publisher.store, { sync: publisher.sync })
        : undefined;
    const store = ownedStore ?? (publisher.store as DedupStore);
    const cores = new Map<string, DedupPublisherCore>();
    // Listening from the moment each core exists: a partition that fails while a slower one is
    // still opening must fail the open, not leave a publisher that never hears of it.
    const failures = new PartitionFailures();
    try {
      const partitions = await locator.partitions(opts.superStream);
      await checkRecordedPartitions(store, opts.superStream, publisher.producerName, partitions);
      // Hash routing needs the broker no more: each partition has its own connections.
      if (opts.routing.kind === 'hash') await locator.close();
      const opened = await Promise.allSettled(
        partitions.map(async (partition) => {
          const transport = new StreamTransport({
            ...options,
            stream: partition,
            connection: opts.connection,
            createStream: false,
            connectTimeoutMs: opts.connectTimeoutMs,
            subEntry: opts.subEntry.size > 1 ? opts.subEntry : undefined,
          });
          const core = await DedupPublisherCore.open(transport, { ...options, store });
          failures.watch(partition, core);
          return core;
        }),
      );
      let failure: Error | undefined;
      opened.forEach((result, i) => {
        if (result.status === 'fulfilled') cores.set(partitions[i]!, result.value);
        else failure ??= namePartition(result.reason, partitions[i]!, opts.superStream);
      });
      const failed = failures.first;
      failure ??= failed && namePartition(failed.error, failed.partition, opts.superStream);
      if (failure !== undefined) throw failure;
      return new SuperStreamDedupPublisher(opts, cores, locator, ownedStore, failures);
    } catch (err) {
      await Promise.allSettled([...cores.values()].map((core) => core.close()));
      await locator.close();
      await ownedStore?.close();
      throw err;
    }
  }

  /**
   * Routes one message to its partition and publishes it there; resolves with the partition, the
   * publishing ID and the outcome once that partition's broker confirmed it (or at once for a
   * repeated key in keyed mode, with `outcome: 'duplicate'`). Messages reach each partition in
   * call order. With `routing.kind: 'key'` a routing key met for the first time costs a route
   * query, and sends made meanwhile wait for it.
   *
   * Options as for `StreamDedupPublisher.send`: `headers`, `signal`, `key` (keyed mode: it routes
   * too), `publishingId` (explicit mode: above the last ID of the partition the routing chooses).
   *
   * @throws TypeError when the body is not bytes, the routing function throws (the error is the
   *   cause) or returns something else than a string; RangeError when it returns an empty string.
   *   Nothing is sent then. Otherwise as `StreamDedupPublisher.send`.
   * @throws DedupError (rejection) as `StreamDedupPublisher.send`, its message naming the partition;
   *   `DEDUP_ID_MODE_MISMATCH` for a keyed send without a key; with `routing.kind: 'key'`,
   *   `DEDUP_BROKER_REFUSED` when no binding matches the routing key, `DEDUP_PARTITIONS_CHANGED` when
   *   it leads to no known partition, and `DEDUP_BROKER_UNREACHABLE` when the route query found no
   *   broker for `reconnect.giveUpAfterMs`. A send queued behind a route query reports what
   *   `StreamDedupPublisher.send` would throw (bad headers, too large) as a rejection.
   */
  send(body: Uint8Array, options: SendOptions = NO_OPTIONS): Promise<SuperStreamSendResult> {
    assertBody(body);
    const stopped = this.#stopped();
    if (stopped !== undefined) return Promise.reject(stopped);
    if (this.#keyed && options.key === undefined) {
      return Promise.reject(
        new DedupError(
          'DEDUP_ID_MODE_MISMATCH',
          `publisher "${this.producerName}" uses idMode 'keyed': every send() needs options.key`,
        ),
      );
    }
    return this.#dispatch(this.#route(body, options), body, options);
  }

  /**
   * Publishes one message to the partition named, past the routing: for a processor whose input
   * is partitioned as its output (input partition k writes output partition k, with explicit IDs
   * from its own offsets). Not in keyed mode, where the domain key routes.
   *
   * @throws RangeError when `partition` is not one of {@link SuperStreamDedupPublisher.partitions}.
   * @throws TypeError in keyed mode. Otherwise as {@link SuperStreamDedupPublisher.send}.
   */
  sendTo(
    partition: string,
    body: Uint8Array,
    options: SendOptions = NO_OPTIONS,
  ): Promise<SuperStreamSendResult> {
    if (this.#keyed)
      throw new TypeError("sendTo() is not available with idMode 'keyed': the domain key routes");
    if (!this.#cores.has(partition)) {
      outOfRange(
        'partition',
        `one of ${this.partitions.map((p) => JSON.stringify(p)).join(', ')}`,
        partition,
      );
    }
    assertBody(body);
    const stopped = this.#stopped();
    if (stopped !== undefined) return Promise.reject(stopped);
    return this.#dispatch(partition, body, options);
  }

  /**
   * The partition {@link SuperStreamDedupPublisher.send} would choose for this message (a route
   * query for a new routing key with `routing.kind: 'key'`). Rejects as `send()` would throw.
   */
  async partitionFor(body: Uint8Array, options: SendOptions = NO_OPTIONS): Promise<string> {
    assertBody(body);
    return this.#route(body, options);
  }

  /**
   * Per partition, the last publishing ID handed out (0n before the first). Right after `open()`
   * with explicit IDs: where that partition's source resumes (as `StreamDedupPublisher.lastPublishingId`).
   */
  get lastPublishingIds(): ReadonlyMap<string, bigint> {
    return new Map([...this.#cores].map(([p, core]) => [p, core.lastPublishingId]));
  }

  /** Per partition, what `open()` found and did (`localLastId`, `brokerLastId`, `resent`, `reassigned`). */
  get openReports(): ReadonlyMap<string, OpenReport> {
    return new Map([...this.#cores].map(([p, core]) => [p, core.report]));
  }

  /** Messages accepted and not yet confirmed, over every partition. */
  get inFlight(): number {
    let n = 0;
    for (const core of this.#cores.values()) n += core.inFlight;
    return n;
  }

  /** Counters since open, summed over the partitions: sent, confirmed, resent, keyDuplicates, reconnects. */
  get stats(): Readonly<PublisherCounters> {
    const sum: PublisherCounters = { sent: 0, confirmed: 0, resent: 0, keyDuplicates: 0, reconnects: 0 };
    for (const core of this.#cores.values()) {
      for (const k of Object.keys(sum) as Array<keyof PublisherCounters>) sum[k] += core.counters[k];
    }
    return sum;
  }

  /** True once closing or closed (by `close()` or by a partition's error). */
  get isClosed(): boolean {
    return this.#closing !== undefined;
  }

  /**
   * Resolves once every partition has closed: with the error that closed the publisher (a
   * partition's, naming it, its code kept), or `undefined` after `close()`.
   */
  closed(): Promise<DedupError | undefined> {
    return this.#closedPromise;
  }

  /**
   * Closes every partition's publisher (each waits up to `closeTimeoutMs` for its confirms, at the
   * same time), then the connection used for partitions and routes (not an application's
   * `Client`), then the store if `open()` opened it. Idempotent.
   */
  close(): Promise<void> {
    this.#closing ??= this.#closeAll();
    return this.#closing;
  }

  /** `close()`, for `await using publisher = await SuperStreamDedupPublisher.open(…)`. */
  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }

  /**
   * Hands a message to its partition's core. A route still being queried, or earlier sends
   * waiting for theirs, make it wait its turn: explicit IDs must reach a partition in call order.
   */
  #dispatch(
    partition: string | Promise<string>,
    body: Uint8Array,
    options: SendOptions,
  ): Promise<SuperStreamSendResult> {
    if (typeof partition === 'string' && this.#waiting === 0) return this.#sendOn(partition, body, options);
    if (typeof partition !== 'string') partition.catch(() => undefined); // handled below, maybe later
    this.#waiting++;
    const handed = this.#tail
      .then(() => partition)
      .then((p) => ({ result: this.#sendOn(p, body, options) }))
      .finally(() => this.#waiting--);
    this.#tail = handed.then(
      () => undefined,
      () => undefined,
    );
    return handed.then(({ result }) => result);
  }

  /** Why sends are refused: the error that closed the publisher, or `close()`; `undefined` while open. */
  #stopped(): DedupError | undefined {
    if (this.#fatal !== undefined || this.#closing === undefined) return this.#fatal;
    return new DedupError(
      'DEDUP_PUBLISHER_CLOSED',
      `publisher "${this.producerName}" on super stream "${this.superStream}" is closed; nothing was sent`,
    );
  }

  #sendOn(partition: string, body: Uint8Array, options: SendOptions): Promise<SuperStreamSendResult> {
    const stopped = this.#stopped();
    if (stopped !== undefined) return Promise.reject(stopped);
    const core = this.#cores.get(partition)!;
    const given = options.headers;
    const target = { destination: this.superStream, partition, producer: this.producerName };
    const sending = core.tracing
      ? traceSend(target, given, (headers) =>
          core.send(body, headers === given ? options : { ...options, headers }),
        )
      : core.send(body, options);
    return sending.then(
      (r) => ({ partition, publishingId: r.publishingId, outcome: r.outcome }),
      (err: unknown) => {
        throw namePartition(err, partition, this.superStream);
      },
    );
  }

  /** One partition stopped on an error: the whole publisher closes with it. */
  #partitionFailed(partition: string, error: DedupError): void {
    if (this.#closing !== undefined) return;
    this.#fatal = namePartition(error, partition, this.superStream) as DedupError; // a DedupError in, a DedupError out
    void this.close();
  }

  async #closeAll(): Promise<void> {
    // allSettled: one partition's failure to close must not keep the store open.
    await Promise.allSettled([...this.#cores.values()].map((core) => core.close()));
    await this.#locator.close();
    await this.#ownedStore?.close();
    this.#resolveClosed(this.#fatal);
  }
}

/** The same error (a DedupError keeps its code), its message naming the partition. */
function namePartition(error: unknown, partition: string, superStream: string): Error {
  if (!(error instanceof DedupError)) return error instanceof Error ? error : new Error(String(error));
  return new DedupError(
    error.code,
    `partition "${partition}" of super stream "${superStream}": ${error.message}`,
    {
      cause: error,
    },
  );
}

/** The routing of `send()`: a partition, or for a routing key not seen before, a route query's. */
function makeRouter(
  opts: ResolvedSuperStreamOptions,
  partitions: readonly string[],
  locator: Locator,
): (body: Uint8Array, options: SendOptions) => string | Promise<string> {
  const keyOf = opts.routing.key;
  if (keyOf === undefined) {
    // Keyed mode: the domain key is the routing key.
    return (_body, options) => {
      if (typeof options.key !== 'string') {
        throw new TypeError(`Expected options.key to be a string, got ${describeValue(options.key)}`);
      }
      return partitionForKey(options.key, partitions);
    };
  }
  if (opts.routing.kind === 'hash')
    return (body, options) => partitionForKey(routingKey(keyOf, body, options), partitions);
  const routes = new KeyRoutes(locator, opts.superStream, partitions);
  return (body, options) => routes.partitionOf(routingKey(keyOf, body, options));
}

/** The application's routing key for a message, checked. */
function routingKey(keyOf: RoutingKeyFunction, body: Uint8Array, options: SendOptions): string {
  let key: unknown;
  try {
    key = keyOf(body, options.headers);
  } catch (err) {
    throw new TypeError(`routing.key threw (nothing was sent): ${errorText(err)}`, { cause: err });
  }
  if (typeof key !== 'string') {
    throw new TypeError(
      `Expected routing.key to return a string, got ${describeValue(key)} (nothing was sent)`,
    );
  }
  if (key.length === 0)
    throw new RangeError('Expected routing.key to return a non-empty string, got "" (nothing was sent)');
  return key;
}
