/**
 * AUDIT THIS FILE WHEN UPGRADING rabbitmq-stream-js-client.
 *
 * Every place stream-dedup reaches past the client's public API into its private fields lives
 * here, checked at run time so that a client that moved a field fails at `open()` with a clear
 * message instead of misbehaving later. Written against rabbitmq-stream-js-client 1.0.x (pinned
 * with `~` in package.json): after an upgrade, check each field below in the client's source
 * (`publisher.ts`, `consumer.ts`, `connection.ts`, `client.ts`, `response_decoder.ts`) and run
 * the integration tests. Not part of the public API.
 */
import { EventEmitter } from 'node:events';
import { Socket } from 'node:net';
import type { Client, Consumer, Publisher } from 'rabbitmq-stream-js-client';
import { DedupError } from '../errors.js';
import { ChunkDecodeError } from './amqp10-decode.js';
import { DELIVER_KEY, decodeDeliverFrame, type ChunkLimits } from './stream-chunks.js';

/** The publish-confirm and publish-error events of a client connection. */
export interface ConfirmListeners {
  on(
    event: 'publish_confirm',
    listener: (confirm: { publisherId: number; publishingIds: bigint[] }) => void,
  ): void;
  on(event: 'publish_error', listener: (error: { publisherId: number }) => void): void;
}

