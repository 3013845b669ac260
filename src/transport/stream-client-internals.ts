/**
 * AUDIT THIS FILE WHEN UPGRADING rabbitmq-stream-js-client.
 *
 * Every place stream-dedup reaches past the client's public API into its private fields lives
 * here, checked at run time so that a client that moved a field fails at `open()` with a clear
 * message instead of misbehaving later. Written against rabbitmq-stream-js-client 1.0.x (pinned
 * with `~` in package.json): after an upgrade, check each field below in the client's source
 * (`publisher.ts`, `consumer.ts`, `connection.ts`) and run the integration tests. Not part of
 * the public API.
 */
import type { EventEmitter } from 'node:events';
import { Socket } from 'node:net';
import type { Consumer, Publisher } from 'rabbitmq-stream-js-client';
import { DedupError } from '../errors.js';

/** The publish-confirm and publish-error events of a client connection. */
export interface ConfirmListeners {
  on(
    event: 'publish_confirm',
    listener: (confirm: { publisherId: number; publishingIds: bigint[] }) => void,
  ): void;
  on(event: 'publish_error', listener: (error: { publisherId: number }) => void): void;
}

function unsupportedClient(what: string): DedupError {
  return new DedupError(
    'DEDUP_BROKER_REFUSED',
    `this rabbitmq-stream-js-client version does not expose the publisher connection stream-dedup ${what}; ` +
      'use the 1.0.x line pinned in package.json',
  );
}

/**
 * The socket of the publisher's connection (1.0: `publisher.connection.socket`): the publisher
 * writes its own publish frames there.
 *
 * @throws DedupError `DEDUP_BROKER_REFUSED` when this client version does not have it.
 */
export function publisherSocket(publisher: Publisher): Socket {
  const socket = (publisher as unknown as { connection?: { socket?: unknown } }).connection?.socket;
  if (!(socket instanceof Socket)) throw unsupportedClient('writes to');
  return socket;
}

/**
 * The producer's connection (1.0: `publisher.connection`), for its confirm events when the
 * application's own client carries the producer.
 *
 * @throws DedupError `DEDUP_BROKER_REFUSED` when this client version does not have it.
 */
export function publisherConnection(publisher: Publisher): ConfirmListeners {
  const connection = (publisher as unknown as { connection?: { on?: unknown } }).connection;
  if (typeof connection?.on !== 'function') throw unsupportedClient('listens on');
  return connection as ConfirmListeners;
}

/**
 * The emitter through which the client closes a consumer after a leader change (1.0:
 * `consumer.connection.closeEventsEmitter`), or `undefined` when this client version has none.
 * For the verifying consumer, which handles leader changes itself.
 */
export function consumerCloseEvents(consumer: Consumer): EventEmitter | undefined {
  return (consumer as unknown as { connection?: { closeEventsEmitter?: EventEmitter } }).connection
    ?.closeEventsEmitter;
}

/**
 * The stream a `metadata_update` listener was called for (1.0: `update.response.metadataInfo.stream`),
 * or `undefined` when the update does not have that shape.
 */
export function metadataUpdateStream(update: unknown): string | undefined {
  return (update as { response?: { metadataInfo?: { stream?: string } } } | null | undefined)?.response
    ?.metadataInfo?.stream;
}
