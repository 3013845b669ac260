import { createSecureContext, type ConnectionOptions } from 'node:tls';
import type { Client, ClientParams } from 'rabbitmq-stream-js-client';
import { Backoff, sleep } from '../util/backoff.js';

/** Rejects with `${what} timed out after ${ms} ms` unless `promise` settles first. */
export function withTimeout<T>(
  promise: Promise<T>,
  ms: number,
  what: string,
  makeError: (message: string) => Error = (message) => new Error(message),
): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(makeError(`${what} timed out after ${ms} ms`)), ms);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

/** The stream exists but no member can serve it right now, as while a new leader is elected. */
export class StreamNotAvailableError extends Error {
  override readonly name = 'StreamNotAvailableError';
}

/** The stream does not exist (the broker's metadata says so: response code 2). */
export class StreamDoesNotExistError extends Error {
  override readonly name = 'StreamDoesNotExistError';
}

/**
 * True when the stream was not available (RabbitMQ's response code 6, which the client reports
 * only in an error's message, or a {@link StreamNotAvailableError}), anywhere in the cause chain.
 */
export function isStreamNotAvailable(err: unknown): boolean {
  for (let e: unknown = err; e instanceof Error; e = e.cause) {
    if (e instanceof StreamNotAvailableError || /returned error with code 6\b/.test(e.message)) return true;
  }
  return false;
}

/** Socket errors that mean a node did not answer (it is down or restarting). */
const NODE_DOWN = new Set(['ECONNREFUSED', 'ECONNRESET', 'EPIPE', 'ETIMEDOUT', 'EHOSTUNREACH']);

function nodeDidNotAnswer(err: unknown): boolean {
  if (err instanceof AggregateError) return err.errors.some(nodeDidNotAnswer);
  return NODE_DOWN.has(String((err as { code?: unknown } | null)?.code));
}

/**
 * The client's "Stream was not found on any node", or a member's own answer to the declaration
 * (response code 2, "Stream does not exist").
 */
function saysStreamMissing(err: Error): boolean {
  return err.message.includes('not found on any node') || /returned error with code 2\b/.test(err.message);
}

/**
 * Tells a declaration (of a producer or a consumer) that failed for now from one that cannot
 * work, and returns the error to report. After the locator answered, the client connects to the
 * member it chose from the stream's metadata: while a node is down or restarting that member may
 * not answer (measured: ECONNREFUSED from a replica the metadata still listed), and during an
 * election the client says "Stream was not found on any node" — which it also says for a missing
 * stream. A member may also answer "Stream does not exist" (code 2) for a stream the cluster has:
 * measured on a node coming back from a network partition (pause_minority) while its view of the
 * streams was not yet restored (test/integration/nemesis.test.ts). The stream's metadata, asked of
 * the locator, tells the cases apart (2: does not exist). Transient cases come back as
 * {@link StreamNotAvailableError}.
 */
export async function explainDeclareFailure(client: Client, stream: string, err: unknown): Promise<unknown> {
  if (nodeDidNotAnswer(err)) {
    return new StreamNotAvailableError(`the stream member chosen did not answer (${errorText(err)})`, {
      cause: err,
    });
  }
  if (!(err instanceof Error) || !saysStreamMissing(err)) return err;
  const [info] = await withTimeout(
    client.queryMetadata({ streams: [stream] }),
    5_000,
    'querying metadata',
  ).catch(() => []);
  if (info?.responseCode === 2)
    return new StreamDoesNotExistError('the stream does not exist', { cause: err });
  return new StreamNotAvailableError(
    `the stream has no ${info?.leader === undefined ? 'leader' : 'member'} available right now (a leader election?)`,
    { cause: err },
  );
}

/**
 * Believes "the stream does not exist" only when it is heard again: through another node, or
 * through the same one {@link MissingStreamCheck.SAME_NODE_MS} later. A node back from a partition
 * can answer code 2 — to the declaration and to the metadata query alike — for a stream the
 * cluster has, until its view is restored (test/integration/nemesis.test.ts), and every attempt
 * goes through the next endpoint (with one endpoint, or a shared client, always the same). Until
 * then the answer is given back as a {@link StreamNotAvailableError}, to be tried again; a stream
 * that really is gone fails at the next attempt through another node, or within about that time.
 */
export class MissingStreamCheck {
  /** How long one node must keep saying "does not exist" to be believed alone. */
  static readonly SAME_NODE_MS = 2_000;
  /** The answers of this run of "does not exist": through which node, and when the first came. */
  #via = new Set<string>();
  #since = 0;

