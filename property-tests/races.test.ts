import fc from 'fast-check';
import { describe, it } from 'vitest';
import { formatReport } from '../src/history/checker.js';
import { identityHeaders } from '../src/identity/headers.js';
import { ConsumerHarness, consumerPolicy, type StreamEntry } from './support/consumer.js';
import { SimNetwork } from './support/network.js';
import { ProducerHarness, type ProducerSpec } from './support/producer.js';
import { checkWithin } from './support/runs.js';
import {
  checkProducer,
  drainByHand,
  drive,
  expectIncreasingWire,
  scheduledParts,
} from './support/scheduled.js';

// The seed is set globally by property-tests/setup.ts. Every interleaving below is chosen by
// fc.scheduler: disk commits, the broker reading each frame (in wire order), each confirm (in any
// order), the application's calls, crashes, cuts and reconnects.

const RACE_RUNS = 500;

const spec = fc.record({
  durability: fc.constantFrom<'outbox' | 'reserve'>('outbox', 'reserve'),
  maxBatch: fc.integer({ min: 1, max: 3 }),
  maxInFlight: fc.oneof(fc.integer({ min: 1, max: 4 }), fc.constant(10_000)),
});

type RaceSpec = { durability: 'outbox' | 'reserve'; maxBatch: number; maxInFlight: number };

const producerSpec = (s: RaceSpec) =>
  ({ stream: 'orders', producerName: 'p', idMode: 'auto', ...s }) satisfies ProducerSpec;

/** A producer started on a fresh simulated network, every step of it scheduled by `s`. */
async function startProducer(s: fc.Scheduler, spec: ProducerSpec) {
  const network = new SimNetwork();
  const h = new ProducerHarness(network, spec, scheduledParts(s));
  const err = await h.start();
  if (err !== undefined) throw err;
  return { network, h, progress: () => network.activity + h.progress() };
}

/** Schedules `sends` send() calls one after another, labelled `${label} #i`. */
function scheduleSends(s: fc.Scheduler, h: ProducerHarness, sends: number, label: string): void {
  s.scheduleSequence(
    Array.from({ length: sends }, (_, i) => ({
      label: `${label} #${i}`,
      builder: () => {
        h.send(1);
        return Promise.resolve();
      },
    })),
  );
}

