import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { runCrashScenario } from '../../src/cli/crash.js';
import { checkHistory, formatReport } from '../../src/testing.js';
import { readStreamToEnd, StreamDedupPublisher } from '../../src/stream.js';
import { DedupError } from '../../src/errors.js';
import { uniqueName } from '../support/broker.js';
import { CLI_FROM_SOURCE } from '../support/cli.js';
import { readAppliedEffects } from '../support/effects.js';
import {
  awaitNemesisLeader,
  NEMESIS_CONNECTION as connection,
  NEMESIS_ENDPOINTS_ENV,
  nemesis,
  nemesisLeader,
  useNemesisCluster,
  withNemesisAdmin,
} from '../support/nemesis.js';
import { useTempDir } from '../support/tmp.js';

// Network faults, Jepsen style (docs/design.md §11), on the cluster of scripts/nemesis.sh: three
// nodes in their own network namespaces, every packet between them and between a client and a node
// crossing a router namespace where nftables drops what the fault says. Through a series of
// partitions, pauses and a slow link, a producer (SIGKILLed now and then) publishes with
// deduplication and a verifying consumer applies every message in a child process; then the same
// history checker as the crash tests, every effect counted, and `audit` of the stream.
// The test command runs one round of each fault; `npm run soak:nemesis` runs several.
const SOAK = process.env.STREAM_DEDUP_SOAK === '1';
const ROUNDS = SOAK ? Number(process.env.NEMESIS_ROUNDS ?? 5) : 1;
/** Erlang's net_ticktime on these nodes (scripts/nemesis.sh): a partition is noticed in about this. */
const TICK_MS = 5_000;
const CONFIRM_TIMEOUT_MS = 5_000;
/**
 * How long one connection attempt may take: the library's default (10 s) in the soak; 3 s in the
 * bounded run, where most of the time to resume is a connection attempt to a node that went
 * silent waiting out this timeout (measured: about 10 s of each 15 s stall with the default).
 */
const CONNECT_TIMEOUT_MS = SOAK ? undefined : 3_000;
const consumerFixture = fileURLToPath(new URL('../fixtures/effects-consumer.ts', import.meta.url));

useNemesisCluster();
const tempDir = useTempDir();

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

/**
 * What the faults in force did, from `scripts/nemesis.sh heal`'s counters: packets dropped and
 * duplicated, bytes through rate limits.
 */
const effects = { dropped: 0, duplicated: 0, limited: 0 };

/** Ends every fault in force, adding what they did to {@link effects}. */
async function heal(): Promise<void> {
  const out = await nemesis('heal');
  const counted = /dropped=(\d+) duplicated=(\d+) limited=(\d+)/.exec(out);
  if (counted === null) throw new Error(`scripts/nemesis.sh heal printed no counters: ${out}`);
  effects.dropped += Number(counted[1]);
  effects.duplicated += Number(counted[2]);
  effects.limited += Number(counted[3]);
}

/** One fault: what it does, for how long, how it ends (besides `heal`), and what shows it took effect. */
interface Fault {
  readonly name: string;
  /** Starts the fault; `leader` is the stream's leader node when it starts. */
  start(leader: number): Promise<unknown>;
  readonly holdMs: number;
  /** Ends it (every fault ends with `heal` too). */
  stop?(leader: number): Promise<unknown>;
  /**
   * Checked after it: its rules dropped packets (`drops`), duplicated some (`duplicates`), passed
   * bytes through a rate limit (`limits`), and the probe went without a confirm for at least half
   * the hold (`stall`: the leader could not commit, or the clients could not reach it).
   */
  readonly shows: {
    readonly drops?: true;
    readonly duplicates?: true;
    readonly limits?: true;
    readonly stall?: true;
  };
}

const others = (n: number): [number, number] => [1, 2, 3].filter((m) => m !== n) as [number, number];

