import { readFileSync } from 'node:fs';
import type { AmqpSocketOptions } from '../transport/amqp-connect.js';
import type { StreamConnectionOptions } from '../transport/util.js';

/**
 * TLS settings from the environment, or `undefined` without TLS: RABBITMQ_TLS=1, or any of the
 * file variables, turns it on. Files are read here; a missing one is a TypeError naming it.
 */
export function tlsFromEnv(env: NodeJS.ProcessEnv = process.env):
  | {
      readonly ca?: string;
      readonly cert?: string;
      readonly key?: string;
      readonly passphrase?: string;
      readonly servername?: string;
    }
  | undefined {
  const files = {
    ca: env.RABBITMQ_TLS_CA_FILE,
    cert: env.RABBITMQ_TLS_CERT_FILE,
    key: env.RABBITMQ_TLS_KEY_FILE,
  };
  const on =
    env.RABBITMQ_TLS === '1' ||
    env.RABBITMQ_TLS === 'true' ||
    Object.values(files).some((f) => f !== undefined);
  if (!on) return undefined;
  const read = (variable: string, path: string | undefined): string | undefined => {
    if (path === undefined || path.length === 0) return undefined;
    try {
      return readFileSync(path, 'utf8');
    } catch (err) {
      throw new TypeError(
        `${variable}: cannot read ${path} (${(err as NodeJS.ErrnoException).code ?? 'error'})`,
        { cause: err },
      );
    }
  };
  const ca = read('RABBITMQ_TLS_CA_FILE', files.ca);
  const cert = read('RABBITMQ_TLS_CERT_FILE', files.cert);
  const key = read('RABBITMQ_TLS_KEY_FILE', files.key);
  return {
    ...(ca === undefined ? {} : { ca }),
    ...(cert === undefined ? {} : { cert }),
    ...(key === undefined ? {} : { key }),
    ...(env.RABBITMQ_TLS_KEY_PASSPHRASE === undefined ? {} : { passphrase: env.RABBITMQ_TLS_KEY_PASSPHRASE }),
    ...(env.RABBITMQ_TLS_SERVERNAME === undefined ? {} : { servername: env.RABBITMQ_TLS_SERVERNAME }),
  };
}

/** The broker the CLI talks to: RABBITMQ_* environment variables, loopback by default. */
export function connectionFromEnv(env: NodeJS.ProcessEnv = process.env): StreamConnectionOptions {
  // RABBITMQ_STREAM_ENDPOINTS: a cluster's stream ports, "host:port,host:port", tried in turn.
  const endpoints = env.RABBITMQ_STREAM_ENDPOINTS?.split(',')
    .filter((e) => e.length > 0)
    .map((e) => {
      const [hostname, port] = e.split(':');
      return { hostname: hostname ?? '127.0.0.1', port: Number(port) };
    });
  const tls = tlsFromEnv(env);
  return {
    hostname: env.RABBITMQ_HOST ?? '127.0.0.1',
    port: Number(env.RABBITMQ_STREAM_PORT ?? (tls === undefined ? 5552 : 5551)),
    username: env.RABBITMQ_USER ?? 'guest',
    password: env.RABBITMQ_PASSWORD ?? 'guest',
    vhost: env.RABBITMQ_VHOST ?? '/',
    // Verified against the given CA (or the system's): never the stream client's unverified default.
    ...(tls === undefined ? {} : { ssl: { rejectUnauthorized: true, ...tls } }),
    ...(endpoints === undefined || endpoints.length === 0 ? {} : { endpoints }),
  };
}

/** The AMQP 0-9-1 URL of the broker the CLI talks to (`amqps://` with TLS). */
export function amqpUrlFromEnv(env: NodeJS.ProcessEnv = process.env): string {
  const user = encodeURIComponent(env.RABBITMQ_USER ?? 'guest');
  const password = encodeURIComponent(env.RABBITMQ_PASSWORD ?? 'guest');
  const vhost = encodeURIComponent(env.RABBITMQ_VHOST ?? '/');
  const tls = tlsFromEnv(env) !== undefined;
  const port = env.RABBITMQ_AMQP_PORT ?? (tls ? 5671 : 5672);
  return `${tls ? 'amqps' : 'amqp'}://${user}:${password}@${env.RABBITMQ_HOST ?? '127.0.0.1'}:${port}/${vhost}`;
}

/** amqplib's socket options from the environment: the TLS settings, if any. */
export function amqpSocketOptionsFromEnv(
  env: NodeJS.ProcessEnv = process.env,
): AmqpSocketOptions | undefined {
  return tlsFromEnv(env);
}
