import { readFileSync, writeFileSync } from 'node:fs';
import { afterEach } from 'vitest';

// Fails the test during which any process failed with an unhandled rejection or an uncaught
// exception: the test process itself, and every process it started (test/support/unhandled-guard.mjs
// records theirs). A library that crashes its host is broken even when the test's own assertions pass.
const log = process.env.STREAM_DEDUP_UNHANDLED_LOG;
const here: string[] = [];
process.on('unhandledRejection', (err) =>
  here.push(`unhandledRejection: ${String((err as Error)?.stack ?? err)}`),
);
process.on('uncaughtException', (err) => here.push(`uncaughtException: ${String(err?.stack ?? err)}`));

afterEach(() => {
  let children = '';
  if (log !== undefined) {
    try {
      children = readFileSync(log, 'utf8');
    } catch {
      children = '';
    }
    if (children.length > 0) writeFileSync(log, '');
  }
  const mine = here.splice(0);
  if (children.length > 0 || mine.length > 0) {
    throw new Error(
      `unhandled errors during this test:\n${[...mine, children].filter((s) => s.length > 0).join('\n')}`,
    );
  }
});
