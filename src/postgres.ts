/**
 * `stream-dedup/postgres`: the verifying consumers' store in PostgreSQL (docs/design.md §13). The
 * only part of the package that imports `pg` (an optional peer dependency).
 */
export { postgresHandler, type PostgresMessageHandler } from './postgres/handler.js';
export type { PostgresClient, PostgresTransaction } from './postgres/handler-client.js';
export { migrate, SCHEMA_VERSION, type MigrateOptions, type MigrateResult } from './postgres/schema.js';
export {
  PostgresStore,
  type PostgresStoreCommonOptions,
  type PostgresStoreOptions,
  type PostgresStorePoolOptions,
  type PostgresStoreUrlOptions,
} from './postgres/store.js';
export {
  PgOutbox,
  OUTBOX_MAX_MESSAGE_BYTES,
  OUTBOX_ENQUEUE_MANY_BYTES,
  type EnqueueItem,
  type EnqueueOptions,
  type EnqueueResult,
  type OutboxClient,
  type PgOutboxOptions,
} from './postgres/outbox/outbox.js';
export { PgOutboxRelay, OutboxPoisonRowError, type OutboxRelayStats } from './postgres/outbox/relay.js';
export type {
  OutboxRelayEvent,
  PgOutboxRelayCommonOptions,
  PgOutboxRelayOptions,
  PgOutboxRelayStreamOptions,
  PgOutboxRelaySuperStreamOptions,
} from './postgres/outbox/relay-options.js';
