import { execFile } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { connect as amqpConnect } from 'amqplib';
import { connect, type Client } from 'rabbitmq-stream-js-client';
import { afterAll, beforeAll } from 'vitest';
import { BROKER } from './broker.js';

// The three-node cluster that scripts/rabbitmq.sh starts (`cluster`), on its own ports, all on
// 127.0.0.1: node i (1..3) has stream port 5560+i and AMQP 0-9-1 port 5680+i. The single broker on
// 5552/5672 is another node, not part of it.
const run = promisify(execFile);
const root = fileURLToPath(new URL('../../', import.meta.url));

/** The cluster's stream ports, node 1 to 3. */
export const CLUSTER_PORTS = [5561, 5562, 5563] as const;
/** The cluster's AMQP 0-9-1 ports, node 1 to 3. */
export const CLUSTER_AMQP_PORTS = [5681, 5682, 5683] as const;
/** Every node's stream port, as `connection.endpoints`. */
export const CLUSTER_ENDPOINTS = CLUSTER_PORTS.map((port) => ({ hostname: BROKER.host, port }));
/** Connection parameters with every node as an endpoint. */
export const CLUSTER_CONNECTION = {
  username: BROKER.username,
  password: BROKER.password,
  vhost: BROKER.vhost,
  endpoints: CLUSTER_ENDPOINTS,
};

/** Runs scripts/rabbitmq.sh with these arguments (`cluster`, `node-kill N`, `node-start N`, …). */
export const clusterScript = (...args: string[]): Promise<{ stdout: string; stderr: string }> =>
  run('bash', ['scripts/rabbitmq.sh', ...args], { cwd: root });

/**
 * Starts (or finds) the cluster before the file's tests — failing loudly when it cannot (not root,
 * no chroot) — and, after them, starts every node again that a test left down. The cluster is
 * left running, for the next file or run.
 */
export function useCluster(): void {
  beforeAll(async () => {
    await clusterScript('cluster');
  }, 180_000);
  afterAll(async () => {
    await clusterScript('node-start', '1');
    await clusterScript('node-start', '2');
    await clusterScript('node-start', '3');
  }, 180_000);
}

/** Runs `fn` with a client on the first node that answers (nodes go down in these tests). */
export async function withAdmin<T>(fn: (client: Client) => Promise<T>): Promise<T> {
  let lastError: unknown;
  for (const port of CLUSTER_PORTS) {
    let client: Client | undefined;
    try {
      client = await connect({ ...CLUSTER_CONNECTION, hostname: BROKER.host, port });
      return await fn(client);
    } catch (err) {
      lastError = err;
    } finally {
      await client?.close().catch(() => undefined);
    }
  }
  throw lastError instanceof Error ? lastError : new Error('no node answered');
}

/** Which node (1..3) leads the stream now, and how many replicas it has. */
export function leaderNode(stream: string): Promise<{ node: number; replicas: number }> {
  return withAdmin(async (client) => {
    const [meta] = await client.queryMetadata({ streams: [stream] });
    return { node: (meta?.leader?.port ?? 0) - 5560, replicas: meta?.replicas?.length ?? 0 };
  });
}

/**
 * Declares a super stream as `rabbitmq-streams add_super_stream` does (a direct exchange marked
 * `x-super-stream`, one stream per partition bound with its routing key "i" and
 * `x-stream-partition-order` i), but declares partition i over an AMQP 0-9-1 connection to node i+1
 * with `x-queue-leader-locator: client-local`: its leader is then that node, deterministically.
 * The broker's own creation does not spread them reliably: created through the stream protocol
 * on node 1, `client-local` put all three leaders on node 1, and both the default and `balanced`
 * (which counts the leaders of every stream already on the cluster) put two of the three there.
 */
export async function declareSpreadSuperStream(name: string, count: number): Promise<string[]> {
  const partitions = Array.from({ length: count }, (_, i) => `${name}-${i}`);
  const url = (port: number): string => `amqp://${BROKER.username}:${BROKER.password}@${BROKER.host}:${port}`;
  const connections = await Promise.all(CLUSTER_AMQP_PORTS.map((port) => amqpConnect(url(port))));
  try {
    await Promise.all(
      partitions.map(async (partition, i) => {
        const channel = await connections[i]!.createChannel();
        await channel.assertQueue(partition, {
          durable: true,
          arguments: {
            'x-queue-type': 'stream',
            'x-initial-cluster-size': 3,
            'x-queue-leader-locator': 'client-local',
          },
        });
        await channel.close();
      }),
    );
    const channel = await connections[0]!.createChannel();
    await channel.assertExchange(name, 'direct', { durable: true, arguments: { 'x-super-stream': true } });
    for (const [i, partition] of partitions.entries()) {
      await channel.bindQueue(partition, name, String(i), { 'x-stream-partition-order': i });
    }
    await channel.close();
  } finally {
    await Promise.all(connections.map((c) => c.close().catch(() => undefined)));
  }
  return partitions;
}
