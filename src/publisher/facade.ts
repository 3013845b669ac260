import type { DedupError } from '../errors.js';
import type { PublisherCounters } from '../telemetry/metrics.js';
import { traceSend } from '../telemetry/tracing.js';
import type { DedupPublisherCore } from './core.js';
import type { OpenReport, SendOptions, SendResult } from './types.js';

/**
 * What every dedup publisher offers, whatever its transport. `StreamDedupPublisher` and
 * `AmqpDedupPublisher` add their own `open()`.
 */
export abstract class DedupPublisher {
  readonly #core: DedupPublisherCore;

  /** @internal Use the transport's `open()`. */
  constructor(core: DedupPublisherCore) {
    this.#core = core;
  }

  /**
   * Publishes one message and resolves once the broker confirmed it (or, for a repeated key in
   * keyed mode, at once with `outcome: 'duplicate'`). IDs are assigned in call order; call it many
   * times without awaiting each for throughput (it waits for room beyond `maxInFlight`).
   *
   * @throws TypeError or RangeError for a body that is not bytes, bad headers or key, or a message
   *   larger than the broker accepts.
   * @throws DedupError (rejection) `DEDUP_PUBLISHER_CLOSED`, `DEDUP_CONFIRM_TIMEOUT` (the message
   *   stays in the outbox and is re-sent: do not send it again), `DEDUP_ID_REGRESSION` and
   *   `DEDUP_ID_MODE_MISMATCH`, `DEDUP_ABORTED`, or the error that closed the publisher
   *   (`DEDUP_NAME_CONFLICT`, `DEDUP_BROKER_UNREACHABLE`).
   * @example
   * ```ts
   * const { publishingId } = await pub.send(Buffer.from('{"order":17}'), { headers: { type: 'created' } });
   * ```
   */
  send(body: Uint8Array, options?: SendOptions): Promise<SendResult> {
    const core = this.#core;
    if (!core.tracing) return core.send(body, options);
    const given = options?.headers;
    // A `send` span; its trace context travels in the headers (and the outbox): see telemetry/tracing.ts.
    return traceSend({ destination: core.target, producer: core.producerName }, given, (headers) =>
      core.send(body, headers === given ? options : { ...options, headers }),
    );
  }

  /** The last publishing ID handed out (0n before the first): where an explicit-ID source resumes. */
  get lastPublishingId(): bigint {
    return this.#core.lastPublishingId;
  }

  /** What `open()` found and did (over AMQP 0-9-1 `brokerLastId` is always `undefined`). */
  get openReport(): OpenReport {
    return this.#core.report;
  }

  /** Messages accepted and not yet confirmed. */
  get inFlight(): number {
    return this.#core.inFlight;
  }

  /** Counters since open: sent, confirmed, resent, keyDuplicates, reconnects (also OpenTelemetry metrics). */
  get stats(): Readonly<PublisherCounters> {
    return this.#core.counters;
  }

  /** The producer name. */
  get producerName(): string {
    return this.#core.producerName;
  }

  /** True once closing or closed. */
  get isClosed(): boolean {
    return this.#core.isClosed;
  }

  /** Resolves when the publisher has closed: with the error that closed it, or `undefined` after `close()`. */
  closed(): Promise<DedupError | undefined> {
    return this.#core.closed();
  }

  /**
   * Waits up to `closeTimeoutMs` for outstanding confirms, frees the producer name on the broker,
   * closes the connection and releases the store. Idempotent.
   */
  close(): Promise<void> {
    return this.#core.close();
  }

  /** `close()`, for `await using publisher = await StreamDedupPublisher.open(…)`. */
  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }
}
