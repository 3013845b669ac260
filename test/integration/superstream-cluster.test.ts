import { join } from 'node:path';
import { connect, type Client } from 'rabbitmq-stream-js-client';
import { describe, expect, it } from 'vitest';
import { ID_HEADER, PRODUCER_HEADER } from '../../src/identity/headers.js';
import { checkHistory, formatReport } from '../../src/testing.js';
import { readStreamToEnd } from '../../src/transport/stream-ops.js';
import { SuperStreamDedupPublisher } from '../../src/stream.js';
import { BROKER, uniqueName } from '../support/broker.js';
import {
  CLUSTER_CONNECTION,
  CLUSTER_PORTS,
  clusterScript,
  declareSpreadSuperStream,
  useCluster,
  withAdmin,
} from '../support/cluster.js';
import { useTempDir } from '../support/tmp.js';

// Issue 18, done means 1 (second half): a super stream of 3 replicated partitions on the
// three-node cluster of scripts/rabbitmq.sh, partition i led by node i+1. The node leading one
// partition is killed with kill -9 while a SuperStreamDedupPublisher publishes to all three; the
// other partitions must keep confirming while that one has no leader, and every partition must hold
// each acknowledged message exactly once, in ID order.

useCluster();
const tempDir = useTempDir();

/** The partition whose leader is killed: 0, led by node 1, the first endpoint of the connection. */
const VICTIM = 0;
/** Unconfirmed sends per partition: each partition has its own window (see the workers below). */
const WINDOW = 100;
/** How long the throughput before the kill and after the recovery is measured. */
const MEASURE_MS = 3_000;
const PARTITIONS = 3;

/** Per partition: the node (1..3) that leads it and how many replicas it has (0 when unknown). */
async function placement(client: Client, partitions: readonly string[]) {
  const metas = await client.queryMetadata({ streams: [...partitions] });
  return partitions.map((stream) => {
    const meta = metas.find((m) => m.streamName === stream);
    return {
      leader: CLUSTER_PORTS.indexOf((meta?.leader?.port ?? 0) as (typeof CLUSTER_PORTS)[number]) + 1,
      replicas: meta?.replicas?.length ?? 0,
    };
  });
}

/** Confirms per second among `times` (sorted) in [from, to). */
function rate(times: readonly number[], from: number, to: number): number {
  const n = times.filter((t) => t >= from && t < to).length;
  return to > from ? (n * 1_000) / (to - from) : 0;
}

/** The longest time without a confirm in [from, to], its edges included. */
function longestGap(times: readonly number[], from: number, to: number): number {
  let last = from;
  let gap = 0;
  for (const t of times) {
    if (t < from) continue;
    if (t > to) break;
    gap = Math.max(gap, t - last);
    last = t;
  }
  return Math.max(gap, to - last);
}

