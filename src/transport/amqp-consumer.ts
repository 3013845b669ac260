import type { Channel, ChannelModel, ConsumeMessage, Options } from 'amqplib';
import { closeLate, ConnectBudget, connectAmqp, type AmqpSocketOptions } from './amqp-connect.js';
import { DedupError } from '../errors.js';
import { VerifyingConsumer } from '../consumer/facade.js';
import {
  VerifyingConsumerCore,
  type SubscriptionOptions,
  type VerifyingConsumerOptions,
} from '../consumer/core.js';
import {
  nonEmptyString,
  resolveSubscriptionOptions,
  resolveVerifyingConsumerOptions,
  type ResolvedSubscriptionOptions,
  type ResolvedVerifyingConsumerOptions,
} from '../consumer/options.js';
import { Resubscriber, type Generation } from '../consumer/resubscribe.js';
import type { Logger } from '../telemetry/logger.js';
import type { PolicySpec } from '../verifier/types.js';
import { expectOptionalObject, integerOption, outOfRange, typeMismatch } from '../util/options.js';
import { assertTlsOptions, errorText, withTimeout } from './util.js';

/** Options of {@link AmqpVerifyingConsumer.open}. */
export interface AmqpVerifyingConsumerOptions extends VerifyingConsumerOptions, SubscriptionOptions {
  /** An AMQP URL or amqplib connect options. */
  readonly url: string | Options.Connect;
  /** The stream queue to consume. */
  readonly queue: string;
  /**
   * Unacknowledged messages the broker may send ahead (basic.qos; an integer from 1 to 65535). A
   * count, not bytes (RabbitMQ does not implement basic.qos' byte limit): the consumer may hold this many times
   * the largest message, so set it to the memory you allow divided by the largest message.
   * @defaultValue 1000
   */
  readonly prefetch?: number;
  /**
   * TLS for an `amqps://` URL: a custom CA, a client certificate and key (and its passphrase), the
   * server name to verify — Node's `tls.connect` options, passed to amqplib. Secrets given here
   * never appear in errors or logs.
   * @defaultValue none: Node's defaults (TLS only with an `amqps://` URL)
   */
  readonly socketOptions?: AmqpSocketOptions;
}

/** {@link AmqpVerifyingConsumerOptions}, checked, with their defaults. */
interface ResolvedAmqpOptions {
  readonly consumer: ResolvedVerifyingConsumerOptions;
  readonly subscription: ResolvedSubscriptionOptions;
  readonly url: string | Options.Connect;
  readonly queue: string;
  readonly prefetch: number;
  readonly socketOptions: AmqpSocketOptions | undefined;
}

/** The publishers' default `maxInFlight` (README, "API"); the unit test binds the two. @internal */
export const PUBLISHER_DEFAULT_MAX_IN_FLIGHT = 5_000;

/**
 * The warning `open()` logs when the window is below the publishers' default `maxInFlight`, or
 * `undefined`. After a crash an AMQP 0-9-1 publisher re-sends up to `maxInFlight` messages, and
 * the broker stores them again: a copy more than the window below the highest ID is `stale`,
 * not recognised as a duplicate. The default stays 1 024 (a larger default would change stored
 * states on upgrade, and a group refuses a changelog of another policy): this says so instead.
 *
 * @internal
 */
export function windowWarning(policy: PolicySpec): string | undefined {
  if (policy.kind !== 'window' || policy.size >= PUBLISHER_DEFAULT_MAX_IN_FLIGHT) return undefined;
  return (
    `policy window(${policy.size}) is below the publishers' default maxInFlight (${PUBLISHER_DEFAULT_MAX_IN_FLIGHT}): ` +
    `after a publisher crash, AMQP 0-9-1 re-send copies more than ${policy.size} ids below the highest ` +
    `are reported stale, not as duplicates; use a window at least the publishers' maxInFlight for a new store`
  );
}

/**
 * Checks every option before anything is opened or connected.
 *
 * @throws TypeError, RangeError "Expected <option> to be <what>, got <value>"; TypeError for TLS
 *   options that cannot be used.
 */
function resolveAmqpOptions(options: AmqpVerifyingConsumerOptions): ResolvedAmqpOptions {
  const base = resolveVerifyingConsumerOptions(options);
  const { url, socketOptions } = options;
  const urlWhat = 'an AMQP URL or amqplib connect options';
  if (url === '') outOfRange('url', urlWhat, url);
  if (typeof url !== 'string' && (typeof url !== 'object' || url === null || Array.isArray(url)))
    typeMismatch('url', urlWhat, url);
  const queue = nonEmptyString(options.queue, 'queue');
  // basic.qos carries the prefetch count in 16 bits.
  const prefetch = integerOption(options.prefetch, 'prefetch', 1000, 1, 65_535);
  expectOptionalObject(socketOptions, 'socketOptions');
  if (socketOptions !== undefined) assertTlsOptions(socketOptions, 'socketOptions');
  // A batch larger than the prefetch would wait for messages the broker holds back until acked.
  const commitEvery = Math.min(base.commitEvery, Math.max(1, Math.floor(prefetch / 2)));
  return Object.freeze({
    consumer: resolveVerifyingConsumerOptions({ ...base, commitEvery }),
    subscription: resolveSubscriptionOptions(options),
    url,
    queue,
    prefetch,
    socketOptions,
  });
}

/**
 * Consumes a stream queue over AMQP 0-9-1 through the verifier — the only deduplication AMQP 0-9-1
 * publishers get, since the broker does not deduplicate them. Effects, verifier state and the
 * stream offset commit in one LevelDB batch; messages are acked only after that commit, and the
 * consumer resumes with `x-stream-offset` = committed offset + 1.
 *
 * @example
 * ```ts
 * const consumer = await AmqpVerifyingConsumer.open({
 *   url: 'amqp://guest:guest@127.0.0.1:5672',
 *   queue: 'orders',
 *   consumerName: 'order-projection',
 *   store: './.dedup',
 *   handler: (message, tx) => tx.put(`order:${message.identity?.publishingId}`, message.body),
 * });
 * ```
 */
