import fc from 'fast-check';
import { describe, expect, it, vi } from 'vitest';
import { DedupError } from '../src/errors.js';
import { SuperStreamDedupPublisher } from '../src/superstream/publisher.js';
import type { StreamDedupPublisherOptions } from '../src/transport/stream-options.js';
import { memoryStore } from '../test/support/memory-store.js';
import { PartitionTransports } from '../test/support/partition-transports.js';
import { checkWithin } from './support/runs.js';

// Super stream publisher model (issue 32, item 8): partitions answer their open in any order, some
// are refused at open, and some fail for good (stream deleted, every reconnect refused) at any
// point once their core exists — while others still open, or after the open. Whatever the order,
// the publisher ends closed with the error: the open rejects with it, or closed() resolves with it
// and isClosed is true; every partition's connection is closed. No broker: each partition's
// StreamTransport is a scripted stand-in.

const hub = vi.hoisted(() => ({
  partitions: [] as string[],
  transports: undefined as PartitionTransports | undefined,
}));
vi.mock(import('../src/transport/stream-transport.js'), async (importOriginal) => ({
  ...(await importOriginal()),
  StreamTransport: class {
    constructor(options: StreamDedupPublisherOptions) {
      return hub.transports!.of(options.stream);
    }
  } as never,
}));
vi.mock(import('../src/superstream/partitions.js'), async (importOriginal) => ({
  ...(await importOriginal()),
  Locator: class {
    partitions(): Promise<string[]> {
      return Promise.resolve(hub.partitions);
    }
    close(): Promise<void> {
      return Promise.resolve();
    }
  } as never,
}));

const RUNS = 300;

/** One partition's script: refused at open, or opened at `openRank` and perhaps failed later. */
const partitionScript = fc.record({
  refused: fc.boolean(),
  openRank: fc.nat({ max: 20 }),
  /** Failing `failAfter + 1` ranks after its open (undefined: never). */
  failAfter: fc.option(fc.nat({ max: 20 }), { nil: undefined }),
});
type PartitionScript = { refused: boolean; openRank: number; failAfter: number | undefined };

type Step = { readonly rank: number; readonly partition: number; readonly kind: 'open' | 'refuse' | 'fail' };

function steps(scripts: readonly PartitionScript[]): Step[] {
  const all: Step[] = [];
  scripts.forEach((s, partition) => {
    all.push({ rank: s.openRank, partition, kind: s.refused ? 'refuse' : 'open' });
    if (!s.refused && s.failAfter !== undefined) {
      all.push({ rank: s.openRank + 1 + s.failAfter, partition, kind: 'fail' });
    }
  });
  return all.sort((a, b) => a.rank - b.rank || a.partition - b.partition);
}

/** A few event-loop turns: what a failure needs to reach the publisher once its core has closed. */
async function turns(n = 5): Promise<void> {
  for (let i = 0; i < n; i++) await new Promise((resolve) => setImmediate(resolve));
}

describe('super stream publisher model', () => {
  it('superstream - a partition failing at any point during or after open ends the publisher closed with the error', async () => {
    const transports = new PartitionTransports();
    hub.transports = transports;
    await checkWithin(
      'superstream: partition failures',
      fc.asyncProperty(fc.array(partitionScript, { minLength: 1, maxLength: 4 }), async (scripts) => {
        transports.clear();
        const names = scripts.map((_, i) => `inv-${i}`);
        hub.partitions = names;
        const store = await memoryStore();
        try {
          const opening = SuperStreamDedupPublisher.open({
            superStream: 'inv',
            producerName: 'p',
            store,
            routing: { kind: 'hash', key: () => 'k' },
            reconnect: { initialDelayMs: 1, maxDelayMs: 1 },
            logger: transports.logger,
          });
          const settled = opening.then(
            (pub) => ({ pub, err: undefined }),
            (err: unknown) => ({ pub: undefined, err }),
          );
          while (transports.all().filter((t) => t.connects > 0).length < names.length) await turns(1);
          const plan = steps(scripts);
          const lastAnswer = plan.reduce((last, s, i) => (s.kind === 'fail' ? last : i), -1);
          /** Partitions that failed (or were refused) before the open's outcome, then after it. */
          const failedBefore: string[] = [];
          const failedAfter: string[] = [];
          let outcome: Awaited<typeof settled> | undefined;
          for (const [i, step] of plan.entries()) {
            const t = transports.of(names[step.partition]!);
            if (step.kind === 'open') {
              t.open();
              await t.started;
            } else if (step.kind === 'refuse') {
              t.refuseOpen();
              failedBefore.push(t.target);
            } else {
              const live = outcome === undefined || (outcome.pub !== undefined && !outcome.pub.isClosed);
              t.fail();
              await t.closedOnce;
              await turns();
              if (live) (outcome === undefined ? failedBefore : failedAfter).push(t.target);
            }
            if (i === lastAnswer) outcome = await settled;
          }
          outcome ??= await settled;
          if (failedBefore.length > 0) {
            const state = outcome.pub === undefined ? undefined : { isClosed: outcome.pub.isClosed };
            await outcome.pub?.close();
            expect(state, 'the open must fail when a partition failed before it returned').toBeUndefined();
            expect(outcome.err).toBeInstanceOf(DedupError);
            expect((outcome.err as DedupError).code).toBe('DEDUP_BROKER_REFUSED');
            expect(failedBefore.some((p) => (outcome.err as Error).message.includes(`"${p}"`))).toBe(true);
          } else {
            const pub = outcome.pub!;
            expect(outcome.err).toBeUndefined();
            if (failedAfter.length > 0) {
              const isClosed = pub.isClosed;
              if (!isClosed) await pub.close();
              expect(isClosed, 'a failed partition must close the publisher').toBe(true);
              const closedWith = await pub.closed();
              expect(closedWith).toMatchObject({ code: 'DEDUP_BROKER_REFUSED' });
              expect(closedWith!.message).toContain(`partition "${failedAfter[0]}"`);
              for (const p of pub.partitions) {
                await expect(pub.sendTo(p, Buffer.from('x'))).rejects.toBe(closedWith);
              }
            } else {
              expect(pub.isClosed).toBe(false);
              await pub.close();
              expect(await pub.closed()).toBeUndefined();
            }
          }
          for (const t of transports.all()) expect(t.closes, `${t.target} closed`).toBeGreaterThan(0);
        } finally {
          await store.close();
        }
      }),
      { runs: RUNS, timeLimitMs: 100_000 },
    );
  });
});
