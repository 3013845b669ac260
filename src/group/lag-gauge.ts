/**
 * A consumer group member's lag gauge (docs/design.md §16): the `stream_dedup.verifier.lag` of each
 * partition the member holds, as a `StreamVerifyingConsumer` reports its stream's (attributes
 * `consumer` = the group's name, `stream` = the partition). Sampled every `lagIntervalMs` by one
 * timer per member (one stats query per held partition); a partition the member loses is no
 * longer reported from that moment, and a sample that was under way when it was lost is dropped.
 */
import { observeLags } from '../telemetry/metrics.js';
import type { ConsumerLag } from '../transport/stream-lag.js';

/** What the gauge asks of its member. @internal */
export interface LagSource {
  /** The partitions the member holds now. */
  readonly held: () => readonly string[];
  /** One partition's lag (rejects when the partition is not held or the query fails). */
  readonly lag: (partition: string) => Promise<ConsumerLag>;
}

/** @internal */
export class GroupLagGauge {
  readonly #source: LagSource;
  /** The last sample of each partition held since it was taken. */
  readonly #samples = new Map<string, bigint>();
  /** Bumped when a partition is lost: a sample started before is dropped. */
  readonly #losses = new Map<string, number>();
  #timer: NodeJS.Timeout | undefined;
  #unobserve: () => void = () => undefined;
  #closed = false;
  #sampling: Promise<void> | undefined;

  /** Starts reporting for group `consumerName`; `intervalMs` 0: nothing is sampled or reported. */
  constructor(consumerName: string, intervalMs: number, source: LagSource) {
    this.#source = source;
    if (intervalMs === 0) {
      this.#closed = true;
      return;
    }
    this.#unobserve = observeLags(consumerName, () => this.#current());
    this.#timer = setInterval(() => void this.sample(), intervalMs).unref();
  }

  /**
   * Reads the lag of every partition held now; a failed read keeps that partition's last sample.
   * One sampling at a time: a tick while the last one still waits for the broker (each query is
   * bounded: 5 s) joins it instead of stacking queries.
   */
  sample(): Promise<void> {
    this.#sampling ??= this.#sampleNow().finally(() => (this.#sampling = undefined));
    return this.#sampling;
  }

  async #sampleNow(): Promise<void> {
    await Promise.all(
      this.#source.held().map(async (partition) => {
        const before = this.#losses.get(partition) ?? 0;
        const lag = await this.#source.lag(partition).catch(() => undefined);
        this.record(partition, lag, before);
      }),
    );
  }

  /** The loss count of `partition` now: what {@link GroupLagGauge.record} compares. */
  lossesOf(partition: string): number {
    return this.#losses.get(partition) ?? 0;
  }

  /** Keeps `lag` of `partition` if it was not lost since `losses` was read and is still held. */
  record(partition: string, lag: ConsumerLag | undefined, losses: number): void {
    if (this.#closed || lag === undefined || this.lossesOf(partition) !== losses) return;
    if (!this.#source.held().includes(partition)) return;
    this.#samples.set(partition, lag.offsets);
  }

  /** `partition` left the member: not reported any more, and a sample under way is dropped. */
  lost(partition: string): void {
    this.#losses.set(partition, this.lossesOf(partition) + 1);
    this.#samples.delete(partition);
  }

  /** Stops sampling and reporting. Idempotent. */
  close(): void {
    this.#closed = true;
    clearInterval(this.#timer);
    this.#unobserve();
    this.#samples.clear();
  }

  /** The samples of the partitions held at the collection. */
  #current(): [string, bigint][] {
    const held = new Set(this.#source.held());
    return [...this.#samples].filter(([partition]) => held.has(partition));
  }
}
