import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { fileURLToPath } from 'node:url';
import { BROKER } from './broker.js';

/** Starts the CLI from source, as the crash tests' producer processes. */
export const CLI_FROM_SOURCE: readonly string[] = [
  process.execPath,
  '--import',
  'tsx',
  fileURLToPath(new URL('../../src/cli/main.ts', import.meta.url)),
];

/** What a CLI run printed and how it ended. */
export interface CliRun {
  readonly code: number | null;
  readonly stdout: string;
  readonly stderr: string;
}

/** Runs the CLI from source with `env` over this process's environment; resolves once it exited. */
export async function runCli(
  args: readonly string[],
  env: Readonly<Record<string, string>> = {},
): Promise<CliRun> {
  const [cmd, ...pre] = CLI_FROM_SOURCE;
  const child = spawn(cmd!, [...pre, ...args], {
    env: { ...process.env, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stdout = '';
  let stderr = '';
  child.stdout.setEncoding('utf8').on('data', (s: string) => (stdout += s));
  child.stderr.setEncoding('utf8').on('data', (s: string) => (stderr += s));
  const [code] = (await once(child, 'close')) as [number | null];
  return { code, stdout, stderr };
}

/** Runs the CLI from source with the test broker in its environment (plus `env`); resolves once it exited. */
export function runCliOnBroker(
  args: readonly string[],
  env: Readonly<Record<string, string>> = {},
): Promise<CliRun> {
  return runCli(args, {
    RABBITMQ_HOST: BROKER.host,
    RABBITMQ_STREAM_PORT: String(BROKER.streamPort),
    RABBITMQ_USER: BROKER.username,
    RABBITMQ_PASSWORD: BROKER.password,
    RABBITMQ_VHOST: BROKER.vhost,
    ...env,
  });
}