function within<T>(promise: Promise<T>, ms: number, what: () => string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what()} (waited ${ms} ms)`)), ms);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

const pause = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

describe('super stream on the cluster - the leader of one partition killed', () => {
  it(`kill -9 of partition ${VICTIM}'s leader mid-publish: the other partitions keep confirming, nothing lost or duplicated`, async () => {
    const started = performance.now();
    const at = (): string => `${((performance.now() - started) / 1000).toFixed(1)} s`;
    const name = uniqueName('ss-cluster');
    const partitions = await declareSpreadSuperStream(name, PARTITIONS);
    const victim = partitions[VICTIM]!;
    const victimNode = VICTIM + 1;
    // Metadata is asked of a node that stays up.
    const adminPort = CLUSTER_PORTS[(VICTIM + 1) % CLUSTER_PORTS.length]!;
    const admin = await connect({ ...CLUSTER_CONNECTION, hostname: BROKER.host, port: adminPort });
    let pub: SuperStreamDedupPublisher | undefined;
    try {
      // Replicas come up a moment after the declaration; there is no event for it.
      let placed = await placement(admin, partitions);
      for (let i = 0; i < 100 && placed.some((p) => p.replicas < 2); i++) {
        await pause(100);
        placed = await placement(admin, partitions);
      }
      // Partition i led by node i+1, with a replica on each of the two other nodes: a partition
      // survives its leader's death, and no two partitions share a leader.
      expect(placed).toEqual(partitions.map((_, i) => ({ leader: i + 1, replicas: 2 })));

      // What each partition's publisher did (lost connections, reconnects), from its logger.
      type PublisherEvent = { at: number; target: string; what: string };
      const events: PublisherEvent[] = [];
      let onEvent: ((e: PublisherEvent) => void) | undefined;
      const record = (obj: object, msg?: string): void => {
        const o = obj as { target?: string; err?: unknown; resend?: number };
        const detail =
          o.err instanceof Error
            ? ` (${o.err.message})`
            : o.resend !== undefined
              ? ` (re-sending ${o.resend})`
              : '';
        const event = { at: performance.now(), target: o.target ?? '?', what: `${msg ?? ''}${detail}` };
        events.push(event);
        onEvent?.(event);
      };
      const logger = { debug: () => undefined, info: record, warn: record, error: record };

      pub = await SuperStreamDedupPublisher.open({
        connection: CLUSTER_CONNECTION,
        superStream: name,
        producerName: 'ss-failover',
        store: join(await tempDir(), 'store'),
        routing: { kind: 'hash', key: (body) => Buffer.from(body).toString() },
        reconnect: { initialDelayMs: 100, maxDelayMs: 500 },
        logger,
      });
      expect(pub.partitions).toEqual(partitions);
      const publisher = pub;

      // One worker per partition, each with its own window of WINDOW unconfirmed sends: a single
      // window over all partitions would fill up with the victim's unconfirmed messages and stop
      // the test's own sends to the others. Each worker keeps the labels that hash routing sends to
      // its partition (send() routes them; the result must say that partition).
      const attempted = partitions.map((): string[] => []);
      const acknowledged = partitions.map((): string[] => []);
      const confirmTimes = partitions.map((): number[] => []);
      const failures: string[] = [];
      const misrouted: string[] = [];
      let publishing = true;
      let onConfirm: ((p: number, t: number) => void) | undefined;
      const worker = async (p: number): Promise<void> => {
        const inFlight = new Set<Promise<void>>();
        for (let n = 0; publishing; n++) {
          const label = `w${p}-${n}`;
          if ((await publisher.partitionFor(Buffer.from(label))) !== partitions[p]) continue;
          attempted[p]!.push(label);
          const sent = publisher.send(Buffer.from(label)).then(
            (r) => {
              const t = performance.now();
              confirmTimes[p]!.push(t);
              acknowledged[p]!.push(label);
              if (r.partition !== partitions[p]) misrouted.push(`${label} → ${r.partition}`);
              onConfirm?.(p, t);
            },
            (err: unknown) => {
              failures.push(`${label}: ${err instanceof Error ? err.message : String(err)}`);
            },
          );
          inFlight.add(sent);
          void sent.finally(() => inFlight.delete(sent));
          if (inFlight.size >= WINDOW) await Promise.race(inFlight);
        }
        await Promise.all(inFlight);
      };
      const workers = Promise.all(partitions.map((_, p) => worker(p)));
      const stopWorkers = async (): Promise<void> => {
        publishing = false;
        await within(
          workers,
          60_000,
          () =>
            `sends still unsettled after the workers stopped: ${partitions
              .map((p, i) => `${p}: ${attempted[i]!.length - acknowledged[i]!.length}`)
              .join(', ')}`,
        );
      };

      try {
        // Every partition confirms, then the throughput before the kill is measured.
        await within(
          new Promise<void>((resolve) => {
            onConfirm = () => {
              if (confirmTimes.every((t) => t.length > 0)) resolve();
            };
          }),
          30_000,
          () => 'not every partition confirmed a first message',
        );
        const beforeFrom = performance.now();
        await pause(MEASURE_MS);
        const killStart = performance.now();
        const reconnectsBefore = publisher.stats.reconnects;

        // The victim's window without a leader: from the moment its publisher saw its connection
        // to the leader go (the kill's own event; the script returns ~0.1-0.2 s after the death)
        // to its first confirm after that, from the new leader.
        let lostAt: number | undefined;
        let markLost!: (t: number) => void;
        let markRecovered!: (t: number) => void;
        const lost = new Promise<number>((resolve) => (markLost = resolve));
        const recovered = new Promise<number>((resolve) => (markRecovered = resolve));
        onEvent = (e) => {
          if (lostAt === undefined && e.target === victim && e.what.includes('connection lost')) {
            lostAt = e.at;
            markLost(e.at);
          }
        };
        onConfirm = (p, t) => {
          if (p === VICTIM && lostAt !== undefined && t > lostAt) markRecovered(t);
        };
        await clusterScript('node-kill', String(victimNode));
        const killDone = performance.now();
        // The election as the metadata shows it, from a surviving node (measured, not waited on).
        let electedAt: number | undefined;
        let newLeader = 0;
        const watching = (async () => {
          while (electedAt === undefined && performance.now() - killDone < 60_000) {
            const [p] = await placement(admin, [victim]).catch(() => [{ leader: 0, replicas: 0 }]);
            if (p!.leader !== 0 && p!.leader !== victimNode) {
              electedAt = performance.now();
              newLeader = p!.leader;
            } else await pause(100);
          }
        })();
        const from = await within(lost, 30_000, () => `partition ${victim} never lost its connection`);
        const recoveredAt = await within(
          recovered,
          60_000,
          () => `partition ${victim} confirmed nothing after its leader was killed`,
        );
        await watching;
        // A few seconds more on the new leader.
        await pause(MEASURE_MS);
        const afterTo = performance.now();
        const reconnectsAfterFailover = publisher.stats.reconnects;

        // The killed node comes back (as a replica) while the publisher keeps publishing.
        await clusterScript('node-start', String(victimNode));
        const restartedAt = performance.now();
        await stopWorkers();
        await publisher.close();

        const others = partitions.map((_, i) => i).filter((i) => i !== VICTIM);
        const othersTimes = others.map((i) => confirmTimes[i]!);
        const sum = (f: (times: readonly number[]) => number): number =>
          othersTimes.reduce((s, times) => s + f(times), 0);
        const before = sum((times) => rate(times, beforeFrom, killStart));
        const during = sum((times) => rate(times, from, recoveredAt));
        const after = sum((times) => rate(times, recoveredAt, afterTo));
        const duringCounts = othersTimes.map(
          (times) => times.filter((t) => t >= from && t < recoveredAt).length,
        );
        const gaps = othersTimes.map((times) => Math.round(longestGap(times, from, recoveredAt)));
        const ms = (t: number): number => Math.round(t);
        console.log(
          `[superstream failover] partition ${victim} (leader node${victimNode}) leaderless for ${ms(
            recoveredAt - from,
          )} ms (connection lost → first confirm; new leader node${newLeader} in the metadata ${
            electedAt === undefined ? '?' : ms(electedAt - from)
          } ms after the loss); others confirmed ${ms(during)} msg/s during it (before: ${ms(
            before,
          )} msg/s, after: ${ms(after)} msg/s); per other partition during it: ${others
            .map((i, j) => `${partitions[i]} ${duringCounts[j]} msgs, longest pause ${gaps[j]} ms`)
            .join('; ')}; reconnects: ${reconnectsBefore} before, ${
            reconnectsAfterFailover - reconnectsBefore
          } in the failover, ${publisher.stats.reconnects - reconnectsAfterFailover} around the restart (${ms(
            restartedAt - afterTo,
          )} ms); sent ${attempted.reduce((s, a) => s + a.length, 0)} in ${at()}`,
        );
        const since = (t: number): string => `${ms(t - from) >= 0 ? '+' : ''}${ms(t - from)} ms`;
        console.log(
          `[superstream failover] publisher events from the kill on (times from the victim's loss; the kill script returned at ${since(
            killDone,
          )}):\n  ${events
            .filter((e) => e.at >= killStart)
            .map((e) => `${since(e.at)} ${e.target}: ${e.what.replace(/^stream-dedup: /, '')}`)
            .join('\n  ')}`,
        );

        expect(failures).toEqual([]);
        expect(misrouted).toEqual([]);
        // The other partitions kept publishing while the victim had no leader: none of them lost
        // its connection, and each confirmed messages. Soft: the streams are checked below anyway.
        // (Failing when written: every partition's StreamTransport opens its locator connection
        // through the first endpoint, node 1, and takes that connection's loss for its own, so the
        // kill disconnects all three partitions. Killing node 2 instead: one reconnect, the victim's.)
        const othersLost = events.filter(
          (e) =>
            e.target !== victim && e.at >= killStart && e.at <= afterTo && e.what.includes('connection lost'),
        );
        expect
          .soft(
            othersLost.map((e) => `${e.target}: ${e.what}`),
            'other partitions disconnected by the kill',
          )
          .toEqual([]);
        for (const [j, n] of duringCounts.entries()) {
          expect
            .soft(n, `${partitions[others[j]!]} confirms while ${victim} had no leader`)
            .toBeGreaterThan(0);
        }
      } finally {
        // On a failure: close() settles what is still unconfirmed, so the workers end.
        publishing = false;
        await publisher.close();
        await workers.catch(() => undefined);
      }

      // Every partition read to its end: each acknowledged message exactly once, in its
      // partition, the producer's IDs 1..n in stream order.
      for (const [p, partition] of partitions.entries()) {
        const records = await readStreamToEnd(CLUSTER_CONNECTION, partition, { timeoutMs: 60_000 });
        const observed = records.map((r) => ({
          label: r.body.toString(),
          producerName: r.applicationProperties[PRODUCER_HEADER] as string | undefined,
          publishingId: BigInt(String(r.applicationProperties[ID_HEADER])),
        }));
        const report = checkHistory({
          attempted: attempted[p]!,
          acknowledged: acknowledged[p]!,
          observed,
        });
        console.log(
          `[superstream failover] ${partition}: attempted=${attempted[p]!.length} acknowledged=${
            acknowledged[p]!.length
          } stream=${records.length} ${formatReport(report)}`,
        );
        expect(report.lost).toEqual([]);
        expect(report.duplicated).toEqual([]);
        expect(report.unexpected).toEqual([]);
        expect(report.orderViolations).toEqual([]);
        expect(observed.every((m) => m.producerName === 'ss-failover')).toBe(true);
        expect(observed.map((m) => m.publishingId)).toEqual(observed.map((_, i) => BigInt(i + 1)));
        expect(records.length).toBe(acknowledged[p]!.length);
      }
    } finally {
      await pub?.close();
      await admin.close().catch(() => undefined);
      await withAdmin((client) => client.deleteSuperStream({ streamName: name })).catch(() => undefined);
    }
  }, 180_000);
});
