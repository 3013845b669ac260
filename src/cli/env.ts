import type { StreamConnectionOptions } from '../transport/stream.js';

/** The broker the CLI talks to: RABBITMQ_* environment variables, loopback by default. */
export function connectionFromEnv(env: NodeJS.ProcessEnv = process.env): StreamConnectionOptions {
  // RABBITMQ_STREAM_ENDPOINTS: a cluster's stream ports, "host:port,host:port", tried in turn.
  const endpoints = env.RABBITMQ_STREAM_ENDPOINTS?.split(',')
    .filter((e) => e.length > 0)
    .map((e) => {
      const [hostname, port] = e.split(':');
      return { hostname: hostname ?? '127.0.0.1', port: Number(port) };
    });
  return {
    hostname: env.RABBITMQ_HOST ?? '127.0.0.1',
    port: Number(env.RABBITMQ_STREAM_PORT ?? 5552),
    username: env.RABBITMQ_USER ?? 'guest',
    password: env.RABBITMQ_PASSWORD ?? 'guest',
    vhost: env.RABBITMQ_VHOST ?? '/',
    ...(endpoints === undefined || endpoints.length === 0 ? {} : { endpoints }),
  };
}

/** The AMQP 0-9-1 URL of the broker the CLI talks to. */
export function amqpUrlFromEnv(env: NodeJS.ProcessEnv = process.env): string {
  const user = encodeURIComponent(env.RABBITMQ_USER ?? 'guest');
  const password = encodeURIComponent(env.RABBITMQ_PASSWORD ?? 'guest');
  const vhost = encodeURIComponent(env.RABBITMQ_VHOST ?? '/');
  return `amqp://${user}:${password}@${env.RABBITMQ_HOST ?? '127.0.0.1'}:${env.RABBITMQ_AMQP_PORT ?? 5672}/${vhost}`;
}
