import type { Channel, ChannelModel, ConsumeMessage, Options } from 'amqplib';
import { connectAmqp, type AmqpSocketOptions } from './amqp-connect.js';
import { DedupError } from '../errors.js';
import { VerifyingConsumer } from '../consumer/facade.js';
import { VerifyingConsumerCore, type VerifyingConsumerOptions } from '../consumer/core.js';
import { silentLogger, type Logger } from '../telemetry/logger.js';
import { assertTlsOptions, errorText, retryWithBackoff, withTimeout } from './util.js';

/** Options of {@link AmqpVerifyingConsumer.open}. */
export interface AmqpVerifyingConsumerOptions extends VerifyingConsumerOptions {
  /** An AMQP URL or amqplib connect options. */
  readonly url: string | Options.Connect;
  /** The stream queue to consume. */
  readonly queue: string;
  /** Unacknowledged messages the broker may send ahead (basic.qos). @defaultValue 1000 */
  readonly prefetch?: number;
  /** Where a consumer without a committed offset starts (`x-stream-offset`). @defaultValue 'first' */
  readonly startFrom?: 'first' | 'next';
  /** Reconnect backoff, in ms. @defaultValue `{ initialDelayMs: 100, maxDelayMs: 5000 }` */
  readonly reconnect?: { readonly initialDelayMs?: number; readonly maxDelayMs?: number };
  /** How long one connection attempt may take, in ms. @defaultValue 10000 */
  readonly connectTimeoutMs?: number;
  /**
   * TLS for an `amqps://` URL: a custom CA, a client certificate and key (and its passphrase), the
   * server name to verify — Node's `tls.connect` options, passed to amqplib. Secrets given here
   * never appear in errors or logs.
   */
  readonly socketOptions?: AmqpSocketOptions;
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
  readonly #options: AmqpVerifyingConsumerOptions;
  readonly #log: Logger;
  #model: ChannelModel | undefined;
  #queue: Promise<void> = Promise.resolve();
  #generation = 0;

  private constructor(core: VerifyingConsumerCore, options: AmqpVerifyingConsumerOptions) {
    super(core);
    this.#options = options;
    this.#log = options.logger ?? silentLogger;
  }

  /**
   * Opens the store, connects, and consumes from the committed offset + 1.
   *
   * @throws DedupError `DEDUP_STORE_LOCKED`, `DEDUP_STORE_CORRUPT`, `DEDUP_BROKER_UNREACHABLE`,
   *   `DEDUP_BROKER_REFUSED` (for example a missing queue).
   */
  static async open(options: AmqpVerifyingConsumerOptions): Promise<AmqpVerifyingConsumer> {
    if (typeof options?.queue !== 'string' || options.queue.length === 0) {
      throw new RangeError('queue must be a non-empty string');
    }
    const prefetch = options.prefetch ?? 1000;
    if (!Number.isInteger(prefetch) || prefetch < 1) throw new RangeError('prefetch must be an integer ≥ 1');
    if (options.socketOptions !== undefined) assertTlsOptions(options.socketOptions, 'socketOptions');
    // A batch larger than the prefetch would wait for messages the broker holds back until acked.
    const core = await VerifyingConsumerCore.open({
      ...options,
      commitEvery: Math.min(options.commitEvery ?? 1000, Math.max(1, Math.floor(prefetch / 2))),
    });
    const consumer = new AmqpVerifyingConsumer(core, options);
    try {
      await consumer.#subscribe();
    } catch (err) {
      await core.close();
      throw err;
    }
    return consumer;
  }

  async #subscribe(): Promise<void> {
    const generation = ++this.#generation;
    const model = await connectAmqp(
      this.#options.url,
      this.#options.connectTimeoutMs ?? 10_000,
      () => {
        if (generation === this.#generation) this.#lost();
      },
      this.#options.socketOptions,
    );
    this.#model = model;
    let channel: Channel;
    try {
      channel = await model.createChannel();
      channel.on('error', () => undefined);
      channel.on('close', () => {
        if (generation === this.#generation) this.#lost();
      });
      await channel.prefetch(this.#options.prefetch ?? 1000);
      const resume = this.core.resumeOffset;
      const start = resume !== undefined ? Number(resume) : (this.#options.startFrom ?? 'first');
      await channel.consume(
        this.#options.queue,
        (msg) => {
          if (msg === null) {
            if (generation === this.#generation) this.#lost(); // cancelled by the broker
            return;
          }
          this.#deliver(generation, channel, msg);
        },
        { noAck: false, arguments: { 'x-stream-offset': start } },
      );
      this.#log.info(
        { consumer: this.core.consumerName, queue: this.#options.queue, offset: String(start) },
        'stream-dedup: verifying consumer subscribed',
      );
    } catch (err) {
      await withTimeout(model.close(), 2_000, 'closing').catch(() => undefined);
      throw new DedupError(
        'DEDUP_BROKER_REFUSED',
        `cannot consume queue "${this.#options.queue}": ${errorText(err)}`,
        {
          cause: err,
        },
      );
    }
  }

  #deliver(generation: number, channel: Channel, msg: ConsumeMessage): void {
    const headers = (msg.properties.headers ?? {}) as Record<string, unknown>;
    const rawOffset = headers['x-stream-offset'];
    const incoming = {
      offset: typeof rawOffset === 'number' || typeof rawOffset === 'bigint' ? BigInt(rawOffset) : -1n,
      content: msg.content,
      applicationProperties: headers,
      settle: () => {
        if (generation === this.#generation) channel.ack(msg);
      },
    };
    this.#queue = this.#queue.then(async () => {
      if (generation !== this.#generation || this.core.failure !== undefined) return;
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

  /** The connection went away: drop the uncommitted batch and consume again from the committed offset. */
  #lost(): void {
    if (this.isStopping) return;
    this.#generation++;
    this.#log.warn(
      {
        consumer: this.core.consumerName,
        queue: this.#options.queue,
        committedOffset: this.core.committedOffset?.toString(),
      },
      'stream-dedup: verifying consumer lost its subscription; subscribing again from the committed offset',
    );
    this.#queue = this.#queue.then(async () => {
      // Taken here, not when the loss was seen: a subscription in progress then has finished
      // (taken earlier, that new connection would be left open).
      const old = this.#model;
      this.#model = undefined;
      this.core.discardPending();
      if (old !== undefined) await withTimeout(old.close(), 2_000, 'closing').catch(() => undefined);
      await retryWithBackoff(
        () => this.#subscribe(),
        () => this.isStopping,
        this.#options.reconnect,
      );
    });
  }

  /** @internal Commits (and acks) what was processed before the channel goes. */
  protected override async shutdown(closeCore: () => Promise<void>): Promise<void> {
    await this.#queue.catch(() => undefined);
    await closeCore();
    this.#generation++;
    const model = this.#model;
    this.#model = undefined;
    if (model !== undefined) await withTimeout(model.close(), 5_000, 'closing').catch(() => undefined);
  }
}
