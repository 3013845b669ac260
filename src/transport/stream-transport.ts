/**
 * The stream-protocol half of `StreamDedupPublisher`: connects through rabbitmq-stream-js-client,
 * declares the named producer, writes publish frames and reports confirms to the publisher core.
 * Not part of the public API.
 */
import { once } from 'node:events';
import { Socket as SocketClass, type Socket } from 'node:net';
import type { Client, ClientParams, Publisher } from 'rabbitmq-stream-js-client';
import { DedupError } from '../errors.js';
import { targetDeletedError } from '../publisher/errors.js';
import type { OutgoingMessage, PublishTransport, TransportHandlers } from '../publisher/types.js';
import { publisherConnection, publisherSocket, splitFullConnections } from './stream-client-internals.js';
import { PublishFrameEncoder } from './stream-frames.js';
import {
  resolveSubEntry,
  type ResolvedSubEntry,
  type SubEntryCompression,
  type StreamDedupPublisherOptions,
} from './stream-options.js';
import { connectStreamClient } from './stream-probe.js';
import {
  EndpointRotation,
  errorText,
  explainDeclareFailure,
  MissingStreamCheck,
  isStreamClient,
  openThroughEndpoints,
  StreamDoesNotExistError,
  StreamNotAvailableError,
  withTimeout,
} from './util.js';

/** Frame overhead we keep free for the publish frame and AMQP 1.0 message sections. */
const FRAME_OVERHEAD = 512;

/** @internal The stream-protocol half of `StreamDedupPublisher`. */
export class StreamTransport implements PublishTransport {
  readonly target: string;
  /** The encoder writes a batch as one sub-entry, whatever `subEntry` says now (docs/design.md §10). */
  readonly carriesBatches = true;
  readonly #endpoints: EndpointRotation;
  #params: ClientParams;
  #attempts = 0;
  /** Connected once: later connects are reconnections. */
  #connected = false;
  /** "Does not exist" is believed only when heard again (a node back from a partition can say it). */
  readonly #missing = new MissingStreamCheck();
  readonly #producerName: string;
  readonly #createStream: boolean;
  /** The arguments a created stream gets (a changelog's retention, group/changelog-retention.ts). */
  readonly #streamArguments: Readonly<Record<string, number>>;
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
  readonly #subEntry: ResolvedSubEntry;

