import { fileURLToPath } from 'node:url';

/** Starts the CLI from source, as the crash tests' producer processes. */
export const CLI_FROM_SOURCE: readonly string[] = [
  process.execPath,
  '--import',
  'tsx',
  fileURLToPath(new URL('../../src/cli/main.ts', import.meta.url)),
];
