/**
 * stream-dedup: producer-side sequence deduplication for RabbitMQ Streams and AMQP 0-9-1 stream
 * queues. The transports live in `stream-dedup/stream` and `stream-dedup/amqp`.
 *
 * @packageDocumentation
 */
export { DedupError, isDedupError, type DedupErrorCode } from './errors.js';
export {
  ID_HEADER,
  PRODUCER_HEADER,
  identityHeaders,
  readIdentity,
  type IdentityReading,
  type MessageIdentity,
} from './identity/headers.js';
export { MAX_PRODUCER_NAME_BYTES, assertProducerName } from './identity/producer-name.js';
export { MAX_PUBLISHING_ID, assertPublishingId, parsePublishingId } from './identity/publishing-id.js';
export { DedupStore, type StoreOptions } from './store/store.js';
export type {
  DedupPublisherOptions,
  Durability,
  OpenReport,
  ReconnectOptions,
  SendOptions,
  SendResult,
} from './publisher/types.js';
export {
  checkHistory,
  formatReport,
  type History,
  type HistoryReport,
  type ObservedMessage,
  type OrderViolation,
} from './history/checker.js';
