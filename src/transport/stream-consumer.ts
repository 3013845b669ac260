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
import {
  consumerCloseEvents,
  decodeDeliveriesOurselves,
  metadataUpdateStream,
} from './stream-client-internals.js';
import { connectStreamClient } from './stream-probe.js';
import {
  VerifyingConsumerCore,
  type SubscriptionOptions,
  type VerifyingConsumerOptions,
} from '../consumer/core.js';
import type { IncomingMessage } from '../consumer/types.js';
import {
  EndpointRotation,
  errorText,
  explainDeclareFailure,
  MissingStreamCheck,
  openThroughEndpoints,
  StreamNotAvailableError,
  withTimeout,
  type StreamConnectionOptions,
} from './util.js';

/** Delivered messages waiting for the handler above which the consumer stops asking for chunks… */
const BUFFER_HIGH = 20_000;
/** …and below which it asks again. */
const BUFFER_LOW = 5_000;
/** Processed messages at the head of the buffer that make it worth copying the rest down. */
const COMPACT_AT = 1_024;
type StreamMessage = Parameters<Parameters<Client['declareConsumer']>[1]>[0];
type ConsumerCreditPolicy = NonNullable<Parameters<Client['declareConsumer']>[0]['creditPolicy']>;

/** Options of {@link StreamVerifyingConsumer.open}. */
export interface StreamVerifyingConsumerOptions extends VerifyingConsumerOptions, SubscriptionOptions {
  /** Connection parameters; defaults as for `StreamDedupPublisher`. */
  readonly connection?: StreamConnectionOptions;
  /** The stream to consume. */
  readonly stream: string;
}

/** {@link StreamVerifyingConsumerOptions}, checked, with their defaults. */
interface ResolvedStreamOptions {
  readonly consumer: ResolvedVerifyingConsumerOptions;
  readonly subscription: ResolvedSubscriptionOptions;
  readonly stream: string;
  readonly connection: StreamConnectionOptions;
}

/**
 * Checks every option before anything is opened or connected.
 *
 * @throws TypeError, RangeError "Expected <option> to be <what>, got <value>".
 */
