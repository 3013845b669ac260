import type { StreamConnectionOptions } from '../transport/stream.js';

/** The broker the CLI talks to: RABBITMQ_* environment variables, loopback by default. */
export function connectionFromEnv(env: NodeJS.ProcessEnv = process.env): StreamConnectionOptions {
  return {
    hostname: env.RABBITMQ_HOST ?? '127.0.0.1',
    port: Number(env.RABBITMQ_STREAM_PORT ?? 5552),
    username: env.RABBITMQ_USER ?? 'guest',
    password: env.RABBITMQ_PASSWORD ?? 'guest',
    vhost: env.RABBITMQ_VHOST ?? '/',
  };
}
