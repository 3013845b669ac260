import type { ConnectionOptions } from 'node:tls';
import { connect, type ChannelModel, type Options } from 'amqplib';
import { DedupError } from '../errors.js';
import { errorText, withTimeout } from './util.js';

/**
 * One AMQP 0-9-1 connect's time bound (`connectTimeoutMs`): the handshake, the channel's open,
 * the queue check and the consume all draw from it. amqplib bounds none of the steps after the
 * handshake: a broker that answers the handshake and then falls silent (a paused node, a full
 * window) would hold `open()`, each reconnect and `close()` until the heartbeat notices (minutes),
 * or for ever with `heartbeat=0`.
 *
 * @internal
 */
export class ConnectBudget {
  /** The whole bound, in ms. */
  readonly timeoutMs: number;
  readonly #deadline: number;

  /** Starts the clock. */
  constructor(timeoutMs: number) {
    this.timeoutMs = timeoutMs;
    this.#deadline = performance.now() + timeoutMs;
  }

  /** What is left of the bound, in whole ms (0 or less: nothing). */
  get leftMs(): number {
    return Math.ceil(this.#deadline - performance.now());
  }

  /**
   * `work` within what is left of the bound. What it yields after the bound ran out goes to
   * `late` (a channel or a connection to close), never to the caller.
   *
   * @throws DedupError `DEDUP_BROKER_UNREACHABLE` when the bound runs out first (a transient
   *   failure: a reconnect tries again).
   */
  step<T>(work: Promise<T>, what: string, late?: (value: T) => void): Promise<T> {
    const left = this.leftMs;
    let timedOut = false;
    work.then(
      (value) => {
        if (timedOut) late?.(value);
      },
      () => undefined,
    );
    const outOfTime = (): DedupError => {
      timedOut = true;
      return new DedupError(
        'DEDUP_BROKER_UNREACHABLE',
        `${what} did not complete within connectTimeoutMs (${this.timeoutMs} ms)`,
      );
    };
    // Nothing left (an earlier step took it all): no timer, whose 0 ms Node makes 1.
    if (left <= 0) return Promise.reject(outOfTime());
    return withTimeout(work, left, what, outOfTime);
  }
}

/**
 * Connects to RabbitMQ over AMQP 0-9-1 within `budget`, and wires the connection's events:
 * amqplib emits 'error' before 'close', and an unhandled 'error' event would kill the process.
 * A connection that completes after the wait gave up is closed, not left open. The steps after
 * the handshake (channel, queue) draw from the same budget.
 *
 * @throws DedupError `DEDUP_BROKER_REFUSED` when the broker refuses the login or the virtual
 *   host; `DEDUP_BROKER_UNREACHABLE` otherwise.
 * @internal
 */
export async function connectAmqp(
  url: string | Options.Connect,
  budget: ConnectBudget,
  onClose: () => void,
  socketOptions?: AmqpSocketOptions,
): Promise<ChannelModel> {
  let model: ChannelModel;
  try {
    model = await budget.step(connect(url, socketOptions), `connecting to ${where(url)}`, closeLate);
  } catch (err) {
    const refused = refusal(err, url);
    throw new DedupError(
      refused === undefined ? 'DEDUP_BROKER_UNREACHABLE' : 'DEDUP_BROKER_REFUSED',
      refused ?? `cannot connect to RabbitMQ over AMQP 0-9-1 at ${where(url)}: ${errorText(err)}`,
      { cause: err },
    );
  }
  model.on('error', () => undefined);
  model.on('close', onClose);
  return model;
}

/** Closes a channel that opened after its connect gave up; never rejects. @internal */
export function closeLate(channel: { close(): Promise<void> }): void {
  channel.close().catch(() => undefined);
}

/**
 * Socket options for amqplib's connection: with an `amqps://` URL (or `protocol: 'amqps'`), the TLS
 * options of Node's `tls.connect` — a custom CA, a client certificate and key (and the key's
 * passphrase), the server name to verify.
 */
export type AmqpSocketOptions = Pick<
  ConnectionOptions,
  'ca' | 'cert' | 'key' | 'passphrase' | 'servername' | 'rejectUnauthorized' | 'pfx'
> & {
  /**
   * The socket's connect time-out in ms, amqplib's own (`connectTimeoutMs` bounds the whole connect).
   * @defaultValue none: amqplib's own
   */
  readonly timeout?: number;
};

/** The host and port of a connection, for messages: never the credentials. */
function where(url: string | Options.Connect): string {
  if (typeof url !== 'string') return `${url.hostname ?? 'localhost'}:${url.port ?? 5672}`;
  try {
    const u = new URL(url);
    return `${u.hostname}:${u.port || (u.protocol === 'amqps:' ? 5671 : 5672)}`;
  } catch {
    return 'the given URL';
  }
}

function vhostOf(url: string | Options.Connect): string {
  if (typeof url !== 'string') return url.vhost ?? '/';
  try {
    const path = new URL(url).pathname;
    return path.length > 1 ? decodeURIComponent(path.slice(1)) : '/';
  } catch {
    return '/';
  }
}

/**
 * amqplib's wording for a refusal during the handshake: the broker closes the connection, with a
 * reason at the login (403 ACCESS_REFUSED), and with none amqplib keeps at connection.open (a
 * virtual host that does not exist or that the user may not use: 530 NOT_ALLOWED).
 */
function refusal(err: unknown, url: string | Options.Connect): string | undefined {
  const message = err instanceof Error ? err.message : '';
  if (/Handshake terminated by server: 403\b/.test(message)) {
    return `RabbitMQ at ${where(url)} refused the login (wrong username or password, or the mechanism): ${message.replace(/^.*?with message /, '')}`;
  }
  if (/Handshake terminated by server/.test(message)) {
    return `RabbitMQ at ${where(url)} refused the connection: ${message}`;
  }
  if (/Expected ConnectionOpenOk; got <ConnectionClose/.test(message)) {
    return `RabbitMQ at ${where(url)} refused virtual host ${JSON.stringify(vhostOf(url))} (it does not exist, or the user has no access to it)`;
  }
  return undefined;
}
