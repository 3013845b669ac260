/**
 * A PostgreSQL server of a test's own, for the tests that kill the server: started by
 * scripts/postgres.sh (`up`, `kill`, `down`) with its own folder and port, so the shared server on
 * 5433 is never touched. `remove()` stops it and deletes its folder.
 */
import { execFile } from 'node:child_process';
import { rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';

const run = promisify(execFile);
const root = fileURLToPath(new URL('../../', import.meta.url));

/** A private server: its URL and its life. */
export interface PrivatePostgres {
  readonly url: string;
  readonly port: number;
  /** SIGKILLs the postmaster (its backends exit); resolves once the port is free. */
  kill(): Promise<void>;
  /** Starts it again (crash recovery runs at start). */
  start(): Promise<void>;
  /** Stops it and deletes its folder. */
  remove(): Promise<void>;
}

/** Starts a private server on a free-looking port in 5440–5499 (initdb: a few seconds). */
export async function startPrivatePostgres(): Promise<PrivatePostgres> {
  const port = 5440 + Math.floor(Math.random() * 60);
  const dir = join(tmpdir(), `sd-pg-${process.pid}-${port}`);
  const env = { ...process.env, STREAM_DEDUP_PG_PORT: String(port), STREAM_DEDUP_PG_DIR: dir };
  const script = (command: string): Promise<unknown> =>
    run('bash', ['scripts/postgres.sh', command], { cwd: root, env, timeout: 120_000 });
  await script('up');
  return {
    url: `postgres://stream_dedup:stream-dedup@127.0.0.1:${port}/stream_dedup`,
    port,
    kill: async () => void (await script('kill')),
    start: async () => void (await script('up')),
    remove: async () => {
      await script('down').catch(() => undefined);
      await rm(dir, { recursive: true, force: true });
    },
  };
}
