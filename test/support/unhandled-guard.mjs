// Loaded into every process the integration tests start (NODE_OPTIONS=--import, set by
// vitest.config.ts): an unhandled rejection or an uncaught exception is written to the run's log,
// which test/integration/no-unhandled.ts checks after every test, and the process then dies as
// Node would have killed it (exit 1, the error on stderr).
import { appendFileSync } from 'node:fs';

const log = process.env.STREAM_DEDUP_UNHANDLED_LOG;

function record(kind, err) {
  const what = err instanceof Error ? (err.stack ?? err.message) : String(err);
  if (log !== undefined) {
    try {
      appendFileSync(log, `pid ${process.pid} (${process.argv.slice(1).join(' ')}): ${kind}: ${what}\n`);
    } catch {
      // The log is the test run's; a child outliving it has nothing to report to.
    }
  }
  process.stderr.write(`${kind}: ${what}\n`);
  process.exit(1);
}

// Vitest's own workers inherit NODE_OPTIONS too: there test/integration/no-unhandled.ts watches.
if (!/[\\/]vitest[\\/]/.test(process.argv[1] ?? '')) {
  process.on('unhandledRejection', (err) => record('unhandledRejection', err));
  process.on('uncaughtException', (err) => record('uncaughtException', err));
}