/** `what`: the field stream-dedup needs, e.g. "the publisher connection stream-dedup writes to". */
function unsupportedClient(what: string): DedupError {
  return new DedupError(
    'DEDUP_BROKER_REFUSED',
    `this rabbitmq-stream-js-client version does not expose ${what}; ` +
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
  if (!(socket instanceof Socket)) throw unsupportedClient('the publisher connection stream-dedup writes to');
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
  if (typeof connection?.on !== 'function')
    throw unsupportedClient('the publisher connection stream-dedup listens on');
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

/** A connection's response decoder, as far as stream-dedup replaces its Deliver decoding (1.0: `connection.decoder`). */
interface ClientDecoder {
  /** Takes the socket's bytes: whole frames, parts of frames, several frames. */
  add(data: Buffer, getCompressionBy: unknown): void;
  /** Where decoded frames go: `deliverV1`, `deliverV2` carry `{ subscriptionId, messages }`. */
  readonly emitter: EventEmitter;
  /** The start of a frame whose rest has not arrived. */
  lastData: Buffer;
}

/** Clients whose `getConnection` is wrapped, and decoders whose `add` is replaced: each once. */
const hookedClients = new WeakSet<object>();
const hookedDecoders = new WeakSet<object>();

/**
 * Makes every connection `client` opens for a consumer (or a publisher: `getConnection` serves
 * both) decode Deliver frames with `stream-chunks.ts` instead of the client's decoder, which
 * misreads sub-entry batches (see that file). Only on this client: the client's classes are not
 * touched, so the application's own clients keep the client's behaviour.
 *
 * How (1.0): the client's private `getConnection` is wrapped; on each connection it returns, the
 * response decoder's `add` (called by the socket's `data` listener) is replaced by a reader that
 * splits the bytes into frames itself, hands every other frame to the original `add` as one whole
 * frame, and emits each Deliver frame (versions 1 and 2) on `decoder.emitter` as `deliverV1` /
 * `deliverV2` with `{ subscriptionId, committedChunkId, messages }`: the shape the client's
 * delivery callbacks read (`client.ts`, `getDeliverV1Callback`). Idempotent per client and per
 * connection.
 *
 * A chunk that does not decode never throws in the socket listener (that would kill the process):
 * `onDecodeError` is called once, with a `ChunkDecodeError`, and every later Deliver frame of that
 * connection is dropped, so that nothing after the bad chunk is ever applied. The caller stops.
 * `limits` are the chunk decoder's ceilings (its defaults when absent), for every connection.
 *
 * @throws DedupError `DEDUP_BROKER_REFUSED` when this client version has no `getConnection`; from
 *   a connection's opening (so `declareConsumer` rejects) when it has no decoder of that shape.
 */
export function decodeDeliveriesOurselves(
  client: Client,
  onDecodeError: (error: ChunkDecodeError) => void,
  limits?: ChunkLimits,
): void {
  const target = client as unknown as { getConnection?: unknown };
  const getConnection = target.getConnection;
  if (typeof getConnection !== 'function') {
    throw unsupportedClient("the client's getConnection, through which stream-dedup reads deliveries");
  }
  if (hookedClients.has(client)) return;
  hookedClients.add(client);
  target.getConnection = async function (this: unknown, ...args: unknown[]): Promise<unknown> {
    const connection: unknown = await getConnection.apply(this, args);
    hookDecoder(connection, onDecodeError, limits);
    return connection;
  };
}

/** A client's decode-error listeners ({@link listenDecodeErrors}). */
interface DecodeRoute {
  readonly listeners: Set<(error: ChunkDecodeError) => void>;
  /** The first Deliver frame of the client's connections that did not decode, if one did not. */
  failure: ChunkDecodeError | undefined;
}

const decodeRoutes = new WeakMap<object, DecodeRoute>();

/**
 * {@link decodeDeliveriesOurselves} for a client that carries several reads, one after another or
 * together (a standby tail's reader kept across copies, a take-over's restore and then its genesis
 * read): each read listens while its subscription lives, and a Deliver frame that does not decode is
 * told to every read listening at that moment (the frame's connection drops every later Deliver
 * frame, so each of them would otherwise wait for deliveries that never come). A listener that
 * begins after such a failure hears it at once, synchronously. Returns the function that stops
 * `listener`. {@link deliveryDecodeFailure} says whether a failure happened: such a client is
 * replaced, not read again.
 *
 * @throws Error when `client` was hooked by {@link decodeDeliveriesOurselves} with a callback of its
 *   own (its errors would not reach the listeners); what that function throws.
 */
export function listenDecodeErrors(client: Client, listener: (error: ChunkDecodeError) => void): () => void {
  let route = decodeRoutes.get(client);
  if (route === undefined) {
    if (hookedClients.has(client))
      throw new Error('listenDecodeErrors: this client already reports decode errors to one callback');
    const created: DecodeRoute = { listeners: new Set(), failure: undefined };
    decodeDeliveriesOurselves(client, (error) => {
      created.failure ??= error;
      for (const each of [...created.listeners]) each(error);
    });
    decodeRoutes.set(client, created);
    route = created;
  }
  const own = (error: ChunkDecodeError): void => listener(error);
  const listening = route;
  listening.listeners.add(own);
  if (listening.failure !== undefined) own(listening.failure);
  return () => listening.listeners.delete(own);
}

/** The first Deliver frame of `client` that did not decode ({@link listenDecodeErrors}), if any. */
export function deliveryDecodeFailure(client: Client): ChunkDecodeError | undefined {
  return decodeRoutes.get(client)?.failure;
}

function hookDecoder(
  connection: unknown,
  onDecodeError: (error: ChunkDecodeError) => void,
  limits: ChunkLimits | undefined,
): void {
  const decoder = (connection as { decoder?: Partial<ClientDecoder> } | null | undefined)?.decoder;
  if (
    typeof decoder !== 'object' ||
    decoder === null ||
    typeof decoder.add !== 'function' ||
    !(decoder.emitter instanceof EventEmitter) ||
    !Buffer.isBuffer(decoder.lastData)
  ) {
    throw unsupportedClient("the connection's response decoder, through which stream-dedup reads deliveries");
  }
  if (hookedDecoders.has(decoder)) return;
  hookedDecoders.add(decoder);
  const reader = new DeliveryReader(decoder as ClientDecoder, onDecodeError, limits);
  decoder.add = (data: Buffer, getCompressionBy: unknown) => reader.add(data, getCompressionBy);
}

/**
 * Splits a connection's bytes into frames and decodes its Deliver frames. Bytes of an incomplete
 * frame wait as a list of the socket's chunks, joined once when the frame is complete: the
 * client's own `add` joins everything it holds on every `data` event, quadratic in a large frame.
 */
class DeliveryReader {
  readonly #decoder: ClientDecoder;
  readonly #originalAdd: (data: Buffer, getCompressionBy: unknown) => void;
  readonly #onDecodeError: (error: ChunkDecodeError) => void;
  readonly #limits: ChunkLimits | undefined;
  #pending: Buffer[] = [];
  #pendingBytes = 0;
  /** A Deliver frame did not decode: later ones are dropped (the consumer is stopping). */
  #failed = false;

  constructor(
    decoder: ClientDecoder,
    onDecodeError: (error: ChunkDecodeError) => void,
    limits: ChunkLimits | undefined,
  ) {
    this.#decoder = decoder;
    this.#limits = limits;
    this.#originalAdd = decoder.add.bind(decoder);
    this.#onDecodeError = onDecodeError;
    // Bytes the client's decoder kept from a frame not yet complete are ours from now on.
    if (decoder.lastData.length > 0) {
      this.#pending.push(decoder.lastData);
      this.#pendingBytes = decoder.lastData.length;
      decoder.lastData = Buffer.alloc(0);
    }
  }

  add(data: Buffer, getCompressionBy: unknown): void {
    let buf = data;
    if (this.#pendingBytes > 0) {
      this.#pending.push(data);
      this.#pendingBytes += data.length;
      if (this.#pendingBytes < this.#frameEnd()) return;
      buf = Buffer.concat(this.#pending, this.#pendingBytes);
      this.#pending = [];
      this.#pendingBytes = 0;
    }
    let pos = 0;
    try {
      while (buf.length - pos >= 4) {
        const end = pos + 4 + buf.readUInt32BE(pos);
        if (end > buf.length) break;
        const start = pos;
        pos = end;
        this.#frame(buf, start, end, getCompressionBy);
      }
    } finally {
      // Also when a frame's handling threw (the client's decoder may): the rest stays for later.
      if (pos < buf.length) {
        this.#pending.push(pos === 0 ? buf : buf.subarray(pos));
        this.#pendingBytes = buf.length - pos;
      }
    }
  }

  /** Where the first pending frame ends, counted from the first pending byte (infinite below 4 bytes). */
  #frameEnd(): number {
    if (this.#pendingBytes < 4) return Infinity;
    if (this.#pending[0]!.length < 4) this.#pending = [Buffer.concat(this.#pending, this.#pendingBytes)];
    return 4 + this.#pending[0]!.readUInt32BE(0);
  }

  /** One whole frame, `buf[start, end)` with its size prefix. */
  #frame(buf: Buffer, start: number, end: number, getCompressionBy: unknown): void {
    if (end - start < 8 || buf.readUInt16BE(start + 4) !== DELIVER_KEY) {
      this.#originalAdd(start === 0 && end === buf.length ? buf : buf.subarray(start, end), getCompressionBy);
      return;
    }
    if (this.#failed) return;
    let decoded;
    try {
      decoded = decodeDeliverFrame(buf, start + 4, end, this.#limits);
    } catch (err) {
      this.#failed = true;
      this.#onDecodeError(
        err instanceof ChunkDecodeError
          ? err
          : new ChunkDecodeError(`a Deliver frame did not decode: ${String(err)}`, { cause: err }),
      );
      return;
    }
    this.#decoder.emitter.emit(decoded.version === 1 ? 'deliverV1' : 'deliverV2', {
      subscriptionId: decoded.subscriptionId,
      committedChunkId: decoded.committedChunkId,
      messages: decoded.chunk.messages,
    });
  }
}

/**
 * Tells `onUpdate` whether each consumer update of `client`'s connections activates or
 * deactivates the consumer (1.0: the decoder's `consumer_update_query` event carries `active`,
 * but the client calls `consumerUpdateListener` without it). `onUpdate` runs first, synchronously
 * in the same event as the client's handler, which calls the listener before it awaits anything
 * (`client.ts`, `getConsumerUpdateCallback`): the listener reads the flag `onUpdate` just set.
 * The client's handler then runs with its rejection caught.
 * Meant for a client with one single-active consumer. Idempotent per connection.
 *
 * @throws DedupError `DEDUP_BROKER_REFUSED` when this client version has no `getConnection`; from
 *   a connection's opening when it has no decoder emitter.
 */
export function watchConsumerUpdates(client: Client, onUpdate: (active: boolean) => void): void {
  const target = client as unknown as { getConnection?: unknown };
  const getConnection = target.getConnection;
  if (typeof getConnection !== 'function') {
    throw unsupportedClient("the client's getConnection, through which stream-dedup hears consumer updates");
  }
  const watched = new WeakSet<object>();
  target.getConnection = async function (this: unknown, ...args: unknown[]): Promise<unknown> {
    const connection: unknown = await getConnection.apply(this, args);
    const emitter = (connection as { decoder?: { emitter?: unknown } } | null | undefined)?.decoder?.emitter;
    if (!(emitter instanceof EventEmitter)) {
      throw unsupportedClient(
        "the connection's decoder events, through which stream-dedup hears consumer updates",
      );
    }
    if (!watched.has(emitter)) {
      watched.add(emitter);
      // The client's own listener answers the broker and rejects, unhandled, when that answer
      // cannot be written (measured: a member paused past its heartbeat, then resumed): it runs
      // here, right after `onUpdate`, with its rejection caught.
      const clientListeners = emitter.listeners('consumer_update_query') as Array<
        (update: unknown) => unknown
      >;
      emitter.removeAllListeners('consumer_update_query');
      emitter.on('consumer_update_query', (update: { active?: unknown }) => {
        onUpdate(update.active === 1 || update.active === true);
        for (const listener of clientListeners) void Promise.resolve(listener(update)).catch(() => undefined);
      });
    }
    return connection;
  };
}

/**
 * The broker's last publishing ID of producer `publisherRef` on `stream`, asked through the
 * client's locator connection without declaring a producer (1.0: `client.locatorConnection`,
 * whose `queryPublisherSequence` the client's own `declarePublisher` uses). 0n when the name
 * never published there.
 *
 * @throws DedupError `DEDUP_BROKER_REFUSED` when this client version has no such connection.
 */
export function queryPublisherSequence(
  client: Client,
  stream: string,
  publisherRef: string,
): Promise<bigint> {
  const locator = (client as unknown as { locatorConnection?: { queryPublisherSequence?: unknown } })
    .locatorConnection;
  if (typeof locator?.queryPublisherSequence !== 'function') {
    throw unsupportedClient("the client's locator connection, through which stream-dedup asks for a last ID");
  }
  return (
    locator.queryPublisherSequence as (p: { stream: string; publisherRef: string }) => Promise<bigint>
  ).call(locator, { stream, publisherRef });
}

/**
 * Prepares every connection of a client the library connects — its locator connection and every
 * connection it opens later:
 *
 * - Keeps a failed heartbeat from killing the process (1.0: `connection.heartbeat`, whose
 *   `heartbeat()` re-arms itself with a `setTimeout` and rejects, unhandled, when the heartbeat
 *   cannot be written: measured on a process paused past its heartbeat and resumed, whose first
 *   timer wrote to the socket the broker had closed). The loss itself is seen through the
 *   connection's close.
 * - Turns Nagle's algorithm off (1.0 leaves it on; the broker's side has it off): with more than
 *   one chunk of credit in flight, each small credit request waited for the broker's delayed ACK.
 *   Measured reading 5 000 one-entry chunks: 73.7 s with 4 credits, 1.26 s with Nagle off (1.87 s
 *   with 1 credit); this is what lets the changelog restore ask for many chunks at once.
 *
 * @throws DedupError `DEDUP_BROKER_REFUSED` when this client version has no such heartbeat.
 */
export function guardHeartbeats(client: Client): void {
  const target = client as unknown as { getConnection?: unknown; locatorConnection?: unknown };
  const getConnection = target.getConnection;
  if (typeof getConnection !== 'function') {
    throw unsupportedClient("the client's getConnection, through which stream-dedup guards heartbeats");
  }
  if (target.locatorConnection !== undefined) prepareConnection(target.locatorConnection);
  if (guardedClients.has(client)) return;
  guardedClients.add(client);
  target.getConnection = async function (this: unknown, ...args: unknown[]): Promise<unknown> {
    const connection: unknown = await getConnection.apply(this, args);
    prepareConnection(connection);
    return connection;
  };
}

const guardedClients = new WeakSet<object>();
const guardedHeartbeats = new WeakSet<object>();

/** Nagle off and the heartbeat guarded, on one connection (see {@link guardHeartbeats}). */
function prepareConnection(connection: unknown): void {
  const socket = (connection as { socket?: unknown } | null | undefined)?.socket;
  if (socket instanceof Socket) socket.setNoDelay(true);
  const heartbeat = (connection as { heartbeat?: { heartbeat?: unknown } } | null | undefined)?.heartbeat;
  if (typeof heartbeat?.heartbeat !== 'function') {
    throw unsupportedClient("the connection's heartbeat, which stream-dedup guards");
  }
  if (guardedHeartbeats.has(heartbeat)) return;
  guardedHeartbeats.add(heartbeat);
  const beat = (heartbeat.heartbeat as () => Promise<void>).bind(heartbeat);
  // Its timer calls `this.heartbeat()`: this property, from now on.
  heartbeat.heartbeat = () => beat().catch(() => undefined);
}

/**
 * Publisher and subscription IDs one connection can issue: each is a u8 on the wire, and RabbitMQ
 * 4.3.5+ refuses the 257th live one of a connection with response code 17 (measured on 4.3.6:
 * test/integration/broker-limits.test.ts).
 */
export const MAX_IDS_PER_CONNECTION = 256;

interface PoolShape {
  getConnection(
    entityType: string,
    streamName: string,
    vhost: string,
    host: string,
    create: () => Promise<unknown>,
  ): Promise<unknown>;
  getCacheKey(streamName: string, vhost: string, host: string, entityType: string): string;
  cacheConnection(key: string, connection: unknown): void;
  connectionsMap: Map<string, unknown[]>;
}

const splitPools = new WeakSet<object>();

/**
 * Makes the client open another connection where its pool would hand out one that has issued
 * all 256 publisher (or subscription) IDs. The client (1.0: `client.pool`) shares a connection
 * among up to 256 publishers of a stream, but numbers them from a counter it never winds back
 * (`connection.publisherId`, `consumerId`): once a connection has issued 256, every later declare
 * on it throws RangeError ERR_OUT_OF_RANGE inside the client (measured: 256 declares on one
 * connection, then any declare while one of them is still open), and the application's
 * publisher on the same stream keeps that connection alive — so an application's client that
 * opens and closes producers on a stream stopped opening them for good. With
 * `MAX_SHARED_CLIENT_INSTANCES` above 256 the same holds for the 257th live one. For the
 * application's own `Client` (`connection: client`), on which stream-dedup declares its producers;
 * the application's own declares on that client then get a new connection there too, where the
 * client would have thrown.
 *
 * @throws DedupError `DEDUP_BROKER_REFUSED` when this client version has no such pool.
 */
export function splitFullConnections(client: Client): void {
  const pool = (client as unknown as { pool?: Partial<PoolShape> }).pool;
  if (
    typeof pool?.getConnection !== 'function' ||
    typeof pool.getCacheKey !== 'function' ||
    typeof pool.cacheConnection !== 'function' ||
    !(pool.connectionsMap instanceof Map)
  ) {
    throw unsupportedClient(
      "the client's connection pool, whose connections stream-dedup keeps below 256 IDs",
    );
  }
  if (splitPools.has(pool)) return;
  splitPools.add(pool);
  const p = pool as PoolShape;
  const getConnection = p.getConnection.bind(p);
  // IDs issued or promised per connection and kind: the client takes its ID only after
  // getConnection's promise resolves, so two declares resolved together would both be handed a
  // connection with one ID left. A handout is reserved before anything is awaited, and every
  // handout is followed by exactly one ID.
  const promised = new WeakMap<object, { publisher: number; consumer: number }>();
  const counted = (connection: object, kind: 'publisher' | 'consumer'): number => {
    const counter = (connection as { publisherId?: unknown; consumerId?: unknown })[`${kind}Id`];
    return Math.max(promised.get(connection)?.[kind] ?? 0, typeof counter === 'number' ? counter : 0);
  };
  const reserve = (connection: unknown, kind: 'publisher' | 'consumer', delta: 1 | -1): void => {
    if (typeof connection !== 'object' || connection === null) return;
    const entry = promised.get(connection) ?? { publisher: 0, consumer: 0 };
    entry[kind] = delta === 1 ? counted(connection, kind) + 1 : entry[kind] - 1;
    promised.set(connection, entry);
  };
  p.getConnection = async (entityType, streamName, vhost, host, create) => {
    const kind = entityType === 'publisher' ? 'publisher' : 'consumer';
    const key = p.getCacheKey(streamName, vhost, host, entityType);
    const last = p.connectionsMap.get(key)?.at(-1);
    if (typeof last === 'object' && last !== null && counted(last, kind) >= MAX_IDS_PER_CONNECTION) {
      const connection = await create();
      p.cacheConnection(key, connection);
      reserve(connection, kind, 1);
      return connection;
    }
    reserve(last, kind, 1);
    let connection: unknown;
    try {
      connection = await getConnection(entityType, streamName, vhost, host, create);
    } catch (err) {
      reserve(last, kind, -1);
      throw err;
    }
    if (connection !== last) {
      reserve(last, kind, -1);
      reserve(connection, kind, 1);
    }
    return connection;
  };
}
