import fc from 'fast-check';
import {
  VerifyingConsumerCore,
  type VerifyEvent,
  type VerifyingConsumerOptions,
} from '../../src/consumer/core.js';
import { checkHistory, type HistoryReport, type ObservedMessage } from '../../src/history/checker.js';
import { identityHeaders, readIdentity } from '../../src/identity/headers.js';
import type { StoredMessage } from '../../test/support/model-broker.js';
import { DedupStore } from '../../src/store/store.js';
import type { PolicySpec } from '../../src/verifier/index.js';
import { memoryDisk } from '../../test/support/memory-store.js';
import { ProcessDisk, type ProcessDiskOptions } from './disk.js';
import { settle } from './turns.js';

/** One message of a stream as a consumer reads it. */
export interface StreamEntry {
  readonly offset: bigint;
  /** The logical message (its body). */
  readonly label: string;
  readonly headers: Readonly<Record<string, unknown>> | undefined;
}

/** A stream's messages as the model broker stored them, with their stamped identity. */
export function streamEntries(messages: readonly StoredMessage[]): StreamEntry[] {
  return messages.map((m, i) => ({
    offset: BigInt(i),
    label: m.body,
    headers: identityHeaders(m.producerName, m.publishingId),
  }));
}

/** Where a restarted consumer is fed from. */
export type ResumeFrom =
  /** The core's own `resumeOffset` (stream protocol). */
  | { readonly kind: 'resume' }
  /** Just after the last ack the broker received (AMQP 0-9-1 redelivers everything unacked). */
  | { readonly kind: 'acked' }
  /** `back` messages before `resumeOffset` (a broker-side offset that lags). */
  | { readonly kind: 'earlier'; readonly back: number };

/** Options of a {@link ConsumerHarness}. */
export interface ConsumerHarnessOptions {
  readonly policy: PolicySpec;
  readonly commit: 'message' | 'batch';
  readonly commitEvery?: number;
  readonly scopeTtlMs?: number;
  readonly disk?: ProcessDiskOptions;
}

interface ConsumerLife {
  readonly disk: ProcessDisk;
  readonly core: VerifyingConsumerCore;
  /** Offsets settled by the core whose ack has not reached the broker. */
  readonly pendingAcks: bigint[];
  crashed: boolean;
}

/** Never fires during a test: commits happen on `commitEvery`, `flush()` and `close()` only. */
const NO_LINGER_MS = 2_000_000_000;

/**
 * A crashable verifying consumer (DESIGN §5, credit-17): each new message appends its label to an
 * effect log committed in the same batch as the verifier state and the offset. A crash abandons the
 * core (its disk goes dead); the next life reads from the committed offset, from the last ack, or
 * from earlier. The effect log, checked with the history checker, must hold every distinct stream
 * message exactly once, in per-producer ID order.
 */
export class ConsumerHarness {
  readonly entries: readonly StreamEntry[];
  readonly options: ConsumerHarnessOptions;
  readonly disk = memoryDisk();
  life: ConsumerLife | undefined;
  /** The next offset the transport hands to the core. */
  cursor = 0n;
  /** The highest offset whose ack reached the broker (-1n: none). */
  ackedUpTo = -1n;
  readonly events: VerifyEvent[] = [];
  readonly violations: string[] = [];
  lives = 0;
  #progress = 0;

  constructor(entries: readonly StreamEntry[], options: ConsumerHarnessOptions) {
    this.entries = entries;
    this.options = options;
  }

  get isRunning(): boolean {
    return this.life !== undefined;
  }

  get remaining(): number {
    return this.entries.length - Number(this.cursor);
  }

  progress(): number {
    return this.#progress + (this.life?.disk.calls ?? 0);
  }

  async start(from: ResumeFrom = { kind: 'resume' }, diskOptions?: ProcessDiskOptions): Promise<void> {
    if (this.life !== undefined) throw new Error('already running');
    const disk = new ProcessDisk(this.disk, diskOptions ?? this.options.disk ?? {});
    const store = await DedupStore.wrap(disk);
    const options: VerifyingConsumerOptions = {
      consumerName: 'balance-projection',
      store,
      policy: this.options.policy,
      commit: this.options.commit,
      commitEvery: this.options.commitEvery ?? 1_000,
      commitLingerMs: NO_LINGER_MS,
      scopeTtlMs: this.options.scopeTtlMs ?? 0,
      onEvent: (e) => this.events.push(e),
      handler: async (message, tx) => {
        const raw = await tx.get('log');
        const log = raw === undefined ? '' : Buffer.from(raw).toString();
        tx.put('log', `${log}${message.body.toString()}\n`);
      },
    };
    const core = await VerifyingConsumerCore.open(options);
    this.lives++;
    this.life = { disk, core, pendingAcks: [], crashed: false };
    const resume = core.resumeOffset ?? 0n;
    if (from.kind === 'resume') this.cursor = resume;
    else if (from.kind === 'acked') this.cursor = this.ackedUpTo + 1n;
    else this.cursor = resume - BigInt(from.back) < 0n ? 0n : resume - BigInt(from.back);
  }

  /** The transport hands the next `count` messages to the core, one at a time. */
  async deliver(count: number): Promise<void> {
    const life = this.life;
    if (life === undefined) return;
    for (let i = 0; i < count && this.cursor < BigInt(this.entries.length); i++) {
      // A dead life's reader stops: the next life reads from its own position.
      if (this.life !== life) return;
      const entry = this.entries[Number(this.cursor)]!;
      this.cursor++;
      this.#progress++;
      await life.core.process({
        offset: entry.offset,
        content: Buffer.from(entry.label),
        applicationProperties: entry.headers,
        settle: () => {
          if (!life.crashed) life.pendingAcks.push(entry.offset);
        },
      });
    }
  }

