/**
 * `AmqpDedupPublisher`, the dedup publisher for stream queues reached over AMQP 0-9-1.
 */
import { DedupPublisherCore } from '../publisher/core.js';
import { DedupPublisher } from '../publisher/facade.js';
import { cleaningCreatedFolder } from '../store/fresh-folder.js';
import { resolveAmqpPublisherOptions, type AmqpDedupPublisherOptions } from './amqp-options.js';
import { AmqpTransport } from './amqp-transport.js';

/**
 * A dedup publisher for one producer name on one stream queue, over AMQP 0-9-1 with publisher
 * confirms. Same IDs, outbox, backpressure and bad-input rules as `StreamDedupPublisher`; the
 * identity is stamped as string headers `x-dedup-producer` and `x-dedup-id`.
 *
 * Unlike the stream protocol, the broker keeps no last ID per name and never drops a repeat: after
 * a crash or reconnect, re-sent outbox messages may be in the stream twice. Consume with a
 * verifying consumer, which removes them.
 *
 * @example
 * ```ts
 * await using pub = await AmqpDedupPublisher.open({
 *   url: 'amqp://guest:guest@127.0.0.1:5672',
 *   queue: 'orders',
 *   declareQueue: true,
 *   producerName: 'orders-amqp',
 *   store: './.dedup',
 * });
 * await pub.send(Buffer.from('{"order":17}'));
 * ```
 */
export class AmqpDedupPublisher extends DedupPublisher {
  // Private: publishers come from `open()` (without it the published types, which leave out the
  // base class's internal constructor, would let `new AmqpDedupPublisher()` compile).
  private constructor(core: DedupPublisherCore) {
    super(core);
  }

  /**
   * Opens the store, connects, opens a confirm channel and re-sends unconfirmed outbox messages
   * with their original IDs before any new message.
   *
   * @throws DedupError `DEDUP_STORE_LOCKED`, `DEDUP_STORE_CORRUPT`, `DEDUP_BROKER_UNREACHABLE`,
   *   `DEDUP_BROKER_REFUSED` (for example a missing queue), `DEDUP_ID_MODE_MISMATCH`,
   *   `DEDUP_STORE_CLOSED` (a shared `store` already closed); `DEDUP_UNSAFE_OPTIONS` before any
   *   I/O for explicit IDs with `durability: 'reserve'` (AMQP 0-9-1 cannot report the broker's
   *   last ID) and keyed IDs with it.
   * @throws TypeError or RangeError for invalid options, before any I/O.
   */
  static async open(options: AmqpDedupPublisherOptions): Promise<AmqpDedupPublisher> {
    const { declareQueue, connectTimeoutMs } = resolveAmqpPublisherOptions(options);
    const transport = new AmqpTransport({ ...options, declareQueue, connectTimeoutMs });
    return new AmqpDedupPublisher(
      await cleaningCreatedFolder(options.store, () => DedupPublisherCore.open(transport, options)),
    );
  }
}
