import type { ConnectionOptions } from 'node:tls';
import { connect, type ChannelModel, type Options } from 'amqplib';
import { DedupError } from '../errors.js';
import { errorText, withTimeout } from './util.js';

/**
 * Connects to RabbitMQ over AMQP 0-9-1 with a bounded wait, and wires the connection's events:
 * amqplib emits 'error' before 'close', and an unhandled 'error' event would kill the process.
 * A connection that completes after the wait gave up is closed, not left open.
 *
 * @throws DedupError `DEDUP_BROKER_REFUSED` when the broker refuses the login or the virtual
 *   host; `DEDUP_BROKER_UNREACHABLE` otherwise.
 */
export async function connectAmqp(
  url: string | Options.Connect,
  timeoutMs: number,
  onClose: () => void,
  socketOptions?: AmqpSocketOptions,
): Promise<ChannelModel> {
  let model: ChannelModel;
  const attempt = connect(url, socketOptions);
  try {
    model = await withTimeout(attempt, timeoutMs, 'connecting');
  } catch (err) {
    attempt.then((late) => late.close()).catch(() => undefined);
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

/**
 * Socket options for amqplib's connection: with an `amqps://` URL (or `protocol: 'amqps'`), the TLS
 * options of Node's `tls.connect` — a custom CA, a client certificate and key (and the key's
 * passphrase), the server name to verify.
 */
export type AmqpSocketOptions = Pick<
  ConnectionOptions,
  'ca' | 'cert' | 'key' | 'passphrase' | 'servername' | 'rejectUnauthorized' | 'pfx'
> & { readonly timeout?: number };

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
