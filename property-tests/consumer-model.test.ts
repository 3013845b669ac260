import fc from 'fast-check';
import { describe, it, vi } from 'vitest';
import { formatReport } from '../src/history/checker.js';
import { identityHeaders, parseIdentity, SKIP_HEADER } from '../src/identity/headers.js';
import { decodeScopeKey } from '../src/identity/scope-key.js';
import type { PolicySpec } from '../src/verifier/index.js';
import {
  ConsumerHarness,
  consumerPolicy,
  consumerStep,
  NEVER_MS,
  RacingConsumer,
  racingStep,
  RACING_TTL_MS,
  runRacingStep,
  runStep,
  showRacingStep,
  showStep,
  type ConsumerStep,
  type RacingOptions,
  type RacingStep,
  type StreamEntry,
} from './support/consumer.js';
import { hostileEntry, TENANT_HEADER } from './support/hostile-headers.js';
import { checkWithin } from './support/runs.js';

// The seed is set globally by property-tests/setup.ts. Replay a shrunk run with the printed seed,
// path and replayPath: FC_SEED=… FC_PATH=… FC_REPLAY_PATH=… npx vitest run --project property
// property-tests/consumer-model.test.ts

/**
 * A stream as a verifying consumer may find it: two producers' messages, each producer's distinct
 * IDs increasing (gaps allowed, some declared skipped by the message after them, some partly),
 * interleaved; copies of earlier messages further on (an AMQP 0-9-1 publisher's retries, which the
 * broker never deduplicates, or a forgotten producer name); and a few messages without identity,
 * which must never take effect.
 */
const stream: fc.Arbitrary<StreamEntry[]> = fc
  .record({
    picks: fc.array(
      fc.tuple(fc.constantFrom('a', 'b'), fc.integer({ min: 1, max: 4 }), fc.constantFrom(0, 0, 1, 2)),
      { minLength: 1, maxLength: 40 },
    ),
    copies: fc.array(fc.tuple(fc.nat(), fc.nat({ max: 40 })), { maxLength: 8 }),
    unidentified: fc.array(fc.nat(), { maxLength: 2 }),
    hostilePlaces: fc.array(fc.nat(), { maxLength: 3 }),
    hostile: fc.tuple(hostileEntry('h0'), hostileEntry('h1'), hostileEntry('h2')),
  })
  .map(({ picks, copies, unidentified, hostilePlaces, hostile }) => {
    const last = new Map<string, bigint>();
    const messages: Array<Omit<StreamEntry, 'offset'>> = picks.map(([producer, step, declare]) => {
      const previous = last.get(producer) ?? 0n;
      const id = previous + BigInt(step);
      last.set(producer, id);
      const headers: Record<string, unknown> = identityHeaders(producer, id);
      // 1: the whole jump is declared skipped; 2: all but its first ID (which stays a gap).
      const from = previous + BigInt(declare);
      if (declare > 0 && from >= 1n && from < id) headers[SKIP_HEADER] = String(from);
      return { label: `${producer}/${id}`, headers };
    });
    for (const [at, later] of copies) {
      const i = at % messages.length;
      messages.splice(Math.min(messages.length, i + 1 + later), 0, messages[i]!);
    }
    for (const [n, at] of unidentified.entries()) {
      messages.splice(at % (messages.length + 1), 0, { label: `plain/${n}`, headers: {} });
    }
    // Messages from a hostile writer (issue 32): header values of any AMQP 1.0 type, decoded by
    // the stream consumer's decoder, in both sections; applied only when identity and tenant are valid.
    for (const [n, at] of hostilePlaces.entries()) {
      const { headers, annotations, expected } = hostile[n]!;
      messages.splice(at % (messages.length + 1), 0, {
        label: `hostile/${n}`,
        headers,
        annotations,
        expected,
      });
    }
    return messages.map((m, i) => ({ offset: BigInt(i), ...m }));
  });

/** The application's tenant function trusts the wire: a message's `x-tenant` header as it is. */
const tenantFromWire = (m: { readonly headers: Readonly<Record<string, unknown>> }): string =>
  (Object.hasOwn(m.headers, TENANT_HEADER) ? m.headers[TENANT_HEADER] : '') as string;

