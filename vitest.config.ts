import { defineConfig } from 'vitest/config';

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
