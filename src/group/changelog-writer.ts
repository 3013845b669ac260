/**
 * Appends a partition's changelog entries (docs/design.md §12) under one producer name shared by
 * every member of the group, with the publishing ID `lastOffset + 2` (1 is the genesis). The broker keeps one entry
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
import type { OutgoingMessage, TransportHandlers } from '../publisher/types.js';
import type { Logger } from '../telemetry/logger.js';
import { StreamTransport } from '../transport/stream-transport.js';
import { errorText, withTimeout, type StreamConnectionOptions } from '../transport/util.js';
import { Backoff, sleep } from '../util/backoff.js';
import { permanentRefusal } from './refusal.js';

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

/**
 * The part of `StreamTransport` the writer uses (tests give a model of it).
 *
 * @internal
 */
export interface ChangelogTransport {
  connect(handlers: TransportHandlers): Promise<bigint>;
  publish(messages: readonly OutgoingMessage[]): Promise<void>;
  queryLastId(): Promise<bigint>;
  close(): Promise<void>;
  readonly maxMessageBytes: number;
}

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
  /** Headers on every record (the group's settings: {@link SETTINGS_HEADER}). */
  readonly headers?: Readonly<Record<string, string>>;
  /** The transport; by default a `StreamTransport` that creates the changelog on its first connect. */
  readonly transport?: ChangelogTransport;
  /** The stream arguments the changelog is created with (its retention, §12.2). */
  readonly streamArguments?: Readonly<Record<string, number>>;
}

