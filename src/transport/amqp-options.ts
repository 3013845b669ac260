/**
 * What `AmqpDedupPublisher.open()` takes: the options every dedup publisher shares, plus AMQP
 * 0-9-1's.
 */
import type { Options } from 'amqplib';
import { DedupError } from '../errors.js';
import { resolvePublisherOptions, type ResolvedPublisherOptions } from '../publisher/options.js';
import type { DedupPublisherOptions } from '../publisher/types.js';
import {
  absent,
  booleanOption,
  expectObject,
  expectOptionalObject,
  outOfRange,
  timerOption,
  typeMismatch,
} from '../util/options.js';
import type { AmqpSocketOptions } from './amqp-connect.js';
import { assertTlsOptions } from './util.js';

/**
 * The options of {@link AmqpDedupPublisher.open} whatever the `idMode`: see
 * {@link AmqpDedupPublisherOptions}.
 *
 * @remarks Since 0.6.0 (before, these were all of `AmqpDedupPublisherOptions`).
 */
export interface AmqpPublisherCommonOptions extends DedupPublisherOptions {
  /** An AMQP URL (`amqp://guest:guest@127.0.0.1:5672`) or amqplib connect options. The publisher owns its connection. */
  readonly url: string | Options.Connect;
  /** The stream queue to publish into (through the default exchange). */
  readonly queue: string;
  /** Declare the queue as a durable stream queue (`x-queue-type: stream`) if missing. @defaultValue false */
  readonly declareQueue?: boolean;
  /**
   * How long one whole connect may take, in ms: the handshake, the confirm channel's open and the
   * queue's check (or declaration) together, at `open()` and at every reconnect. A channel that
   * opens after it is closed. @defaultValue 10000
   */
  readonly connectTimeoutMs?: number;
  /**
   * TLS for an `amqps://` URL: a custom CA, a client certificate and key (and its passphrase), the
   * server name to verify — Node's `tls.connect` options, passed to amqplib. Secrets given here
   * never appear in errors or logs.
   * @defaultValue none: Node's defaults (TLS only with an `amqps://` URL)
   */
  readonly socketOptions?: AmqpSocketOptions;
}

/**
 * Automatic IDs: every `durability`.
 *
 * @remarks Since 0.6.0
 */
export interface AmqpAutoPublisherOptions extends AmqpPublisherCommonOptions {
  /** `'auto'`; `'explicit'` and `'keyed'` are {@link AmqpOutboxPublisherOptions}. @defaultValue 'auto' */
  readonly idMode?: 'auto';
}

/**
 * Explicit or keyed IDs: `durability` is `'outbox'`. `'reserve'` is refused with
 * `DEDUP_UNSAFE_OPTIONS`: explicit IDs would resume after the broker's last ID, which AMQP 0-9-1
 * cannot report, and a crash could leave a key recorded whose message never reached the broker.
 *
 * @remarks Since 0.6.0
 */
export interface AmqpOutboxPublisherOptions extends AmqpPublisherCommonOptions {
  /** Explicit or keyed IDs. */
  readonly idMode: 'explicit' | 'keyed';
  /** Only `'outbox'`. @defaultValue 'outbox' */
  readonly durability?: 'outbox';
}

/**
 * Options of {@link AmqpDedupPublisher.open}. Explicit and keyed IDs take no
 * `durability: 'reserve'`: the types say what `open()` checks at run time (`DEDUP_UNSAFE_OPTIONS`
 * for a caller the types do not reach).
 *
 * @remarks Since 0.1.0; a union of {@link AmqpAutoPublisherOptions} and
 *   {@link AmqpOutboxPublisherOptions} since 0.6.0 (before, one interface).
 */
export type AmqpDedupPublisherOptions = AmqpAutoPublisherOptions | AmqpOutboxPublisherOptions;

/** The AMQP publisher's options with every default filled in; frozen. @internal */
export interface ResolvedAmqpPublisherOptions {
  readonly queue: string;
  readonly declareQueue: boolean;
  readonly connectTimeoutMs: number;
  /** The options every publisher core takes, checked. */
  readonly publisher: ResolvedPublisherOptions;
}

/**
 * Checks every option of `AmqpDedupPublisher.open` before any I/O (no store folder, no
 * connection): the shared publisher options, the AMQP ones, and the combinations that can never
 * work over AMQP 0-9-1.
 *
 * @throws TypeError, RangeError for a bad option ("Expected <name> to be <what>, got <value>").
 * @throws DedupError `DEDUP_UNSAFE_OPTIONS` for keyed IDs without an outbox (as every publisher),
 *   and for explicit IDs with `durability: 'reserve'`: they resume after the broker's last ID,
 *   which AMQP 0-9-1 cannot report.
 * @internal
 */
export function resolveAmqpPublisherOptions(
  options: AmqpDedupPublisherOptions,
): ResolvedAmqpPublisherOptions {
  expectObject(options, 'options');
  const queue: unknown = options.queue;
  const what = 'a non-empty string of at most 255 UTF-8 bytes';
  if (typeof queue !== 'string') typeMismatch('queue', what, queue);
  if (queue.length === 0 || Buffer.byteLength(queue, 'utf8') > 255) outOfRange('queue', what, queue);
  const url: unknown = options.url;
  if (typeof url !== 'string' && (typeof url !== 'object' || url === null || Array.isArray(url))) {
    typeMismatch('url', 'an AMQP URL or amqplib connect options', url);
  }
  expectOptionalObject(options.socketOptions, 'socketOptions');
  if (!absent(options.socketOptions)) assertTlsOptions(options.socketOptions, 'socketOptions');
  const declareQueue = booleanOption(options.declareQueue, 'declareQueue', false);
  const connectTimeoutMs = timerOption(options.connectTimeoutMs, 'connectTimeoutMs', 10_000, 1);
  const publisher = resolvePublisherOptions(options);
  if (publisher.idMode === 'explicit' && publisher.durability === 'reserve') {
    // Known before any I/O: reconcile() would refuse it only after opening the store and
    // connecting (with the broker down, DEDUP_BROKER_UNREACHABLE and a new store folder).
    throw new DedupError(
      'DEDUP_UNSAFE_OPTIONS',
      `idMode 'explicit' with durability 'reserve' needs the broker's last publishing ID to recover after a ` +
        `crash, and AMQP 0-9-1 cannot report it (queue "${queue}"): use durability 'outbox'`,
    );
  }
  return Object.freeze({ queue, declareQueue, connectTimeoutMs, publisher });
}
