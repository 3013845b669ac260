/**
 * The publisher's timers: confirms that do not come (the connection is then replaced and the
 * messages re-sent), keys past their retention, and the broker's last ID moving above this
 * producer's own (another writer under the name).
 */
import type { Entry } from './entry.js';
import { confirmTimeoutError } from './errors.js';
import type { PendingQueue } from './pending.js';

/** What the watchdog asks of the publisher core. */
export interface WatchdogHooks {
  /** Connected and not closing: the only state in which the checks mean anything. */
  active(): boolean;
  /** `expired` sent messages went unconfirmed past the timeout: replace the connection. */
  stalled(expired: number): void;
  /** Keyed mode: drop keys past the retention. */
  pruneKeys?: (() => void) | undefined;
  /** The broker's last ID for the name, when the transport can tell. */
  queryLastId(): Promise<bigint | undefined>;
  /** The highest ID this producer may have used: a broker above it means another writer. */
  ceiling(): bigint;
  conflict(brokerLast: bigint): void;
}

export class Watchdog {
  readonly #timers: NodeJS.Timeout[] = [];

  constructor(
    private readonly opts: {
      readonly producerName: string;
      readonly confirmTimeoutMs: number;
      readonly watchIntervalMs: number;
    },
    private readonly pending: PendingQueue<Entry>,
    private readonly hooks: WatchdogHooks,
  ) {}

  start(): void {
    const { confirmTimeoutMs, watchIntervalMs } = this.opts;
    this.#every(Math.max(50, Math.min(1_000, Math.floor(confirmTimeoutMs / 4))), () => this.#checkTimeouts());
    const prune = this.hooks.pruneKeys;
    if (prune !== undefined) {
      // On open, then every minute (the age limit of an idle publisher; commits prune by count).
      prune();
      this.#every(60_000, prune);
    }
    if (watchIntervalMs > 0) this.#every(watchIntervalMs, () => void this.#watch());
  }

  stop(): void {
    for (const timer of this.#timers.splice(0)) clearInterval(timer);
  }

  #every(ms: number, tick: () => void): void {
    const timer = setInterval(tick, ms);
    timer.unref();
    this.#timers.push(timer);
  }

  #checkTimeouts(): void {
    if (!this.hooks.active()) return;
    const timeoutMs = this.opts.confirmTimeoutMs;
    const deadline = performance.now() - timeoutMs;
    let expired = 0;
    for (const e of this.pending.values()) {
      if (e.sentAt === 0 || e.sentAt > deadline) break;
      // Every stalled message counts, also those recovered from the outbox and those whose caller
      // was already told: a connection that stops confirming only them must be replaced too.
      expired++;
      if (e.reject !== undefined)
        e.settle(confirmTimeoutError(this.opts.producerName, e.publishingId, timeoutMs));
    }
    if (expired > 0) this.hooks.stalled(expired);
  }

  async #watch(): Promise<void> {
    if (!this.hooks.active()) return;
    try {
      const brokerLast = await this.hooks.queryLastId();
      if (brokerLast !== undefined && brokerLast > this.hooks.ceiling() && this.hooks.active()) {
        this.hooks.conflict(brokerLast);
      }
    } catch {
      // A failed query is the reconnect logic's business, not the watch's.
    }
  }
}
