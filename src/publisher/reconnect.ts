/**
 * The publisher's reconnect loop: after a lost connection (or a connection that stopped
 * confirming) it connects again with backoff, until it succeeds, the publisher stops, or
 * `giveUpAfterMs` passes. What a new connection means (re-send, name conflict) is the core's call.
 */
import type { DedupError } from '../errors.js';
import type { Logger } from '../telemetry/logger.js';
import { Backoff, sleep } from '../util/backoff.js';
import { isPermanentFailure } from './errors.js';
import type { PublishTransport, ReconnectOptions, TransportHandlers } from './types.js';

/** What the loop asks of the publisher core. */
export interface ReconnectHooks {
  /** False once the publisher closes or fails: the loop stops at its next step. */
  stillReconnecting(): boolean;
  /** Handlers for the next connection (the core ties them to its current epoch). */
  handlers(): TransportHandlers;
  /** Connected; the broker's last ID for the name (undefined when the transport cannot tell). */
  connected(brokerLast: bigint | undefined): void;
  /** The broker refused for good (the stream was deleted): no retry can help. */
  refused(error: DedupError): void;
  /** No connection for `giveUpAfterMs`: the last attempt's error. */
  gaveUp(lastError: unknown): void;
}

export class Reconnector {
  #wake: (() => void) | undefined;
  #loop: Promise<void> | undefined;

  constructor(
    private readonly transport: PublishTransport,
    private readonly options: Required<ReconnectOptions>,
    private readonly hooks: ReconnectHooks,
  ) {}

  /** Starts the loop (the core calls it once per lost connection). */
  start(): void {
    this.#loop = this.#run();
  }

  /**
   * Cuts a backoff wait short and waits for the loop to return: call it after the core stopped
   * reconnecting, so that a connection opened meanwhile is closed after this, never before.
   */
  async stop(): Promise<void> {
    this.#wake?.();
    await this.#loop;
  }

  async #run(): Promise<void> {
    const started = performance.now();
    const backoff = new Backoff(this.options);
    while (this.hooks.stillReconnecting()) {
      await sleep(backoff.next(), (wake) => (this.#wake = wake));
      this.#wake = undefined;
      if (!this.hooks.stillReconnecting()) return;
      try {
        const brokerLast = await this.transport.connect(this.hooks.handlers());
        // Closing meanwhile: close() closes this connection once this loop has returned.
        if (this.hooks.stillReconnecting()) this.hooks.connected(brokerLast);
        return;
      } catch (err) {
        if (isPermanentFailure(err)) {
          this.hooks.refused(err);
          return;
        }
        // Whatever the last attempt failed at (connecting, or declaring the producer, as on a
        // shared client whose connection is gone), giving up is one condition with one code.
        if (performance.now() - started > this.options.giveUpAfterMs) {
          this.hooks.gaveUp(err);
          return;
        }
      }
    }
  }
}

/**
 * After a reconnect, the broker reports a last ID below one it confirmed: it lost stored messages
 * (a failover that dropped acknowledged writes) or forgot the name (docs/design.md §6.7). Not ours
 * to repair: the IDs are spent; the stream shows the hole (audit, the verifier's gap). @internal
 */
export function logBrokerBehind(
  log: Logger,
  producer: string,
  target: string,
  brokerLast: bigint,
  confirmed: bigint,
): void {
  log.error(
    { producer, target, brokerLastId: brokerLast.toString(), confirmedId: confirmed.toString() },
    'stream-dedup: the broker reports a last ID below one it confirmed: acknowledged messages may be lost (run audit)',
  );
}
