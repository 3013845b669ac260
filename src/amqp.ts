/**
 * AMQP 0-9-1 (`amqplib`): the dedup publisher and the verifying consumer for stream queues
 * reached over AMQP 0-9-1. Import from `stream-dedup/amqp`.
 *
 * The broker does **not** deduplicate AMQP 0-9-1 publishes, even into a stream queue: a re-sent
 * outbox message can be stored twice. The publisher still gives every message a durable,
 * strictly increasing ID and stamps it, and the verifying consumer removes the copies.
 *
 * This file is the entry point: it only re-exports. Its exported names are checked against
 * `api/exports.json` by `npm run api:check`.
 *
 * @packageDocumentation
 */
export { AmqpDedupPublisher } from './transport/amqp-publisher.js';
export type {
  AmqpAutoPublisherOptions,
  AmqpDedupPublisherOptions,
  AmqpOutboxPublisherOptions,
  AmqpPublisherCommonOptions,
} from './transport/amqp-options.js';
export { AmqpVerifyingConsumer, type AmqpVerifyingConsumerOptions } from './transport/amqp-consumer.js';
export type { AmqpSocketOptions } from './transport/amqp-connect.js';
