import { EventEmitter } from 'node:events';
import { Socket } from 'node:net';
import type { Consumer, Publisher } from 'rabbitmq-stream-js-client';
import { describe, expect, it } from 'vitest';
import {
  consumerCloseEvents,
  metadataUpdateStream,
  publisherConnection,
  publisherSocket,
} from '../../src/transport/stream-client-internals.js';
import { thrown } from '../support/thrown.js';

// The probes of rabbitmq-stream-js-client 1.0's private fields: what they find where the client
// keeps them, and the clear refusal when a client version moved them.

const publisher = (connection: unknown): Publisher => ({ connection }) as unknown as Publisher;

describe('stream client internals', () => {
  it("finds the publisher's socket and connection where the 1.0 client keeps them", () => {
    const socket = new Socket();
    const connection = Object.assign(new EventEmitter(), { socket });
    expect(publisherSocket(publisher(connection))).toBe(socket);
    expect(publisherConnection(publisher(connection))).toBe(connection);
    socket.destroy();
  });

  it('refuses with DEDUP_BROKER_REFUSED, naming the pinned client line, when a client version moved them', () => {
    for (const moved of [undefined, {}, { socket: {} }]) {
      expect(thrown(() => publisherSocket(publisher(moved)))).toMatchObject({
        code: 'DEDUP_BROKER_REFUSED',
        message: /1\.0\.x line pinned in package\.json/,
      });
    }
    expect(thrown(() => publisherConnection(publisher({})))).toMatchObject({ code: 'DEDUP_BROKER_REFUSED' });
  });

  it("reads a consumer's close events and a metadata update's stream, or undefined when they moved", () => {
    const emitter = new EventEmitter();
    expect(consumerCloseEvents({ connection: { closeEventsEmitter: emitter } } as unknown as Consumer)).toBe(
      emitter,
    );
    expect(consumerCloseEvents({} as unknown as Consumer)).toBeUndefined();
    expect(metadataUpdateStream({ response: { metadataInfo: { stream: 'orders' } } })).toBe('orders');
    expect(metadataUpdateStream({ code: 6 })).toBeUndefined();
    expect(metadataUpdateStream(undefined)).toBeUndefined();
  });
});
