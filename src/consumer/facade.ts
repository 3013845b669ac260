import type { VerifyingConsumerCore } from './core.js';
import type { VerifyStats } from './types.js';

/**
 * What every verifying consumer offers, whatever its transport. `StreamVerifyingConsumer` and
 * `AmqpVerifyingConsumer` add their own `open()` and how they subscribe and shut down.
 */
export abstract class VerifyingConsumer {
  /** @internal */
  protected readonly core: VerifyingConsumerCore;
  #stopping: Promise<void> | undefined;
  #resolveClosed!: (error: Error | undefined) => void;
  readonly #closed: Promise<Error | undefined>;

  /** @internal */
  protected constructor(core: VerifyingConsumerCore) {
    this.core = core;
    this.#closed = new Promise((resolve) => (this.#resolveClosed = resolve));
  }

  /**
   * Resolves once every message up to `offset` is committed; rejects if the consumer stops first:
   * with the error that stopped it, or a `DedupError` `DEDUP_CONSUMER_CLOSED` after `close()`.
   */
  waitForOffset(offset: bigint): Promise<void> {
    return this.core.waitForOffset(offset);
  }

  /** Counters since open: new, duplicate, stale, gapsReported, gapsConfirmed, skips, unidentified, commits. */
  get stats(): Readonly<VerifyStats> {
    return this.core.stats;
  }

  /** The last committed offset. */
  get committedOffset(): bigint | undefined {
    return this.core.committedOffset;
  }

  /** Reads a value the handler committed. */
  readEffect(key: string): Promise<Buffer | undefined> {
    return this.core.readEffect(key);
  }

  /** Resolves when the consumer stopped: with the error that stopped it, or `undefined` after `close()`. */
  closed(): Promise<Error | undefined> {
    return this.#closed;
  }

  /** Commits what was processed, stops consuming and releases the store. Idempotent. */
  close(): Promise<void> {
    return this.stop(undefined);
  }

  /** Calls {@link VerifyingConsumer.close}: `await using consumer = await …open(…)`. */
  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }

  /**
   * @internal Subscribes `consumer` for the first time; when that fails, closes it (releasing the
   * store and anything a subscription left) and rethrows.
   */
  protected static async subscribed<T extends VerifyingConsumer>(
    consumer: T,
    subscribe: () => Promise<void>,
  ): Promise<T> {
    try {
      await subscribe();
    } catch (err) {
      await consumer.close();
      throw err;
    }
    return consumer;
  }

  /** @internal Stops once, for `close()` or because of `error`. */
  protected stop(error: Error | undefined): Promise<void> {
    this.#stopping ??= (async () => {
      await this.shutdown(() => this.core.close());
      this.#resolveClosed(error ?? this.core.failure);
    })();
    return this.#stopping;
  }

  /**
   * @internal The transport's part of stopping; it calls `closeCore` (commit what was processed,
   * release the store) at the point its protocol needs: before the channel closes for AMQP acks.
   */
  protected abstract shutdown(closeCore: () => Promise<void>): Promise<void>;
}
