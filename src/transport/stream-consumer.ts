import { Offset, type Client, type ClientParams } from 'rabbitmq-stream-js-client';
import { DedupError } from '../errors.js';
import type { Logger } from '../telemetry/logger.js';
import { VerifyingConsumer } from '../consumer/facade.js';
import {
  nonEmptyString,
  resolveSubscriptionOptions,
  resolveVerifyingConsumerOptions,
  type ResolvedSubscriptionOptions,
  type ResolvedVerifyingConsumerOptions,
} from '../consumer/options.js';
import { Resubscriber, type Generation } from '../consumer/resubscribe.js';
import { expectObject, integerOption, typeMismatch } from '../util/options.js';
import { consumerCloseEvents, decodeDeliveriesOurselves } from './stream-client-internals.js';
import {
  VerifyingConsumerCore,
  type SubscriptionOptions,
  type VerifyingConsumerOptions,
} from '../consumer/core.js';
import type { ChunkLimits } from './stream-chunks.js';
import { planResume } from './stream-resume.js';
import { regressionError } from '../store/chunk-identity.js';
import { connectSubscriber, OrderedDelivery } from './stream-delivery.js';
import { resolveChunkLimits } from './stream-options.js';
import {
  bounded,
  lagOf,
  lastChunkId,
  resolveCaughtUpOptions,
  type CaughtUpOptions,
  type ConsumerLag,
} from './stream-lag.js';
import { observeLag } from '../telemetry/metrics.js';
import {
  EndpointRotation,
  errorText,
  explainDeclareFailure,
  MissingStreamCheck,
  openThroughEndpoints,
  StreamDoesNotExistError,
  StreamNotAvailableError,
  withTimeout,
  type StreamConnectionOptions,
} from './util.js';

/** Options of {@link StreamVerifyingConsumer.open}. */
export interface StreamVerifyingConsumerOptions extends VerifyingConsumerOptions, SubscriptionOptions {
  /**
   * Connection parameters; defaults as for `StreamDedupPublisher`.
   * @defaultValue `{ hostname: 'localhost', port: 5552, username: 'guest', password: 'guest', vhost: '/' }`
   */
  readonly connection?: StreamConnectionOptions;
  /** The stream to consume. */
  readonly stream: string;
  /**
   * The most bytes the compressed sub-entry batches of one delivered chunk may inflate to,
   * together (so also each batch). A chunk whose batches announce more stops the consumer with
   * `DEDUP_STREAM_UNREADABLE` before anything of it is inflated or applied. The default is 16
   * times the largest frame a writer may send under RabbitMQ's default `stream.frame_max` (1 MiB).
   * @defaultValue 16777216 (16 MiB)
   * @remarks Since 0.6.0
   */
  readonly maxInflatedBytes?: number;
  /**
   * How often the consumer reads its lag for the `stream_dedup.verifier.lag` gauge, in ms (one
   * stream stats query each time); `0`: never (the gauge is not reported).
   * @defaultValue 30000
   * @remarks Since 0.6.0
   */
  readonly lagIntervalMs?: number;
}

/** {@link StreamVerifyingConsumerOptions}, checked, with their defaults. */
interface ResolvedStreamOptions {
  readonly consumer: ResolvedVerifyingConsumerOptions;
  readonly subscription: ResolvedSubscriptionOptions;
  readonly stream: string;
  readonly connection: StreamConnectionOptions;
  readonly limits: ChunkLimits;
  readonly lagIntervalMs: number;
}

/**
 * Checks every option before anything is opened or connected.
 *
 * @throws TypeError, RangeError "Expected <option> to be <what>, got <value>".
 */
function resolveStreamOptions(options: StreamVerifyingConsumerOptions): ResolvedStreamOptions {
  const consumer = resolveVerifyingConsumerOptions(options);
  const stream = nonEmptyString(options.stream, 'stream');
  const connection = checkConnectionOptions(options.connection);
  const limits = resolveChunkLimits(options.maxInflatedBytes);
  const lagIntervalMs = integerOption(options.lagIntervalMs, 'lagIntervalMs', 30_000, 0, 2_147_483_647);
  return Object.freeze({
    consumer,
    subscription: resolveSubscriptionOptions(options),
    stream,
    connection,
    limits,
    lagIntervalMs,
  });
}

/**
 * Checks a consumer's `connection` option (its host, port and endpoints; not yet TLS, which
 * `EndpointRotation` checks).
 *
 * @internal
 * @throws TypeError, RangeError "Expected <option> to be <what>, got <value>".
 */
