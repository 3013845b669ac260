import { execFile } from 'node:child_process';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { connect, type Client } from 'rabbitmq-stream-js-client';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runCrashScenario } from '../../src/cli/crash.js';
import { formatReport } from '../../src/history/checker.js';
import { StreamDedupPublisher, StreamVerifyingConsumer } from '../../src/transport/stream.js';
import { BROKER, uniqueName } from '../support/broker.js';
import { CLI_FROM_SOURCE } from '../support/cli.js';
import { useTempDir } from '../support/tmp.js';

// DESIGN §3 measured it once by hand; here it is a test: a 3-replica stream on the three-node
// cluster that scripts/rabbitmq.sh starts (stream ports 5561-5563, all on 127.0.0.1) keeps its
// promise through leader kill -9s, a rolling restart of every node and producer SIGKILLs.
const run = promisify(execFile);
const root = fileURLToPath(new URL('../../', import.meta.url));
const PORTS = [5561, 5562, 5563];
const endpoints = PORTS.map((port) => ({ hostname: BROKER.host, port }));
const connection = { username: BROKER.username, password: BROKER.password, vhost: BROKER.vhost, endpoints };
// The test command runs a bounded version; `npm run soak:cluster` runs a long one.
const SOAK = process.env.STREAM_DEDUP_SOAK === '1';
const LEADER_KILLS = SOAK ? 10 : 2;
const PRODUCER_KILLS = SOAK ? 30 : 5;
const script = (...args: string[]): Promise<unknown> =>
  run('bash', ['scripts/rabbitmq.sh', ...args], { cwd: root });

beforeAll(async () => {
  // Starts (or finds) the cluster; fails loudly when it cannot (not root, no chroot).
  await script('cluster');
}, 180_000);
afterAll(async () => {
  await script('node-start', '1');
  await script('node-start', '2');
  await script('node-start', '3');
}, 180_000);
const tempDir = useTempDir();

/** Runs `fn` with a client on the first node that answers (nodes go down in this test). */
async function withAdmin<T>(fn: (client: Client) => Promise<T>): Promise<T> {
  let lastError: unknown;
  for (const port of PORTS) {
    let client: Client | undefined;
    try {
      client = await connect({ ...connection, hostname: BROKER.host, port });
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
function leaderNode(stream: string): Promise<{ node: number; replicas: number }> {
  return withAdmin(async (client) => {
    const [meta] = await client.queryMetadata({ streams: [stream] });
    return { node: (meta?.leader?.port ?? 0) - 5560, replicas: meta?.replicas?.length ?? 0 };
  });
}

describe('cluster - a 3-replica stream under faults', () => {
  it(`leader kill -9 ${LEADER_KILLS} times, every node restarted, ${PRODUCER_KILLS} producer SIGKILLs: 0 lost, 0 duplicated, every effect once`, async () => {
    const stream = uniqueName('cluster');
    await withAdmin((client) => client.createStream({ stream, arguments: { 'initial-cluster-size': 3 } }));
    // Replicas come up a moment after the declaration; there is no event for it.
    for (let i = 0; i < 100 && (await leaderNode(stream)).replicas < 2; i++) {
      await new Promise((r) => setTimeout(r, 100));
    }
    expect((await leaderNode(stream)).replicas).toBe(2);

    // A probe publisher sends one message every 20 ms: the gap in its confirms after a fault is
    // the time to resume.
    const probe = await StreamDedupPublisher.open({
      connection,
      stream,
      producerName: 'cluster-probe',
      store: join(await tempDir(), 'probe'),
      reconnect: { initialDelayMs: 100, maxDelayMs: 500 },
    });
    let lastConfirm = performance.now();
    let probing = true;
    const probeLoop = (async () => {
      for (let i = 0; probing; i++) {
        void probe.send(Buffer.from(`probe-${i}`)).then(() => (lastConfirm = performance.now()));
        await new Promise((r) => setTimeout(r, 20));
      }
    })();
    // From the moment the fault is complete (the node is dead, or back) to the next confirm.
    const resumeAfter = async (fault: string, act: () => Promise<unknown>): Promise<string> => {
      await act();
      const at = performance.now();
      while (lastConfirm < at) await new Promise((r) => setTimeout(r, 10));
      return `${fault}: resumed after ${Math.round(lastConfirm - at)} ms`;
    };

    const chaos = async (): Promise<string[]> => {
      const log: string[] = [];
      for (let round = 0; round < LEADER_KILLS; round++) {
        await new Promise((r) => setTimeout(r, 1_500));
        const { node } = await leaderNode(stream).catch(() => ({ node: 2 }));
        log.push(await resumeAfter(`kill -9 leader node${node}`, () => script('node-kill', String(node))));
        log.push(await resumeAfter(`restart node${node}`, () => script('node-start', String(node))));
      }
      for (const node of [1, 2, 3]) {
        log.push(
          await resumeAfter(`restart node${node}`, async () => {
            await script('node-stop', String(node));
            await script('node-start', String(node));
          }),
        );
      }
      return log;
    };

    const endpointsEnv = PORTS.map((p) => `${BROKER.host}:${p}`).join(',');
    const saved = process.env.RABBITMQ_STREAM_ENDPOINTS;
    process.env.RABBITMQ_STREAM_ENDPOINTS = endpointsEnv;
    let result: Awaited<ReturnType<typeof runCrashScenario>>;
    let faults: string[];
    try {
      const faulting = chaos();
      [result, faults] = await Promise.all([
        runCrashScenario({
          cli: CLI_FROM_SOURCE,
          stream,
          producerName: 'cluster-producer',
          kills: PRODUCER_KILLS,
          perRun: 40_000,
          minKillMs: 300,
          maxKillMs: 2_000,
          // The stream is read back once every node is up again.
          beforeRead: () => faulting,
        }),
        faulting,
      ]);
    } finally {
      if (saved === undefined) delete process.env.RABBITMQ_STREAM_ENDPOINTS;
      else process.env.RABBITMQ_STREAM_ENDPOINTS = saved;
      probing = false;
      await probeLoop;
      await probe.close();
    }

    // Every effect once: a verifying consumer through the cluster's endpoints.
    let doubles = 0;
    const consumer = await StreamVerifyingConsumer.open({
      connection,
      stream,
      consumerName: 'cluster-effects',
      store: join(await tempDir(), 'consumer'),
      handler: async (message, tx) => {
        const key = `applied:${message.body.toString()}`;
        if ((await tx.get(key)) !== undefined) doubles++;
        tx.put(key, '1');
      },
    });
    await consumer.waitForOffset(BigInt(result.streamMessages - 1));
    const missing: string[] = [];
    for (const label of result.acknowledgedLabels) {
      if ((await consumer.readEffect(`applied:${label}`)) === undefined) missing.push(label);
    }
    await consumer.close();

    console.log(`[cluster] ${faults.join('; ')}`);
    console.log(
      `[cluster] producer kills=${result.kills} acknowledged=${result.acknowledged} stream=${result.streamMessages} ` +
        `${formatReport(result.report)}; consumer stats=${JSON.stringify(consumer.stats)} doubles=${doubles} missing=${missing.length}`,
    );
    expect(result.kills).toBe(PRODUCER_KILLS);
    expect(result.report.lost).toEqual([]);
    expect(result.report.duplicated).toEqual([]);
    // The probe's messages share the stream; nothing else may be there.
    expect(result.report.unexpected.filter((label) => !label.startsWith('probe-'))).toEqual([]);
    expect(result.report.orderViolations).toEqual([]);
    expect(missing).toEqual([]);
    expect(doubles).toBe(0);
  }, 3_600_000);
});
