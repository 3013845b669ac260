import type fc from 'fast-check';
import { checkHistory, formatReport } from '../../src/history/checker.js';
import type { Connection, ConnectionHooks, SimNetwork } from './network.js';
import type { ProducerHarness } from './producer.js';
import { settle } from './turns.js';

/** Hands each step of the simulated world to the scheduler. */
export function scheduledParts(s: fc.Scheduler) {
  const hooks: ConnectionHooks = {
    onQueued: (c, count) => {
      for (let i = 0; i < count; i++) {
        void s
          .schedule(Promise.resolve(), `broker reads a frame of connection ${c.id}`)
          .then(() => c.deliver(1));
      }
    },
    onConfirmQueued: (c, id) => {
      void s.schedule(Promise.resolve(), `confirm ${id} on connection ${c.id}`).then(() => c.confirmId(id));
    },
  };
  const gate = (what: string) => s.schedule(Promise.resolve(), `disk commits a ${what}`);
  return { hooks, disk: { gate } };
}

/**
 * Releases scheduled tasks one by one, letting the event loop settle between them (the cores pump
 * on setImmediate), until nothing is scheduled and nothing moves.
 */
export async function drive(s: fc.Scheduler, progress: () => number): Promise<void> {
  for (let i = 0; i < 5_000; i++) {
    await settle(progress);
    if (s.count() === 0) return;
    await s.waitNext(1);
  }
  throw new Error('the scheduled world never went idle');
}

/**
 * After the race: a new unscheduled life (if needed) drains everything by hand, then closes. A life
 * still running on scheduled parts keeps having its scheduled tasks released (`s`).
 */
export async function drainByHand(network: SimNetwork, h: ProducerHarness, s?: fc.Scheduler): Promise<void> {
  const progress = () => network.activity + h.progress();
  const pump = async () => {
    await settle(progress);
    if (s !== undefined) await drive(s, progress);
  };
  network.startBroker();
  while (network.zombies.length > 0) network.deliverZombie(0);
  if (!h.isRunning) {
    const err = await h.start({ disk: {}, hooks: {} });
    if (err !== undefined) throw err;
  } else if (!h.isConnected) {
    await h.reconnect();
  }
  await pump();
  for (let round = 0; ; round++) {
    const c = h.life!.transport.connection!;
    const moved = c.deliver() + c.confirmAll();
    await pump();
    if (moved === 0 && h.life!.core.inFlight === 0) break;
    if (round > 100) throw new Error('did not drain');
  }
  if (h.life!.unsettled > 0) throw new Error(`${h.life!.unsettled} sends never settled`);
  const closing = h.close();
  if (s !== undefined) await drive(s, progress);
  await closing;
}

/** The producer invariants of docs/design.md §7 through the history checker, plus the harness's violations. */
export function checkProducer(
  network: SimNetwork,
  h: ProducerHarness,
  extraAcknowledged: Iterable<string> = [],
): void {
  const problems = h.problems();
  if (problems.length > 0) throw new Error(problems.join('\n'));
  const stored = network.broker.messages(h.spec.stream);
  const report = checkHistory({
    attempted: h.attempted,
    acknowledged: [...h.acknowledged.keys(), ...extraAcknowledged],
    observed: stored.map((m) => ({
      label: m.body,
      producerName: m.producerName,
      publishingId: m.publishingId,
    })),
  });
  if (!report.ok) throw new Error(formatReport(report));
}

/** Per connection, the publisher wrote strictly increasing IDs (re-sends included). */
export function expectIncreasingWire(connections: readonly Connection[]): void {
  for (const c of connections) {
    const wire = c.written.map((m) => m.publishingId);
    for (let i = 1; i < wire.length; i++) {
      if (!(wire[i]! > wire[i - 1]!)) throw new Error(`connection ${c.id} wire order ${wire.join(',')}`);
    }
  }
}
