/**
 * `stream-dedup/postgres`: the verifying consumers' store in PostgreSQL (docs/design.md §13). The
 * only part of the package that imports `pg` (an optional peer dependency).
 */
export { postgresHandler, type PostgresMessageHandler } from './handler.js';
export type { PostgresClient, PostgresTransaction } from './handler-client.js';
export { migrate, SCHEMA_VERSION, type MigrateOptions, type MigrateResult } from './schema.js';
export { PostgresStore, type PostgresStoreOptions } from './store.js';
export {
  PgOutbox,
  OUTBOX_MAX_MESSAGE_BYTES,
  type EnqueueOptions,
  type EnqueueResult,
  type OutboxClient,
  type PgOutboxOptions,
} from './outbox/outbox.js';
export { PgOutboxRelay, OutboxPoisonRowError, type OutboxRelayStats } from './outbox/relay.js';
export type { OutboxRelayEvent, PgOutboxRelayOptions } from './outbox/relay-options.js';
