import { BROKER, canConnect } from '../support/broker.js';

// The integration tests need a real RabbitMQ. When it is missing they fail here, loudly, with
// the command that starts one: nothing is skipped.
export default async function setup(): Promise<void> {
  const missing: string[] = [];
  for (const [what, port] of [
    ['stream', BROKER.streamPort],
    ['AMQP 0-9-1', BROKER.amqpPort],
  ] as const) {
    if (!(await canConnect(BROKER.host, port))) missing.push(`${what} on ${BROKER.host}:${port}`);
  }
  if (missing.length > 0) {
    throw new Error(
      `The integration tests need RabbitMQ (>= 4.0, stream plugin) but nothing answers: ${missing.join(', ')}.\n` +
        `Start one with \`sudo bash scripts/rabbitmq.sh up\`, or point RABBITMQ_HOST / RABBITMQ_STREAM_PORT / ` +
        `RABBITMQ_AMQP_PORT at yours.${process.env.CI === 'true' ? ' (CI=true: this is a failure, not a skip.)' : ''}`,
    );
  }
}