  /**
   * What a failed declaration's explained error (from {@link explainDeclareFailure}) counts as;
   * `via` names the node (endpoint) the attempt went through.
   */
  judge(err: unknown, via: string): unknown {
    if (!(err instanceof StreamDoesNotExistError)) {
      this.#via.clear();
      return err;
    }
    if (this.#via.size === 0) this.#since = performance.now();
    this.#via.add(via);
    if (this.#via.size >= 2 || performance.now() - this.#since >= MissingStreamCheck.SAME_NODE_MS) return err;
    return new StreamNotAvailableError(
      'the stream metadata says the stream does not exist; asking again before believing it',
      { cause: err },
    );
  }

  /** A declaration succeeded. */
  succeeded(): void {
    this.#via.clear();
  }
}

/** How long `open()` waits for a stream that is not available (a leader election takes seconds). */
export const OPEN_UNAVAILABLE_WAIT_MS = 30_000;

/**
 * The open-time connection policy shared by the publisher and the consumer: an endpoint that does
 * not answer is skipped for the next, and only a whole round of them in a row fails; a stream
 * that is not available is tried again with backoff for up to {@link OPEN_UNAVAILABLE_WAIT_MS}.
 * Anything else fails now.
 */
export async function openThroughEndpoints<T>(endpoints: number, attempt: () => Promise<T>): Promise<T> {
  const deadline = performance.now() + OPEN_UNAVAILABLE_WAIT_MS;
  let unreachable = 0;
  const backoff = new Backoff({ initialDelayMs: 100, maxDelayMs: 2_000, jitter: false });
  for (;;) {
    try {
      return await attempt();
    } catch (err) {
      const delay = isStreamNotAvailable(err) ? backoff.next() : 0;
      if (delay > 0 && performance.now() + delay < deadline) {
        // A node answered: the round of endpoints that do not answer starts again.
        unreachable = 0;
        await sleep(delay);
        continue;
      }
      if ((err as { code?: unknown }).code !== 'DEDUP_BROKER_UNREACHABLE' || ++unreachable >= endpoints)
        throw err;
    }
  }
}

/** A one-line description of a client error (AggregateErrors from dual-stack connects included). */
export function errorText(err: unknown): string {
  if (err instanceof AggregateError && err.errors.length > 0) return err.errors.map(errorText).join('; ');
  if (err instanceof Error) return err.message || err.name;
  return String(err);
}

/** The stream client's connection parameters with our defaults: localhost:5552, guest/guest, vhost '/'. */
export function withConnectionDefaults<
  T extends { hostname?: string; port?: number; username?: string; password?: string; vhost?: string },
>(c: T): T & { hostname: string; port: number; username: string; password: string; vhost: string } {
  return {
    ...c,
    hostname: c.hostname ?? 'localhost',
    port: c.port ?? 5552,
    username: c.username ?? 'guest',
    password: c.password ?? 'guest',
    vhost: c.vhost ?? '/',
  };
}

/**
 * Where and how to reach the broker's stream port: `rabbitmq-stream-js-client` connection
 * parameters without `listeners` (the library owns its connections and their listeners), plus
 * `endpoints`: the stream ports of a cluster's nodes, tried in turn on every (re)connect, so that
 * losing the node one connected through does not stop reconnection.
 */
export type StreamConnectionOptions = Partial<Omit<ClientParams, 'listeners' | 'ssl'>> & {
  /**
   * A cluster's nodes: every (re)connect tries the next one. Left out: `hostname` and `port`.
   * @defaultValue none: `hostname` and `port` alone
   */
  readonly endpoints?: ReadonlyArray<{
    /** The node's host name or address. */
    readonly hostname: string;
    /** Its stream port (5552, or 5551 with TLS). */
    readonly port: number;
  }>;
  /**
   * TLS (the stream port over TLS is 5551 by default): `true` uses the stream client's default,
   * which does NOT verify the broker's certificate; pass options to verify it against a custom CA,
   * present a client certificate and key (with its passphrase), or name the server to verify.
   * Node's `tls.connect` options, passed through. Secrets given here never appear in errors or logs.
   * @defaultValue `false` (no TLS)
   */
  readonly ssl?: boolean | StreamTlsOptions;
};

/** Node's `tls.connect` options the stream connections take (see {@link StreamConnectionOptions}). */
export type StreamTlsOptions = Pick<
  ConnectionOptions,
  'ca' | 'cert' | 'key' | 'passphrase' | 'servername' | 'rejectUnauthorized' | 'pfx'
>;

/** Rotates through a connection's endpoints: each call gives the parameters for the next attempt. */
export class EndpointRotation {
  readonly #base: ClientParams;
  readonly #endpoints: ReadonlyArray<{ readonly hostname: string; readonly port: number }>;
  #next = 0;

  constructor(options: StreamConnectionOptions) {
    const { endpoints, ...rest } = options;
    if (typeof rest.ssl === 'object') assertTlsOptions(rest.ssl, 'connection.ssl');
    // The client's SSL type names four fields, but it hands the object to tls.connect as it is
    // (connection.js, buildSSLParams): Buffers, passphrase and servername pass through.
    this.#base = withConnectionDefaults(rest) as ClientParams;
    this.#endpoints = endpoints ?? [];
  }

  /** The parameters of the next attempt. */
  next(): ClientParams {
    if (this.#endpoints.length === 0) return this.#base;
    const e = this.#endpoints[this.#next++ % this.#endpoints.length]!;
    return { ...this.#base, hostname: e.hostname, port: e.port };
  }

  /** How many endpoints there are (1 without `endpoints`): an attempt on each is one round. */
  get size(): number {
    return Math.max(1, this.#endpoints.length);
  }

  /** For messages: the endpoints tried. */
  describe(): string {
    const all = this.#endpoints.length === 0 ? [this.#base] : this.#endpoints;
    return all.map((e) => `${e.hostname}:${e.port}`).join(', ');
  }
}

/**
 * Checks TLS options before any connection: a key that does not decrypt (a wrong passphrase), a
 * PEM that does not parse, a certificate that does not match its key. The message is OpenSSL's,
 * which never holds the passphrase.
 *
 * @throws TypeError naming `what`.
 */
export function assertTlsOptions(options: ConnectionOptions, what: string): void {
  try {
    createSecureContext(options);
  } catch (err) {
    const detail = err instanceof Error ? err.message : String(err);
    throw new TypeError(
      `${what}: the TLS options cannot be used: ${detail}` +
        (/bad decrypt/i.test(detail) ? ' (is the passphrase of the key right?)' : ''),
      { cause: err },
    );
  }
}

/** True for a `rabbitmq-stream-js-client` Client (of any copy of the package), not connection parameters. */
export function isStreamClient(connection: unknown): connection is Client {
  return (
    typeof connection === 'object' &&
    connection !== null &&
    typeof (connection as Partial<Client>).declarePublisher === 'function'
  );
}