/** @internal */
export class ChangelogWriter {
  readonly #options: ChangelogWriterOptions;
  readonly #transport: ChangelogTransport;
  #connected = false;
  /**
   * The transport's connect under way: one at a time. A second connect tore the first one's client
   * down mid-declare, and a connect that outlived its caller's timeout assigned a client nobody
   * closed (the warm-up's, after close()).
   */
  #connecting: Promise<bigint> | undefined;
  #closed = false;
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
    this.#transport =
      options.transport ??
      new StreamTransport(
        {
          stream: options.stream,
          producerName: options.producerName,
          connection: options.connection,
          connectTimeoutMs: options.connectTimeoutMs,
          createStream: true,
        } as ConstructorParameters<typeof StreamTransport>[0],
        { streamArguments: options.streamArguments },
      );
  }

  /**
   * Connects ahead of the first append, so that a partition's first batch after a take-over does
   * not wait for it (measured: 170-355 ms, most of a first append). For a changelog that exists:
   * the connection creates a missing one, and creating it can hold up another member's restore
   * (see where it is called). Nothing depends on it: a failure is left to the next append, which
   * connects again and decides from the confirm and the broker's last ID as always.
   */
  warmUp(): void {
    if (this.#connected || this.#connecting !== undefined || this.#closed) return;
    this.#connect().then(
      () => {
        if (!this.#closed) this.#connected = true;
      },
      () => undefined,
    );
  }

  /**
   * Connects, or joins the connect under way. Every step of the transport's connect is bounded
   * (connectTimeoutMs each, 30 s of waiting out an election), so it settles; a caller that cannot
   * wait that long bounds its own wait and comes back to the same connect. One that settles after
   * close() has its connection closed.
   */
  #connect(): Promise<bigint> {
    if (this.#connecting !== undefined) return this.#connecting;
    const run = this.#transport.connect(this.#handlers);
    this.#connecting = run;
    const settled = (): void => {
      if (this.#connecting === run) this.#connecting = undefined;
      if (this.#closed) void this.#transport.close().catch(() => undefined);
    };
    run.then(settled, settled);
    return run;
  }

  /** The largest entry that fits one message. */
  get maxEntryBytes(): number {
    return this.#transport.maxMessageBytes;
  }

  /**
   * Appends `entry` with publishing ID `id`; resolves once the broker confirmed it and said whose
   * entry is the latest. Lost connections are reconnected and the entry sent again (the broker
   * keeps one copy of an ID); so is an entry that a failover lost after its confirm (the broker's
   * last ID then below ours). Gives up as soon as `isCurrent()` turns false (the partition moved).
   *
   * @throws DedupError `DEDUP_BROKER_UNREACHABLE` after `appendTimeoutMs`; `DEDUP_BROKER_REFUSED`
   *   for an entry too large for one message, or at once for a permanent refusal (access refused,
   *   a changelog that does not exist after its create: {@link permanentRefusal}); `DEDUP_CONSUMER_CLOSED` once the partition moved or
   *   the writer closed.
   */
  async append(entry: Buffer, id: bigint, isCurrent: () => boolean): Promise<AppendOutcome> {
    const { appendTimeoutMs, logger } = this.#options;
    const deadline = performance.now() + appendTimeoutMs;
    const left = (): number => Math.max(1, deadline - performance.now());
    const backoff = new Backoff(this.#options.reconnect);
    let lastError: unknown;
    for (let attempt = 0; !this.#closed && isCurrent(); attempt++) {
      if (attempt > 0) {
        if (performance.now() >= deadline) break;
        await sleep(Math.min(backoff.next(), left()));
        if (this.#closed || !isCurrent()) break;
      }
      try {
        if (!this.#connected) {
          const lastId = await withTimeout(
            this.#connect(),
            left(),
            `connecting the writer of changelog "${this.#options.stream}"`,
          );
          if (this.#closed) continue; // the loop ends: closed
          this.#connected = true;
          // Above ours: another member wrote past this entry. Equal: it may be ours, not yet
          // replicated; it is sent again below and only a confirm decides.
          if (lastId > id) return 'fenced';
        }
        if (entry.length > this.#transport.maxMessageBytes) {
          throw new DedupError(
            'DEDUP_BROKER_REFUSED',
            `changelog entry of ${entry.length} bytes is above the ${this.#transport.maxMessageBytes} ` +
              `bytes one message may carry on stream "${this.#options.stream}": lower commitEvery`,
          );
        }
        const confirmed = new Promise<boolean>((resolve) => (this.#waiter = { id, resolve }));
        await this.#transport.publish([{ publishingId: id, body: entry, headers: this.#options.headers }]);
        const outcome = await withTimeout(
          confirmed,
          left(),
          `waiting for the confirm of changelog entry ${id}`,
        );
        if (!outcome) continue; // lost: reconnect and send again
        const last = await withTimeout(
          this.#transport.queryLastId(),
          this.#options.connectTimeoutMs,
          `querying the last ID of changelog "${this.#options.stream}"`,
        );
        if (last === id) return 'landed';
        if (last > id) return 'fenced';
        // Confirmed, and yet the broker's last ID is below ours: a new leader without our entry.
        throw new Error(`the broker confirmed changelog entry ${id} but now reports ${last} as its last ID`);
      } catch (err) {
        if (err instanceof DedupError && err.code === 'DEDUP_BROKER_REFUSED' && this.#connected) throw err;
        // Refused for good (no write permission on the changelog, a changelog its create could not
        // make): retrying until appendTimeoutMs only reported it as unreachable, and the member
        // then re-ran the handler and failed again, forever. The broker's code stays in the message.
        const refusal = permanentRefusal(err);
        if (refusal !== undefined) {
          this.#waiter = undefined;
          this.#connected = false;
          throw new DedupError(
            'DEDUP_BROKER_REFUSED',
            `changelog "${this.#options.stream}" cannot be written by producer ` +
              `"${this.#options.producerName}": ${refusal}: ${errorText(err)}`,
            { cause: err },
          );
        }
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
    if (this.#closed || !isCurrent()) {
      throw new DedupError(
        'DEDUP_CONSUMER_CLOSED',
        `changelog entry ${id} on stream "${this.#options.stream}" was given up: the partition moved or the member closed`,
        { cause: lastError },
      );
    }
    throw new DedupError(
      'DEDUP_BROKER_UNREACHABLE',
      `changelog entry ${id} on stream "${this.#options.stream}" was not confirmed within ` +
        `${appendTimeoutMs} ms: ${errorText(lastError)}`,
      { cause: lastError },
    );
  }

  /** Closes the connection; an append under way rejects. Idempotent. */
  async close(): Promise<void> {
    this.#closed = true;
    this.#handlers.disconnected(new Error('closed'));
    // A connect under way is given connectTimeoutMs to end (its connection is closed once it does,
    // however late: see #connect); the transport is closed now either way.
    const connecting = this.#connecting;
    if (connecting !== undefined) {
      await withTimeout(connecting, this.#options.connectTimeoutMs, 'closing').catch(() => undefined);
    }
    await this.#transport.close();
  }
}

/**
 * Checks, at a member's `open()`, that changelog `stream` can be written under `producerName`: a
 * named publisher's declaration needs write permission on the stream, and writes nothing (no
 * record a restore could misread). Without it a member whose permissions do not cover the
 * changelogs was found only at its first append, after its handler had run. Only a changelog that
 * exists is checked: creating one here would bring a changelog deleted by hand back empty under a
 * member holding state (design §12). A missing changelog, or a failure that may pass (a timeout,
 * a lost node), is left to the first append, which stops the member on a permanent refusal too.
 *
 * @throws DedupError `DEDUP_BROKER_REFUSED` for a permanent refusal (access refused, code 16;
 *   {@link permanentRefusal}), with the broker's code in the message and its error as `cause`.
 *
 * @internal
 */
export async function checkChangelogWritable(
  o: Pick<ChangelogWriterOptions, 'stream' | 'producerName' | 'connection' | 'connectTimeoutMs'> & {
    /**
     * Whether the broker's metadata answered for the changelog with a leader: otherwise nothing is
     * checked (a missing stream, or one the user may not even see, which the restore reports).
     */
    readonly exists: boolean;
    readonly transport?: ChangelogTransport;
  },
): Promise<void> {
  // A declaration on a missing stream, or one the user may not see, waits out what may be an
  // election (up to connectTimeoutMs): such an open() paid it (measured: 11.0 s instead of 0.8 s).
  if (!o.exists) return;
  const transport =
    o.transport ??
    new StreamTransport({
      stream: o.stream,
      producerName: o.producerName,
      connection: o.connection,
      connectTimeoutMs: o.connectTimeoutMs,
    } as ConstructorParameters<typeof StreamTransport>[0]);
  const run = transport.connect({ confirmed: () => undefined, disconnected: () => undefined });
  // Closed once the connect settles, however late (a connect that outlives the wait below too).
  const close = (): void => void transport.close().catch(() => undefined);
  run.then(close, close);
  try {
    await withTimeout(run, o.connectTimeoutMs, `checking that changelog "${o.stream}" can be written`);
  } catch (err) {
    const refusal = permanentRefusal(err);
    if (refusal === undefined) return;
    throw new DedupError(
      'DEDUP_BROKER_REFUSED',
      `changelog "${o.stream}" cannot be written by producer "${o.producerName}": ${refusal}: ${errorText(err)}`,
      { cause: err },
    );
  }
}
