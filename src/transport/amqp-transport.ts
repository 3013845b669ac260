/**
 * The AMQP 0-9-1 half of `AmqpDedupPublisher`: connects through amqplib, publishes on a confirm
 * channel with the identity stamped as headers, and reports confirms to the publisher core. Not
 * part of the public API.
 */
import { once } from 'node:events';
import { Duplex } from 'node:stream';
import type { ChannelModel, ConfirmChannel, Options } from 'amqplib';
import { DedupError } from '../errors.js';
import { AMQP091_TRANSPORT, ID_HEADER, identityHeaders, TRANSPORT_HEADER } from '../identity/headers.js';
import { targetDeletedError } from '../publisher/errors.js';
import type { OutgoingMessage, PublishTransport, TransportHandlers } from '../publisher/types.js';
import { closeLate, ConnectBudget, connectAmqp, type AmqpSocketOptions } from './amqp-connect.js';
import type { AmqpDedupPublisherOptions } from './amqp-options.js';
import { assertTlsOptions, errorText, withTimeout } from './util.js';

/** How long close() waits for the broker to answer the connection's close. */
const CLOSE_TIMEOUT_MS = 5_000;

/** RabbitMQ 4's default `max_message_size` (16 MiB). */
const MAX_MESSAGE_BYTES = 16 * 1024 * 1024;

/** @internal The AMQP 0-9-1 half of `AmqpDedupPublisher`. */
export class AmqpTransport implements PublishTransport {
  readonly target: string;
  readonly maxMessageBytes: number = MAX_MESSAGE_BYTES;
  readonly #url: string | Options.Connect;
  readonly #socketOptions: AmqpSocketOptions | undefined;
  readonly #producerName: string;
  readonly #declare: boolean;
  readonly #connectTimeoutMs: number;
  #model: ChannelModel | undefined;
  #channel: ConfirmChannel | undefined;
  #lost: Promise<never> | undefined;
  #markLost: ((error: Error) => void) | undefined;
  #generation = 0;
  /** Connected once: later connects are reconnections. */
  #connected = false;
  /** IDs the broker returned as unroutable on the current channel, until their ack arrives. */
  readonly #returned = new Set<string>();

  constructor(options: AmqpDedupPublisherOptions) {
    if (
      typeof options.queue !== 'string' ||
      options.queue.length === 0 ||
      Buffer.byteLength(options.queue, 'utf8') > 255
    ) {
      throw new RangeError('queue must be a non-empty string of at most 255 UTF-8 bytes');
    }
    if (typeof options.url !== 'string' && (typeof options.url !== 'object' || options.url === null)) {
      throw new TypeError('url must be an AMQP URL or amqplib connect options');
    }
    this.target = options.queue;
    this.#url = options.url;
    this.#producerName = options.producerName;
    this.#declare = options.declareQueue ?? false;
    this.#connectTimeoutMs = options.connectTimeoutMs ?? 10_000;
    if (options.socketOptions !== undefined) assertTlsOptions(options.socketOptions, 'socketOptions');
    this.#socketOptions = options.socketOptions;
  }