  async flush(): Promise<void> {
    await this.life?.core.flush();
    this.#progress++;
  }

  /** The acks the core sent reach the broker. */
  acks(): void {
    const life = this.life;
    if (life === undefined) return;
    for (const offset of life.pendingAcks.splice(0)) if (offset > this.ackedUpTo) this.ackedUpTo = offset;
    this.#progress++;
  }

  /** The process dies with its uncommitted batch; `applyHeld` held commits reached the disk first. */
  async crash(applyHeld = 0): Promise<void> {
    const life = this.life;
    if (life === undefined) return;
    this.life = undefined;
    life.crashed = true;
    await life.disk.crash(applyHeld);
    // Only the dead object's linger timer: its memory is gone with it, its disk is dead.
    life.core.discardPending();
  }

  /**
   * Dies in the middle of a commit: the commit's batch reached the disk (`reached`) or not, and
   * nothing after it ran (no settle, no ack).
   */
  async crashDuringCommit(reached: boolean): Promise<void> {
    const life = this.life;
    if (life === undefined) return;
    life.disk.hold();
    const flushing = life.core.flush();
    flushing.catch(() => undefined);
    let done = false;
    void flushing.then(() => (done = true));
    await settle(() => life.disk.heldCount + (done ? 1 : 0) + life.disk.calls);
    await this.crash(reached ? 1 : 0);
  }

  /** Reads everything left, commits, closes, and returns the effect log. */
  async finish(): Promise<string[]> {
    if (this.life === undefined) await this.start();
    await this.deliver(this.remaining);
    const life = this.life!;
    await life.core.close();
    this.life = undefined;
    const store = await DedupStore.wrap(new ProcessDisk(this.disk));
    // The effect keys live under the consumer's own prefix (`u:<length>:<name>`).
    const raw = await store.db.get(`u:${'balance-projection'.length}:balance-projection` + 'log');
    return raw === undefined ? [] : Buffer.from(raw).toString().split('\n').slice(0, -1);
  }

  /**
   * The consumer-side history: every distinct identified stream message must take effect exactly
   * once (nothing lost, nothing twice), in per-producer ID order.
   */
  check(log: readonly string[]): HistoryReport {
    const identity = new Map<string, ObservedMessage>();
    for (const e of this.entries) {
      const r = readIdentity(e.headers);
      if (r.kind === 'ok') identity.set(e.label, { label: e.label, ...r.identity });
    }
    const labels = [...identity.keys()];
    return checkHistory({
      attempted: labels,
      acknowledged: labels,
      observed: log.map((label) => identity.get(label) ?? { label }),
    });
  }
}

/** One step of a consumer's life, for plans and command models. */
export type ConsumerStep =
  | { readonly kind: 'deliver'; readonly count: number }
  | { readonly kind: 'flush' }
  | { readonly kind: 'acks' }
  | { readonly kind: 'crash' }
  | { readonly kind: 'crash-during-commit'; readonly reached: boolean }
  | { readonly kind: 'start'; readonly from: ResumeFrom };

export function showStep(step: ConsumerStep): string {
  switch (step.kind) {
    case 'deliver':
      return `deliver(${step.count})`;
    case 'crash-during-commit':
      return `crashDuringCommit(${step.reached ? 'reached disk' : 'lost'})`;
    case 'start':
      return `start(${step.from.kind}${step.from.kind === 'earlier' ? ` ${step.from.back}` : ''})`;
    default:
      return step.kind;
  }
}

/** Runs one step; a step that does not apply (not running, already running) does nothing. */
export async function runStep(h: ConsumerHarness, step: ConsumerStep): Promise<void> {
  switch (step.kind) {
    case 'deliver':
      return h.deliver(step.count);
    case 'flush':
      return h.flush();
    case 'acks':
      return h.acks();
    case 'crash':
      return h.crash();
    case 'crash-during-commit':
      return h.crashDuringCommit(step.reached);
    case 'start':
      if (!h.isRunning) await h.start(step.from);
  }
}

const resumeFrom: fc.Arbitrary<ResumeFrom> = fc.oneof(
  fc.constant({ kind: 'resume' as const }),
  fc.constant({ kind: 'acked' as const }),
  fc.integer({ min: 1, max: 5 }).map((back) => ({ kind: 'earlier' as const, back })),
);

/** Consumer steps, delivery-heavy, with crashes before, during and after commits. */
export const consumerStep: fc.Arbitrary<ConsumerStep> = fc.oneof(
  {
    weight: 6,
    arbitrary: fc.integer({ min: 1, max: 6 }).map((count) => ({ kind: 'deliver' as const, count })),
  },
  { weight: 2, arbitrary: fc.constant({ kind: 'flush' as const }) },
  { weight: 2, arbitrary: fc.constant({ kind: 'acks' as const }) },
  { weight: 1, arbitrary: fc.constant({ kind: 'crash' as const }) },
  {
    weight: 2,
    arbitrary: fc.boolean().map((reached) => ({ kind: 'crash-during-commit' as const, reached })),
  },
  { weight: 2, arbitrary: resumeFrom.map((from) => ({ kind: 'start' as const, from })) },
);

/** A consumer policy: highest, or a small or large window. */
export const consumerPolicy: fc.Arbitrary<PolicySpec> = fc.oneof(
  fc.constant({ kind: 'highest' as const }),
  fc.constantFrom(1, 2, 4, 64, 1_024).map((size) => ({ kind: 'window' as const, size })),
);
