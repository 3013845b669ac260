import fc from 'fast-check';
import type { MemoryLevel } from 'memory-level';
import {
  VerifyingConsumerCore,
  type EffectTransaction,
  type VerifyEvent,
  type VerifyingConsumerOptions,
} from '../../src/consumer/core.js';
import { checkHistory, type HistoryReport, type ObservedMessage } from '../../src/history/checker.js';
import { identityHeaders, readIdentity } from '../../src/identity/headers.js';
import { encodeScopeKey } from '../../src/identity/scope-key.js';
import type { StoredMessage } from '../../test/support/model-broker.js';
import { DedupStore, type KeyValueDb } from '../../src/store/store.js';
import { decodeTracker, type PolicySpec, type SequenceTracker } from '../../src/verifier/index.js';
import { memoryDisk } from '../../test/support/memory-store.js';
import { never, ProcessDisk, type ProcessDiskOptions } from './disk.js';
import { settle } from './turns.js';

/** One message of a stream as a consumer reads it. */
export interface StreamEntry {
  readonly offset: bigint;
  /** The logical message (its body). */
  readonly label: string;
  readonly headers: Readonly<Record<string, unknown>> | undefined;
  /** Message annotations (a hostile writer's entries: support/hostile-headers.ts). */
  readonly annotations?: Readonly<Record<string, unknown>>;
  /**
   * A hostile writer's entry: the identity it must take effect under, by construction, or
   * `null` when it must never take effect. Other entries are judged by `readIdentity`.
   */
  readonly expected?: { readonly producerName: string; readonly publishingId: bigint } | null;
}

