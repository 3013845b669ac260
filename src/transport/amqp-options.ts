/**
 * What `AmqpDedupPublisher.open()` takes: the options every dedup publisher shares, plus AMQP
 * 0-9-1's.
 */
import type { Options } from 'amqplib';
import type { DedupPublisherOptions } from '../publisher/types.js';
import type { AmqpSocketOptions } from './amqp-connect.js';

/** Options of {@link AmqpDedupPublisher.open}. */
export interface AmqpDedupPublisherOptions extends DedupPublisherOptions {
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
   */
  readonly socketOptions?: AmqpSocketOptions;
}
