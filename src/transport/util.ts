import type { ClientParams } from 'rabbitmq-stream-js-client';

/** Rejects with `${what} timed out after ${ms} ms` unless `promise` settles first. */
export function withTimeout<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what} timed out after ${ms} ms`)), ms);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
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
 * Calls `attempt` until it succeeds or `stopped()` says to give up, with exponential backoff and
 * jitter between tries.
 */
export async function retryWithBackoff(
  attempt: () => Promise<void>,
  stopped: () => boolean,
  backoff: { readonly initialDelayMs?: number; readonly maxDelayMs?: number } = {},
): Promise<void> {
  let delay = backoff.initialDelayMs ?? 100;
  while (!stopped()) {
    await new Promise((resolve) => setTimeout(resolve, delay * (0.5 + Math.random() / 2)));
    if (stopped()) return;
    try {
      await attempt();
      return;
    } catch {
      delay = Math.min(delay * 2, backoff.maxDelayMs ?? 5_000);
    }
  }
}

/**
 * Where and how to reach the broker's stream port: `rabbitmq-stream-js-client` connection
 * parameters without `listeners` (the library owns its connections and their listeners), plus
 * `endpoints`: the stream ports of a cluster's nodes, tried in turn on every (re)connect, so that
 * losing the node one connected through does not stop reconnection.
 */
export type StreamConnectionOptions = Partial<Omit<ClientParams, 'listeners'>> & {
  readonly endpoints?: ReadonlyArray<{ readonly hostname: string; readonly port: number }>;
};

/** Rotates through a connection's endpoints: each call gives the parameters for the next attempt. */
export class EndpointRotation {
  readonly #base: ClientParams;
  readonly #endpoints: ReadonlyArray<{ readonly hostname: string; readonly port: number }>;
  #next = 0;

  constructor(options: StreamConnectionOptions) {
    const { endpoints, ...rest } = options;
    this.#base = withConnectionDefaults(rest);
    this.#endpoints = endpoints ?? [];
  }

  /** The parameters of the next attempt. */
  next(): ClientParams {
    if (this.#endpoints.length === 0) return this.#base;
    const e = this.#endpoints[this.#next++ % this.#endpoints.length]!;
    return { ...this.#base, hostname: e.hostname, port: e.port };
  }

  /** For messages: the endpoints tried. */
  describe(): string {
    const all = this.#endpoints.length === 0 ? [this.#base] : this.#endpoints;
    return all.map((e) => `${e.hostname}:${e.port}`).join(', ');
  }
}