describe('races (fc.scheduler)', () => {
  it('race - concurrent send() calls get ids in call order, reach the wire in id order, and all land once', async () => {
    await checkWithin(
      'race: concurrent sends',
      fc.asyncProperty(
        fc.scheduler(),
        spec,
        fc.array(fc.integer({ min: 1, max: 4 }), { minLength: 1, maxLength: 4 }),
        async (s, config, callers) => {
          const { network, h, progress } = await startProducer(s, producerSpec(config));
          for (const [caller, sends] of callers.entries())
            scheduleSends(s, h, sends, `caller ${caller} sends`);
          await drive(s, progress);
          const calls = [...h.attempted];
          const connections = h.life!.transport.connections;
          await drainByHand(network, h, s);
          checkProducer(network, h);
          // IDs follow call order, whatever the interleaving of callers, commits and confirms.
          const ids = calls.map((label) => h.acknowledged.get(label));
          for (let i = 1; i < ids.length; i++) {
            if (!(ids[i]! > ids[i - 1]!))
              throw new Error(`call order ${calls.join(',')} got ids ${ids.join(',')}`);
          }
          expectIncreasingWire(connections);
        },
      ),
      { runs: RACE_RUNS, timeLimitMs: 10_000 },
    );
  });

  /** Sends, a scheduled close(), everything else scheduled around it; returns what close() left. */
  async function closeRace(s: fc.Scheduler, config: RaceSpec, sends: number, closeTimeoutMs: number) {
    const { network, h, progress } = await startProducer(s, { ...producerSpec(config), closeTimeoutMs });
    const life = h.life!;
    h.send(sends);
    let closing: Promise<void> | undefined;
    let unsettledAtClose = -1;
    void s.schedule(Promise.resolve(), 'application calls close()').then(() => {
      closing = h.close().then(() => {
        unsettledAtClose = life.unsettled;
      });
    });
    await drive(s, progress);
    await closing;
    const hanging = [...h.attempted].filter((l) => !h.acknowledged.has(l) && !h.rejected.has(l));
    return { network, h, unsettledAtClose, hanging };
  }

  it('race - confirm vs close(): every send has settled by the time close() resolves', async () => {
    await checkWithin(
      'race: confirm vs close, settled',
      fc.asyncProperty(
        fc.scheduler(),
        spec,
        fc.integer({ min: 1, max: 6 }),
        fc.constantFrom(0, 60_000),
        async (s, config, sends, closeTimeoutMs) => {
          const { unsettledAtClose, hanging } = await closeRace(s, config, sends, closeTimeoutMs);
          if (unsettledAtClose !== 0) {
            throw new Error(
              `close() resolved with ${unsettledAtClose} sends never settled (closeTimeoutMs ${closeTimeoutMs}): ${hanging.join(', ')}`,
            );
          }
        },
      ),
      { runs: RACE_RUNS, timeLimitMs: 10_000 },
    );
  });

  it('race - confirm vs close(): a send rejected with DEDUP_PUBLISHER_CLOSED stays in the outbox and the next open() re-sends it; the closed core never touches its store again', async () => {
    await checkWithin(
      'race: confirm vs close, outbox',
      fc.asyncProperty(
        fc.scheduler(),
        spec.map((c) => ({ ...c, durability: 'outbox' as const })),
        fc.integer({ min: 1, max: 6 }),
        fc.constantFrom(0, 60_000),
        async (s, config, sends, closeTimeoutMs) => {
          const { network, h } = await closeRace(s, config, sends, closeTimeoutMs);
          const closedLabels = [...h.rejected]
            .filter(([, code]) => code === 'DEDUP_PUBLISHER_CLOSED')
            .map(([l]) => l);
          await drainByHand(network, h, s);
          checkProducer(network, h, closedLabels);
        },
      ),
      { runs: RACE_RUNS, timeLimitMs: 10_000 },
    );
  });

  it('race - a crash during a group commit loses only sends that never resolved; the next open re-sends the outbox and nothing lands twice or out of order', async () => {
    await checkWithin(
      'race: crash during group commit',
      fc.asyncProperty(
        fc.scheduler(),
        spec,
        fc.integer({ min: 1, max: 8 }),
        fc.boolean(),
        async (s, config, sends, zombie) => {
          const { network, h, progress } = await startProducer(s, producerSpec(config));
          scheduleSends(s, h, sends, 'send');
          let crashing: Promise<void> | undefined;
          void s.schedule(Promise.resolve(), 'SIGKILL').then(() => {
            crashing = h.crash(zombie);
          });
          await drive(s, progress);
          await crashing;
          await drainByHand(network, h, s);
          checkProducer(network, h);
        },
      ),
      { runs: RACE_RUNS, timeLimitMs: 10_000 },
    );
  });

  it('race - a connection cut and reconnect in the middle of sends: unconfirmed messages go out again in id order before new ones, nothing lost or doubled', async () => {
    await checkWithin(
      'race: reconnect during send',
      fc.asyncProperty(
        fc.scheduler(),
        spec,
        fc.integer({ min: 1, max: 8 }),
        fc.array(fc.boolean(), { minLength: 1, maxLength: 3 }),
        async (s, config, sends, cuts) => {
          const { network, h, progress } = await startProducer(s, producerSpec(config));
          const transport = h.life!.transport;
          scheduleSends(s, h, sends, 'send');
          for (const [i, zombie] of cuts.entries()) {
            void s.schedule(Promise.resolve(), `cut #${i}${zombie ? ' (frames linger)' : ''}`).then(() => {
              if (transport.connection?.state !== 'live') return;
              transport.cut(zombie);
              // The network comes back when the scheduler says so, once the core asks.
              void s
                .schedule(transport.connectAttempt(), `network back #${i}`)
                .then(() => transport.acceptConnect());
            });
          }
          void s.schedule(Promise.resolve(), 'late frames land').then(() => {
            while (network.zombies.length > 0) network.deliverZombie(0);
          });
          await drive(s, progress);
          await drainByHand(network, h, s);
          checkProducer(network, h);
          // Per connection the wire is in id order (re-sends included).
          expectIncreasingWire(h.history[0]!.transport.connections);
        },
      ),
      { runs: RACE_RUNS, timeLimitMs: 10_000 },
    );
  });

  it('race - a consumer crash between commit and settle/ack: the redelivery from the last ack takes no effect twice, and nothing is lost', async () => {
    const entries: StreamEntry[] = Array.from({ length: 8 }, (_, i) => ({
      offset: BigInt(i),
      label: `${i % 2 === 0 ? 'a' : 'b'}/${Math.floor(i / 2) + 1}`,
      headers: identityHeaders(i % 2 === 0 ? 'a' : 'b', BigInt(Math.floor(i / 2) + 1)),
    }));
    await checkWithin(
      'race: consumer crash around commit and ack',
      fc.asyncProperty(
        fc.scheduler(),
        consumerPolicy,
        fc.constantFrom<'message' | 'batch'>('message', 'batch'),
        fc.integer({ min: 1, max: 4 }),
        fc.integer({ min: 1, max: 4 }),
        async (s, policy, commit, commitEvery, ackRounds) => {
          const gate = (what: string) => s.schedule(Promise.resolve(), `disk commits a ${what}`);
          const h = new ConsumerHarness(entries, { policy, commit, commitEvery, disk: { gate } });
          await h.start();
          const reading = h.deliver(entries.length).catch(() => undefined);
          for (let i = 0; i < ackRounds; i++) {
            void s.schedule(Promise.resolve(), `acks reach the broker #${i}`).then(() => h.acks());
          }
          let crashing: Promise<void> | undefined;
          void s.schedule(Promise.resolve(), 'SIGKILL').then(() => {
            crashing = h.crash();
          });
          await drive(s, () => h.progress());
          await crashing;
          void reading; // the dead reader never finishes: its disk is dead
          await h.start({ kind: 'acked' }, {});
          const report = h.check(await h.finish());
          if (!report.ok) throw new Error(formatReport(report));
        },
      ),
      { runs: RACE_RUNS, timeLimitMs: 10_000 },
    );
  });
});
