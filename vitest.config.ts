import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { defineConfig } from 'vitest/config';

// Every process the integration tests start loads the guard that records unhandled rejections and
// uncaught exceptions in this run's log; test/integration/no-unhandled.ts fails the test that saw one.
const UNHANDLED_LOG = join(tmpdir(), `stream-dedup-unhandled-${process.pid}.log`);
const GUARD = fileURLToPath(new URL('./test/support/unhandled-guard.mjs', import.meta.url));

// Three projects: `unit` (no broker), `property` (fast-check models, no broker) and
// `integration` (a real RabbitMQ and LevelDB on disk; fails loudly when the broker is missing).
export default defineConfig({
  test: {
    projects: [
      {
        extends: true,
        test: {
          name: 'unit',
          include: ['test/**/*.test.ts'],
          exclude: ['test/integration/**'],
          // CPU-bound property tests take 2-8 s on a loaded 2-core machine: 5 s would be flaky.
          testTimeout: 30_000,
        },
      },
      {
        extends: true,
        test: {
          name: 'property',
          include: ['property-tests/**/*.test.ts'],
          setupFiles: ['property-tests/setup.ts'],
          testTimeout: 120_000,
        },
      },
      {
        extends: true,
        test: {
          name: 'integration',
          include: ['test/integration/**/*.test.ts'],
          globalSetup: ['test/integration/global-setup.ts'],
          setupFiles: ['test/integration/no-unhandled.ts'],
          env: {
            STREAM_DEDUP_UNHANDLED_LOG: UNHANDLED_LOG,
            NODE_OPTIONS: `${process.env.NODE_OPTIONS ?? ''} --import=${GUARD}`.trim(),
          },
          testTimeout: 120_000,
          hookTimeout: 60_000,
          // One broker on two cores: files run one after another so fault tests measure the
          // library, not contention between test files.
          fileParallelism: false,
        },
      },
    ],
  },
});
