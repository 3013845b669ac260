/**
 * The subscription life of a verifying consumer, whatever its transport: subscription
 * generations (deliveries and events of a subscription that is gone are ignored), the serial queue
 * that runs deliveries and resubscriptions in order, resubscribing with backoff after a lost
 * connection, and shutting down without leaving a connection open. The transport only says how
 * to subscribe once and calls `lost()` when its connection or consumer goes away.
 */
import type { Logger } from '../telemetry/logger.js';
import { Backoff, sleep } from '../util/backoff.js';

/** A transport's connection, as far as resubscribing goes: something to close. */
export interface Connection {
  close(): Promise<unknown>;
}

/** One subscription attempt, as its transport sees it. */
export interface Generation<C extends Connection> {
  /** True while this is the consumer's current subscription: only then do its deliveries count. */
  isCurrent(): boolean;
  /** The attempt's connection is open (not yet subscribed): stopping the consumer closes it too. */
  opened(connection: C): void;
  /**
   * The subscription went away (its connection closed, its consumer was cancelled): the consumer
   * drops its uncommitted batch and subscribes again from its committed offset. Ignored unless
   * current; during the attempt itself, ignored if the attempt then fails (it is retried or
   * reported anyway).
   */
  lost(): void;
}

/** The consumer, as far as resubscribing goes. */
export interface ResubscribingCore {
  readonly consumerName: string;
  readonly committedOffset: bigint | undefined;
  /** Drops the uncommitted batch: a new subscription delivers it again. */
  discardPending(): void;
}

/** What a {@link Resubscriber} is built from. */
export interface ResubscriberOptions<C extends Connection> {
  /**
   * Opens a connection (calling `generation.opened()` with it at once) and subscribes from the
   * consumer's resume offset. On failure it closes what it opened and rejects.
   */
  readonly subscribe: (generation: Generation<C>) => Promise<void>;
  readonly core: ResubscribingCore;
  /** The backoff between attempts, in ms. */
  readonly reconnect: { readonly initialDelayMs: number; readonly maxDelayMs: number };
  readonly logger: Logger;
  /** What the consumer reads, for logs: `{ stream }` or `{ queue }`. */
  readonly target: Readonly<Record<string, string>>;
  /** Called whenever the current generation moves on: deliveries buffered for the old one go. */
  readonly onNewGeneration?: () => void;
}

/** How long closing a lost connection may take before a new one is opened. */
const CLOSE_LOST_MS = 2_000;
/** How long closing the connection may take when the consumer stops. */
const CLOSE_ON_STOP_MS = 5_000;

/** An attempt's state, shared between its {@link Generation} and the resubscriber. */
interface Attempt<C> {
  subscribing: boolean;
  lostWhileSubscribing: boolean;
  connection: C | undefined;
}

/**
 * Subscribes, resubscribes after losses, and shuts down: one implementation for every transport.
 *
 * @internal
 */
export class Resubscriber<C extends Connection> {
  readonly #options: ResubscriberOptions<C>;
  #generation = 0;
  /** The connection of the current subscription (or of the attempt under way). */
  #current: C | undefined;
  #queue: Promise<void> = Promise.resolve();
  #stopping = false;
  /** Ends the backoff wait under way, if any. */
  #wake: (() => void) | undefined;

  constructor(options: ResubscriberOptions<C>) {
    this.#options = options;
  }

