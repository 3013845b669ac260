import { connect as netConnect, type Socket } from 'node:net';
import { connect as tlsConnect, type ConnectionOptions } from 'node:tls';
import { connect, type Client, type ClientParams } from 'rabbitmq-stream-js-client';
import { DedupError } from '../errors.js';
import { errorText, withTimeout } from './util.js';
import { guardHeartbeats } from './stream-client-internals.js';

/**
 * A handshake of our own with a stream port before rabbitmq-stream-js-client connects to it.
 *
 * Why: the client (1.0) runs its handshake inside an async socket listener. A refused login throws
 * there ("Unable Authenticate -> 8") and a missing virtual host makes its decoder read past a
 * buffer: an unhandled rejection or an uncaught exception that kills the process, while the
 * promise `connect()` returned never settles. So every connection is first opened here — the same
 * frames (peer properties, SASL, tune, open, close) with our own decoder — and a refusal becomes a
 * typed error at once; only a handshake that succeeded is repeated by the client.
 */

/** What the probe needs of the client's connection parameters. */
export interface ProbeParams {
  readonly hostname: string;
  readonly port: number;
  readonly username: string;
  readonly password: string;
  readonly vhost: string;
  /** `true` or TLS options, as the client takes them. */
  readonly ssl?: boolean | ConnectionOptions | undefined;
  /** `'PLAIN'` (default) or `'EXTERNAL'` (TLS client certificates). */
  readonly mechanism?: string | undefined;
}

/** Stream protocol response codes the probe names (PROTOCOL.adoc of rabbitmq_stream). */
const RESPONSE_CODES: Readonly<Record<number, string>> = {
  7: 'SASL mechanism not supported',
  8: 'authentication failure (wrong username or password)',
  9: 'SASL error',
  11: 'authentication failure: this user may only connect from localhost',
  12: 'virtual host access failure (the virtual host does not exist, or the user has no access to it)',
  16: 'access refused',
};

const PEER_PROPERTIES = 0x0011;
const SASL_HANDSHAKE = 0x0012;
const SASL_AUTHENTICATE = 0x0013;
const TUNE = 0x0014;
const OPEN = 0x0015;
const CLOSE = 0x0016;
const RESPONSE = 0x8000;
/** Larger than any frame a broker sends during the handshake: anything else is not RabbitMQ. */
const MAX_HANDSHAKE_FRAME = 1 << 20;

function str(s: string): Buffer {
  const bytes = Buffer.from(s, 'utf8');
  const out = Buffer.allocUnsafe(2 + bytes.length);
  out.writeInt16BE(bytes.length, 0);
  bytes.copy(out, 2);
  return out;
}

function frame(key: number, parts: readonly Buffer[]): Buffer {
  const body = Buffer.concat([Buffer.from([key >> 8, key & 0xff, 0, 1]), ...parts]);
  const size = Buffer.allocUnsafe(4);
  size.writeUInt32BE(body.length, 0);
  return Buffer.concat([size, body]);
}

function u32(n: number): Buffer {
  const b = Buffer.allocUnsafe(4);
  b.writeUInt32BE(n, 0);
  return b;
}

function u16(n: number): Buffer {
  const b = Buffer.allocUnsafe(2);
  b.writeUInt16BE(n, 0);
  return b;
}

/** Reads whole frames off a socket, one at a time. */
class FrameReader {
  #buffer: Buffer = Buffer.alloc(0);
  #waiter: { resolve: (f: Buffer) => void; reject: (e: Error) => void } | undefined;
  #failure: Error | undefined;

  constructor(
    socket: Socket,
    private readonly where: string,
  ) {
    socket.on('data', (chunk: Buffer) => {
      this.#buffer = this.#buffer.length === 0 ? chunk : Buffer.concat([this.#buffer, chunk]);
      this.#deliver();
    });
    socket.on('error', (err) => this.#fail(err));
    socket.on('close', () => this.#fail(new Error(`${where} closed the connection during the handshake`)));
  }

  #fail(err: Error): void {
    this.#failure ??= err;
    const waiter = this.#waiter;
    this.#waiter = undefined;
    waiter?.reject(this.#failure);
  }

  #deliver(): void {
    if (this.#waiter === undefined || this.#buffer.length < 4) return;
    const size = this.#buffer.readUInt32BE(0);
    if (size < 4 || size > MAX_HANDSHAKE_FRAME) {
      this.#fail(
        new NotStreamPortError(
          `${this.where} does not speak RabbitMQ's stream protocol (it answered ${JSON.stringify(
            this.#buffer.subarray(0, 16).toString('latin1'),
          )}…)`,
        ),
      );
      return;
    }
    if (this.#buffer.length < 4 + size) return;
    const f = this.#buffer.subarray(4, 4 + size);
    this.#buffer = this.#buffer.subarray(4 + size);
    const waiter = this.#waiter;
    this.#waiter = undefined;
    waiter.resolve(f);
  }

  next(): Promise<Buffer> {
    if (this.#failure !== undefined) return Promise.reject(this.#failure);
    return new Promise((resolve, reject) => {
      this.#waiter = { resolve, reject };
      this.#deliver();
    });
  }
}

class NotStreamPortError extends Error {}
class RefusedError extends Error {}

/**
 * Opens a connection to the stream port, runs the protocol's handshake up to `open` of the virtual
 * host, and closes it.
 *
 * @throws DedupError `DEDUP_BROKER_REFUSED` when the broker refuses the login, the virtual host
 *   or access (the message names which, never the password); `DEDUP_BROKER_UNREACHABLE` when
 *   nothing answers in `timeoutMs`, the connection fails, or the peer is not a RabbitMQ stream port.
 */
export async function probeStreamPort(params: ProbeParams, timeoutMs: number): Promise<void> {
  const where = `${params.hostname}:${params.port}`;
  // TLS exactly as the client sets it up (`ssl: true` is its own default, without verification).
  const socket =
    params.ssl === undefined || params.ssl === false
      ? netConnect({ host: params.hostname, port: params.port })
      : tlsConnect(
          params.port,
          params.hostname,
          params.ssl === true ? { rejectUnauthorized: false } : params.ssl,
        );
  const reader = new FrameReader(socket, where);
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`no answer from ${where} within ${timeoutMs} ms`)), timeoutMs);
  });
  timeout.catch(() => undefined);
  try {
    await Promise.race([handshake(socket, reader, params, where), timeout]);
  } catch (err) {
    if (err instanceof RefusedError) {
      throw new DedupError('DEDUP_BROKER_REFUSED', err.message);
    }
    const detail = err instanceof Error ? err.message : String(err);
    throw new DedupError(
      'DEDUP_BROKER_UNREACHABLE',
      err instanceof NotStreamPortError
        ? detail
        : `cannot connect to RabbitMQ's stream port at ${where}: ${detail}`,
      { cause: err },
    );
  } finally {
    clearTimeout(timer);
    socket.destroy();
  }
}