const FAULTS: readonly Fault[] = [
  {
    // The leader, and the publisher connected to it, in the minority: pause_minority stops it.
    name: 'partition: leader isolated from both followers (minority of one, clients still reach it)',
    start: (l) => nemesis('isolate', String(l)),
    holdMs: 1.5 * TICK_MS,
    shows: { drops: true, stall: true },
  },
  {
    // The publisher's node gone from the network altogether: peers and clients alike.
    name: 'partition: leader isolated from everyone (followers and clients)',
    start: async (l) => {
      await nemesis('isolate', String(l));
      await nemesis('cut', 'client', String(l));
    },
    holdMs: 1.5 * TICK_MS,
    shows: { drops: true, stall: true },
  },
  {
    name: 'partition: clients cut from the leader (the cluster whole)',
    start: (l) => nemesis('cut', 'client', String(l)),
    holdMs: TICK_MS,
    // Not `stall`: the probe stalls only if its publisher's connection is on the leader. After the
    // leader moved in an earlier fault it can be on another node, which forwards its messages to
    // the leader over the cluster's own links, left whole here: seen once in CI (leader node 3, the
    // probe 278 of 278 confirmed through the fault, 18 packets of other clients dropped).
    shows: { drops: true },
  },
  {
    // Each node sees a majority (itself and the bridge): nobody pauses; the leader replicates
    // through the bridge only.
    name: 'partition: bridge (leader and one follower cut, the other follower sees both)',
    start: (l) => nemesis('cut', String(l), String(others(l)[0])),
    holdMs: 1.5 * TICK_MS,
    shows: { drops: true },
  },
  {
    name: 'partition: one way (the leader hears the followers, they do not hear it)',
    start: async (l) => {
      for (const f of others(l)) await nemesis('cut', String(l), String(f), 'oneway');
    },
    holdMs: 1.5 * TICK_MS,
    shows: { drops: true, stall: true },
  },
  {
    name: 'partition: flapping (leader isolated and healed every 1-2 s)',
    start: async (l) => {
      const until = performance.now() + 1.5 * TICK_MS;
      while (performance.now() < until) {
        await nemesis('isolate', String(l));
        await sleep(1_000 + Math.random() * 1_000);
        await heal();
        await sleep(1_000 + Math.random() * 1_000);
      }
    },
    holdMs: 0,
    shows: { drops: true },
  },
  {
    // A long GC pause: the VM stops (nemesis.sh checks it did), its peers declare it down, a new
    // leader is elected; then it runs on believing it still leads.
    name: 'pause: SIGSTOP of the leader past the net tick, then SIGCONT',
    start: (l) => nemesis('pause', String(l)),
    holdMs: 1.5 * TICK_MS,
    stop: (l) => nemesis('resume', String(l)),
    shows: { stall: true },
  },
  {
    name: 'slow link: clients to the leader at 1 mbit/s, 10 % of packets lost and 5 % duplicated both ways',
    start: (l) => nemesis('slow', String(l), '1mbit', '10', '5'),
    holdMs: TICK_MS,
    shows: { drops: true, duplicates: true, limits: true },
  },
];

/**
 * `scripts/nemesis.sh partitions` in one line: per node, the partitions it has recorded (RabbitMQ
 * keeps them until the node restarts) and how many nodes it runs with.
 */
function clusterView(out: string): string {
  return out
    .trim()
    .split('\n')
    .map((line) => {
      const node = line.split(' ')[0];
      const view = line.slice(line.indexOf(' ') + 1);
      const names = (key: string): string[] =>
        (new RegExp(`${key}=\\[([^\\]]*)\\]`).exec(view)?.[1] ?? '')
          .split(',')
          .filter(Boolean)
          .map((n) => n.replace('rabbit@', ''));
      if (!view.includes('running=')) return `${node} did not answer`;
      // RabbitMQ 4.3 no longer keeps a list of partitions a node saw (rabbit_node_monitor:partitions/0).
      if (view.includes('partitions=not_reported')) return `${node} runs with ${names('running').length}`;
      const partitions = names('partitions');
      return `${node} runs with ${names('running').length}, partitioned from ${partitions.length > 0 ? partitions.join('+') : 'none'}`;
    })
    .join('; ');
}

/**
 * Runs the effects consumer (test/fixtures/effects-consumer.ts) as a child process until it is
 * SIGKILLed, or with `target` until that offset is committed. Log lines go to `log`.
 */
