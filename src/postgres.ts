/**
 * `stream-dedup/postgres`: the verifying consumers' store in PostgreSQL (docs/design.md §13). The
 * only part of the package that imports `pg` (an optional peer dependency).
 */
export { postgresHandler, type PostgresMessageHandler } from './postgres/handler.js';
export type { PostgresClient, PostgresTransaction } from './postgres/handler-client.js';
export { migrate, SCHEMA_VERSION, type MigrateOptions, type MigrateResult } from './postgres/schema.js';
export { PostgresStore, type PostgresStoreOptions } from './postgres/store.js';
