/**
 * Appends a partition's changelog entries (docs/design.md §12) under one producer name shared by
 * every member of the group, with the publishing ID `lastOffset + 1`. The broker keeps one entry
 * per ID and drops an entry at or below the highest one it holds (and still confirms it): two
 * members that both think they own the partition write the same IDs for the same input, and the
 * broker keeps one copy. After each confirm the writer asks the broker for the name's last ID:
 * equal to ours, our entry (or one of another member for the same input) is the changelog's
 * latest; above ours, another member wrote past us and our entry was dropped: `fenced`.
 *
 * Not a `DedupPublisher`: that one promises a single writer per name and IDs above its own last
 * one, and keeps an outbox. The changelog has several writers by design and is itself the log
 * that is written first; a batch whose entry was not confirmed is simply not committed, and its
 * messages are processed again.
 */
import type { Client } from 'rabbitmq-stream-js-client';
import { DedupError } from '../errors.js';
import type { TransportHandlers } from '../publisher/types.js';
import type { Logger } from '../telemetry/logger.js';
import { StreamTransport } from '../transport/stream-transport.js';
import { errorText, withTimeout, type StreamConnectionOptions } from '../transport/util.js';
import { Backoff, sleep } from '../util/backoff.js';

/**
 * What an append found.
 *
 * @internal
 */
export type AppendOutcome =
  /** The changelog's last ID is our entry's: ours, or another member's for the same input. */
  | 'landed'
  /** The changelog holds a higher ID: another member wrote past our entry, which was dropped. */
  | 'fenced';

/** @internal */
export interface ChangelogWriterOptions {
  readonly stream: string;
  readonly producerName: string;
  readonly connection: StreamConnectionOptions | Client | undefined;
  readonly connectTimeoutMs: number;
  /** How long one append may take, reconnections included, before it rejects. */
  readonly appendTimeoutMs: number;
  readonly reconnect: { readonly initialDelayMs: number; readonly maxDelayMs: number };
  readonly logger: Logger;
}

/** @internal */
export class ChangelogWriter {
  readonly #options: ChangelogWriterOptions;
  readonly #transport: StreamTransport;
  #connected = false;
  #closed = false;
  /** The broker's last ID as the last connect reported it. */
  #lastIdAtConnect = 0n;
  /** The confirm or loss the append under way waits for. */
  #waiter: { id: bigint; resolve: (confirmed: boolean) => void } | undefined;
  readonly #handlers: TransportHandlers = {
    confirmed: (ids) => {
      const waiter = this.#waiter;
      if (waiter !== undefined && ids.includes(waiter.id)) {
        this.#waiter = undefined;
        waiter.resolve(true);
      }
    },
    disconnected: () => {
      this.#connected = false;
      const waiter = this.#waiter;
      this.#waiter = undefined;
      waiter?.resolve(false);
    },
  };

  constructor(options: ChangelogWriterOptions) {
    this.#options = options;
    this.#transport = new StreamTransport({
      stream: options.stream,
      producerName: options.producerName,
      connection: options.connection,
      connectTimeoutMs: options.connectTimeoutMs,
      createStream: true,
    } as ConstructorParameters<typeof StreamTransport>[0]);
  }

  /** The largest entry that fits one message. */
  get maxEntryBytes(): number {
    return this.#transport.maxMessageBytes;
  }

  /**
   * Appends `entry` with publishing ID `id`; resolves once the broker confirmed it and said whose
   * entry is the latest. Lost connections are reconnected and the entry sent again (the broker
   * keeps one copy of an ID).
   *
   * @throws DedupError `DEDUP_BROKER_UNREACHABLE` after `appendTimeoutMs`; `DEDUP_BROKER_REFUSED`
   *   for an entry too large for one message, or a broker whose last ID is below a confirmed one.
   */
  async append(entry: Buffer, id: bigint): Promise<AppendOutcome> {
    const { appendTimeoutMs, logger } = this.#options;
    const deadline = performance.now() + appendTimeoutMs;
    const backoff = new Backoff(this.#options.reconnect);
    let lastError: unknown;
    for (let attempt = 0; !this.#closed; attempt++) {
      if (attempt > 0) {
        if (performance.now() >= deadline) break;
        await sleep(Math.min(backoff.next(), Math.max(1, deadline - performance.now())));
      }
      try {
        if (!this.#connected) {
          this.#lastIdAtConnect = await this.#transport.connect(this.#handlers);
          this.#connected = true;
          // Our ID, or one above, is there already: an earlier attempt landed, or another member's.
          if (this.#lastIdAtConnect >= id) return this.#judge(id, this.#lastIdAtConnect);
        }
        if (entry.length > this.#transport.maxMessageBytes) {
          throw new DedupError(
            'DEDUP_BROKER_REFUSED',
            `changelog entry of ${entry.length} bytes is above the ${this.#transport.maxMessageBytes} ` +
              `bytes one message may carry on stream "${this.#options.stream}": lower commitEvery`,
          );
        }
        const confirmed = new Promise<boolean>((resolve) => (this.#waiter = { id, resolve }));
        await this.#transport.publish([{ publishingId: id, body: entry, headers: undefined }]);
        const left = Math.max(1, deadline - performance.now());
        const outcome = await withTimeout(
          confirmed,
          left,
          `waiting for the confirm of changelog entry ${id}`,
        );
        if (!outcome) continue; // lost: reconnect and send again
        const last = await withTimeout(
          this.#transport.queryLastId(),
          this.#options.connectTimeoutMs,
          `querying the last ID of changelog "${this.#options.stream}"`,
        );
        return this.#judge(id, last);
      } catch (err) {
        if (err instanceof DedupError && err.code === 'DEDUP_BROKER_REFUSED' && this.#connected) throw err;
        lastError = err;
        this.#waiter = undefined;
        this.#connected = false;
        if (attempt === 0) {
          logger.warn(
            { changelog: this.#options.stream, id: id.toString(), err: errorText(err) },
            'stream-dedup: changelog append failed; trying again',
          );
        }
      }
    }
    throw new DedupError(
      this.#closed ? 'DEDUP_CONSUMER_CLOSED' : 'DEDUP_BROKER_UNREACHABLE',
      this.#closed
        ? 'the consumer closed while a changelog entry was being appended'
        : `changelog entry ${id} on stream "${this.#options.stream}" was not confirmed within ` +
            `${appendTimeoutMs} ms: ${errorText(lastError)}`,
      { cause: lastError },
    );
  }

  /** Closes the connection; an append under way rejects. Idempotent. */
  async close(): Promise<void> {
    this.#closed = true;
    this.#handlers.disconnected(new Error('closed'));
    await this.#transport.close();
  }

  #judge(id: bigint, last: bigint): AppendOutcome {
    if (last === id) return 'landed';
    if (last > id) return 'fenced';
    throw new DedupError(
      'DEDUP_BROKER_REFUSED',
      `changelog "${this.#options.stream}": the broker confirmed entry ${id} but reports ${last} as its last ID`,
    );
  }
}
