/**
 * RabbitMQ stream-protocol transport (`rabbitmq-stream-js-client`): the dedup publisher for
 * streams. Import from `stream-dedup/stream`.
 *
 * @packageDocumentation
 */
import { once } from 'node:events';
import { Socket } from 'node:net';
import { Offset, type Client, type ClientParams, type Publisher } from 'rabbitmq-stream-js-client';
import { DedupError } from '../errors.js';
import { DedupPublisherCore } from '../publisher/core.js';
import { DedupPublisher } from '../publisher/facade.js';
import type {
  DedupPublisherOptions,
  OutgoingMessage,
  PublishTransport,
  TransportHandlers,
} from '../publisher/types.js';
import {
  EndpointRotation,
  errorText,
  explainDeclareFailure,
  openThroughEndpoints,
  StreamNotAvailableError,
  withTimeout,
  type StreamConnectionOptions,
} from './util.js';
import { PublishFrameEncoder } from './stream-frames.js';
import { connectStreamClient } from './stream-probe.js';

export type { StreamConnectionOptions, StreamTlsOptions } from './util.js';

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

/** Frame overhead we keep free for the publish frame and AMQP 1.0 message sections. */
const FRAME_OVERHEAD = 512;

/** @internal The stream-protocol half of {@link StreamDedupPublisher}. */
export class StreamTransport implements PublishTransport {
  readonly target: string;
  readonly #endpoints: EndpointRotation;
  #params: ClientParams;
  #attempts = 0;
  /** Connected once: later connects are reconnections. */
  #connected = false;
  readonly #producerName: string;
  readonly #createStream: boolean;
  readonly #connectTimeoutMs: number;
  #client: Client | undefined;
  /** The application's client, when `connection` was one: used, never closed. */
  readonly #shared: Client | undefined;
  /** On a shared client: the connections we listen on, and the current connect's handlers. */
  readonly #listenedConnections = new WeakSet<object>();
  #sharedHandlers:
    | {
        confirmed: (confirm: { publisherId: number; publishingIds: bigint[] }, connId: string) => void;
        failed: (error: { publisherId: number }, connId: string) => void;
      }
    | undefined;
  #publisher: Publisher | undefined;
  /** Bumped on every (re)connect and on close: events of older clients are ignored. */
  #generation = 0;
  /** Rejects when the current connection is lost or torn down. */
  #lost: Promise<never> | undefined;
  #markLost: ((error: Error) => void) | undefined;
  #maxFrameSize = 1_048_576;
  #socket: Socket | undefined;
  #encoder: PublishFrameEncoder | undefined;

  constructor(options: StreamDedupPublisherOptions) {
    if (typeof options.stream !== 'string' || options.stream.length === 0 || options.stream.length > 255) {
      throw new RangeError('stream must be a non-empty string of at most 255 characters');
    }
    this.target = options.stream;
    this.#producerName = options.producerName;
    this.#createStream = options.createStream ?? false;
    this.#connectTimeoutMs = options.connectTimeoutMs ?? 10_000;
    this.#shared = isClient(options.connection) ? options.connection : undefined;
    this.#endpoints = new EndpointRotation(isClient(options.connection) ? {} : (options.connection ?? {}));
    this.#params = this.#endpoints.next();
  }

  get maxMessageBytes(): number {
    return this.#maxFrameSize - FRAME_OVERHEAD;
  }