  /**
   * AMQP 0-9-1 has no per-name "last publishing ID" on the broker: resolves `undefined`, and the
   * core trusts its store (reconciliation on open is the store's last ID; a second writer under
   * the same name is not detected by the broker — the store's lock and one-producer-per-name rule
   * are the defence).
   */
  async connect(handlers: TransportHandlers): Promise<undefined> {
    await this.#teardown();
    const generation = ++this.#generation;
    let markLost!: (error: Error) => void;
    const lost = new Promise<never>((_, reject) => (markLost = reject));
    lost.catch(() => undefined);
    this.#lost = lost;
    this.#markLost = markLost;
    const fail = (error: Error): void => {
      markLost(error);
      if (generation === this.#generation) handlers.disconnected(error);
    };
    // One bound for the handshake, the channel and the queue check (ConnectBudget).
    const budget = new ConnectBudget(this.#connectTimeoutMs);
    const model = await connectAmqp(
      this.#url,
      budget,
      () => fail(new Error('AMQP connection closed')),
      this.#socketOptions,
    );
    this.#model = model;
    try {
      const channel = await budget.step(model.createConfirmChannel(), 'opening a confirm channel', closeLate);
      channel.on('error', () => undefined);
      channel.on('close', () => fail(new Error('AMQP channel closed')));
      // Published `mandatory`: a message no queue takes (the queue was deleted) comes back here
      // before its ack, which would otherwise confirm a message that was dropped.
      channel.on('return', (message: { properties: { headers?: Record<string, unknown> } }) => {
        const id = message.properties.headers?.[ID_HEADER];
        if (generation === this.#generation && typeof id === 'string') this.#returned.add(id);
      });
      // Declared only at open(): a queue deleted while the publisher runs stops it (below) rather
      // than coming back empty under the same name.
      if (this.#declare && !this.#connected) {
        const declaring = channel.assertQueue(this.target, {
          durable: true,
          arguments: { 'x-queue-type': 'stream' },
        });
        await budget.step(declaring, `declaring queue "${this.target}"`);
      } else {
        await budget.step(channel.checkQueue(this.target), `checking queue "${this.target}"`);
      }
      this.#channel = channel;
      this.#handlers = handlers;
      this.#connected = true;
      return undefined;
    } catch (err) {
      // The close, too, within what is left of the bound: after a step that ran out of it (a
      // broker gone silent, which will not answer the close either), none, and the socket goes.
      await this.#teardown(budget.leftMs);
      // A step that ran out of the bound: transient, a reconnect tries again.
      if (err instanceof DedupError) throw err;
      if (this.#connected && (err as { code?: unknown } | null)?.code === 404) {
        throw targetDeletedError('queue', this.target, this.#producerName, err);
      }
      throw new DedupError(
        'DEDUP_BROKER_REFUSED',
        `the broker refused queue "${this.target}": ${errorText(err)}`,
        {
          cause: err,
        },
      );
    }
  }

  #handlers: TransportHandlers | undefined;

  async publish(messages: readonly OutgoingMessage[]): Promise<void> {
    const channel = this.#channel;
    const lost = this.#lost;
    const handlers = this.#handlers;
    const markLost = this.#markLost;
    if (channel === undefined || lost === undefined || handlers === undefined || markLost === undefined) {
      throw new Error('not connected');
    }
    const generation = this.#generation;
    for (const m of messages) {
      const id = m.publishingId;
      // The mark lets `audit` tell this transport's re-send copies (expected: the broker does not
      // deduplicate AMQP 0-9-1) from a stream-protocol publisher's duplicates (a defect).
      const headers = {
        ...m.headers,
        ...identityHeaders(this.#producerName, id),
        [TRANSPORT_HEADER]: AMQP091_TRANSPORT,
      };
      const body = Buffer.isBuffer(m.body)
        ? m.body
        : Buffer.from(m.body.buffer, m.body.byteOffset, m.body.byteLength);
      const hasRoom = channel.sendToQueue(
        this.target,
        body,
        { headers, persistent: true, mandatory: true },
        (err: unknown) => {
          if (generation !== this.#generation) return;
          if (this.#returned.size > 0 && this.#returned.delete(String(id))) {
            // Acked, but returned unroutable: not stored. The reconnect finds out why.
            const error = new Error(`publishing ID ${id} was returned: no queue "${this.target}" took it`);
            markLost(error);
            handlers.disconnected(error);
          } else if (err === null || err === undefined) handlers.confirmed([id]);
          else {
            // A nack: the broker did not take it. Treat the channel as unusable: everything
            // unconfirmed is re-sent on a fresh one.
            const error = new Error(`the broker nacked publishing ID ${id}`);
            markLost(error);
            handlers.disconnected(error);
          }
        },
      );
      if (!hasRoom) await Promise.race([once(channel, 'drain'), lost]);
    }
  }

  queryLastId(): Promise<undefined> {
    return Promise.resolve(undefined);
  }

  async close(): Promise<void> {
    await this.#teardown();
  }

  /** Closes the connection, waiting up to `closeWithinMs` for the broker's answer (then the socket is destroyed). */
  async #teardown(closeWithinMs = CLOSE_TIMEOUT_MS): Promise<void> {
    this.#generation++;
    this.#returned.clear();
    this.#markLost?.(new Error('connection closed by the publisher'));
    const model = this.#model;
    this.#model = undefined;
    this.#channel = undefined;
    this.#handlers = undefined;
    this.#lost = undefined;
    this.#markLost = undefined;
    if (model === undefined) return;
    const socket = amqpSocket(model);
    // A socket the broker stopped reading would not carry the close handshake: it goes at once.
    if (socket?.writableNeedDrain === true) {
      socket.destroy();
      return;
    }
    if (closeWithinMs <= 0) {
      model.close().catch(() => undefined);
      socket?.destroy();
      return;
    }
    const closed = await withTimeout(model.close(), closeWithinMs, 'closing').then(
      () => true,
      () => false,
    );
    // A broker that stops reading never answers the close: the socket goes, so that nothing of
    // ours stays open with frames it may never read (issue 32, item 7). A publish waiting for
    // 'drain' has already ended: #markLost above.
    if (!closed) socket?.destroy();
  }
}

/** amqplib's socket under a channel model (0.10: `model.connection.stream`), if it is one. */
function amqpSocket(model: ChannelModel): Duplex | undefined {
  const stream = (model as unknown as { connection?: { stream?: unknown } }).connection?.stream;
  return stream instanceof Duplex ? stream : undefined;
}
