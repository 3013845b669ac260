import { execFile } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { connect, type Client, type Publisher } from 'rabbitmq-stream-js-client';
import { StreamDedupPublisher, type StreamNumberedPublisherOptions } from 'stream-dedup/stream';

/** The broker the benchmarks use: loopback and the ports scripts/rabbitmq.sh starts. */
export const CONNECTION = {
  hostname: process.env.RABBITMQ_HOST ?? '127.0.0.1',
  port: Number(process.env.RABBITMQ_STREAM_PORT ?? 5552),
  username: process.env.RABBITMQ_USER ?? 'guest',
  password: process.env.RABBITMQ_PASSWORD ?? 'guest',
  vhost: process.env.RABBITMQ_VHOST ?? '/',
};

export function connectClient(): Promise<Client> {
  return connect({ ...CONNECTION, addressResolver: { enabled: false } });
}

/** Resolves once `publisher` has heard `count` publishing IDs confirmed (a publish error throws). */
export function allConfirmed(publisher: Publisher, count: number): Promise<void> {
  let confirmed = 0;
  return new Promise<void>((resolve) =>
    publisher.on('publish_confirm', (err, ids) => {
      if (err !== null) throw new Error(`publish error ${err}`);
      confirmed += ids.length;
      if (confirmed >= count) resolve();
    }),
  );
}

/**
 * Publishes `count` stamped messages of 100 B to `stream` through a `reserve` StreamDedupPublisher
 * (`options`: its producer name, store and anything else), all sends at once, and closes it.
 */
export async function publishStamped(
  count: number,
  options: Omit<StreamNumberedPublisherOptions, 'connection' | 'durability'>,
): Promise<void> {
  const pub = await StreamDedupPublisher.open({ connection: CONNECTION, durability: 'reserve', ...options });
  const body = Buffer.alloc(100, 0x61);
  await Promise.all(Array.from({ length: count }, () => pub.send(body)));
  await pub.close();
}

export function uniqueName(prefix: string): string {
  return `${prefix}-${process.pid}-${Date.now().toString(36)}`;
}

export interface Row {
  readonly name: string;
  readonly msgsPerSec: number;
  readonly ratio: number;
  readonly target?: number;
}

/** Prints a table, then the rows as one JSON line (the last line of the output). */
export function report(bench: string, rows: readonly Row[], extra: Record<string, unknown> = {}): void {
  const width = Math.max(...rows.map((r) => r.name.length));
  console.log(`${'case'.padEnd(width)}  ${'msg/s'.padStart(10)}  ${'ratio'.padStart(6)}  target`);
  for (const r of rows) {
    const verdict = r.target === undefined ? '' : `${r.ratio >= r.target ? '≥' : '<'} ${r.target}`;
    console.log(
      `${r.name.padEnd(width)}  ${Math.round(r.msgsPerSec).toString().padStart(10)}  ${r.ratio.toFixed(2).padStart(6)}  ${verdict}`,
    );
  }
  console.log(
    JSON.stringify({
      bench,
      ...extra,
      rows: rows.map((r) => ({
        ...r,
        msgsPerSec: Math.round(r.msgsPerSec),
        ratio: Number(r.ratio.toFixed(3)),
      })),
    }),
  );
}

/** The middle value (the upper one of the two middles for an even count). */
export function median(xs: readonly number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)]!;
}

const execFileAsync = promisify(execFile);

/**
 * Runs `script` again in a fresh Node process (same Node flags plus `nodeFlags`, `args`, this
 * environment plus `env`) and returns the JSON of the last line it prints: each measurement gets a
 * process of its own, as JMH forks per benchmark, so that call sites do not see every case's classes.
 * `signal` kills the child (a bench interrupted while it runs).
 */
export async function measureInChild<T>(
  script: string,
  args: readonly string[],
  env: Readonly<Record<string, string>>,
  { nodeFlags = [], signal }: { readonly nodeFlags?: readonly string[]; readonly signal?: AbortSignal } = {},
): Promise<T> {
  const { stdout } = await execFileAsync(
    process.execPath,
    [...process.execArgv, ...nodeFlags, fileURLToPath(script), ...args],
    {
      env: { ...process.env, ...env },
      maxBuffer: 1 << 20,
      ...(signal === undefined ? {} : { signal }),
    },
  );
  return JSON.parse(stdout.trim().split('\n').at(-1)!) as T;
}