export function checkConnectionOptions(value: StreamConnectionOptions | undefined): StreamConnectionOptions {
  const connection = value ?? {};
  expectObject(connection, 'connection');
  checkEndpoint(connection, 'connection');
  const { endpoints } = connection;
  if (endpoints !== undefined) {
    if (!Array.isArray(endpoints)) typeMismatch('connection.endpoints', 'an array', endpoints);
    endpoints.forEach((endpoint: unknown, i) => {
      expectObject(endpoint, `connection.endpoints[${i}]`);
      checkEndpoint(endpoint, `connection.endpoints[${i}]`, true);
    });
  }
  return connection;
}

/** A host name and a port: required in an endpoint, optional in `connection` itself. */
function checkEndpoint(value: Record<string, unknown>, name: string, required = false): void {
  if (required || value.hostname !== undefined) nonEmptyString(value.hostname, `${name}.hostname`);
  if (required && value.port === undefined)
    typeMismatch(`${name}.port`, 'an integer from 1 to 65535', undefined);
  // A port read from the environment is a decimal string: the client takes it as it is.
  const port =
    typeof value.port === 'string' && /^\d{1,5}$/.test(value.port) ? Number(value.port) : value.port;
  integerOption(port, `${name}.port`, 0, 1, 65_535);
}

/**
 * Consumes a stream through the verifier: each message's identity is checked per (consumer,
 * tenant, producer); a new message runs the handler, whose LevelDB writes commit in one batch with
 * the verifier state and the offset. The consumer resumes from its own committed offset, so a
 * crash at any moment neither loses nor repeats an effect.
 *
 * @example
 * ```ts
 * const consumer = await StreamVerifyingConsumer.open({
 *   stream: 'ledger',
 *   consumerName: 'balance-projection',
 *   store: './.dedup',
 *   handler: async (message, tx) => {
 *     const balance = Number((await tx.get('balance'))?.toString() ?? 0);
 *     tx.put('balance', String(balance + Number(message.body)));
 *   },
 * });
 * ```
 */
export class StreamVerifyingConsumer extends VerifyingConsumer {
  readonly #endpoints: EndpointRotation;
  /** "Does not exist" is believed only when heard again (a node back from a partition can say it). */
  readonly #missing = new MissingStreamCheck();
  #params: ClientParams;
  #attempts = 0;
  readonly #options: ResolvedStreamOptions;
  readonly #subscriptions: Resubscriber<Client>;
  readonly #delivery: OrderedDelivery;
  readonly #log: Logger;
  /** The connection of the current subscription (for stats queries); `undefined` between them. */
  #client: Client | undefined;
  /** The highest offset delivered by any subscription of this life. */
  #delivered: bigint | undefined;
  /** The lag the gauge reports: the last one read. */
  #lastLag: ConsumerLag | undefined;
  #lagTimer: NodeJS.Timeout | undefined;
  #unobserveLag: () => void = () => undefined;
  #closing = false;

