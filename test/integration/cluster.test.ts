import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { createInterface } from 'node:readline';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { runCrashScenario } from '../../src/cli/crash.js';
import { formatReport } from '../../src/testing.js';
import { StreamDedupPublisher } from '../../src/stream.js';
import { BROKER, uniqueName } from '../support/broker.js';
import { CLI_FROM_SOURCE } from '../support/cli.js';
import { readAppliedEffects } from '../support/effects.js';
import {
  CLUSTER_CONNECTION as connection,
  CLUSTER_PORTS as PORTS,
  clusterScript as script,
  leaderNode,
  useCluster,
  withAdmin,
} from '../support/cluster.js';
import { useTempDir } from '../support/tmp.js';

// docs/design.md §3 measured it once by hand; here it is a test: a 3-replica stream on the three-node
// cluster that scripts/rabbitmq.sh starts (stream ports 5561-5563, all on 127.0.0.1) keeps its
// promise through leader kill -9s, a rolling restart of every node and producer SIGKILLs.
// The cluster's setup (ports, start, admin client, leader lookup) is shared: test/support/cluster.ts.
// The test command runs a bounded version; `npm run soak:cluster` runs a long one.
const SOAK = process.env.STREAM_DEDUP_SOAK === '1';
const LEADER_KILLS = SOAK ? 10 : 2;
const PRODUCER_KILLS = SOAK ? 30 : 5;
const CONSUMER_KILLS = SOAK ? 20 : 4;
const ENDPOINTS_ENV = PORTS.map((p) => `${BROKER.host}:${p}`).join(',');
const consumerFixture = fileURLToPath(new URL('../fixtures/effects-consumer.ts', import.meta.url));

// Starts (or finds) the cluster; fails loudly when it cannot (not root, no chroot).
useCluster();
const tempDir = useTempDir();

/**
 * Runs the effects consumer (test/fixtures/effects-consumer.ts) as a child process: until
 * `target` is committed, or SIGKILLed `killAfterMs` after it subscribed. Its log lines (what it
 * subscribed to, what it lost) are appended to `log`.
 */
