/**
 * The one way the library connects a client for reads that are not a subscription it keeps (a
 * group partition's restore, genesis read and stalled-partition watch; the standby tail): through
 * the next node that answers, so that a dead node does not fail the read.
 */
import type { Client } from 'rabbitmq-stream-js-client';
import { connectStreamClient } from './stream-probe.js';
import { keepReaderConnections } from './stream-reader-connections.js';
import { EndpointRotation, openThroughEndpoints, type StreamConnectionOptions } from './util.js';

/** @internal */
export interface ReaderConnectorOptions {
  /** Each endpoint's connect is bounded by it (the probe's and the client's handshake). */
  readonly connectTimeoutMs: number;
  /**
   * Keep the client's subscription connections between its reads (one per node,
   * stream-reader-connections.ts): for a client that reads many times.
   * @defaultValue false
   */
  readonly keepConnections?: boolean;
}

/**
 * A function that connects a reader client: `connectStreamClient` through the endpoints of
 * `connection` in turn (`openThroughEndpoints`: each endpoint once, ≤ `connectTimeoutMs` each, and
 * a node that says "not available" retried within its bound). The caller closes each client.
 *
 * @throws (from the returned function) DedupError `DEDUP_BROKER_UNREACHABLE` or `DEDUP_BROKER_REFUSED`.
 * @internal
 */
export function readerConnector(
  connection: StreamConnectionOptions,
  options: ReaderConnectorOptions,
): () => Promise<Client> {
  const endpoints = new EndpointRotation(connection);
  return () =>
    openThroughEndpoints(endpoints.size, async () => {
      const client = await connectStreamClient(endpoints.next(), options.connectTimeoutMs);
      if (options.keepConnections === true) {
        try {
          keepReaderConnections(client);
        } catch (err) {
          await client.close().catch(() => undefined);
          throw err;
        }
      }
      return client;
    });
}