function resolveStreamOptions(options: StreamVerifyingConsumerOptions): ResolvedStreamOptions {
  const consumer = resolveVerifyingConsumerOptions(options);
  const stream = nonEmptyString(options.stream, 'stream');
  const connection = options.connection ?? {};
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
  return Object.freeze({ consumer, subscription: resolveSubscriptionOptions(options), stream, connection });
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
  /**
   * Delivered by the current subscription, not yet processed, in stream order (read from #head
   * on). Emptied whenever the generation moves on, so everything in it is of the current one.
   */
  #buffer: IncomingMessage[] = [];
  #head = 0;
  #draining = false;
  /** A credit the client asked for while the buffer was full: granted once the drain catches up. */
  #heldCredit: (() => void) | undefined;
  readonly #log: Logger;

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
    this.#subscriptions = new Resubscriber<Client>({
      subscribe: (generation) => this.#subscribe(generation),
      core,
      reconnect: options.subscription.reconnect,
      logger: this.#log,
      target: { stream: options.stream },
      onNewGeneration: () => this.#clearBuffer(),
    });
  }

  /**
   * Checks the options, opens the store, reads the committed offset and subscribes from the next
   * one.
   *
   * @throws TypeError, RangeError for a bad option ("Expected <option> to be <what>, got <value>"),
   *   before anything is opened or connected.
   * @throws DedupError `DEDUP_STORE_LOCKED`, `DEDUP_STORE_CORRUPT`, `DEDUP_BROKER_UNREACHABLE`,
   *   `DEDUP_BROKER_REFUSED` (for example a missing stream).
   */
  static async open(options: StreamVerifyingConsumerOptions): Promise<StreamVerifyingConsumer> {
    const resolved = resolveStreamOptions(options);
    // Checks the TLS options: before the store is opened too.
    const endpoints = new EndpointRotation(resolved.connection);
    const core = await VerifyingConsumerCore.open(resolved.consumer);
    const consumer = new StreamVerifyingConsumer(core, resolved, endpoints);
    return VerifyingConsumer.subscribed(consumer, () =>
      openThroughEndpoints(endpoints.size, () => consumer.#subscriptions.subscribe()),
    );
  }

  /**
   * Messages the broker delivered that wait for the handler. Bounded: above 20 000 the consumer
   * stops asking for chunks until the handler catches up (plus at most one chunk in flight).
   */
  get buffered(): number {
    return this.#draining ? this.#buffer.length - this.#head : 0;
  }

  /** One subscription attempt, through the next endpoint; see {@link Resubscriber}. */
  async #subscribe(generation: Generation<Client>): Promise<void> {
    this.#heldCredit = undefined;
    // A cluster: each attempt after the first goes through the next node, in case the last one is down.
    if (this.#attempts++ > 0) this.#params = this.#endpoints.next();
    const client = await connectStreamClient(
      {
        ...this.#params,
        listeners: {
          connection_closed: () => generation.lost(),
          // A leader change or a deleted stream: subscribe again, through whichever node answers.
          metadata_update: (update) => {
            if (metadataUpdateStream(update) === this.#options.stream) generation.lost();
          },
        },
      },
      this.#options.subscription.connectTimeoutMs,
    );
    generation.opened(client);
    const resume = this.core.resumeOffset;
    const offset =
      resume !== undefined
        ? Offset.offset(resume)
        : this.#options.subscription.startFrom === 'next'
          ? Offset.next()
          : Offset.first();
    try {
      // The client misreads sub-entry batches (their offsets, and every batch but a chunk's first):
      // this client's connections decode chunks with stream-chunks.ts (docs/design.md §10). A chunk
      // that does not decode stops the consumer before anything of it is applied; a restart stops
      // there again rather than skip it.
      decodeDeliveriesOurselves(client, (error) => {
        if (!generation.isCurrent()) return;
        void this.stop(
          new DedupError(
            'DEDUP_STREAM_UNREADABLE',
            `cannot read stream "${this.#options.stream}": ${error.message}`,
            { cause: error },
          ),
        );
      });
      // Bounded: on a cluster in failover the subscription can hang with no answer and no close
      // (measured: a consumer stalled for good after a leader kill -9, and an open() hung on a
      // node being stopped).
      const consumer = await withTimeout(
        client.declareConsumer(
          {
            stream: this.#options.stream,
            offset,
            connectionClosedListener: () => generation.lost(),
            creditPolicy: this.#creditPolicy(generation),
          },
          (message) => this.#onMessage(generation, message),
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
      const via = consumer.getConnectionInfo();
      this.#log.info(
        {
          consumer: this.core.consumerName,
          stream: this.#options.stream,
          offset: resume?.toString() ?? offset.type,
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
        `cannot consume stream "${this.#options.stream}": ${errorText(err)}`,
        { cause: err },
      );
    }
  }

  /** The client's delivery callback: never throws, never waits (see the comment inside). */
  #onMessage(generation: Generation<Client>, message: StreamMessage): void {
    // The client may deliver two chunks at once, and an exception here would be unhandled.
    // Process right here while nothing waits (the common, synchronous case); otherwise
    // buffer, and drain one at a time in order. Failures become a stop.
    if (!generation.isCurrent()) return;
    // The client's message is the core's IncomingMessage as it is (no wrapper per message);
    // deliveries always carry their offset.
    const item = message as IncomingMessage;
    if (item.offset === undefined) {
      void this.stop(new Error('the stream client delivered a message without an offset'));
      return;
    }
    if (this.#draining) {
      this.#buffer.push(item);
      return;
    }
    if (this.core.failure !== undefined) return;
    let pending: Promise<void> | undefined;
    try {
      pending = this.core.process(item);
    } catch (err) {
      void this.stop(err instanceof Error ? err : new Error(String(err)));
      return;
    }
    if (pending !== undefined) {
      this.#draining = true;
      this.#subscriptions.enqueue(async () => {
        try {
          await pending;
        } catch (err) {
          void this.stop(err instanceof Error ? err : new Error(String(err)));
          this.#clearBuffer();
          this.#draining = false;
          return;
        }
        await this.#drain();
      });
    }
  }

  async #drain(): Promise<void> {
    try {
      while (this.#head < this.#buffer.length) {
        if (this.#heldCredit !== undefined && this.#buffer.length - this.#head < BUFFER_LOW) {
          this.#grantHeldCredit();
        }
        const item = this.#buffer[this.#head++]!;
        // Drop what was processed: in a long drain the array would otherwise keep every message
        // of it alive (measured: 59 000 at once, promoted and collected the expensive way).
        if (this.#head >= COMPACT_AT && this.#head * 2 >= this.#buffer.length) {
          this.#buffer = this.#buffer.slice(this.#head);
          this.#head = 0;
        }
        if (this.core.failure !== undefined) continue;
        try {
          const pending = this.core.process(item);
          if (pending !== undefined) await pending;
        } catch (err) {
          void this.stop(err instanceof Error ? err : new Error(String(err)));
          break;
        }
      }
    } finally {
      this.#clearBuffer();
      this.#draining = false;
      this.#grantHeldCredit();
    }
  }

  /** Drops what older subscription generations delivered and is still buffered (never processed). */
  #clearBuffer(): void {
    this.#buffer = [];
    this.#head = 0;
  }

  /**
   * One chunk of credit at a time, as in the client's default policy: with more credit the client
   * runs two chunks' deliveries at once and interleaves their messages (measured: 927 of 100 000
   * then fell outside a 1024 window as stale), and the verifier needs stream order. The credit is
   * held back while more than {@link BUFFER_HIGH} delivered messages wait for an asynchronous
   * handler: without that the client reads the stream into memory far ahead of a slow handler
   * (measured: 35 000 messages ahead on a loaded 3-node cluster).
   */
  #creditPolicy(generation: Generation<Client>): ConsumerCreditPolicy {
    type Request = (howMany: number) => Promise<void>;
    return {
      onSubscription: () => 1,
      onChunkReceived: () => Promise.resolve(),
      onChunkCompleted: (request: Request) => {
        if (!generation.isCurrent()) return Promise.resolve();
        const grant = (): void => void request(1).catch(() => undefined);
        if (!this.#draining || this.#buffer.length - this.#head < BUFFER_HIGH) grant();
        else this.#heldCredit = grant;
        return Promise.resolve();
      },
      requestCredits: (request: Request, howMany: number) => request(howMany),
    } as unknown as ConsumerCreditPolicy;
  }

  #grantHeldCredit(): void {
    const grant = this.#heldCredit;
    this.#heldCredit = undefined;
    grant?.();
  }

  /** @internal Unsubscribes first (what is buffered is dropped), lets the message in progress finish, then commits. */
  protected override shutdown(closeCore: () => Promise<void>): Promise<void> {
    return this.#subscriptions.shutdown(closeCore, false);
  }
}