export class AmqpVerifyingConsumer extends VerifyingConsumer {
  readonly #options: ResolvedAmqpOptions;
  readonly #log: Logger;
  readonly #subscriptions: Resubscriber<ChannelModel>;

  private constructor(core: VerifyingConsumerCore, options: ResolvedAmqpOptions) {
    super(core);
    this.#options = options;
    this.#log = options.consumer.logger;
    this.#subscriptions = new Resubscriber<ChannelModel>({
      subscribe: (generation) => this.#subscribe(generation),
      core,
      reconnect: options.subscription.reconnect,
      logger: this.#log,
      target: { queue: options.queue },
    });
    core.onRewind((delayMs) => this.#subscriptions.rewind(delayMs));
  }

  /**
   * Checks the options, opens the store, connects, and consumes from the committed offset + 1.
   *
   * @throws TypeError, RangeError for a bad option ("Expected <option> to be <what>, got <value>"),
   *   before anything is opened or connected.
   * @throws DedupError `DEDUP_STORE_LOCKED`, `DEDUP_STORE_CORRUPT`, `DEDUP_BROKER_UNREACHABLE`,
   *   `DEDUP_BROKER_REFUSED` (for example a missing queue).
   */
  static async open(options: AmqpVerifyingConsumerOptions): Promise<AmqpVerifyingConsumer> {
    const resolved = resolveAmqpOptions(options);
    const warning = windowWarning(resolved.consumer.policy);
    if (warning !== undefined) resolved.consumer.logger.warn({ policy: resolved.consumer.policy }, warning);
    const core = await VerifyingConsumerCore.open(resolved.consumer, { destination: resolved.queue });
    const consumer = new AmqpVerifyingConsumer(core, resolved);
    return VerifyingConsumer.subscribed(consumer, () => consumer.#subscriptions.subscribe());
  }

  /** One subscription attempt; see {@link Resubscriber}. */
  async #subscribe(generation: Generation<ChannelModel>): Promise<void> {
    // One bound for the handshake, the channel and the consume (ConnectBudget).
    const budget = new ConnectBudget(this.#options.subscription.connectTimeoutMs);
    const model = await connectAmqp(
      this.#options.url,
      budget,
      () => generation.lost(),
      this.#options.socketOptions,
    );
    generation.opened(model);
    let channel: Channel;
    try {
      channel = await budget.step(model.createChannel(), 'opening a channel', closeLate);
      channel.on('error', () => undefined);
      channel.on('close', () => generation.lost());
      await budget.step(channel.prefetch(this.#options.prefetch), 'setting the prefetch');
      // Before the first commit: the first offset delivered (core.startOffset), not 'next' again.
      const resume = this.core.startOffset;
      const start = resume !== undefined ? Number(resume) : this.#options.subscription.startFrom;
      const consuming = channel.consume(
        this.#options.queue,
        (msg) => {
          if (msg === null) {
            generation.lost(); // cancelled by the broker
            return;
          }
          this.#deliver(generation, channel, msg);
        },
        { noAck: false, arguments: { 'x-stream-offset': start } },
      );
      await budget.step(consuming, `consuming queue "${this.#options.queue}"`);
      this.#log.info(
        { consumer: this.core.consumerName, queue: this.#options.queue, offset: String(start) },
        'stream-dedup: verifying consumer subscribed',
      );
    } catch (err) {
      // The close within what is left of the bound: after a step that ran out of it (a broker gone
      // silent, which will not answer the close either), not waited for at all (it waited 2 s).
      const left = Math.min(budget.leftMs, 2_000);
      if (left > 0) await withTimeout(model.close(), left, 'closing').catch(() => undefined);
      else model.close().catch(() => undefined);
      // A step that ran out of the bound: transient, the next attempt tries again.
      if (err instanceof DedupError) throw err;
      throw new DedupError(
        'DEDUP_BROKER_REFUSED',
        `cannot consume queue "${this.#options.queue}": ${errorText(err)}`,
        {
          cause: err,
        },
      );
    }
  }

  #deliver(generation: Generation<ChannelModel>, channel: Channel, msg: ConsumeMessage): void {
    const headers = (msg.properties.headers ?? {}) as Record<string, unknown>;
    const rawOffset = headers['x-stream-offset'];
    const incoming = {
      offset: typeof rawOffset === 'number' || typeof rawOffset === 'bigint' ? BigInt(rawOffset) : -1n,
      content: msg.content,
      applicationProperties: headers,
      settle: () => {
        if (generation.isCurrent()) channel.ack(msg);
      },
    };
    this.#subscriptions.enqueue(async () => {
      if (!generation.isCurrent() || this.core.failure !== undefined) return;
      if (incoming.offset < 0n) {
        void this.stop(
          new DedupError(
            'DEDUP_BROKER_REFUSED',
            `queue "${this.#options.queue}" is not a stream queue (no x-stream-offset)`,
          ),
        );
        return;
      }
      try {
        const pending = this.core.process(incoming);
        if (pending !== undefined) await pending;
      } catch (err) {
        void this.stop(err instanceof Error ? err : new Error(String(err)));
      }
    });
  }

  /** @internal Processes what was delivered, commits (and acks) it, then closes the connection. */
  protected override shutdown(closeCore: () => Promise<void>): Promise<void> {
    return this.#subscriptions.shutdown(closeCore, true);
  }
}