  /**
   * Connects and declares the producer. The first connection (at `open()`) goes round the
   * endpoints past a node that does not answer, and waits out a leader election; reconnections
   * are retried with backoff by the core.
   */
  async connect(handlers: TransportHandlers): Promise<bigint> {
    if (this.#connected) return this.#connectOnce(handlers);
    const lastId = await openThroughEndpoints(this.#endpoints.size, () => this.#connectOnce(handlers));
    this.#connected = true;
    return lastId;
  }

  async #connectOnce(handlers: TransportHandlers): Promise<bigint> {
    await this.#teardown();
    const generation = ++this.#generation;
    // A cluster: each attempt after the first goes through the next node, in case the last one is down.
    if (this.#attempts++ > 0) this.#params = this.#endpoints.next();
    const current = (): boolean => generation === this.#generation;
    let publisherId = -1;
    let connectionId = '';
    let markLost!: (error: Error) => void;
    this.#lost = new Promise<never>((_, reject) => (markLost = reject));
    this.#lost.catch(() => undefined);
    this.#markLost = markLost;
    const lost = (what: string) => () => {
      const error = new Error(`${what} connection to ${this.#address()} closed`);
      markLost(error);
      if (current()) handlers.disconnected(error);
    };
    const confirmed = (confirm: { publisherId: number; publishingIds: bigint[] }, connId: string): void => {
      // One listener hears every publisher on the connection: keep only ours.
      if (current() && confirm.publisherId === publisherId && connId === connectionId) {
        handlers.confirmed(confirm.publishingIds);
      }
    };
    const failed = (error: { publisherId: number }, connId: string): void => {
      // The client decodes publish-error frames wrongly (docs/design.md §3): do not trust the IDs or the
      // code; treat the connection as unusable, so everything pending is re-sent.
      if (current() && error.publisherId === publisherId && connId === connectionId) {
        const e = new Error('the broker reported a publish error');
        markLost(e);
        handlers.disconnected(e);
      }
    };
    const client =
      this.#shared ??
      (await this.#connectClient({
        publish_confirm: confirmed,
        publish_error: failed,
        connection_closed: lost('locator'),
      }));
    this.#client = client;
    try {
      this.#maxFrameSize = client.maxFrameSize > 0 ? client.maxFrameSize : this.#maxFrameSize;
      if (this.#createStream) {
        // An existing stream declared with other arguments (replicas, retention) answers
        // PRECONDITION_FAILED: it exists, which is all we need; declaring the publisher below
        // reports a stream that really is missing.
        await client.createStream({ stream: this.target, arguments: {} }).catch(() => undefined);
      }
      const publisher = await withTimeout(
        client.declarePublisher({
          stream: this.target,
          publisherRef: this.#producerName,
          connectionClosedListener: lost('publisher'),
        }),
        this.#connectTimeoutMs,
        `declaring producer "${this.#producerName}" on stream "${this.target}"`,
        (message) => new StreamNotAvailableError(message),
      );
      publisherId = publisher.publisherId;
      connectionId = publisher.getConnectionInfo().id;
      this.#publisher = publisher;
      if (this.#shared !== undefined) {
        // The application's client has no listeners of ours: listen on the producer's connection,
        // once per connection (the pool may hand the same one back after a reconnect), through
        // handlers that follow the current connect.
        this.#sharedHandlers = { confirmed, failed };
        const connection = publisherConnection(publisher);
        if (!this.#listenedConnections.has(connection)) {
          this.#listenedConnections.add(connection);
          connection.on('publish_confirm', (c) => this.#sharedHandlers?.confirmed(c, connectionId));
          connection.on('publish_error', (e) => this.#sharedHandlers?.failed(e, connectionId));
        }
      }
      this.#encoder = new PublishFrameEncoder(publisherId, this.#producerName, this.#maxFrameSize);
      this.#socket = publisherSocket(publisher);
      return await publisher.getLastPublishingId();
    } catch (caught) {
      const err = await explainDeclareFailure(client, this.target, caught);
      await this.#teardown();
      throw new DedupError(
        'DEDUP_BROKER_REFUSED',
        `the broker refused producer "${this.#producerName}" on stream "${this.target}": ${errorText(err)}`,
        { cause: err },
      );
    }
  }

  /** A client of our own, to the current endpoint. */
  #connectClient(listeners: ClientParams['listeners']): Promise<Client> {
    return connectStreamClient({ ...this.#params, listeners }, this.#connectTimeoutMs);
  }

  async publish(messages: readonly OutgoingMessage[]): Promise<void> {
    // Bound to the socket of this call: after a reconnect nothing of this call may reach the new
    // connection ahead of the re-sent older IDs.
    const socket = this.#socket;
    const lost = this.#lost;
    const encoder = this.#encoder;
    if (
      socket === undefined ||
      lost === undefined ||
      encoder === undefined ||
      socket.destroyed ||
      !socket.writable
    ) {
      throw new Error('not connected');
    }
    // Our own frames, written to the publisher's socket: one counter (ours), no basicSend/send mix.
    for (const frame of encoder.encode(messages)) {
      if (!socket.write(frame)) await Promise.race([once(socket, 'drain'), lost]);
    }
  }

  async queryLastId(): Promise<bigint> {
    const publisher = this.#publisher;
    if (publisher === undefined) throw new Error('not connected');
    return publisher.getLastPublishingId();
  }

  async close(): Promise<void> {
    await this.#teardown(true);
  }

  /** Frees the name (deletePublisher: `publisher.close()` alone does not) and closes the client. */
  async #teardown(deleteName = false): Promise<void> {
    this.#generation++;
    this.#markLost?.(new Error('connection closed by the publisher'));
    this.#markLost = undefined;
    this.#lost = undefined;
    const client = this.#client;
    const publisher = this.#publisher;
    this.#client = undefined;
    this.#publisher = undefined;
    this.#socket = undefined;
    this.#encoder = undefined;
    if (client === undefined) return;
    // On a shared client the producer goes in every case (it holds a reference to its connection).
    if ((deleteName || client === this.#shared) && publisher !== undefined) {
      await withTimeout(client.deletePublisher(publisher.extendedId), 5_000, 'deletePublisher').catch(
        () => undefined,
      );
    }
    if (client === this.#shared) return;
    await withTimeout(client.close(), 5_000, 'closing the client').catch(() => undefined);
  }

  #address(): string {
    return this.#shared !== undefined ? 'the given client' : `${this.#params.hostname}:${this.#params.port}`;
  }
}

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
  /**
   * Opens the store, connects, declares the named producer and reconciles: the store's last ID
   * against the broker's. Unconfirmed outbox messages are re-sent, in ID order with their original
   * IDs, before any new message.
   *
   * @throws DedupError `DEDUP_STORE_LOCKED` (another process has the store, or this producer is
   *   already open on it), `DEDUP_STORE_CORRUPT`, `DEDUP_BROKER_UNREACHABLE`, `DEDUP_BROKER_REFUSED`
   *   (for example a missing stream), `DEDUP_SEQUENCE_REGRESSION` (the broker is ahead of the
   *   store), `DEDUP_ID_MODE_MISMATCH`.
   * @throws TypeError or RangeError for invalid options (an empty or over-long name, …).
   */
  static async open(options: StreamDedupPublisherOptions): Promise<StreamDedupPublisher> {
    if (typeof options !== 'object' || options === null) throw new TypeError('options must be an object');
    const core = await DedupPublisherCore.open(new StreamTransport(options), options);
    return new StreamDedupPublisher(core);
  }
}

/**
 * The socket of the publisher's connection (rabbitmq-stream-js-client 1.0 keeps it in
 * `publisher.connection.socket`). Checked, so that a client version that moved it fails at open
 * with a clear message rather than later.
 */
function publisherSocket(publisher: Publisher): Socket {
  const socket = (publisher as unknown as { connection?: { socket?: unknown } }).connection?.socket;
  if (!(socket instanceof Socket)) {
    throw new DedupError(
      'DEDUP_BROKER_REFUSED',
      'this rabbitmq-stream-js-client version does not expose the publisher connection stream-dedup writes to; ' +
        'use the 1.0.x line pinned in package.json',
    );
  }
  return socket;
}

/** True for a `rabbitmq-stream-js-client` Client (of any copy of the package), not parameters. */
function isClient(connection: StreamConnectionOptions | Client | undefined): connection is Client {
  return (
    typeof connection === 'object' &&
    connection !== null &&
    typeof (connection as Partial<Client>).declarePublisher === 'function'
  );
}

interface ConfirmListeners {
  on(
    event: 'publish_confirm',
    listener: (confirm: { publisherId: number; publishingIds: bigint[] }) => void,
  ): void;
  on(event: 'publish_error', listener: (error: { publisherId: number }) => void): void;
}

/** The producer's connection (rabbitmq-stream-js-client 1.0: `publisher.connection`), checked like its socket. */
function publisherConnection(publisher: Publisher): ConfirmListeners {
  const connection = (publisher as unknown as { connection?: { on?: unknown } }).connection;
  if (typeof connection?.on !== 'function') {
    throw new DedupError(
      'DEDUP_BROKER_REFUSED',
      'this rabbitmq-stream-js-client version does not expose the publisher connection stream-dedup listens on; ' +
        'use the 1.0.x line pinned in package.json',
    );
  }
  return connection as ConfirmListeners;
}

/** One message read back by {@link readStreamToEnd}. */
export interface StreamRecord {
  readonly offset: bigint;
  readonly body: Buffer;
  readonly applicationProperties: Readonly<Record<string, string | number>>;
  /** Where RabbitMQ 4.0 puts AMQP 0-9-1 headers named `x-…` (the identity stamps of an AMQP publisher). */
  readonly messageAnnotations: Readonly<Record<string, unknown>>;
}

/**
 * Deletes a stream, if it exists (the CLI's demo removes its own stream at the end).
 *
 * @internal
 * @throws DedupError `DEDUP_BROKER_UNREACHABLE` or `DEDUP_BROKER_REFUSED`.
 */
export async function deleteStream(connection: StreamConnectionOptions, stream: string): Promise<void> {
  const client = await connectStreamClient(new EndpointRotation(connection).next(), 10_000);
  try {
    await withTimeout(client.deleteStream({ stream }), 10_000, `deleting stream "${stream}"`);
  } catch (err) {
    throw new DedupError('DEDUP_BROKER_REFUSED', `cannot delete stream "${stream}": ${errorText(err)}`, {
      cause: err,
    });
  } finally {
    await withTimeout(client.close(), 5_000, 'closing').catch(() => undefined);
  }
}

/**
 * Reads a stream from its first message to its last committed chunk, for audits and demos.
 * Messages published after the call starts may or may not be included.
 *
 * @throws DedupError `DEDUP_BROKER_UNREACHABLE` or `DEDUP_BROKER_REFUSED` (no such stream).
 */
export async function readStreamToEnd(
  connection: StreamConnectionOptions,
  stream: string,
  options: { readonly timeoutMs?: number } = {},
): Promise<StreamRecord[]> {
  const params: ClientParams = new EndpointRotation(connection).next();
  const client = await connectStreamClient(params, 10_000);
  try {
    let last: bigint;
    try {
      last = (await client.streamStatsRequest(stream)).committedChunkId;
      // An empty stream answers -1: nothing will ever arrive.
      if (last < 0n) return [];
    } catch (err) {
      const text = errorText(err);
      // An existing stream without a committed chunk answers "no offset": it is empty.
      if (/offset/i.test(text)) return [];
      throw new DedupError('DEDUP_BROKER_REFUSED', `cannot read stream "${stream}": ${text}`, { cause: err });
    }
    const records: StreamRecord[] = [];
    const timeoutMs = options.timeoutMs ?? 120_000;
    await new Promise<void>((resolve, reject) => {
      const timer = setTimeout(
        () =>
          reject(
            new DedupError('DEDUP_BROKER_REFUSED', `reading "${stream}" did not finish in ${timeoutMs} ms`),
          ),
        timeoutMs,
      );
      let finishing = false;
      client
        .declareConsumer({ stream, offset: Offset.first() }, (m) => {
          const offset = m.offset ?? -1n;
          records.push({
            offset,
            body: m.content,
            applicationProperties: m.applicationProperties ?? {},
            messageAnnotations: m.messageAnnotations ?? {},
          });
          // The rest of the last chunk is delivered before the next macrotask.
          if (offset >= last && !finishing) {
            finishing = true;
            setImmediate(() => {
              clearTimeout(timer);
              resolve();
            });
          }
        })
        .catch((err: unknown) => {
          clearTimeout(timer);
          reject(
            new DedupError('DEDUP_BROKER_REFUSED', `cannot consume "${stream}": ${errorText(err)}`, {
              cause: err,
            }),
          );
        });
    });
    return records;
  } finally {
    await withTimeout(client.close(), 5_000, 'closing').catch(() => undefined);
  }
}

export { StreamVerifyingConsumer, type StreamVerifyingConsumerOptions } from './stream-consumer.js';
