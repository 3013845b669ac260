/**
 * Warm standbys of a group member (`standbyReplicas`, docs/design.md §12.3): a background loop
 * that keeps a copy of the partitions the choice rule (standby-choice.ts) picks among those the
 * member does not hold, by running the take-over's own restore into the copy's keys
 * (standby-copy.ts) every {@link STANDBY_INTERVAL_MS}. A take-over first claims its partition:
 * the loop stops tailing it (a step still connecting is dropped at once, its late connection closed
 * when it comes; a step past its connect abandons before its next write and is waited for), then the
 * copy is adopted. A tail that fails is logged and retried later with a backoff; it
 * never stops the member. One tail at a time, all on one reader client kept across steps and
 * copies (its subscription connections kept too: reader-connector.ts), replaced only after a step
 * failed (a decode error, a closed connection, a time-out) or when its deliveries stopped decoding.
 */
import type { Client } from 'rabbitmq-stream-js-client';
import type { Logger } from '../telemetry/logger.js';
import type { KeyValueDb } from '../store/store.js';
import { deliveryDecodeFailure } from '../transport/stream-client-internals.js';
import { errorText, withTimeout } from '../transport/util.js';
import { RestoreAbandoned, type RestoreReport } from './restore.js';
import { chooseStandbys } from './standby-choice.js';
import { deleteStandbyCopy, hasStandbyCopy, standbyMemberId, standbyView } from './standby-copy.js';
import { snapshotProducerName } from './snapshot-entry.js';
import { restoreWithSnapshots } from './snapshot-restore.js';

/** How often the copies are brought up to the changelog's end: a take-over applies about this much. */
export const STANDBY_INTERVAL_MS = 250;
/** The longest wait between two tries of a copy whose tail failed. */
const MAX_BACKOFF_MS = 30_000;
/** A tail's quiet wait before it asks the end again (short: a take-over may wait for it to stop). */
const STANDBY_STALL_MS = 1_000;
/**
 * How long a copy is kept while its partition is not among those this member tails (a rebalance
 * may bring it back soon) before it is deleted. With `standbyReplicas` 0 copies go at once.
 */
export const STANDBY_COPY_KEEP_MS = 60_000;

/** A partition a member may keep a copy of. @internal */
export interface StandbyPartition {
  readonly partition: string;
  readonly namespace: string;
  readonly changelog: string;
}

/** @internal */
export interface StandbyTailOptions {
  readonly db: KeyValueDb;
  readonly sync: boolean;
  readonly consumerName: string;
  readonly partitions: readonly StandbyPartition[];
  /** `standbyReplicas`: how many partitions this member tails (0: it only deletes its copies). */
  readonly replicas: number;
  /** The changelogs' producer name, and the settings header their records must carry. */
  readonly producerName: string;
  readonly settings: string | undefined;
  /** True while the member holds `partition` (active). */
  readonly isActive: (partition: string) => boolean;
  /**
   * Connects a reader client (its time bounded by the connector: connectTimeoutMs per endpoint). The
   * tail keeps it across steps and copies, and closes it after a failed step and at close().
   */
  readonly connect: () => Promise<Client>;
  readonly restoreTimeoutMs: number;
  readonly log: Logger;
  /** Tests lower it. @defaultValue {@link STANDBY_INTERVAL_MS} */
  readonly intervalMs?: number;
  /** Tests lower it. @defaultValue {@link STANDBY_COPY_KEEP_MS} */
  readonly keepCopyMs?: number;
  /** After a copy was deleted entirely (tests, diagnostics). */
  readonly onDeleted?: (partition: string) => void;
  /** After each tail step that read something (tests, diagnostics). */
  readonly onTailed?: (partition: string, report: RestoreReport) => void;
}

/** @internal */
export class StandbyTailer {
  readonly #o: StandbyTailOptions;
  readonly #byName: ReadonlyMap<string, StandbyPartition>;
  /** Partitions a take-over claimed (not tailed until released). */
  readonly #claimed = new Set<string>();
  readonly #failures = new Map<string, { count: number; retryAt: number }>();
  #running:
    { readonly partition: string; readonly step: Promise<void>; readonly stop: AbortController } | undefined;
  #chosen: readonly string[] = [];
  /** Partitions whose copy (or part of one) may be in the store, and when each was last chosen. */
  readonly #copies = new Set<string>();
  readonly #chosenAt = new Map<string, number>();
  #closed = false;
  /** The reader client kept across steps and copies (undefined: connect at the next step). */
  #reader: Client | undefined;
  /** Closings of discarded readers: close() waits for them (each bounded). */
  readonly #closings = new Set<Promise<void>>();
  #wake: (() => void) | undefined;
  readonly #loop: Promise<void>;

