/**
 * `StreamDedupPublisher`, the dedup publisher for RabbitMQ streams.
 */
import { DedupPublisherCore } from '../publisher/core.js';
import { DedupPublisher } from '../publisher/facade.js';
import { cleaningCreatedFolder } from '../store/fresh-folder.js';
import type { StreamDedupPublisherOptions } from './stream-options.js';
import { StreamTransport } from './stream-transport.js';

/**
 * A dedup publisher for one producer name on one RabbitMQ stream.
 *
 * Every message gets a strictly increasing publishing ID that is durable in LevelDB before the
 * message leaves the process; in `outbox` durability the message itself is durable too and is
 * re-sent with its original ID after a crash, a reconnect or a broker restart. The broker keeps the
 * highest ID per producer name and drops (while confirming) anything at or below it, so a re-send
 * never makes a second copy.
 *
 * @example
 * ```ts
 * await using pub = await StreamDedupPublisher.open({
 *   connection: { hostname: '127.0.0.1', port: 5552 },
 *   stream: 'orders',
 *   producerName: 'orders-svc',
 *   store: './.dedup',
 * });
 * const { publishingId } = await pub.send(Buffer.from('{"order":17}'), { headers: { type: 'created' } });
 * ```
 */
export class StreamDedupPublisher extends DedupPublisher {
  // Private: publishers come from `open()` (without it the published types, which leave out the
  // base class's internal constructor, would let `new StreamDedupPublisher()` compile).
  private constructor(core: DedupPublisherCore) {
    super(core);
  }

  /**
   * Opens the store, connects, declares the named producer and reconciles: the store's last ID
   * against the broker's. Unconfirmed outbox messages are re-sent, in ID order with their original
   * IDs, before any new message.
   *
   * @throws DedupError `DEDUP_STORE_LOCKED` (another process has the store, or this producer is
   *   already open on it), `DEDUP_STORE_CORRUPT`, `DEDUP_BROKER_UNREACHABLE`, `DEDUP_BROKER_REFUSED`
   *   (for example a missing stream), `DEDUP_SEQUENCE_REGRESSION` (the broker is ahead of the
   *   store), `DEDUP_ID_MODE_MISMATCH`, `DEDUP_STORE_CLOSED` (a shared `store` already closed).
   * @throws TypeError or RangeError for invalid options (an empty or over-long name, …).
   */
  static async open(options: StreamDedupPublisherOptions): Promise<StreamDedupPublisher> {
    if (typeof options !== 'object' || options === null) throw new TypeError('options must be an object');
    const core = await cleaningCreatedFolder(options.store, () =>
      DedupPublisherCore.open(new StreamTransport(options), options),
    );
    return new StreamDedupPublisher(core);
  }
}
