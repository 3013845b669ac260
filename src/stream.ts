/**
 * RabbitMQ stream protocol (`rabbitmq-stream-js-client`): the dedup publisher and the verifying
 * consumer for streams. Import from `stream-dedup/stream`.
 *
 * This file is the entry point: it only re-exports. Its exported names are checked against
 * `api/exports.json` by `npm run api:check`.
 *
 * @packageDocumentation
 */
export { StreamDedupPublisher } from './transport/stream-publisher.js';
export type {
  StreamDedupPublisherOptions,
  StreamKeyedPublisherOptions,
  StreamNumberedPublisherOptions,
  StreamPublisherCommonOptions,
  SubEntryCompression,
  SubEntryOptions,
} from './transport/stream-options.js';
export { StreamVerifyingConsumer, type StreamVerifyingConsumerOptions } from './transport/stream-consumer.js';
export type { CaughtUpOptions, ConsumerLag } from './transport/stream-lag.js';
export { readStreamToEnd, type StreamRecord } from './transport/stream-ops.js';
export type { StreamConnectionOptions, StreamTlsOptions } from './transport/util.js';
export { SuperStreamDedupPublisher } from './superstream/publisher.js';
export type {
  RoutingKeyFunction,
  SuperStreamDedupPublisherOptions,
  SuperStreamKeyedPublisherOptions,
  SuperStreamPublisherCommonOptions,
  SuperStreamRoutedPublisherOptions,
  SuperStreamRouting,
  SuperStreamSendResult,
} from './superstream/options.js';
export { SuperStreamVerifyingConsumer } from './group/consumer.js';
export type {
  AssignmentEvent,
  CommitInfo,
  GroupMessageHandler,
  GroupStats,
  SuperStreamVerifyingConsumerOptions,
  SuperStreamVerifyingConsumerCommonOptions,
  SuperStreamChangelogConsumerOptions,
  SuperStreamSharedDatabaseConsumerOptions,
} from './group/types.js';