  constructor(o: StandbyTailOptions) {
    this.#o = o;
    this.#byName = new Map(o.partitions.map((p) => [p.partition, p]));
    this.#loop = this.#run();
  }

  /** The partitions chosen at the last round (tailed, or waiting for a retry). */
  get chosen(): readonly string[] {
    return this.#chosen;
  }

  /**
   * A take-over of `partition` begins: its tail stops (a step still connecting ends at once; one
   * past its connect ends before its next write, and is waited for) and does not start again until
   * {@link StandbyTailer.release}.
   */
  async claim(partition: string): Promise<void> {
    this.#claimed.add(partition);
    const running = this.#running;
    if (running?.partition !== partition) return;
    running.stop.abort();
    await running.step;
  }

  /** The take-over of `partition` ended (held now, or failed): the rule decides again. */
  release(partition: string): void {
    this.#claimed.delete(partition);
  }

  /** Stops the loop; resolves once the step under way ended and the reader client closed. */
  async close(): Promise<void> {
    this.#closed = true;
    this.#running?.stop.abort();
    this.#wake?.();
    await this.#loop;
    this.#discardReader();
    await Promise.all([...this.#closings]);
  }

  /** The kept reader client goes (closed in the background, within 5 s); the next step connects. */
  #discardReader(): void {
    const reader = this.#reader;
    this.#reader = undefined;
    if (reader === undefined) return;
    const closing = withTimeout(
      Promise.resolve().then(() => reader.close()),
      5_000,
      'closing',
    ).catch(() => undefined);
    this.#closings.add(closing);
    void closing.then(() => this.#closings.delete(closing));
  }

  #held(partition: string): boolean {
    return this.#claimed.has(partition) || this.#o.isActive(partition);
  }

  async #run(): Promise<void> {
    let memberId = '';
    const started = performance.now();
    try {
      if (this.#o.replicas > 0) memberId = await standbyMemberId(this.#o.db, this.#o.sync);
      for (const p of this.#o.partitions)
        if (await hasStandbyCopy(this.#o.db, p.namespace)) this.#copies.add(p.partition);
    } catch (err) {
      this.#o.log.error(
        { consumer: this.#o.consumerName, err: errorText(err) },
        'stream-dedup: the store failed reading the standby ID or copies; this member keeps no standby copies',
      );
      return;
    }
    const names = this.#o.partitions.map((p) => p.partition);
    const interval = this.#o.intervalMs ?? STANDBY_INTERVAL_MS;
    const keep = this.#o.replicas === 0 ? 0 : (this.#o.keepCopyMs ?? STANDBY_COPY_KEEP_MS);
    while (!this.#closed) {
      this.#chosen = chooseStandbys(memberId, names, (p) => this.#held(p), this.#o.replicas);
      for (const partition of this.#chosen) {
        if (this.#closed) break;
        this.#chosenAt.set(partition, performance.now());
        const failed = this.#failures.get(partition);
        if (this.#held(partition) || (failed !== undefined && performance.now() < failed.retryAt)) continue;
        this.#copies.add(partition);
        await this.#step(partition, (signal) => this.#tail(partition, signal));
      }
      // Copies this member has not tailed for `keep` go; never one a take-over claimed (it may adopt it).
      for (const partition of [...this.#copies]) {
        if (this.#closed) break;
        if (this.#chosen.includes(partition) || this.#claimed.has(partition)) continue;
        if (performance.now() - (this.#chosenAt.get(partition) ?? started) < keep) continue;
        await this.#step(partition, () => this.#delete(partition));
      }
      if (this.#closed || (this.#o.replicas === 0 && this.#copies.size === 0)) break;
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, interval);
        this.#wake = () => {
          clearTimeout(timer);
          resolve();
        };
      });
      this.#wake = undefined;
    }
  }

  /** Runs one step of `partition` as the running one (a claim of it aborts it and waits for it). */
  async #step(partition: string, run: (signal: AbortSignal) => Promise<void>): Promise<void> {
    const stop = new AbortController();
    const step = run(stop.signal);
    this.#running = { partition, step, stop };
    await step;
    this.#running = undefined;
  }

  /** Deletes the copy of `partition` (stopped between two batches by a claim or close). Never rejects. */
  async #delete(partition: string): Promise<void> {
    const p = this.#byName.get(partition);
    if (p === undefined) return;
    try {
      const gone = await deleteStandbyCopy(
        this.#o.db,
        this.#o.sync,
        p.namespace,
        () => !this.#closed && !this.#claimed.has(partition),
      );
      if (!gone) return;
      this.#copies.delete(partition);
      this.#o.log.info(
        { consumer: this.#o.consumerName, partition, standbyReplicas: this.#o.replicas },
        'stream-dedup: deleted the standby copy of a partition this member no longer tails',
      );
      this.#o.onDeleted?.(partition);
    } catch (err) {
      this.#o.log.warn(
        { consumer: this.#o.consumerName, partition, err: errorText(err) },
        'stream-dedup: deleting a standby copy failed; tried again at the next round',
      );
    }
  }

  /** One step: the copy of `partition` brought to the changelog's end as it was. Never rejects. */
  async #tail(partition: string, signal: AbortSignal): Promise<void> {
    const p = this.#byName.get(partition);
    if (p === undefined) return;
    const current = (): boolean => !this.#closed && !this.#held(partition);
    const snapshots = snapshotProducerName(this.#o.producerName);
    // A client one of whose connections delivered a frame that did not decode drops every later
    // delivery of that connection: replaced, never read again.
    if (this.#reader !== undefined && deliveryDecodeFailure(this.#reader) !== undefined)
      this.#discardReader();
    try {
      let client = this.#reader;
      if (client === undefined) {
        client = await connectUnlessStopped(this.#o.connect, signal);
        if (client === undefined) return;
        this.#reader = client;
      }
      const report = await restoreWithSnapshots(
        {
          db: standbyView(this.#o.db),
          sync: this.#o.sync,
          namespace: p.namespace,
          changelog: p.changelog,
          producerName: this.#o.producerName,
          settings: this.#o.settings,
          client,
          stallMs: STANDBY_STALL_MS,
          timeoutMs: this.#o.restoreTimeoutMs,
          isCurrent: current,
        },
        { reference: snapshots, producerName: snapshots },
        (fields, message) => this.#o.log.info({ ...fields, partition, standby: true }, message),
      );
      this.#failures.delete(partition);
      if (report.read > 0) this.#o.onTailed?.(partition, report);
    } catch (err) {
      // The restore closed its subscription: the client serves the next step.
      if (err instanceof RestoreAbandoned) return;
      // Anything else may have left the client unusable (a closed connection, a time-out, a frame
      // that did not decode): the next step connects anew.
      this.#discardReader();
      if (!current()) return;
      const count = (this.#failures.get(partition)?.count ?? 0) + 1;
      const backoff = Math.min(MAX_BACKOFF_MS, (this.#o.intervalMs ?? STANDBY_INTERVAL_MS) * 2 ** count);
      this.#failures.set(partition, { count, retryAt: performance.now() + backoff });
      this.#o.log.warn(
        {
          consumer: this.#o.consumerName,
          partition,
          failures: count,
          retryInMs: backoff,
          err: errorText(err),
        },
        'stream-dedup: tailing a standby copy failed; the copy is kept as it is and tried again later',
      );
    }
  }
}

/**
 * `connect()` raced against `signal` (a claim or close): a connect to a node that went away lasts up
 * to connectTimeoutMs per endpoint, and a take-over must not wait for it. Undefined when stopped
 * first; the connection that comes later is closed, a late failure dropped.
 */
async function connectUnlessStopped(
  connect: () => Promise<Client>,
  signal: AbortSignal,
): Promise<Client | undefined> {
  if (signal.aborted) return undefined;
  const pending = connect();
  let onAbort: (() => void) | undefined;
  const stopped = new Promise<undefined>((resolve) => {
    onAbort = () => resolve(undefined);
    signal.addEventListener('abort', onAbort, { once: true });
  });
  try {
    const won = await Promise.race([pending, stopped]);
    if (won === undefined)
      pending.then((late) => Promise.resolve().then(() => late.close())).catch(() => undefined);
    return won;
  } finally {
    if (onAbort !== undefined) signal.removeEventListener('abort', onAbort);
  }
}