  /**
   * Subscribes once, as a new generation: the first subscription, or one attempt of a
   * resubscription. Rejects with the transport's error when the attempt failed.
   */
  async subscribe(): Promise<void> {
    const attempt: Attempt<C> = { subscribing: true, lostWhileSubscribing: false, connection: undefined };
    const generation = this.#nextGeneration(attempt);
    try {
      await this.#options.subscribe(generation);
    } catch (err) {
      attempt.subscribing = false;
      if (attempt.connection !== undefined && this.#current === attempt.connection) this.#current = undefined;
      // What the failed attempt's connection reports from now on (its own closing included) is
      // not the loss of a subscription: the caller retries, or reports the failure.
      if (generation.isCurrent()) this.#retire();
      throw err;
    }
    attempt.subscribing = false;
    if (attempt.lostWhileSubscribing && !this.#stopping) this.#resubscribeLater();
  }

  /**
   * Drops subscription `generation` at once (nothing of it counts from now on), closes its
   * connection once the work queued before has run (at most 2 s, as after a loss), and subscribes
   * again `delayMs` after that, then with the usual backoff. Ignored while stopping or when
   * `generation` is no longer the current subscription (lost already, or moved on).
   */
  leave(generation: Generation<C>, delayMs: number): void {
    if (this.#stopping || !generation.isCurrent()) return;
    this.#retire();
    this.enqueue(() => this.#resubscribe(delayMs));
  }

  /**
   * Drops the current subscription at once and subscribes again from the consumer's (re-read)
   * committed offset `delayMs` later, as {@link Resubscriber.leave} does: after a fence or a
   * retryable failure of the store (VerifyingConsumerCore.onRewind). Ignored while stopping.
   */
  rewind(delayMs: number): void {
    if (this.#stopping) return;
    this.#retire();
    this.enqueue(() => this.#resubscribe(delayMs));
  }

  /** Runs `task` after everything queued before it: deliveries in order, resubscriptions between them. */
  enqueue(task: () => Promise<void>): void {
    this.#queue = this.#queue.then(task);
  }

  /**
   * Stops for good: losses are ignored from now on and a backoff wait ends at once. With
   * `commitFirst` false (stream protocol) the subscription goes first, deliveries not yet processed
   * are dropped, and then `closeCore` commits. With `commitFirst` true (AMQP 0-9-1, whose acks need
   * the channel) the queued deliveries are processed and `closeCore` commits and acks, then the
   * connection goes. Either way, a resubscription under way finishes and its connection is closed.
   */
  async shutdown(closeCore: () => Promise<void>, commitFirst: boolean): Promise<void> {
    this.#stopping = true;
    this.#wake?.();
    if (commitFirst) {
      await this.#idle();
      await closeCore();
      this.#retire();
      await this.#closeCurrent(CLOSE_ON_STOP_MS);
      return;
    }
    this.#retire(); // only the message being processed finishes
    await this.#closeCurrent(CLOSE_ON_STOP_MS);
    await this.#idle();
    // The queue may have held a resubscription whose connect was under way: it has finished now,
    // with a new connection. Closed only before the wait, that connection would stay open.
    await this.#closeCurrent(CLOSE_ON_STOP_MS);
    await closeCore();
  }

  #nextGeneration(attempt: Attempt<C>): Generation<C> {
    const number = this.#retire();
    return {
      isCurrent: () => this.#generation === number,
      opened: (connection) => {
        attempt.connection = connection;
        this.#current = connection;
      },
      lost: () => this.#lost(number, attempt),
    };
  }

  /** Moves to a new generation: events and deliveries of older ones are ignored from now on. */
  #retire(): number {
    this.#options.onNewGeneration?.();
    return ++this.#generation;
  }

  #lost(number: number, attempt: Attempt<C>): void {
    if (number !== this.#generation || this.#stopping) return;
    this.#retire();
    if (attempt.subscribing) attempt.lostWhileSubscribing = true;
    else this.#resubscribeLater();
  }

  /** Logs the loss and queues a resubscription behind the deliveries already queued. */
  #resubscribeLater(): void {
    const { core, logger, target } = this.#options;
    logger.warn(
      { consumer: core.consumerName, ...target, committedOffset: core.committedOffset?.toString() },
      'stream-dedup: verifying consumer lost its subscription; subscribing again from the committed offset',
    );
    this.enqueue(() => this.#resubscribe());
  }

  async #resubscribe(firstDelayMs?: number): Promise<void> {
    // Taken here, not when the loss was seen: a subscription in progress then has finished
    // (taken earlier, that new connection would be left open).
    const old = this.#current;
    this.#current = undefined;
    this.#options.core.discardPending();
    if (old !== undefined) await closeWithin(old, CLOSE_LOST_MS);
    const backoff = new Backoff(this.#options.reconnect);
    let delay = firstDelayMs;
    while (!this.#stopping) {
      await sleep(delay ?? backoff.next(), (wake) => (this.#wake = wake));
      delay = undefined;
      this.#wake = undefined;
      if (this.#stopping) return;
      try {
        await this.subscribe();
        return;
      } catch {
        // The next attempt waits longer.
      }
    }
  }

  /** Resolves once the queued work has run (a resubscription under way included). */
  async #idle(): Promise<void> {
    await this.#queue.catch(() => undefined);
  }

  async #closeCurrent(timeoutMs: number): Promise<void> {
    const connection = this.#current;
    this.#current = undefined;
    if (connection !== undefined) await closeWithin(connection, timeoutMs);
  }
}

/** Closes `connection`, waiting at most `ms`; never rejects. */
async function closeWithin(connection: Connection, ms: number): Promise<void> {
  let stopTimer = (): void => undefined;
  const timeout = sleep(ms, (stop) => (stopTimer = stop));
  try {
    await Promise.race([
      Promise.resolve()
        .then(() => connection.close())
        .catch(() => undefined),
      timeout,
    ]);
  } finally {
    stopTimer();
  }
}