function startConsumer(
  store: string,
  stream: string,
  log: string[],
  target?: bigint,
): { kill(): void; done: Promise<'killed' | 'done'> } {
  const args = ['--import', 'tsx', consumerFixture, stream, store];
  if (target !== undefined) args.push(String(target));
  const child = spawn(process.execPath, args, {
    env: {
      ...process.env,
      RABBITMQ_STREAM_ENDPOINTS: NEMESIS_ENDPOINTS_ENV,
      ...(CONNECT_TIMEOUT_MS === undefined ? {} : { EFFECTS_CONNECT_TIMEOUT_MS: String(CONNECT_TIMEOUT_MS) }),
    },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const exited = once(child, 'exit') as Promise<[number | null, NodeJS.Signals | null]>;
  const lines = Promise.all(
    [child.stdout, child.stderr].map(async (input) => {
      for await (const line of createInterface({ input })) log.push(line);
    }),
  );
  return {
    kill: () => child.kill('SIGKILL'),
    done: (async () => {
      const [code, signal] = await exited;
      await lines;
      if (signal === 'SIGKILL') return 'killed';
      if (code !== 0) throw new Error(`the consumer exited with ${code}:\n  ${log.slice(-20).join('\n  ')}`);
      return 'done';
    })(),
  };
}

describe('nemesis - partitions, pauses and a slow link on a three-node cluster', () => {
  it(`${ROUNDS} round(s) of ${FAULTS.length} faults: 0 acknowledged lost or duplicated, every effect once, audit clean`, async () => {
    const stream = uniqueName('nemesis');
    await withNemesisAdmin((client) =>
      client.createStream({ stream, arguments: { 'initial-cluster-size': 3 } }),
    );
    // Replicas come up a moment after the declaration; there is no event for it.
    for (let i = 0; i < 100 && (await nemesisLeader(stream)).replicas < 2; i++) await sleep(100);
    expect((await nemesisLeader(stream)).replicas).toBe(2);

    const t0 = performance.now();
    const probeLog: { at: number; line: string }[] = [];
    const probeSaw = (level: string, obj: object, msg?: string): void => {
      const { err, ...rest } = obj as { err?: Error };
      probeLog.push({
        at: performance.now(),
        line: `${((performance.now() - t0) / 1000).toFixed(1)} s ${level} ${msg ?? ''} ${JSON.stringify(rest)}${err === undefined ? '' : ` (${err.message})`}`,
      });
    };
    // A probe publisher sends one message every 20 ms, labelled with the fault in force (`probe-<k>-<i>`,
    // k = -1 between faults): the gap in its confirms after a fault ends is the time to resume, and
    // its history, checked per fault at the end, gives each fault's own counts.
    const probe = await StreamDedupPublisher.open({
      connection,
      stream,
      producerName: 'nemesis-probe',
      store: join(await tempDir(), 'probe'),
      confirmTimeoutMs: CONFIRM_TIMEOUT_MS,
      ...(CONNECT_TIMEOUT_MS === undefined ? {} : { connectTimeoutMs: CONNECT_TIMEOUT_MS }),
      reconnect: { initialDelayMs: 100, maxDelayMs: 1_000, giveUpAfterMs: 600_000 },
      // What the publisher sees (lost connections, reconnects, timeouts), with the time of each.
      logger: {
        debug: () => undefined,
        info: (obj, msg) => probeSaw('info', obj, msg),
        warn: (obj, msg) => probeSaw('warn', obj, msg),
        error: (obj, msg) => probeSaw('error', obj, msg),
      },
    });
    let faultInForce = -1;
    const confirmTimes: number[] = [];
    const probeAttempted: string[] = [];
    const probeAcknowledged: string[] = [];
    const probeTimedOut: string[] = [];
    /** Resolved by the probe's next confirm (the event the fault loop waits on). */
    let onConfirm: (() => void)[] = [];
    const nextConfirm = (): Promise<void> => new Promise((resolve) => onConfirm.push(resolve));
    let probing = true;
    const probeSends: Promise<unknown>[] = [];
    const probeLoop = (async () => {
      for (let i = 0; probing; i++) {
        const label = `probe-${faultInForce}-${i}`;
        probeAttempted.push(label);
        probeSends.push(
          probe.send(Buffer.from(label)).then(
            () => {
              confirmTimes.push(performance.now());
              probeAcknowledged.push(label);
              const waiting = onConfirm;
              onConfirm = [];
              for (const resolve of waiting) resolve();
            },
            (err: unknown) => {
              if (err instanceof DedupError && err.code === 'DEDUP_CONFIRM_TIMEOUT')
                probeTimedOut.push(label);
            },
          ),
        );
        await sleep(20);
      }
    })();
    const lastConfirm = (): number => confirmTimes.at(-1) ?? t0;

    interface FaultRun {
      readonly fault: Fault;
      readonly leader: number;
      readonly atS: number;
      readonly heldMs: number;
      readonly resumedMs: number;
      /** The longest time without a probe confirm, from the fault's start to the first confirm after its heal. */
      readonly stalledMs: number;
      /** Packets its rules dropped and duplicated. */
      readonly dropped: number;
      readonly duplicated: number;
      readonly limited: number;
      /** What the probe publisher logged meanwhile: connections lost and made again. */
      readonly lost: number;
      readonly reconnected: number;
      /** What each node reports once the probe resumed: the nodes it runs with, the partitions it recorded. */
      readonly cluster: string;
    }
    const faultRuns: FaultRun[] = [];
    let stopping = false;
    const chaos = async (): Promise<void> => {
      for (let round = 0; round < ROUNDS; round++) {
        for (const fault of FAULTS) {
          await sleep(500 + Math.random() * 500);
          if (stopping) return;
          const leader = await awaitNemesisLeader(stream);
          const began = performance.now();
          faultInForce = faultRuns.length;
          effects.dropped = 0;
          effects.duplicated = 0;
          effects.limited = 0;
          await fault.start(leader);
          await sleep(fault.holdMs);
          await fault.stop?.(leader);
          await heal();
          const healed = performance.now();
          // Resumed: a probe message confirmed after the heal. Bounded, so a cluster that does not
          // come back fails the test with the fault named instead of hanging it.
          const deadline = setTimeout(() => {
            stopping = true;
            for (const resolve of onConfirm) resolve();
          }, 120_000);
          while (lastConfirm() < healed && !stopping) await nextConfirm();
          clearTimeout(deadline);
          if (lastConfirm() < healed) throw new Error(`${fault.name}: no confirm within 120 s of the heal`);
          faultInForce = -1;
          const resumed = lastConfirm();
          const confirms = [began, ...confirmTimes.filter((t) => t > began && t <= resumed)];
          const stalledMs = Math.max(...confirms.slice(1).map((t, i) => t - confirms[i]!));
          const logged = probeLog.filter(({ at }) => at >= began && at <= resumed).map(({ line }) => line);
          faultRuns.push({
            fault,
            leader,
            atS: Math.round((began - t0) / 1000),
            heldMs: Math.round(healed - began),
            resumedMs: Math.round(resumed - healed),
            stalledMs: Math.round(stalledMs),
            dropped: effects.dropped,
            duplicated: effects.duplicated,
            limited: effects.limited,
            lost: logged.filter((line) => line.includes('connection lost')).length,
            reconnected: logged.filter((line) => line.includes('reconnected')).length,
            cluster: clusterView(await nemesis('partitions')),
          });
          console.log(`[nemesis] ${fault.name}: resumed ${faultRuns.at(-1)!.resumedMs} ms after the heal`);
        }
      }
    };

    const consumerStore = join(await tempDir(), 'consumer');
    const consumerLog: string[] = [];
    const saved = process.env.RABBITMQ_STREAM_ENDPOINTS;
    process.env.RABBITMQ_STREAM_ENDPOINTS = NEMESIS_ENDPOINTS_ENV;
    let result: Awaited<ReturnType<typeof runCrashScenario>>;
    const producerLines: string[] = [];
    let consumerKills = 0;
    const faulting = chaos();
    faulting.catch(() => undefined); // awaited below; a failure must not be unhandled meanwhile
    // The verifying consumer runs through all of it, SIGKILLed at random moments.
    const consumerChaos = (async () => {
      let over = false;
      void faulting.finally(() => (over = true)).catch(() => undefined);
      while (!over && !stopping) {
        const c = startConsumer(consumerStore, stream, consumerLog);
        const timer = setTimeout(() => c.kill(), 5_000 + Math.random() * 20_000);
        void faulting.finally(() => c.kill()).catch(() => undefined);
        const stop = setInterval(() => stopping && c.kill(), 200);
        try {
          if ((await c.done) === 'killed') consumerKills++;
        } finally {
          clearTimeout(timer);
          clearInterval(stop);
        }
      }
    })();
    consumerChaos.catch(() => undefined); // likewise
    try {
      result = await runCrashScenario({
        cli: CLI_FROM_SOURCE,
        stream,
        producerName: 'nemesis-producer',
        kills: 2 * ROUNDS,
        // About 2 000 messages a second (4 in flight): every fault meets sends in flight.
        perRun: 10_000,
        concurrency: 4,
        // One kill at a point of progress (lands mid-run), one at a time (may land in a fault).
        kill: [{ afterAcked: [0.2, 0.8] }, { afterMs: [1_000, 4_000] }],
        confirmTimeoutMs: CONFIRM_TIMEOUT_MS,
        ...(CONNECT_TIMEOUT_MS === undefined ? {} : { connectTimeoutMs: CONNECT_TIMEOUT_MS }),
        runUntil: faulting,
        beforeRead: () => Promise.all([faulting, consumerChaos]),
        onProgress: (line) => producerLines.push(line),
      });
    } finally {
      // Whatever happened: no new fault, no new consumer, every node running, every rule gone.
      stopping = true;
      for (const resolve of onConfirm.splice(0)) resolve();
      await Promise.allSettled([faulting, consumerChaos]);
      await heal().catch(() => undefined);
      for (const n of [1, 2, 3]) await nemesis('resume', String(n)).catch(() => undefined);
      if (saved === undefined) delete process.env.RABBITMQ_STREAM_ENDPOINTS;
      else process.env.RABBITMQ_STREAM_ENDPOINTS = saved;
      probing = false;
      await probeLoop;
      // close() waits closeTimeoutMs at most for the last confirms; what it leaves stays in the
      // probe's outbox, and its sends reject.
      await probe.close();
      await Promise.allSettled(probeSends);
    }

    const chaosEnded = performance.now();
    // A last run to the end of the stream, then every effect once.
    const last = startConsumer(consumerStore, stream, consumerLog, BigInt(result.streamMessages - 1));
    expect(await last.done).toBe('done');
    const { missing, twice, doubles } = await readAppliedEffects(
      connection,
      stream,
      consumerStore,
      result.acknowledgedLabels,
    );
    const gaps = consumerLog.filter((line) => line.startsWith('confirmed gap'));

    // Each fault's own counts, from the probe's history: what was sent while it was in force (from
    // its start until the first confirm after its heal), acknowledged, lost or stored twice.
    const probeObserved = (await readStreamToEnd(connection, stream))
      .map((r) => r.body.toString('utf8'))
      .filter((label) => label.startsWith('probe-'));
    const probeReport = checkHistory({
      attempted: probeAttempted,
      acknowledged: probeAcknowledged,
      observed: probeObserved.map((label) => ({ label })),
    });
    const copies = new Map<string, number>();
    for (const label of probeObserved) copies.set(label, (copies.get(label) ?? 0) + 1);
    const timedOutStored = probeTimedOut.filter((label) => copies.get(label) === 1).length;
    const ofFault = (k: number) => (label: string) => label.startsWith(`probe-${k}-`);
    for (const [k, f] of faultRuns.entries()) {
      const sent = probeAttempted.filter(ofFault(k)).length;
      const acked = probeAcknowledged.filter(ofFault(k)).length;
      const timedOut = probeTimedOut.filter(ofFault(k)).length;
      const lost = probeReport.lost.filter(ofFault(k)).length;
      const duplicated = probeReport.duplicated.filter(ofFault(k)).length;
      console.log(
        `[nemesis] ${f.atS} s: ${f.fault.name} [leader node${f.leader}, ${f.heldMs} ms; ${f.dropped} packets dropped, ${f.duplicated} duplicated, ${f.limited} B rate-limited]: ` +
          `first confirm ${f.resumedMs} ms after the heal, longest stall ${f.stalledMs} ms; ` +
          `probe: ${sent} sent, ${acked} acknowledged, ${timedOut} timed out, ${lost} lost, ${duplicated} duplicated; ` +
          `connection lost ${f.lost}x, reconnected ${f.reconnected}x; cluster then: ${f.cluster}`,
      );
    }
    console.log(`[nemesis] producer: ${producerLines.join('; ')}`);
    console.log(
      `[nemesis] producer kills=${result.kills} attempted=${result.attempted} acknowledged=${result.acknowledged} ` +
        `stream=${result.streamMessages} resent=${result.resent} ${formatReport(result.report)}; ` +
        `consumer kills=${consumerKills} doubles=${doubles} missing=${missing.length} applied-twice=${twice.length} ` +
        `confirmed gaps=${gaps.length}; audit ${result.audit.ok ? 'OK' : 'FAILED'} (gaps ${result.audit.gaps}, duplicates ${result.audit.duplicates}, out of order ${result.audit.outOfOrder}); ` +
        `probe ${probeAttempted.length} sent, ${probeAcknowledged.length} acknowledged, ${probeReport.lost.length} lost, ${probeReport.duplicated.length} duplicated, ` +
        `${probeTimedOut.length} timed out (${timedOutStored} of them in the stream once); ` +
        `faults ${Math.round((chaosEnded - t0) / 1000)} s, checks ${Math.round((performance.now() - chaosEnded) / 1000)} s`,
    );
    if (process.env.STREAM_DEDUP_VERBOSE === '1')
      console.log(`[nemesis] probe log:\n  ${probeLog.map(({ line }) => line).join('\n  ')}`);
    if (missing.length > 0 || gaps.length > 0 || process.env.STREAM_DEDUP_VERBOSE === '1') {
      console.log(
        `[nemesis] consumer log:\n  ${consumerLog.join('\n  ')}\nmissing: ${missing.slice(0, 20).join(', ')}`,
      );
    }
    // Every fault took effect: its rules matched packets, and the faults that silence the leader
    // held the probe's confirms back for at least half their hold.
    expect(faultRuns).toHaveLength(ROUNDS * FAULTS.length);
    for (const f of faultRuns) {
      if (f.fault.shows.drops === true) expect(f.dropped, f.fault.name).toBeGreaterThan(0);
      if (f.fault.shows.duplicates === true) expect(f.duplicated, f.fault.name).toBeGreaterThan(0);
      if (f.fault.shows.limits === true) expect(f.limited, f.fault.name).toBeGreaterThan(0);
      if (f.fault.shows.stall === true)
        expect(f.stalledMs, f.fault.name).toBeGreaterThanOrEqual(f.fault.holdMs / 2);
    }
    expect(result.report.lost).toEqual([]);
    expect(result.report.duplicated).toEqual([]);
    // The probe's messages share the stream; nothing else may be there.
    expect(result.report.unexpected.filter((label) => !label.startsWith('probe-'))).toEqual([]);
    expect(result.report.orderViolations).toEqual([]);
    expect(gaps).toEqual([]);
    expect(result.audit).toMatchObject({
      ok: true,
      gaps: 0,
      duplicates: 0,
      outOfOrder: 0,
      contradictions: 0,
    });
    expect(missing).toEqual([]);
    expect(twice).toEqual([]);
    expect(doubles).toBe(0);
    expect(probeReport.lost).toEqual([]);
    expect(probeReport.duplicated).toEqual([]);
    // A timed-out send is "not known yet": never stored twice.
    expect(probeTimedOut.filter((label) => (copies.get(label) ?? 0) > 1)).toEqual([]);
    // No publisher saw the broker go below what it had confirmed (design §11).
    const behind = (line: string): boolean => line.includes('below one it confirmed');
    expect(probeLog.map(({ line }) => line).filter(behind)).toEqual([]);
    expect(result.producerErrors.filter(behind)).toEqual([]);
  }, 1_800_000);
});
