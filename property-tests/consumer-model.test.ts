import fc from 'fast-check';
import { describe, it } from 'vitest';
import { formatReport } from '../src/history/checker.js';
import { identityHeaders } from '../src/identity/headers.js';
import type { PolicySpec } from '../src/verifier/index.js';
import {
  ConsumerHarness,
  consumerPolicy,
  consumerStep,
  runStep,
  showStep,
  type ConsumerStep,
  type StreamEntry,
} from './support/consumer.js';
import { checkWithin } from './support/runs.js';

// The seed is set globally by property-tests/setup.ts. Replay a shrunk run with the printed seed,
// path and replayPath: FC_SEED=… FC_PATH=… FC_REPLAY_PATH=… npx vitest run --project property
// property-tests/consumer-model.test.ts

/**
 * A stream as a verifying consumer may find it: two producers' messages, each producer's distinct
 * IDs increasing (gaps allowed), interleaved; copies of earlier messages further on (an AMQP 0-9-1
 * publisher's retries, which the broker never deduplicates, or a forgotten producer name); and a
 * few messages without identity, which must never take effect.
 */
const stream: fc.Arbitrary<StreamEntry[]> = fc
  .record({
    picks: fc.array(fc.tuple(fc.constantFrom('a', 'b'), fc.integer({ min: 1, max: 3 })), {
      minLength: 1,
      maxLength: 40,
    }),
    copies: fc.array(fc.tuple(fc.nat(), fc.nat({ max: 40 })), { maxLength: 8 }),
    unidentified: fc.array(fc.nat(), { maxLength: 2 }),
  })
  .map(({ picks, copies, unidentified }) => {
    const last = new Map<string, bigint>();
    const messages: Array<{ label: string; headers: Record<string, unknown> | undefined }> = picks.map(
      ([producer, step]) => {
        const id = (last.get(producer) ?? 0n) + BigInt(step);
        last.set(producer, id);
        return { label: `${producer}/${id}`, headers: identityHeaders(producer, id) };
      },
    );
    for (const [at, later] of copies) {
      const i = at % messages.length;
      messages.splice(Math.min(messages.length, i + 1 + later), 0, messages[i]!);
    }
    for (const [n, at] of unidentified.entries()) {
      messages.splice(at % (messages.length + 1), 0, { label: `plain/${n}`, headers: {} });
    }
    return messages.map((m, i) => ({ offset: BigInt(i), ...m }));
  });

interface Model {
  running: boolean;
}

class StepCommand implements fc.AsyncCommand<Model, ConsumerHarness> {
  constructor(readonly step: ConsumerStep) {}

  check(m: Readonly<Model>): boolean {
    return this.step.kind === 'start' ? !m.running : m.running;
  }

  async run(m: Model, h: ConsumerHarness): Promise<void> {
    await runStep(h, this.step);
    m.running = h.isRunning;
  }

  toString(): string {
    return showStep(this.step);
  }
}

describe('verifying consumer model (DESIGN §5, §7)', () => {
  it('model - every distinct stream message takes effect exactly once, in per-producer ID order, through crashes before, during and after commits and redelivery from the offset, the last ack or earlier', async () => {
    await checkWithin(
      'consumer model',
      fc.asyncProperty(
        stream,
        consumerPolicy,
        fc.constantFrom<'message' | 'batch'>('message', 'batch'),
        fc.integer({ min: 1, max: 6 }),
        fc.commands([consumerStep.map((step) => new StepCommand(step))], {
          maxCommands: 80,
          size: 'max',
          replayPath: process.env.FC_REPLAY_PATH,
        }),
        async (entries, policy: PolicySpec, commit, commitEvery, cmds) => {
          const h = new ConsumerHarness(entries, { policy, commit, commitEvery });
          await h.start();
          await fc.asyncModelRun(() => ({ model: { running: true }, real: h }), cmds);
          const report = h.check(await h.finish());
          if (!report.ok) throw new Error(formatReport(report));
          if (h.violations.length > 0) throw new Error(h.violations.join('\n'));
        },
      ),
      { timeLimitMs: 20_000 },
    );
  });
});