  private constructor(
    core: VerifyingConsumerCore,
    options: ResolvedStreamOptions,
    endpoints: EndpointRotation,
  ) {
    super(core);
    this.#options = options;
    this.#log = options.consumer.logger;
    this.#endpoints = endpoints;
    this.#params = endpoints.next();
    this.#delivery = new OrderedDelivery({
      process: (message) => this.core.process(message),
      get stopped() {
        return core.failure !== undefined;
      },
      stop: (error) => void this.stop(error),
      enqueue: (task) => this.#subscriptions.enqueue(task),
    });
    this.#subscriptions = new Resubscriber<Client>({
      subscribe: (generation) => this.#subscribe(generation),
      core,
      reconnect: options.subscription.reconnect,
      logger: this.#log,
      target: { stream: options.stream },
      onNewGeneration: () => this.#delivery.clear(),
    });
    core.onRewind((delayMs) => this.#subscriptions.rewind(delayMs));
    if (options.lagIntervalMs > 0) {
      this.#unobserveLag = observeLag(core.consumerName, options.stream, () => this.#lastLag?.offsets);
      this.#lagTimer = setInterval(() => {
        this.lag().catch(() => undefined);
      }, options.lagIntervalMs).unref();
    }
  }

  /**
   * How far the committed offset is behind the stream's end: one stream stats query (bounded:
   * 5 s). The stream protocol gives the first offset of the stream's last chunk, not its last
   * offset, so `offsets` counts up to that one: a lower bound, short by at most the last chunk's
   * other records (docs/design.md §16).
   *
   * @throws DedupError `DEDUP_BROKER_UNREACHABLE` between subscriptions (after a lost
   *   connection), `DEDUP_BROKER_REFUSED` when the stats query fails or times out,
   *   `DEDUP_CONSUMER_CLOSED` after `close()`.
   * @remarks Since 0.6.0
   */
  async lag(): Promise<ConsumerLag> {
    const last = await lastChunkId(this.#currentClient(), this.#options.stream);
    const lag = lagOf(last, this.core.committedOffset);
    this.#lastLag = lag;
    return lag;
  }

  /**
   * Resolves once the consumer has committed the stream's end as of the call: the first offset of
   * the stream's last chunk (one stats query), then every offset delivered by then (the rest of
   * that chunk, delivered with it). At once for an empty stream. The consumer goes on either way.
   *
   * @throws TypeError, RangeError for a bad option, before any I/O.
   * @throws DedupError `DEDUP_ABORTED` when `timeoutMs` passes or `signal` aborts first; what
   *   {@link StreamVerifyingConsumer.lag} throws; the error that stops the consumer (or
   *   `DEDUP_CONSUMER_CLOSED` after `close()`) if it stops first.
   * @remarks Since 0.6.0
   */
  async caughtUp(options?: CaughtUpOptions): Promise<void> {
    const { signal, timeoutMs } = resolveCaughtUpOptions(options);
    const what = `consumer "${this.core.consumerName}" catching up with stream "${this.#options.stream}"`;
    const wait = (async () => {
      const last = await lastChunkId(this.#currentClient(), this.#options.stream);
      if (last === undefined) return;
      await this.core.waitForOffset(last);
      // The whole last chunk was delivered with its first message.
      const delivered = this.#delivered;
      if (delivered !== undefined && delivered > last) await this.core.waitForOffset(delivered);
    })();
    await bounded(wait, what, signal, timeoutMs);
  }

  #currentClient(): Client {
    if (this.core.failure !== undefined) throw this.core.failure;
    if (this.#closing) throw new DedupError('DEDUP_CONSUMER_CLOSED', 'the consumer is closed');
    const client = this.#client;
    if (client === undefined) {
      throw new DedupError(
        'DEDUP_BROKER_UNREACHABLE',
        `consumer "${this.core.consumerName}" is not subscribed to stream "${this.#options.stream}" at the moment`,
      );
    }
    return client;
  }

  /**
   * Checks the options, opens the store, reads the committed offset and subscribes from the next
   * one.
   *
   * @throws TypeError, RangeError for a bad option ("Expected <option> to be <what>, got <value>"),
   *   before anything is opened or connected.
   * @throws DedupError `DEDUP_STORE_LOCKED`, `DEDUP_STORE_CORRUPT`, `DEDUP_BROKER_UNREACHABLE`,
   *   `DEDUP_BROKER_REFUSED` (for example a missing stream), `DEDUP_STREAM_REGRESSION` (an empty
   *   stream behind a committed offset, or one shorter than it: recreated). A recreated stream
   *   that holds the committed offset stops the consumer with `DEDUP_STREAM_REGRESSION` once its
   *   first chunk is delivered, before any handler runs (`closed()` rejects with it).
   */
  static async open(options: StreamVerifyingConsumerOptions): Promise<StreamVerifyingConsumer> {
    const resolved = resolveStreamOptions(options);
    // Checks the TLS options: before the store is opened too.
    const endpoints = new EndpointRotation(resolved.connection);
    const core = await VerifyingConsumerCore.open(resolved.consumer, { destination: resolved.stream });
    const consumer = new StreamVerifyingConsumer(core, resolved, endpoints);
    return VerifyingConsumer.subscribed(consumer, () =>
      openThroughEndpoints(endpoints.size, () => consumer.#subscriptions.subscribe()),
    );
  }

  /**
   * Messages the broker delivered that wait for the handler. Bounded: above 20 000 of them, or
   * 32 MiB of them (bodies and decoded headers, properties and annotations), the consumer stops asking for chunks until the handler catches up (plus
   * at most one chunk in flight).
   */
  get buffered(): number {
    return this.#delivery.buffered;
  }

  /** One subscription attempt, through the next endpoint; see {@link Resubscriber}. */
  async #subscribe(generation: Generation<Client>): Promise<void> {
    this.#delivery.reset();
    // A cluster: each attempt after the first goes through the next node, in case the last one is down.
    if (this.#attempts++ > 0) this.#params = this.#endpoints.next();
    const client = await connectSubscriber(
      this.#params,
      this.#options.stream,
      generation,
      this.#options.subscription.connectTimeoutMs,
    );
    const isCurrent = (): boolean => generation.isCurrent();
    const committed = this.core.committedOffset;
    const resume = committed === undefined ? undefined : await this.#planResume(client, committed);
    if (resume === undefined) this.core.expectChunk(undefined);
    // Before the first commit, a resubscription starts at the first offset delivered: at 'next'
    // the dropped batch and what was written while away would never come (core.startOffset).
    const first = committed === undefined ? this.core.startOffset : undefined;
    const offset =
      resume !== undefined
        ? Offset.offset(resume)
        : first !== undefined
          ? Offset.offset(first)
          : this.#options.subscription.startFrom === 'next'
            ? Offset.next()
            : Offset.first();
    try {
      // The client misreads sub-entry batches (their offsets, and every batch but a chunk's first):
      // this client's connections decode chunks with stream-chunks.ts (docs/design.md §10). A chunk
      // that does not decode stops the consumer before anything of it is applied; a restart stops
      // there again rather than skip it.
      decodeDeliveriesOurselves(
        client,
        (error) => {
          if (!generation.isCurrent()) return;
          void this.stop(
            new DedupError(
              'DEDUP_STREAM_UNREADABLE',
              `cannot read stream "${this.#options.stream}": ${error.message}`,
              { cause: error },
            ),
          );
        },
        this.#options.limits,
      );
      // Bounded: on a cluster in failover the subscription can hang with no answer and no close
      // (measured: a consumer stalled for good after a leader kill -9, and an open() hung on a
      // node being stopped).
      const consumer = await withTimeout(
        client.declareConsumer(
          {
            stream: this.#options.stream,
            offset,
            connectionClosedListener: () => {
              if (this.#client === client) this.#client = undefined;
              generation.lost();
            },
            creditPolicy: this.#delivery.creditPolicy(isCurrent),
          },
          (message) => {
            const at = message.offset;
            if (isCurrent() && at !== undefined && (this.#delivered === undefined || at > this.#delivered)) {
              this.#delivered = at;
            }
            this.#delivery.deliver(isCurrent, message);
          },
        ),
        10_000,
        'subscribing',
        // A member of the stream in the middle of a restart: retried like an election.
        (message) => new StreamNotAvailableError(message),
      );
      // The client reacts to a leader change by closing the consumer through its locator
      // connection, which may be the dead node's: that rejection is unhandled and kills the process
      // (measured on a 3-node cluster). metadata_update above handles the change instead.
      consumerCloseEvents(consumer)?.removeAllListeners(`close_consumer_${consumer.extendedId}`);
      this.#missing.succeeded();
      this.#client = client;
      const via = consumer.getConnectionInfo();
      this.#log.info(
        {
          consumer: this.core.consumerName,
          stream: this.#options.stream,
          offset: (resume ?? first)?.toString() ?? offset.type,
          node: `${via.host}:${via.port}`,
        },
        'stream-dedup: verifying consumer subscribed',
      );
    } catch (caught) {
      const err = this.#missing.judge(
        await explainDeclareFailure(client, this.#options.stream, caught),
        `${this.#params.hostname}:${this.#params.port}`,
      );
      await withTimeout(client.close(), 5_000, 'closing').catch(() => undefined);
      throw new DedupError(
        'DEDUP_BROKER_REFUSED',
        `cannot consume stream "${this.#options.stream}": ${errorText(err)}` +
          (err instanceof StreamDoesNotExistError ? ' (a consumer does not create it: create it first)' : ''),
        { cause: err },
      );
    }
  }

  /**
   * Where to subscribe with committed offset `committed` (see stream-resume.ts). A stream that
   * cannot be the one the offset came from stops the consumer with `DEDUP_STREAM_REGRESSION`:
   * subscribing at committed + 1 would skip the new stream's offsets up to `committed` silently
   * (the client drops every message below the offset asked for).
   */
  async #planResume(client: Client, committed: bigint): Promise<bigint> {
    const refuse = (found: string): DedupError =>
      regressionError(this.#options.stream, this.core.consumerName, committed, found);
    let plan;
    try {
      plan = await planResume(client, this.#options.stream, committed, this.core.committedChunk, refuse);
    } catch (error) {
      await withTimeout(client.close(), 5_000, 'closing').catch(() => undefined);
      void this.stop(error as Error);
      throw error;
    }
    this.core.expectChunk(plan.expect, refuse);
    return plan.offset;
  }

  /** @internal Unsubscribes first (what is buffered is dropped), lets the message in progress finish, then commits. */
  protected override shutdown(closeCore: () => Promise<void>): Promise<void> {
    this.#closing = true;
    clearInterval(this.#lagTimer);
    this.#unobserveLag();
    this.#client = undefined;
    return this.#subscriptions.shutdown(closeCore, false);
  }
}
