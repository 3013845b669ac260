/**
 * Test oracles for applications that test their own use of stream-dedup: `checkHistory` compares
 * what producers attempted, what they were told was sent and what a reader found in the stream, as
 * Jepsen's queue checkers do; `formatReport` prints its report in one line. Import from
 * `stream-dedup/testing`.
 *
 * This file is the entry point: it only re-exports. Its exported names are checked against
 * `api/exports.json` by `npm run api:check`.
 *
 * @remarks Since 0.2.0 (before: from `stream-dedup`, where they stay, deprecated, until 1.0).
 * @packageDocumentation
 */
export {
  checkHistory,
  formatReport,
  type History,
  type HistoryReport,
  type ObservedMessage,
  type OrderViolation,
} from './history/checker.js';