/**
 * Skips vs loss at the consumer, through its crashes: no gap event (reported or confirmed) holds an
 * ID its producer declared skipped, and with `highest` (which confirms at once) every undeclared
 * hole between a producer's first and last ID is in a confirmed gap event.
 */
function checkSkips(entries: readonly StreamEntry[], policy: PolicySpec, h: ConsumerHarness): void {
  const declared = new Set<string>();
  const seen = new Map<string, Set<bigint>>();
  for (const e of entries) {
    const identity = e.headers === undefined ? 'none' : parseIdentity(e.headers);
    if (typeof identity === 'string') continue;
    const { producerName, publishingId, skippedFrom } = identity;
    if (!seen.has(producerName)) seen.set(producerName, new Set());
    seen.get(producerName)!.add(publishingId);
    for (let id = skippedFrom ?? publishingId; id < publishingId; id++) declared.add(`${producerName}/${id}`);
  }
  const confirmed = new Set<string>();
  for (const e of h.events) {
    if (e.kind !== 'gap') continue;
    const producer = decodeScopeKey(e.scope).producer;
    for (let id = e.range.from; id <= e.range.to; id++) {
      if (declared.has(`${producer}/${id}`)) {
        throw new Error(
          `gap ${e.range.from}..${e.range.to} (confirmed: ${e.confirmed}) holds ${producer}/${id}, declared skipped`,
        );
      }
      if (e.confirmed) confirmed.add(`${producer}/${id}`);
    }
  }
  if (policy.kind !== 'highest') return;
  for (const [producer, ids] of seen) {
    const sorted = [...ids].sort((x, y) => (x < y ? -1 : 1));
    for (let id = sorted[0]!; id < sorted[sorted.length - 1]!; id++) {
      const key = `${producer}/${id}`;
      if (!ids.has(id) && !declared.has(key) && !confirmed.has(key)) {
        throw new Error(`${key} is an undeclared hole that no confirmed gap event reported`);
      }
    }
  }
}

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

describe('verifying consumer model (docs/design.md §5, §7)', () => {
  it('model - every distinct stream message takes effect exactly once, in per-producer ID order, through crashes before, during and after commits and redelivery from the offset, the last ack or earlier; header values of any AMQP 1.0 type from a hostile writer (and a tenant function returning them) never make process() throw and take effect only under a valid identity and tenant', async () => {
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
          const h = new ConsumerHarness(entries, { policy, commit, commitEvery, tenant: tenantFromWire });
          await h.start();
          await fc.asyncModelRun(() => ({ model: { running: true }, real: h }), cmds);
          const report = h.check(await h.finish());
          if (!report.ok) throw new Error(formatReport(report));
          if (h.violations.length > 0) throw new Error(h.violations.join('\n'));
          checkSkips(entries, policy, h);
        },
      ),
      { timeLimitMs: 20_000 },
    );
  });
});

class RacingCommand implements fc.AsyncCommand<object, RacingConsumer> {
  constructor(readonly step: RacingStep) {}

  check(): boolean {
    return true; // a step that does not apply (nothing running, already running) does nothing
  }

  async run(_m: object, h: RacingConsumer): Promise<void> {
    await runRacingStep(h, this.step);
  }

  toString(): string {
    return showRacingStep(this.step);
  }
}

/** What a user can set, and how the world misbehaves, per run. */
const racingOptions = fc.record({
  policy: consumerPolicy,
  commit: fc.constantFrom<'message' | 'batch'>('batch', 'message'),
  commitEvery: fc.integer({ min: 1, max: 4 }),
  commitLingerMs: fc.constantFrom(1, NEVER_MS),
  scopeTtlMs: fc.oneof(
    { weight: 1, arbitrary: fc.constant(0) },
    { weight: 2, arbitrary: fc.constant(RACING_TTL_MS) },
  ),
  slowStore: fc.oneof(
    { weight: 1, arbitrary: fc.constant(false) },
    { weight: 3, arbitrary: fc.constant(true) },
  ),
  pauses: fc.constantFrom<RacingOptions['pauses']>('scheduled', 'mixed', 'read'),
  unidentified: fc.constantFrom<RacingOptions['unidentified']>('reject', 'pass-through'),
  /** Indices into the stream's distinct messages whose handler throws the first time. */
  throwOnce: fc.uniqueArray(fc.nat({ max: 40 }), { maxLength: 2 }),
});

