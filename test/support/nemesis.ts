import { execFile } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { connect, type Client } from 'rabbitmq-stream-js-client';
import { afterAll, beforeAll } from 'vitest';
import { withTimeout } from '../../src/transport/util.js';
import { BROKER } from './broker.js';

// The three-node cluster of scripts/nemesis.sh: each node in its own network namespace, node N at
// 10.99.N.2 (stream 5552, AMQP 5672), this machine's processes at 10.99.0.1, every packet between
// them through a router namespace where the faults drop it. Separate from the cluster of
// test/support/cluster.ts (127.0.0.1, ports 5561-5563), and removed after the file's tests.
const run = promisify(execFile);
const root = fileURLToPath(new URL('../../', import.meta.url));

/** Node N's address (N = 1..3). */
export const nodeHost = (n: number): string => `10.99.${n}.2`;
/** Every node's stream port, as `connection.endpoints`. */
export const NEMESIS_ENDPOINTS = [1, 2, 3].map((n) => ({ hostname: nodeHost(n), port: 5552 }));
/** Connection parameters with every node as an endpoint. */
export const NEMESIS_CONNECTION = {
  username: BROKER.username,
  password: BROKER.password,
  vhost: BROKER.vhost,
  endpoints: NEMESIS_ENDPOINTS,
};
/** The same, as RABBITMQ_STREAM_ENDPOINTS for the CLI and the fixtures. */
export const NEMESIS_ENDPOINTS_ENV = NEMESIS_ENDPOINTS.map((e) => `${e.hostname}:${e.port}`).join(',');

/** Runs scripts/nemesis.sh with these arguments (`cut 1 2`, `isolate 3`, `heal`, `pause 2`, …). */
export async function nemesis(...args: string[]): Promise<string> {
  // Bounded, so that a command that hangs fails the test naming it instead of holding the fault
  // loop (and the producer runs waiting on it) until the test's own timeout.
  const timeout = args[0] === 'up' ? 280_000 : args[0] === 'down' ? 110_000 : 60_000;
  try {
    const { stdout } = await run('bash', ['scripts/nemesis.sh', ...args], { cwd: root, timeout });
    return stdout;
  } catch (err) {
    throw new Error(`scripts/nemesis.sh ${args.join(' ')} failed: ${(err as Error).message}`, { cause: err });
  }
}

/**
 * Makes the network and starts a fresh cluster before the file's tests (failing loudly when it
 * cannot: not root, no chroot, no namespaces), and removes all of it after them.
 */
export function useNemesisCluster(): void {
  // STREAM_DEDUP_NEMESIS_KEEP=1 (while working on these tests): use the cluster that
  // `scripts/nemesis.sh up` started, and leave it running.
  if (process.env.STREAM_DEDUP_NEMESIS_KEEP === '1') return;
  beforeAll(async () => {
    await nemesis('up');
  }, 300_000);
  afterAll(async () => {
    await nemesis('down');
  }, 120_000);
}

/**
 * Runs `fn` (bounded to 10 s) with a client on one node. A node behind a cut drops the SYN: the
 * connection is given up after 3 s, and a client that connects later is closed.
 */
async function withNodeClient<T>(
  hostname: string,
  port: number,
  fn: (client: Client) => Promise<T>,
): Promise<T> {
  const where = `${hostname}:${port}`;
  const connecting = connect({ ...NEMESIS_CONNECTION, hostname, port });
  let client: Client | undefined;
  try {
    client = await withTimeout(connecting, 3_000, `connecting to ${where}`);
    return await withTimeout(fn(client), 10_000, where);
  } catch (err) {
    if (client === undefined) void connecting.then((late) => late.close()).catch(() => undefined);
    throw err;
  } finally {
    await client?.close().catch(() => undefined);
  }
}

/** Node N (1..3) from an address the metadata gives, 0 for none. */
const nodeOfHost = (host: string | undefined): number =>
  Number(/^10\.99\.(\d)\.2$/.exec(host ?? '')?.[1] ?? 0);

/** Runs `fn` with a client on the first node that answers (nodes are cut off in these tests). */
export async function withNemesisAdmin<T>(fn: (client: Client) => Promise<T>): Promise<T> {
  let lastError: unknown;
  for (const { hostname, port } of NEMESIS_ENDPOINTS) {
    try {
      return await withNodeClient(hostname, port, fn);
    } catch (err) {
      lastError = err;
    }
  }
  throw lastError instanceof Error ? lastError : new Error('no node answered');
}

/** Which node (1..3) leads the stream now, and how many replicas it has. */
export function nemesisLeader(stream: string): Promise<{ node: number; replicas: number }> {
  return withNemesisAdmin(async (client) => {
    const [meta] = await client.queryMetadata({ streams: [stream] });
    return { node: nodeOfHost(meta?.leader?.host), replicas: meta?.replicas?.length ?? 0 };
  });
}

/**
 * The stream's leader node (1..3) as a majority of the nodes report it, asked until two agree (an
 * election follows most faults and there is no event for its end; a node just back from a pause
 * can still name itself). Fails naming the stream after `timeoutMs`.
 */
export async function awaitNemesisLeader(stream: string, timeoutMs = 60_000): Promise<number> {
  const deadline = performance.now() + timeoutMs;
  for (;;) {
    const answers = await Promise.all(
      NEMESIS_ENDPOINTS.map(({ hostname, port }) =>
        withNodeClient(hostname, port, async (client) => {
          const [meta] = await withTimeout(
            client.queryMetadata({ streams: [stream] }),
            3_000,
            `querying ${hostname}:${port}`,
          );
          return nodeOfHost(meta?.leader?.host);
        }).catch((err: unknown) => `error: ${String(err)}`),
      ),
    );
    for (const n of [1, 2, 3]) if (answers.filter((a) => a === n).length >= 2) return n;
    if (performance.now() > deadline) {
      const views = answers.map((a, i) => `node${i + 1}: ${a}`).join('; ');
      throw new Error(`${stream}: no leader that two nodes agree on within ${timeoutMs} ms (${views})`);
    }
    await new Promise((r) => setTimeout(r, 200));
  }
}
