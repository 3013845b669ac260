/**
 * stream-dedup: producer-side sequence deduplication for RabbitMQ Streams and AMQP 0-9-1 stream
 * queues. The transports live in `stream-dedup/stream` and `stream-dedup/amqp`, test oracles in
 * `stream-dedup/testing`.
 *
 * This file is the entry point: it only re-exports. Its exported names are checked against
 * `api/exports.json` by `npm run api:check`.
 *
 * @packageDocumentation
 */
export { DedupError, isDedupError, type DedupErrorCode } from './errors.js';
export {
  ID_HEADER,
  PRODUCER_HEADER,
  SKIP_HEADER,
  identityHeaders,
  readIdentity,
  type IdentityReading,
  type MessageIdentity,
} from './identity/headers.js';
export { MAX_PRODUCER_NAME_BYTES, assertProducerName } from './identity/producer-name.js';
export { MAX_PUBLISHING_ID, assertPublishingId, parsePublishingId } from './identity/publishing-id.js';
export { DedupStore, type StoreOptions } from './store/store.js';
export { DedupPublisher } from './publisher/facade.js';
export { VerifyingConsumer } from './consumer/facade.js';
export type {
  DedupPublisherOptions,
  Durability,
  OpenReport,
  ReconnectOptions,
  SendOptions,
  SendResult,
} from './publisher/types.js';
// Moved to `stream-dedup/testing` in 0.2.0; kept here until the next major version (README,
// "Entry points and stability").
export {
  /** @deprecated Since 0.2.0: import it from `stream-dedup/testing`. Kept here until the next major version. */
  checkHistory,
  /** @deprecated Since 0.2.0: import it from `stream-dedup/testing`. Kept here until the next major version. */
  formatReport,
  /** @deprecated Since 0.2.0: import it from `stream-dedup/testing`. Kept here until the next major version. */
  type History,
  /** @deprecated Since 0.2.0: import it from `stream-dedup/testing`. Kept here until the next major version. */
  type HistoryReport,
  /** @deprecated Since 0.2.0: import it from `stream-dedup/testing`. Kept here until the next major version. */
  type ObservedMessage,
  /** @deprecated Since 0.2.0: import it from `stream-dedup/testing`. Kept here until the next major version. */
  type OrderViolation,
} from './history/checker.js';
export {
  MAX_DECLARED_RANGES,
  MAX_WINDOW_SIZE,
  ScopedVerifier,
  createTracker,
  decodeTracker,
  type CheckResult,
  type IdRange,
  type Outcome,
  type PolicySpec,
  type RecordResult,
  type ScopeEntry,
  type SequenceTracker,
} from './verifier/index.js';
export { decodeScopeKey, encodeScopeKey, scopeKeyPrefix, type Scope } from './identity/scope-key.js';
export type {
  EffectTransaction,
  MessageHandler,
  VerifiedMessage,
  VerifyEvent,
  VerifyStats,
  VerifyingConsumerOptions,
} from './consumer/types.js';
export type { Logger } from './telemetry/logger.js';
export type { PublisherCounters } from './telemetry/metrics.js';