/** A smaller stream for the racing model: up to three producers, declared skips, copies, a message without identity. */
const racingStream: fc.Arbitrary<StreamEntry[]> = fc
  .record({
    picks: fc.array(
      fc.tuple(fc.constantFrom('a', 'b', 'c'), fc.integer({ min: 1, max: 2 }), fc.constantFrom(0, 0, 1)),
      { minLength: 1, maxLength: 16 },
    ),
    copies: fc.array(fc.tuple(fc.nat(), fc.nat({ max: 16 })), { maxLength: 6 }),
    unidentified: fc.boolean(),
  })
  .map(({ picks, copies, unidentified }) => {
    const last = new Map<string, bigint>();
    const messages: Array<{ label: string; headers: Record<string, unknown> | undefined }> = picks.map(
      ([producer, step, declare]) => {
        const previous = last.get(producer) ?? 0n;
        const id = previous + BigInt(step);
        last.set(producer, id);
        const headers: Record<string, unknown> = identityHeaders(producer, id);
        // 1: the whole jump is declared skipped; 2: all but its first ID (which stays a gap).
        const from = previous + BigInt(declare);
        if (declare > 0 && from >= 1n && from < id) headers[SKIP_HEADER] = String(from);
        return { label: `${producer}/${id}`, headers };
      },
    );
    for (const [at, later] of copies) {
      const i = at % messages.length;
      messages.splice(Math.min(messages.length, i + 1 + later), 0, messages[i]!);
    }
    if (unidentified) messages.splice(messages.length >> 1, 0, { label: 'plain/0', headers: {} });
    return messages.map((m, i) => ({ offset: BigInt(i), ...m }));
  });

describe('verifying consumer racing model (issue 15: commit boundaries, eviction, slow stores)', () => {
  it('model - asynchronous handlers that await between writes and sometimes throw, slow store writes, lingers, flushes, closes, TTL eviction racing commits, kills and reopens: every message takes effect exactly once, a throwing handler leaves nothing, and offset, dedup state and effects always match', async () => {
    // Only timers and the clock are fake (lingers fire and scopes age when the model says so);
    // setImmediate, which the world settles on, stays real.
    vi.useFakeTimers({ toFake: ['setTimeout', 'clearTimeout', 'setInterval', 'clearInterval', 'Date'] });
    const stats = {
      executions: 0,
      lives: 0,
      batches: 0,
      midHandler: 0,
      throws: 0,
      commitsDuringScan: 0,
      evicted: 0,
      reapplied: 0,
      kills: 0,
    };
    try {
      await checkWithin(
        'consumer racing model',
        fc.asyncProperty(
          racingStream,
          racingOptions,
          fc.scheduler(),
          fc.commands([racingStep.map((step) => new RacingCommand(step))], {
            maxCommands: 60,
            size: 'max',
            replayPath: process.env.FC_REPLAY_PATH,
          }),
          async (entries, { throwOnce, ...options }, s, cmds) => {
            vi.clearAllTimers();
            vi.setSystemTime(1_000_000);
            const labels = [...new Set(entries.map((e) => e.label))];
            const throwing = new Set(throwOnce.map((i) => labels[i % labels.length]!));
            const h = new RacingConsumer(entries, { ...options, throwOnce: throwing }, s, (ms) =>
              vi.advanceTimersByTime(ms),
            );
            await h.start({ kind: 'resume' });
            await fc.asyncModelRun(() => ({ model: {}, real: h }), cmds);
            const violations = await h.finish();
            stats.executions++;
            stats.lives += h.lives;
            stats.batches += h.oracle.batches;
            for (const [k, v] of Object.entries(h.coverage)) stats[k as keyof typeof h.coverage] += v;
            if (violations.length > 0) throw new Error(violations.join('\n'));
          },
        ),
        { timeLimitMs: 25_000 },
      );
    } finally {
      vi.useRealTimers();
      console.log(
        `[consumer racing model] over all executions (shrinking included): ${JSON.stringify(stats)}`,
      );
    }
  });
});