async function handshake(
  socket: Socket,
  reader: FrameReader,
  params: ProbeParams,
  where: string,
): Promise<void> {
  let correlation = 0;
  const request = async (key: number, parts: readonly Buffer[], what: string): Promise<Buffer> => {
    const id = ++correlation;
    socket.write(frame(key, [u32(id), ...parts]));
    for (;;) {
      const f = await reader.next();
      const k = f.readUInt16BE(0);
      if (k === TUNE) {
        // The broker tunes right after authentication: agree to its values.
        socket.write(frame(TUNE, [f.subarray(4, 8), f.subarray(8, 12)]));
        continue;
      }
      if (k !== (key | RESPONSE) || f.length < 10 || f.readUInt32BE(4) !== id) continue;
      const code = f.readUInt16BE(8);
      if (code !== 1) {
        throw new RefusedError(
          `RabbitMQ at ${where} refused ${what}: ${RESPONSE_CODES[code] ?? `response code ${code}`}`,
        );
      }
      return f.subarray(10);
    }
  };
  await request(
    PEER_PROPERTIES,
    [u32(1), str('product'), str('stream-dedup connection check')],
    'the connection',
  );
  const mechanism = params.mechanism ?? 'PLAIN';
  const mechanisms = await request(SASL_HANDSHAKE, [], 'the SASL handshake');
  const offered: string[] = [];
  for (let o = 4, n = mechanisms.readInt32BE(0); n > 0 && o + 2 <= mechanisms.length; n--) {
    const len = mechanisms.readInt16BE(o);
    offered.push(mechanisms.toString('utf8', o + 2, o + 2 + len));
    o += 2 + len;
  }
  if (!offered.includes(mechanism)) {
    throw new RefusedError(
      `RabbitMQ at ${where} does not offer the SASL mechanism ${mechanism} (it offers ${offered.join(', ') || 'none'})`,
    );
  }
  const secret =
    mechanism === 'PLAIN'
      ? Buffer.concat([
          Buffer.from([0]),
          Buffer.from(params.username),
          Buffer.from([0]),
          Buffer.from(params.password),
        ])
      : Buffer.alloc(0);
  await request(
    SASL_AUTHENTICATE,
    [str(mechanism), u32(secret.length), secret],
    `the login of user ${JSON.stringify(params.username)}`,
  );
  await request(OPEN, [str(params.vhost)], `virtual host ${JSON.stringify(params.vhost)}`);
  socket.write(frame(CLOSE, [u32(++correlation), u16(1), str('connection check done')]));
}

/**
 * Connects a rabbitmq-stream-js-client `Client` after {@link probeStreamPort} found the port, the
 * login and the virtual host good: the only way the library creates clients.
 *
 * @throws DedupError `DEDUP_BROKER_REFUSED` or `DEDUP_BROKER_UNREACHABLE` (see the probe); the
 *   client's own failures and time-outs as `DEDUP_BROKER_UNREACHABLE`.
 */
export async function connectStreamClient(params: ClientParams, timeoutMs: number): Promise<Client> {
  await probeStreamPort(params, timeoutMs);
  const where = `${params.hostname}:${params.port}`;
  const attempt = connect(params);
  try {
    const client = await withTimeout(attempt, timeoutMs, `connecting to ${where}`);
    guardHeartbeats(client);
    return client;
  } catch (err) {
    // A client that connects after the wait gave up is closed, not left holding a connection.
    attempt.then((late) => late.close()).catch(() => undefined);
    throw new DedupError(
      'DEDUP_BROKER_UNREACHABLE',
      `cannot connect to RabbitMQ's stream port at ${where}: ${errorText(err)}`,
      { cause: err },
    );
  }
}