/** A stream's messages as the model broker stored them, with their stamped identity. */
export function streamEntries(messages: readonly StoredMessage[]): StreamEntry[] {
  return messages.map((m, i) => ({
    offset: BigInt(i),
    label: m.body,
    headers: m.headers ?? identityHeaders(m.producerName, m.publishingId),
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
  /** The consumer's `tenant` function (hostile entries: one that returns a header as it is). */
  readonly tenant?: VerifyingConsumerOptions['tenant'];
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
 * A crashable verifying consumer (docs/design.md §5, credit-17): each new message appends its label to an
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
      ...(this.options.tenant === undefined ? {} : { tenant: this.options.tenant }),
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
        messageAnnotations: entry.annotations,
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
      if (e.expected !== undefined) {
        if (e.expected !== null) identity.set(e.label, { label: e.label, ...e.expected });
        continue;
      }
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

// ---------------------------------------------------------------------------------------------
// The racing model: asynchronous handlers that await between their writes and sometimes throw,
// slow store writes and eviction scans held by `fc.scheduler`, commit mode × linger × TTL
// eviction, kills and reopens. Its oracle watches every batch that reaches the disk.

type DiskOp = Parameters<KeyValueDb['batch']>[0][number];
type DiskIterator = ReturnType<KeyValueDb['iterator']>;

const CONSUMER = 'balance-projection';
const EFFECT_PREFIX = `u:${CONSUMER.length}:${CONSUMER}`;
const LOG_KEY = `${EFFECT_PREFIX}log`;
const COUNT_KEY = `${EFFECT_PREFIX}count`;
const OFFSET_KEY = `c:${CONSUMER.length}:${CONSUMER}/offset`;

/** Never fires: the racing model's timers only fire when the model advances the fake clock. */
export const NEVER_MS = NO_LINGER_MS;

function deadIterator(): DiskIterator {
  const it: DiskIterator = {
    next: () => never<IteratorResult<[string, Uint8Array]>>(),
    close: () => never<void>(),
    [Symbol.asyncIterator]: () => it,
  };
  return it;
}

/**
 * One process life's view of a disk that outlives it. While `gated`, each batch write waits for
 * `gate` before it reaches the disk (in call order), and so does each step of a scan: a slow
 * store, under the scheduler's control. Every applied batch is shown to `onApplied` right away.
 * `crash()` ends the life: a batch waiting at the gate reaches the disk or not, and every later
 * call never settles.
 */
export class RaceDisk implements KeyValueDb {
  readonly #disk: KeyValueDb;
  readonly #gate: (what: string) => Promise<void>;
  readonly #onApplied: (ops: readonly DiskOp[]) => void;
  readonly #touch: () => void;
  #dead = false;
  #chain: Promise<void> = Promise.resolve();
  /** The batch waiting at the gate (the chain lets one through at a time). */
  #atGate: { ops: DiskOp[]; options: { sync?: boolean } | undefined; skip: boolean } | undefined;
  gated = false;
  /** Scans begun and not finished. */
  scans = 0;

  constructor(
    disk: MemoryLevel<string, Uint8Array>,
    gate: (what: string) => Promise<void>,
    onApplied: (ops: readonly DiskOp[]) => void,
    touch: () => void,
  ) {
    this.#disk = disk as unknown as KeyValueDb;
    this.#gate = gate;
    this.#onApplied = onApplied;
    this.#touch = touch;
  }

  get status(): string {
    return this.#disk.status;
  }

  open(): Promise<void> {
    if (this.#dead) return never();
    return this.#disk.status === 'open' ? Promise.resolve() : this.#disk.open();
  }

  close(): Promise<void> {
    return Promise.resolve();
  }

  get(key: string): Promise<Uint8Array | undefined> {
    if (this.#dead) return never();
    this.#touch();
    return this.#disk.get(key);
  }

  iterator(options: { gte: string; lt: string }): DiskIterator {
    if (this.#dead) return deadIterator();
    this.#touch();
    const inner = this.#disk.iterator(options);
    const entries = inner[Symbol.asyncIterator]();
    const gated = this.gated;
    this.scans++;
    const it: DiskIterator = {
      next: async () => {
        if (gated) await this.#gate('a scan reads the next scope');
        if (this.#dead) return never<IteratorResult<[string, Uint8Array]>>();
        this.#touch();
        const next = await entries.next();
        if (next.done === true) this.scans--;
        return next;
      },
      close: () => inner.close(),
      [Symbol.asyncIterator]: () => it,
    };
    return it;
  }

  batch(ops: DiskOp[], options?: { sync?: boolean }): Promise<void> {
    if (this.#dead) return never();
    this.#touch();
    const gated = this.gated;
    return new Promise<void>((resolve, reject) => {
      this.#chain = this.#chain.then(async () => {
        if (gated) {
          const waiting = { ops, options, skip: false };
          this.#atGate = waiting;
          await this.#gate(`the disk writes ${describeOps(ops)}`);
          this.#atGate = undefined;
          if (waiting.skip) return;
        }
        if (this.#dead) return; // the process died before this write reached the disk
        try {
          await this.#disk.batch(ops, options);
        } catch (err) {
          reject(err instanceof Error ? err : new Error(String(err)));
          return;
        }
        this.#touch();
        this.#onApplied(ops);
        resolve();
      });
    });
  }

  /** The process dies; with `reached`, the write waiting at the gate reached the disk first (unacknowledged). */
  async crash(reached: boolean): Promise<void> {
    this.#dead = true;
    const waiting = this.#atGate;
    if (reached && waiting !== undefined) {
      waiting.skip = true;
      await this.#disk.batch(waiting.ops, waiting.options);
      this.#onApplied(waiting.ops);
    }
  }
}

function describeOps(ops: readonly DiskOp[]): string {
  return ops
    .map((op) =>
      op.key.startsWith('v:')
        ? `${op.type} scope ${scopeProducer(op.key)}`
        : op.key.startsWith(EFFECT_PREFIX)
          ? `${op.key.slice(EFFECT_PREFIX.length)}`
          : op.key === OFFSET_KEY
            ? `offset ${op.type === 'put' ? String(Buffer.from(op.value).readBigUInt64BE()) : 'del'}`
            : op.key,
    )
    .join(', ');
}

/** The producer of a scope record's key (tenant ''), for messages. */
function scopeProducer(key: string): string {
  // v: + consumer part + tenant part ("0:") + producer part ("<length>:<name>")
  const rest = key.slice(2 + `${CONSUMER.length}:${CONSUMER}`.length);
  const m = /^0:(\d+):(.*)$/s.exec(rest);
  return m === null ? key : m[2]!;
}

interface LabelInfo {
  readonly producer: string;
  readonly id: bigint;
  /** The scope record's key; '' for a message without identity. */
  readonly scope: string;
}

/**
 * Watches every batch the disk applies, in order, and checks after each one: the effect log only
 * grows; a line ending in `!` (written by a handler that then threw) is never there; the count
 * written by each handler's second write equals the log's lines (a commit never holds part of a
 * handler); the log's messages are exactly the identified messages at or below the committed
 * offset; each scope record covers the messages applied in it and records none whose effect is
 * missing; a message is applied a second time only after its scope was forgotten in between, by
 * an eviction that deleted state idle longer than the TTL (an eviction that deletes fresher state
 * is itself a violation); and each producer's messages take effect first in ID order.
 */
export class EffectOracle {
  readonly violations: string[] = [];
  log: string[] = [];
  count = 0;
  offset: bigint | undefined;
  batches = 0;
  /** Messages applied again after their scope was forgotten (allowed). */
  reapplied = 0;
  readonly #labels = new Map<string, LabelInfo>();
  readonly #byProducer = new Map<string, LabelInfo[]>();
  readonly #entries: readonly StreamEntry[];
  readonly #ttl: number;
  readonly #evictClock: () => number;
  /** Scope record key → lastSeenMs of the record on disk. */
  readonly #scopes = new Map<string, number>();
  readonly #lastApplied = new Map<string, number>();
  /** Scope record key → the batch that forgot it (legitimately) last. */
  readonly #forgottenAt = new Map<string, number>();
  readonly #sinceForgotten = new Map<string, Set<string>>();
  readonly #firstHighest = new Map<string, bigint>();

  /**
   * `passThrough`: messages without identity take effect too (`unidentified: 'pass-through'`),
   * each exactly once (nothing can forget them).
   */
  constructor(entries: readonly StreamEntry[], ttl: number, evictClock: () => number, passThrough = false) {
    this.#entries = entries;
    this.#ttl = ttl;
    this.#evictClock = evictClock;
    for (const e of entries) {
      const r = readIdentity(e.headers);
      if (this.#labels.has(e.label)) continue;
      if (r.kind !== 'ok') {
        if (passThrough) this.#labels.set(e.label, { producer: '', id: 0n, scope: '' });
        continue;
      }
      const scope =
        'v:' + encodeScopeKey({ consumer: CONSUMER, tenant: '', producer: r.identity.producerName });
      const info = { producer: r.identity.producerName, id: r.identity.publishingId, scope };
      this.#labels.set(e.label, info);
      const list = this.#byProducer.get(info.producer) ?? [];
      list.push(info);
      this.#byProducer.set(info.producer, list);
    }
  }

  #violation(what: string): void {
    if (this.violations.length < 20) this.violations.push(`batch ${this.batches}: ${what}`);
  }

  observe(ops: readonly DiskOp[]): void {
    const b = ++this.batches;
    let newLog: string[] | undefined;
    const scopePuts: Array<[string, Uint8Array]> = [];
    for (const op of ops) {
      if (op.key === LOG_KEY) {
        if (op.type === 'del') this.#violation('the effect log was deleted');
        else newLog = Buffer.from(op.value).toString().split('\n').slice(0, -1);
      } else if (op.key === COUNT_KEY) {
        this.count = op.type === 'del' ? 0 : Number(Buffer.from(op.value).toString());
      } else if (op.key === OFFSET_KEY) {
        this.offset = op.type === 'del' ? undefined : Buffer.from(op.value).readBigUInt64BE();
      } else if (op.key.startsWith('v:')) {
        if (op.type === 'put') {
          this.#scopes.set(op.key, Number(Buffer.from(op.value).readBigUInt64BE(0)));
          scopePuts.push([op.key, op.value]);
          continue;
        }
        const lastSeen = this.#scopes.get(op.key);
        if (lastSeen === undefined) continue;
        this.#scopes.delete(op.key);
        const clock = this.#evictClock();
        if (clock - lastSeen <= this.#ttl) {
          this.#violation(
            `an eviction deleted the state of producer ${scopeProducer(op.key)} written at ${lastSeen}, ` +
              `${clock - lastSeen} ms before the latest eviction clock ${clock} (scopeTtlMs ${this.#ttl})`,
          );
        } else {
          this.#forgottenAt.set(op.key, b);
          this.#sinceForgotten.set(op.key, new Set());
        }
      }
    }
    if (newLog !== undefined) this.#grow(b, newLog);
    if (this.count !== this.log.length) {
      this.#violation(
        `the count of handlers that returned is ${this.count} but the log holds ${this.log.length} lines ` +
          `(${this.log.join(' ')}): a commit holds part of a handler`,
      );
    }
    this.#checkOffset();
    for (const [key, value] of scopePuts) this.#checkScope(key, value);
  }

  #grow(b: number, newLog: string[]): void {
    const old = this.log;
    for (let i = 0; i < old.length; i++) {
      if (newLog[i] !== old[i]) {
        this.#violation(
          `the effect log lost or changed committed lines: ${old.join(' ')} → ${newLog.join(' ')}`,
        );
        break;
      }
    }
    this.log = newLog;
    for (const line of newLog.slice(old.length)) {
      if (line.endsWith('!')) {
        this.#violation(`${line.slice(0, -1)}: the write of a handler that threw is committed`);
        continue;
      }
      const info = this.#labels.get(line);
      if (info === undefined) {
        this.#violation(`${line}: applied, but it has no identity`);
        continue;
      }
      if (info.scope === '') {
        // Passed through without identity: nothing may apply it twice.
        if (this.#lastApplied.has(line)) this.#violation(`${line} (no identity): applied twice`);
        this.#lastApplied.set(line, b);
        continue;
      }
      const previous = this.#lastApplied.get(line);
      if (previous !== undefined) {
        const forgotten = this.#forgottenAt.get(info.scope);
        if (forgotten === undefined || forgotten <= previous) {
          this.#violation(
            `${line}: applied again (batches ${previous} and ${b}) without its scope being forgotten in between`,
          );
        } else {
          this.reapplied++;
        }
      } else {
        const highest = this.#firstHighest.get(info.producer) ?? 0n;
        if (info.id < highest)
          this.#violation(`${line}: took effect after ID ${highest} of ${info.producer}`);
        else this.#firstHighest.set(info.producer, info.id);
      }
      this.#lastApplied.set(line, b);
      const since = this.#sinceForgotten.get(info.scope) ?? new Set<string>();
      since.add(line);
      this.#sinceForgotten.set(info.scope, since);
    }
  }

  /** The log's messages are exactly the messages that take effect at or below the committed offset. */
  #checkOffset(): void {
    const inLog = new Set(this.log);
    const missing: string[] = [];
    const expected = new Set<string>();
    if (this.offset !== undefined) {
      for (const e of this.#entries) {
        if (e.offset > this.offset) break;
        if (!this.#labels.has(e.label)) continue;
        expected.add(e.label);
        if (!inLog.has(e.label)) missing.push(e.label);
      }
    }
    const extra = [...inLog].filter((l) => !expected.has(l));
    if (missing.length > 0 || extra.length > 0) {
      this.#violation(
        `the committed offset is ${this.offset ?? 'none'}, but ` +
          [
            missing.length > 0 ? `the effects of ${missing.join(', ')} are missing` : '',
            extra.length > 0 ? `the effects of ${extra.join(', ')} (above it) are committed` : '',
          ]
            .filter((s) => s !== '')
            .join(' and '),
      );
    }
  }

  /** The scope record covers what was applied since its scope was last forgotten, and nothing else. */
  #checkScope(key: string, value: Uint8Array): void {
    const producer = scopeProducer(key);
    let tracker: SequenceTracker;
    try {
      tracker = decodeTracker(Buffer.from(value).subarray(8));
    } catch (err) {
      this.#violation(`the state of producer ${producer} does not decode: ${String(err)}`);
      return;
    }
    const inLog = new Set(this.log);
    for (const info of this.#byProducer.get(producer) ?? []) {
      const label = `${info.producer}/${info.id}`;
      if (tracker.check(info.id).outcome === 'duplicate' && !inLog.has(label)) {
        this.#violation(`the state of producer ${producer} records ${label}, whose effect is not committed`);
      }
    }
    for (const label of this.#sinceForgotten.get(key) ?? []) {
      if (tracker.check(this.#labels.get(label)!.id).outcome === 'new') {
        this.#violation(`${label} took effect, but the state of producer ${producer} does not record it`);
      }
    }
  }

  /** After the last life: every message that takes effect did, and the offset is the last. */
  checkComplete(): void {
    const inLog = new Set(this.log);
    const lost = [...this.#labels.keys()].filter((l) => !inLog.has(l));
    if (lost.length > 0) this.#violation(`never took effect: ${lost.join(', ')}`);
    const last = this.#entries.at(-1)?.offset;
    if (last !== undefined && this.offset !== last) {
      this.#violation(
        `the committed offset is ${this.offset ?? 'none'} after reading everything, not ${last}`,
      );
    }
  }
}

/** Options of a {@link RacingConsumer}: what a user can set, and how the world misbehaves. */
export interface RacingOptions {
  readonly policy: PolicySpec;
  readonly commit: 'message' | 'batch';
  readonly commitEvery: number;
  readonly commitLingerMs: number;
  readonly scopeTtlMs: number;
  /** Batch writes and eviction scan steps wait for the scheduler (a slow store). */
  readonly slowStore: boolean;
  /** What a handler awaits between its first and second write: a store read, or the scheduler. */
  readonly pauses: 'read' | 'scheduled' | 'mixed';
  /** Messages whose handler throws after its first write, the first time it runs. */
  readonly throwOnce: ReadonlySet<string>;
  /** Messages without identity: rejected, or applied without deduplication. */
  readonly unidentified: 'reject' | 'pass-through';
}

/** What a racing run went through (printed by the model, to show what the runs reach). */
export interface RacingCoverage {
  /** A flush, close, eviction, linger or reconnect started while a handler was between its writes. */
  midHandler: number;
  /** Planted handler errors thrown. */
  throws: number;
  /** Scope records written while an eviction scan was in progress. */
  commitsDuringScan: number;
  /** Scope records deleted by eviction. */
  evicted: number;
  /** Messages processed again after a scope was forgotten (allowed). */
  reapplied: number;
  kills: number;
}

/** The planted handler error (any other error stopping the consumer is a violation). */
class HandlerThrew extends Error {}

interface RacingLife {
  readonly disk: RaceDisk;
  readonly core: VerifyingConsumerCore;
  /** False for the last, plain life that reads everything (no scheduler, no throws). */
  readonly scheduled: boolean;
  readonly pendingAcks: bigint[];
  /** Messages the transport may still hand over. */
  quota: number;
  reading: Promise<void> | undefined;
  state: 'running' | 'stopping';
  stopped: Promise<void> | undefined;
  crashed: boolean;
}

/**
 * A verifying consumer whose world races it: the transport hands messages over in the background
 * (one at a time, as the stream and AMQP consumers do), while the model flushes, advances the
 * clock (lingers fire), evicts, closes, kills and restarts it, and releases scheduled store
 * writes, scan steps and handler pauses in the scheduler's order.
 */
export class RacingConsumer {
  readonly entries: readonly StreamEntry[];
  readonly options: RacingOptions;
  readonly disk = memoryDisk();
  readonly oracle: EffectOracle;
  readonly #s: fc.Scheduler;
  readonly #advance: (ms: number) => void;
  life: RacingLife | undefined;
  cursor = 0n;
  ackedUpTo = -1n;
  lives = 0;
  /** The newest clock any eviction was asked to use (open's included). */
  evictClock = 0;
  readonly unexpected: string[] = [];
  readonly coverage: RacingCoverage = {
    midHandler: 0,
    throws: 0,
    commitsDuringScan: 0,
    evicted: 0,
    reapplied: 0,
    kills: 0,
  };
  readonly #attempts = new Map<string, number>();
  /** Handlers between their first and second write. */
  #between = 0;
  #progress = 0;

  constructor(
    entries: readonly StreamEntry[],
    options: RacingOptions,
    s: fc.Scheduler,
    advance: (ms: number) => void,
  ) {
    this.entries = entries;
    this.options = options;
    this.#s = s;
    this.#advance = advance;
    this.oracle = new EffectOracle(
      entries,
      options.scopeTtlMs,
      () => this.evictClock,
      options.unidentified === 'pass-through',
    );
  }

  progress(): number {
    return this.#progress;
  }

  #touch = (): void => {
    this.#progress++;
  };

  async #settle(): Promise<void> {
    await settle(() => this.#progress);
  }

  #applied(disk: RaceDisk, ops: readonly DiskOp[]): void {
    let puts = 0;
    for (const op of ops) {
      if (!op.key.startsWith('v:')) continue;
      if (op.type === 'del') this.coverage.evicted++;
      else puts++;
    }
    if (disk.scans > 0) this.coverage.commitsDuringScan += puts;
    const before = this.oracle.reapplied;
    this.oracle.observe(ops);
    this.coverage.reapplied += this.oracle.reapplied - before;
  }

  /** Counts a command that may begin or disturb a commit while a handler is between its writes. */
  #race(): void {
    if (this.#between > 0) this.coverage.midHandler++;
  }

  #evictNow(): number {
    const now = Date.now();
    if (now > this.evictClock) this.evictClock = now;
    return now;
  }

  /** Opens a new life (unless one is running or stopping); `scheduled` false for the plain last life. */
  async start(from: ResumeFrom, scheduled = true): Promise<void> {
    if (this.life !== undefined) return;
    const disk = new RaceDisk(
      this.disk,
      (what) => this.#s.schedule(Promise.resolve(), what),
      (ops) => this.#applied(disk, ops),
      this.#touch,
    );
    const store = await DedupStore.wrap(disk);
    if (this.options.scopeTtlMs > 0) this.#evictNow(); // open() evicts with the clock of now
    const core = await VerifyingConsumerCore.open({
      consumerName: CONSUMER,
      store,
      policy: this.options.policy,
      commit: this.options.commit,
      commitEvery: this.options.commitEvery,
      commitLingerMs: this.options.commitLingerMs,
      scopeTtlMs: this.options.scopeTtlMs,
      unidentified: this.options.unidentified,
      handler: (message, tx) => this.#handle(scheduled, message.body.toString(), tx),
    });
    // open() ran unhindered: the race starts once the consumer is open.
    disk.gated = scheduled && this.options.slowStore;
    const life: RacingLife = {
      disk,
      core,
      scheduled,
      pendingAcks: [],
      quota: 0,
      reading: undefined,
      state: 'running',
      stopped: undefined,
      crashed: false,
    };
    this.life = life;
    this.lives++;
    const resume = core.resumeOffset ?? 0n;
    if (from.kind === 'resume') this.cursor = resume;
    else if (from.kind === 'acked') this.cursor = this.ackedUpTo + 1n;
    else this.cursor = resume - BigInt(from.back) < 0n ? 0n : resume - BigInt(from.back);
    await this.#settle();
  }

  /**
   * The handler: appends its message to the log (first write), awaits a store read or the
   * scheduler, throws there if planted, then counts itself (second write).
   */
  async #handle(scheduled: boolean, label: string, tx: EffectTransaction): Promise<void> {
    const attempt = (this.#attempts.get(label) ?? 0) + 1;
    this.#attempts.set(label, attempt);
    const throws = scheduled && attempt === 1 && this.options.throwOnce.has(label);
    const log = await tx.get('log');
    tx.put('log', `${log === undefined ? '' : Buffer.from(log).toString()}${label}${throws ? '!' : ''}\n`);
    this.#progress++;
    // 'mixed': the messages with an odd ID wait for the scheduler, the others read the store.
    const pause =
      this.options.pauses === 'scheduled' ||
      (this.options.pauses === 'mixed' && label.charCodeAt(label.length - 1) % 2 === 1);
    this.#between++;
    try {
      if (scheduled && pause) await this.#s.schedule(Promise.resolve(), `the handler of ${label} goes on`);
      else await tx.get('other');
    } finally {
      this.#between--;
    }
    this.#progress++;
    if (throws) {
      this.coverage.throws++;
      throw new HandlerThrew(`the handler of ${label} threw after its first write`);
    }
    const count = await tx.get('count');
    tx.put('count', String((count === undefined ? 0 : Number(Buffer.from(count).toString())) + 1));
  }

  /** The transport hands over `count` more messages, one at a time, in the background. */
  async deliver(count: number): Promise<void> {
    const life = this.life;
    if (life === undefined || life.state !== 'running') return;
    life.quota += count;
    life.reading ??= this.#read(life).finally(() => (life.reading = undefined));
    await this.#settle();
  }

  async #read(life: RacingLife): Promise<void> {
    while (life.quota > 0 && this.life === life && life.state === 'running') {
      if (this.cursor >= BigInt(this.entries.length)) return;
      life.quota--;
      const entry = this.entries[Number(this.cursor)]!;
      this.cursor++;
      this.#progress++;
      try {
        const pending = life.core.process({
          offset: entry.offset,
          content: Buffer.from(entry.label),
          applicationProperties: entry.headers,
          settle: () => {
            if (!life.crashed) life.pendingAcks.push(entry.offset);
          },
        });
        if (pending !== undefined) await pending;
      } catch (err) {
        if (life.crashed) return;
        if (!(err instanceof HandlerThrew)) {
          this.unexpected.push(`life ${this.lives}: the consumer stopped with ${String(err)}`);
        }
        // As the transports do: a stop closes the consumer (nothing of its batch is kept).
        void this.#stop(life);
        return;
      }
    }
  }

  #stop(life: RacingLife): Promise<void> {
    if (life.stopped !== undefined) return life.stopped;
    life.state = 'stopping';
    life.stopped = life.core.close().then(
      () => {
        if (this.life === life) this.life = undefined;
      },
      (err: unknown) => {
        this.unexpected.push(`close() failed: ${String(err)}`);
      },
    );
    return life.stopped;
  }

  /** Releases up to `count` scheduled tasks, one at a time, in the scheduler's order. */
  async release(count: number): Promise<void> {
    for (let i = 0; i < count; i++) {
      await this.#settle();
      if (this.#s.count() === 0) return;
      await this.#s.waitNext(1);
    }
    await this.#settle();
  }

  /** An explicit `flush()`, not awaited. */
  async flush(): Promise<void> {
    const life = this.life;
    if (life === undefined || life.state !== 'running') return;
    this.#race();
    void life.core.flush().catch(() => undefined);
    await this.#settle();
  }

  /** Time passes: lingers due fire; scopes age. */
  async advance(ms: number): Promise<void> {
    this.#race();
    this.#advance(ms);
    await this.#settle();
  }

  /** An eviction pass with the clock of now (what the hourly timer runs), not awaited. */
  async evict(): Promise<void> {
    const life = this.life;
    if (life === undefined || life.state !== 'running' || this.options.scopeTtlMs === 0) return;
    this.#race();
    void life.core.evictIdle(this.#evictNow()).catch(() => undefined);
    await this.#settle();
  }

  /** A graceful `close()`, not awaited: the life ends when it resolves. */
  async close(): Promise<void> {
    const life = this.life;
    if (life === undefined) return;
    this.#race();
    void this.#stop(life);
    await this.#settle();
  }

  /**
   * A lost connection, handled as a direct user of the core would: the uncommitted batch is
   * dropped at once (a handler in progress included) and delivery starts again from the
   * committed offset.
   */
  async reconnect(): Promise<void> {
    const life = this.life;
    if (life === undefined || life.state !== 'running') return;
    this.#race();
    life.core.discardPending();
    this.cursor = life.core.resumeOffset ?? 0n;
    await this.#settle();
  }

  /** The acks the core sent reach the broker. */
  acks(): void {
    const life = this.life;
    if (life === undefined) return;
    for (const offset of life.pendingAcks.splice(0)) if (offset > this.ackedUpTo) this.ackedUpTo = offset;
  }

  /** kill -9: the uncommitted batch is gone; with `reached`, a write waiting at the store reached the disk. */
  async crash(reached: boolean): Promise<void> {
    const life = this.life;
    if (life === undefined) return;
    this.life = undefined;
    life.crashed = true;
    this.coverage.kills++;
    await life.disk.crash(reached);
    // The dead object's linger timer only: its memory is gone with it.
    life.core.discardPending();
    await this.#settle();
  }

  /**
   * The end: the scheduled world runs until nothing is held (the life, if any, closes), then a
   * plain life reads everything left and closes; returns every violation seen.
   */
  async finish(): Promise<string[]> {
    await this.#drain();
    if (this.life !== undefined) {
      void this.#stop(this.life);
      await this.#drain();
    }
    if (this.life !== undefined) throw new Error('the last scheduled life never closed');
    await this.start({ kind: 'resume' }, false);
    const life = this.life!;
    life.quota = Number.POSITIVE_INFINITY;
    // Nothing is scheduled any more: a deadlock shows as a world that settles with work left
    // (the fake timers cannot bound it).
    await this.#untilDone(this.#read(life), 'the plain life never finished reading');
    await this.#untilDone(this.#stop(life), 'the plain life never closed');
    this.oracle.checkComplete();
    return [...this.unexpected, ...this.oracle.violations];
  }

  async #untilDone(work: Promise<void>, stuck: string): Promise<void> {
    let done = false;
    const watched = work.finally(() => (done = true));
    await settle(() => this.#progress + (done ? 1 : 0), 5_000);
    if (!done) throw new Error(stuck);
    await watched;
  }

  async #drain(): Promise<void> {
    for (let i = 0; i < 5_000; i++) {
      await this.#settle();
      if (this.#s.count() === 0) return;
      await this.#s.waitNext(1);
    }
    throw new Error('the scheduled world never went idle');
  }
}

/** One step of the racing model. */
export type RacingStep =
  | { readonly kind: 'deliver'; readonly count: number }
  | { readonly kind: 'release'; readonly count: number }
  | { readonly kind: 'flush' }
  | { readonly kind: 'advance'; readonly ms: number }
  | { readonly kind: 'evict' }
  | { readonly kind: 'close' }
  | { readonly kind: 'reconnect' }
  | { readonly kind: 'acks' }
  | { readonly kind: 'crash'; readonly reached: boolean }
  | { readonly kind: 'start'; readonly from: ResumeFrom };

export function showRacingStep(step: RacingStep): string {
  switch (step.kind) {
    case 'deliver':
    case 'release':
      return `${step.kind}(${step.count})`;
    case 'advance':
      return `advance(${step.ms} ms)`;
    case 'crash':
      return `crash(${step.reached ? 'the held write reached the disk' : 'held write lost'})`;
    case 'start':
      return `start(${step.from.kind}${step.from.kind === 'earlier' ? ` ${step.from.back}` : ''})`;
    default:
      return `${step.kind}()`;
  }
}

export async function runRacingStep(h: RacingConsumer, step: RacingStep): Promise<void> {
  switch (step.kind) {
    case 'deliver':
      return h.deliver(step.count);
    case 'release':
      return h.release(step.count);
    case 'flush':
      return h.flush();
    case 'advance':
      return h.advance(step.ms);
    case 'evict':
      return h.evict();
    case 'close':
      return h.close();
    case 'reconnect':
      return h.reconnect();
    case 'acks':
      return h.acks();
    case 'crash':
      return h.crash(step.reached);
    case 'start':
      return h.start(step.from);
  }
}

/** The TTL of the racing model, and the clock steps: a linger, less than the TTL, more than it. */
export const RACING_TTL_MS = 1_000;

/** Racing steps: deliveries and releases mostly, then the paths that begin or disturb a commit. */
export const racingStep: fc.Arbitrary<RacingStep> = fc.oneof(
  {
    weight: 6,
    arbitrary: fc.integer({ min: 1, max: 4 }).map((count) => ({ kind: 'deliver' as const, count })),
  },
  {
    weight: 8,
    arbitrary: fc.integer({ min: 1, max: 4 }).map((count) => ({ kind: 'release' as const, count })),
  },
  { weight: 2, arbitrary: fc.constant({ kind: 'flush' as const }) },
  { weight: 1, arbitrary: fc.constant({ kind: 'advance' as const, ms: 1 }) },
  { weight: 1, arbitrary: fc.constant({ kind: 'advance' as const, ms: RACING_TTL_MS / 2 }) },
  { weight: 2, arbitrary: fc.constant({ kind: 'advance' as const, ms: RACING_TTL_MS + 1 }) },
  { weight: 2, arbitrary: fc.constant({ kind: 'evict' as const }) },
  { weight: 1, arbitrary: fc.constant({ kind: 'close' as const }) },
  { weight: 2, arbitrary: fc.constant({ kind: 'reconnect' as const }) },
  { weight: 1, arbitrary: fc.constant({ kind: 'acks' as const }) },
  { weight: 1, arbitrary: fc.boolean().map((reached) => ({ kind: 'crash' as const, reached })) },
  { weight: 2, arbitrary: resumeFrom.map((from) => ({ kind: 'start' as const, from })) },
);
