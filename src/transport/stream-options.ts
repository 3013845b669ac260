/**
 * What `StreamDedupPublisher.open()` takes: the options every dedup publisher shares, plus the
 * stream protocol's.
 */
import type { Client } from 'rabbitmq-stream-js-client';
import type { DedupPublisherOptions } from '../publisher/types.js';
import type { StreamConnectionOptions } from './util.js';

/** Options of {@link StreamDedupPublisher.open}. */
export interface StreamDedupPublisherOptions extends DedupPublisherOptions {
  /**
   * Connection parameters, or an existing `Client` to share. Defaults: `hostname` 'localhost',
   * `port` 5552, `username` and `password` 'guest', `vhost` '/'. With parameters the publisher
   * opens its own connections and reconnects them (through the next of `endpoints` each time);
   * publisher connections dial the host the broker advertises (`stream.advertised_host`) unless
   * `addressResolver` is set. With a `Client` the producer is declared on that client (its
   * connection may carry the application's own publishers: confirms are told apart by producer
   * id), reconnections go through that client's locator connection, and `close()` leaves the
   * client open — it stays the application's to close. When the shared client's own connection is
   * gone, reconnection waits for it (for example the application's `client.restart()`) until
   * `reconnect.giveUpAfterMs`, then closes with `DEDUP_BROKER_UNREACHABLE`; the outbox keeps what
   * was unconfirmed.
   */
  readonly connection?: StreamConnectionOptions | Client;
  /** The stream to publish into. */
  readonly stream: string;
  /** Create the stream if it does not exist. @defaultValue false */
  readonly createStream?: boolean;
  /** How long one connection attempt may take, in ms. @defaultValue 10000 */
  readonly connectTimeoutMs?: number;
}