  constructor(
    options: StreamDedupPublisherOptions,
    internal?: { readonly streamArguments?: Readonly<Record<string, number>> },
  ) {
    if (
      typeof options.stream !== 'string' ||
      options.stream.length === 0 ||
      Buffer.byteLength(options.stream, 'utf8') > 255
    ) {
      throw new RangeError('stream must be a non-empty string of at most 255 UTF-8 bytes');
    }
    this.target = options.stream;
    this.#subEntry = resolveSubEntry(options.subEntry);
    this.#producerName = options.producerName;
    this.#createStream = options.createStream ?? false;
    this.#streamArguments = internal?.streamArguments ?? {};
    this.#connectTimeoutMs = options.connectTimeoutMs ?? 10_000;
    this.#shared = isStreamClient(options.connection) ? options.connection : undefined;
    this.#endpoints = new EndpointRotation(
      isStreamClient(options.connection) ? {} : (options.connection ?? {}),
    );
    this.#params = this.#endpoints.next();
  }

  get maxMessageBytes(): number {
    return this.#maxFrameSize - FRAME_OVERHEAD;
  }

  get subEntrySize(): number {
    return this.#subEntry.size;
  }

  get maxBatchBytes(): number {
    return this.#subEntry.maxUncompressedBytes;
  }

  get subEntryCompression(): SubEntryCompression {
    return this.#subEntry.compression;
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
        // Not a lost connection: the producer's own connection (to the leader, often another node)
        // has its own close listener below. Counting the locator's close re-sent every partition
        // of a super stream whose locator was on a killed node that led only one of them
        // (test/integration/superstream-cluster.test.ts); the next connect opens a new client anyway.
        connection_closed: () => undefined,
      }));
    this.#client = client;
    let createError: unknown;
    try {
      // The application's client would declare on a connection that has issued its 256 IDs.
      if (client === this.#shared) splitFullConnections(client);
      this.#maxFrameSize = client.maxFrameSize > 0 ? client.maxFrameSize : this.#maxFrameSize;
      // Only at open(): a stream deleted while the publisher runs must stop it (below), not come
      // back empty under the same name with IDs that continue where the old one ended.
      if (this.#createStream && !this.#connected) {
        // An existing stream declared with other arguments (replicas, retention) answers
        // PRECONDITION_FAILED: it exists, which is all we need; declaring the publisher below
        // reports a stream that really is missing.
        // Bounded: the client never rejects a request whose connection went, and a connect that
        // hangs here held up whatever waited for it (found for the changelog writer's warm-up).
        // Kept, not thrown: a "does not exist" from the declaration below then carries why the
        // create failed (a refusal for good, access refused, or a passing one, a leader election).
        createError = await withTimeout(
          client.createStream({ stream: this.target, arguments: this.#streamArguments }),
          this.#connectTimeoutMs,
          `creating stream "${this.target}"`,
        ).then(
          () => undefined,
          (err: unknown) => err,
        );
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
      this.#encoder = new PublishFrameEncoder(
        publisherId,
        this.#producerName,
        this.#maxFrameSize,
        this.#subEntry.compression,
      );
      this.#socket = publisherSocket(publisher);
      // Bounded: the client never rejects a request whose connection closed, and a reconnect
      // that hangs here would hold close() forever.
      this.#missing.succeeded();
      return await withTimeout(
        publisher.getLastPublishingId(),
        this.#connectTimeoutMs,
        `querying the last publishing ID of "${this.#producerName}" on stream "${this.target}"`,
      );
    } catch (caught) {
      let explained = await explainDeclareFailure(client, this.target, caught);
      if (explained instanceof StreamDoesNotExistError && createError !== undefined) {
        explained = new StreamDoesNotExistError(
          `the stream does not exist, and creating it failed: ${errorText(createError)}`,
          { cause: new AggregateError([explained.cause, createError], 'declaration and create failed') },
        );
      }
      const err = this.#missing.judge(
        explained,
        this.#shared === undefined ? this.#address() : 'the shared client',
      );
      await this.#teardown();
      if (err instanceof StreamDoesNotExistError && this.#connected) {
        // Deleted while the publisher was open: no reconnect brings it back.
        throw targetDeletedError('stream', this.target, this.#producerName, err);
      }
      // A missing stream is most often a first run: say how to have it created.
      const hint =
        err instanceof StreamDoesNotExistError && !this.#createStream
          ? ' (pass `createStream: true` to create it at open, or create it first)'
          : '';
      throw new DedupError(
        'DEDUP_BROKER_REFUSED',
        `the broker refused producer "${this.#producerName}" on stream "${this.target}": ${errorText(err)}${hint}`,
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
    const socket = this.#socket;
    this.#client = undefined;
    this.#publisher = undefined;
    this.#socket = undefined;
    this.#encoder = undefined;
    if (client === undefined) return;
    // A socket the broker stopped reading (a paused node, a full window) would carry neither the
    // deletePublisher nor the close handshake: 5 s each spent for nothing. Our own client's
    // producer connection goes at once; closing it frees the name on the broker all the same.
    if (client !== this.#shared && socket?.writableNeedDrain === true) socket.destroy();
    // On a shared client the producer goes in every case (it holds a reference to its connection).
    if ((deleteName || client === this.#shared) && publisher !== undefined && socket?.destroyed !== true) {
      await withTimeout(client.deletePublisher(publisher.extendedId), 5_000, 'deletePublisher').catch(
        () => undefined,
      );
    }
    if (client === this.#shared) return;
    const closed = await withTimeout(client.close(), 5_000, 'closing the client').then(
      () => true,
      () => false,
    );
    // A broker that stops reading never answers the close either: the socket goes, so that
    // nothing of ours stays open (and holds the process) with frames the broker may never read.
    // Each wait here is bounded (5 s each): close() returns whatever the socket does (issue 32, item 7).
    if (!closed) {
      socket?.destroy();
      locatorSocket(client)?.destroy();
    }
  }

  #address(): string {
    return this.#shared !== undefined ? 'the given client' : `${this.#params.hostname}:${this.#params.port}`;
  }
}

/** The client's locator socket (1.0: `client.locatorConnection.socket`), if it is one. */
function locatorSocket(client: Client): Socket | undefined {
  const socket = (client as unknown as { locatorConnection?: { socket?: unknown } }).locatorConnection
    ?.socket;
  return socket instanceof SocketClass ? socket : undefined;
}
