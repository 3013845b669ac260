import net from 'node:net';

/** Where the integration tests find RabbitMQ: 127.0.0.1 and the ports scripts/rabbitmq.sh uses. */
export const BROKER = {
  host: process.env.RABBITMQ_HOST ?? '127.0.0.1',
  streamPort: Number(process.env.RABBITMQ_STREAM_PORT ?? 5552),
  amqpPort: Number(process.env.RABBITMQ_AMQP_PORT ?? 5672),
  username: process.env.RABBITMQ_USER ?? 'guest',
  password: process.env.RABBITMQ_PASSWORD ?? 'guest',
  vhost: process.env.RABBITMQ_VHOST ?? '/',
} as const;

/** The AMQP 0-9-1 URL of the test broker. */
export const AMQP_URL: string = `amqp://${BROKER.username}:${BROKER.password}@${BROKER.host}:${BROKER.amqpPort}`;

/** Connection parameters for rabbitmq-stream-js-client. */
export const STREAM_CONNECTION = {
  hostname: BROKER.host,
  port: BROKER.streamPort,
  username: BROKER.username,
  password: BROKER.password,
  vhost: BROKER.vhost,
} as const;

/** Resolves true when something accepts TCP connections on host:port within `timeoutMs`. */
export function canConnect(host: string, port: number, timeoutMs = 2_000): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = net.connect({ host, port });
    const done = (ok: boolean): void => {
      socket.destroy();
      resolve(ok);
    };
    socket.setTimeout(timeoutMs, () => done(false));
    socket.once('connect', () => done(true));
    socket.once('error', () => done(false));
  });
}

/** A stream name no other test uses. */
export function uniqueName(prefix: string): string {
  return `${prefix}-${process.pid}-${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 8)}`;
}