async function runConsumer(
  store: string,
  stream: string,
  log: string[],
  opts: { target?: bigint; killAfterMs?: number },
): Promise<{ outcome: 'killed' | 'done'; readyAt: number; endedAt: number }> {
  const args = ['--import', 'tsx', consumerFixture, stream, store];
  if (opts.target !== undefined) args.push(String(opts.target));
  const child = spawn(process.execPath, args, {
    env: { ...process.env, RABBITMQ_STREAM_ENDPOINTS: ENDPOINTS_ENV },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const exited = once(child, 'exit') as Promise<[number | null, NodeJS.Signals | null]>;
  const stderr = (async () => {
    for await (const line of createInterface({ input: child.stderr })) log.push(line);
  })();
  let readyAt = Number.NaN;
  for await (const line of createInterface({ input: child.stdout })) {
    if (!line.startsWith('ready')) continue;
    readyAt = performance.now();
    log.push(`[consumer process] ${line}`);
    if (opts.killAfterMs !== undefined) setTimeout(() => child.kill('SIGKILL'), opts.killAfterMs);
  }
  const [code, signal] = await exited;
  const endedAt = performance.now();
  await stderr;
  if (signal === 'SIGKILL') return { outcome: 'killed', readyAt, endedAt };
  if (code !== 0)
    throw new Error(`the consumer process exited with ${code}:\n  ${log.slice(-20).join('\n  ')}`);
  return { outcome: 'done', readyAt, endedAt };
}

describe('cluster - a 3-replica stream under faults', () => {
  it(`leader kill -9 ${LEADER_KILLS} times, every node restarted, ${PRODUCER_KILLS} producer and ≥${CONSUMER_KILLS} consumer SIGKILLs: 0 lost, 0 duplicated, every effect once`, async () => {
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
        // A random moment: 1-3 s into the round.
        await new Promise((r) => setTimeout(r, 1_000 + Math.random() * 2_000));
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

    const consumerStore = join(await tempDir(), 'consumer');
    const consumerLog: string[] = [];
    const saved = process.env.RABBITMQ_STREAM_ENDPOINTS;
    process.env.RABBITMQ_STREAM_ENDPOINTS = ENDPOINTS_ENV;
    let result: Awaited<ReturnType<typeof runCrashScenario>>;
    let faults: string[];
    let consumerFaults: string[];
    let killedAt: number | undefined;
    try {
      const faulting = chaos();
      let faultsDone = false;
      void faulting.finally(() => (faultsDone = true)).catch(() => undefined);
      // The verifying consumer runs in a child process through all of it, SIGKILLed at random
      // moments and restarted; each restart must resume from its committed offset.
      const consumerChaos = async (): Promise<string[]> => {
        const log: string[] = [];
        for (let kills = 0; !faultsDone || kills < CONSUMER_KILLS; kills++) {
          const run = await runConsumer(consumerStore, stream, consumerLog, {
            killAfterMs: 300 + Math.random() * 3_000,
          });
          if (killedAt !== undefined) {
            log.push(`SIGKILL consumer: subscribed again after ${Math.round(run.readyAt - killedAt)} ms`);
          }
          killedAt = run.endedAt;
        }
        return log;
      };
      [result, faults, consumerFaults] = await Promise.all([
        runCrashScenario({
          cli: CLI_FROM_SOURCE,
          stream,
          producerName: 'cluster-producer',
          kills: PRODUCER_KILLS,
          perRun: 40_000,
          kill: { afterMs: [300, 2_000] },
          // The stream is read back once every node is up again.
          beforeRead: () => faulting,
        }),
        faulting,
        consumerChaos(),
      ]);
    } finally {
      if (saved === undefined) delete process.env.RABBITMQ_STREAM_ENDPOINTS;
      else process.env.RABBITMQ_STREAM_ENDPOINTS = saved;
      probing = false;
      await probeLoop;
      await probe.close();
    }

    // A last run to the end of the stream, then every effect once: each acknowledged label applied
    // exactly one time, and no label applied twice.
    const last = await runConsumer(consumerStore, stream, consumerLog, {
      target: BigInt(result.streamMessages - 1),
    });
    expect(last.outcome).toBe('done');
    consumerFaults.push(
      `SIGKILL consumer: subscribed again after ${Math.round(last.readyAt - killedAt!)} ms`,
    );
    const { missing, twice, doubles } = await readAppliedEffects(
      connection,
      stream,
      consumerStore,
      result.acknowledgedLabels,
    );

    console.log(`[cluster] ${faults.join('; ')}`);
    console.log(`[cluster] ${consumerFaults.join('; ')}`);
    console.log(
      `[cluster] producer kills=${result.kills} acknowledged=${result.acknowledged} stream=${result.streamMessages} ` +
        `${formatReport(result.report)}; consumer kills=${consumerFaults.length} doubles=${doubles} missing=${missing.length} applied-twice=${twice.length}`,
    );
    const subscriptions = consumerLog.filter((line) => line.includes('subscribed')).length;
    console.log(`[cluster] the consumer subscribed ${subscriptions} times`);
    if (missing.length > 0 || process.env.STREAM_DEDUP_VERBOSE === '1') {
      console.log(
        `[cluster] consumer log:\n  ${consumerLog.join('\n  ')}\nmissing: ${missing.slice(0, 20).join(', ')}`,
      );
    }
    expect(result.kills).toBe(PRODUCER_KILLS);
    expect(result.report.lost).toEqual([]);
    expect(result.report.duplicated).toEqual([]);
    // The probe's messages share the stream; nothing else may be there.
    expect(result.report.unexpected.filter((label) => !label.startsWith('probe-'))).toEqual([]);
    expect(result.report.orderViolations).toEqual([]);
    expect(consumerFaults.length).toBeGreaterThanOrEqual(CONSUMER_KILLS);
    expect(missing).toEqual([]);
    expect(twice).toEqual([]);
    expect(doubles).toBe(0);
  }, 3_600_000);
});
