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

/** An append under way: its entry, who waits for it, and how far it got on which connection. */
interface Pending {
  readonly id: bigint;
  readonly entry: Buffer;
  readonly isCurrent: () => boolean;
  /** When it is given up (`appendTimeoutMs` after the call), reconnections included. */
  readonly deadline: number;
  /** The number of the connection it was last sent on (0: none yet). */
  sentOn: number;
  /** Confirmed on that connection: the next last-ID query decides it. */
  confirmed: boolean;
  readonly resolve: (outcome: AppendOutcome) => void;
  readonly reject: (error: Error) => void;
}

/** @internal */
export class ChangelogWriter {
  readonly #options: ChangelogWriterOptions;
  readonly #transport: ChangelogTransport;
  #connected = false;
  /** Bumped by every connect that succeeded: an entry is sent once per connection. */
  #connection = 0;
  /**
   * The transport's connect under way: one at a time. A second connect tore the first one's client
   * down mid-declare, and a connect that outlived its caller's timeout assigned a client nobody
   * closed (the warm-up's, after close()).
   */
  #connecting: Promise<bigint> | undefined;
  #closed = false;
  /**
   * The appends under way, in the order they were made (their IDs increase): each entry is
   * computed on the one before it, so they are sent in this order on every connection, decided in
   * this order, and a failure of one ends every one after it (docs/design.md §12, pipelined appends).
   */
  #queue: Pending[] = [];
  /** The pump (connect, send, decide) is running; `#wake` ends its wait for the next event. */
  #pumping = false;
  #wake: (() => void) | undefined;
  /** A last-ID query is under way (one at a time: it decides every entry confirmed before it). */
  #querying = false;
  /** Why the last attempt failed (for the time-out's message), and failures since the last success. */
  #lastError: unknown;
  #failures = 0;
  /** The next connect waits a backoff first (the last attempt failed, or the connection was lost). */
  #retrying = false;
  readonly #backoff: Backoff;
  readonly #handlers: TransportHandlers = {
    confirmed: (ids) => {
      for (const p of this.#queue)
        if (p.sentOn === this.#connection && ids.includes(p.id)) p.confirmed = true;
      this.#kick();
    },
    disconnected: () => {
      this.#connected = false;
      this.#retrying = true;
      this.#kick();
    },
  };

  constructor(options: ChangelogWriterOptions) {
    this.#options = options;
    this.#backoff = new Backoff(options.reconnect);
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
        if (this.#closed || this.#connected) return;
        this.#connected = true;
        this.#connection++;
        this.#kick();
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
   * entry is the latest. Several appends may be under way (pipelined: each call is queued at once,
   * in call order, and IDs must increase): they are sent in order, and one last-ID query after
   * their confirms decides them all — `landed` when the broker's last ID is this entry's or that of
   * a later entry this writer has sent (ours, or another member's for the same input: the same
   * state), `fenced` when it is above this entry and none of ours. Lost connections are reconnected
   * and every entry not yet decided is sent again, in order (the broker keeps one copy of an ID); so
   * is an entry that a failover lost after its confirm (the broker's last ID then below ours). An
   * append that fails (or is fenced, or given up) ends every later one of the queue the same way:
   * they were computed on it. Gives up as soon as `isCurrent()` turns false (the partition moved).
   *
   * @throws DedupError `DEDUP_BROKER_UNREACHABLE` after `appendTimeoutMs`; `DEDUP_BROKER_REFUSED`
   *   for an entry too large for one message, or at once for a permanent refusal (access refused,
   *   a changelog that does not exist after its create: {@link permanentRefusal}); `DEDUP_CONSUMER_CLOSED` once the partition moved or
   *   the writer closed.
   */
  append(entry: Buffer, id: bigint, isCurrent: () => boolean): Promise<AppendOutcome> {
    if (this.#closed || !isCurrent()) return Promise.reject(this.#givenUp(id, undefined));
    return new Promise<AppendOutcome>((resolve, reject) => {
      this.#queue.push({
        id,
        entry,
        isCurrent,
        deadline: performance.now() + this.#options.appendTimeoutMs,
        sentOn: 0,
        confirmed: false,
        resolve,
        reject,
      });
      this.#kick();
    });
  }

  /** Closes the connection; the appends under way reject. Idempotent. */
  async close(): Promise<void> {
    this.#closed = true;
    this.#connected = false;
    this.#endFrom(0, (p) => this.#givenUp(p.id, this.#lastError));
    this.#kick();
    // A connect under way is given connectTimeoutMs to end (its connection is closed once it does,
    // however late: see #connect); the transport is closed now either way.
    const connecting = this.#connecting;
    if (connecting !== undefined) {
      await withTimeout(connecting, this.#options.connectTimeoutMs, 'closing').catch(() => undefined);
    }
    await this.#transport.close();
  }

  /** Wakes the pump, or starts it. */
  #kick(): void {
    const wake = this.#wake;
    this.#wake = undefined;
    wake?.();
    if (!this.#pumping && this.#queue.length > 0 && !this.#closed) void this.#pump();
  }

  /** Ends the queued appends from index `from` on, each with `end(p)` (an error, or an outcome). */
  #endFrom(from: number, end: (p: Pending) => Error | AppendOutcome): void {
    const ended = this.#queue.splice(from);
    for (const p of ended) {
      const outcome = end(p);
      if (outcome instanceof Error) p.reject(outcome);
      else p.resolve(outcome);
    }
  }

  #givenUp(id: bigint, cause: unknown): DedupError {
    return new DedupError(
      'DEDUP_CONSUMER_CLOSED',
      `changelog entry ${id} on stream "${this.#options.stream}" was given up: the partition moved or the member closed`,
      { cause },
    );
  }

  /**
   * Connects, sends what the connection has not carried, starts the last-ID query of what was
   * confirmed, and waits for the next event (a confirm, a loss, a new append, a deadline), until
   * the queue is empty. One pump at a time.
   */
  async #pump(): Promise<void> {
    this.#pumping = true;
    try {
      while (!this.#closed) {
        // Appends of a period that ended: given up. Only those: an append of the next period
        // queued after them was computed on that period's restore, not on them.
        if (this.#queue.some((p) => !p.isCurrent())) {
          const stale = this.#queue.filter((p) => !p.isCurrent());
          this.#queue = this.#queue.filter((p) => !stale.includes(p));
          for (const p of stale) p.reject(this.#givenUp(p.id, this.#lastError));
        }
        const head = this.#queue[0];
        if (head === undefined) return;
        if (performance.now() >= head.deadline) {
          const lastError = this.#lastError;
          this.#endFrom(
            0,
            (p) =>
              new DedupError(
                'DEDUP_BROKER_UNREACHABLE',
                `changelog entry ${p.id} on stream "${this.#options.stream}" was not confirmed within ` +
                  `${this.#options.appendTimeoutMs} ms: ${errorText(lastError)}`,
                { cause: lastError },
              ),
          );
          continue;
        }
        try {
          await this.#step(head);
        } catch (err) {
          this.#failed(err, head);
        }
      }
    } finally {
      this.#pumping = false;
    }
  }

  /** One turn of the pump with `head` the oldest append. */
  async #step(head: Pending): Promise<void> {
    const left = (): number => Math.max(1, head.deadline - performance.now());
    if (!this.#connected) {
      if (this.#retrying) {
        this.#retrying = false;
        await sleep(Math.min(this.#backoff.next(), left()));
        if (this.#closed || this.#queue[0] !== head) return;
      }
      const lastId = await withTimeout(
        this.#connect(),
        left(),
        `connecting the writer of changelog "${this.#options.stream}"`,
      );
      if (this.#closed) return;
      this.#connected = true;
      this.#connection++;
      // Above the oldest entry and none of the entries this writer has sent: another member wrote
      // past it. (An entry queued but never sent cannot be ours there: a member paused while
      // another took its partition over queues its next batch before it reconnects, and that
      // batch's ID may be the other member's latest.) Otherwise every entry not decided is sent
      // again below, and only the confirms and the last ID decide.
      if (lastId > head.id && !this.#queue.some((p) => p.id === lastId && p.sentOn !== 0)) {
        this.#endFrom(0, () => 'fenced');
        return;
      }
    }
    // What this connection has not carried, in queue order (an entry appended meanwhile goes at
    // the next turn, after these).
    const connection = this.#connection;
    for (const p of [...this.#queue]) {
      if (p.sentOn === connection) continue;
      if (!this.#connected || this.#connection !== connection || this.#queue[0] !== head) return;
      if (p.entry.length > this.#transport.maxMessageBytes) {
        throw new DedupError(
          'DEDUP_BROKER_REFUSED',
          `changelog entry of ${p.entry.length} bytes is above the ${this.#transport.maxMessageBytes} ` +
            `bytes one message may carry on stream "${this.#options.stream}": lower commitEvery`,
        );
      }
      p.sentOn = connection;
      p.confirmed = false;
      await this.#transport.publish([{ publishingId: p.id, body: p.entry, headers: this.#options.headers }]);
    }
    if (head.confirmed && head.sentOn === connection && !this.#querying) {
      // One query for every entry confirmed so far: each was stored (or dropped) before it is asked.
      const covered = this.#queue.filter((p) => p.confirmed && p.sentOn === connection);
      // What the broker can have of ours when it answers: what was sent before the query.
      const sent = new Set(this.#queue.filter((p) => p.sentOn !== 0).map((p) => p.id));
      this.#querying = true;
      void this.#decide(covered, sent, connection).finally(() => {
        this.#querying = false;
        this.#kick();
      });
    }
    // The next event: a confirm, a loss, a new append, the query's answer, or the deadline.
    await new Promise<void>((resolve) => {
      const timer = setTimeout(resolve, left());
      this.#wake = () => {
        clearTimeout(timer);
        resolve();
      };
    });
  }

  /**
   * Asks the broker for the name's last ID and decides `covered` (confirmed on `connection`, in
   * queue order) with it: equal to an entry's ID, or the ID of a later entry of ours (`sent` before
   * the query), it landed
   * (ours, or another member's for the same input); above it and none of ours, every entry from
   * it on is fenced; below it (a new leader without it), the connection is dropped and the
   * undecided entries are sent again.
   */
  async #decide(covered: readonly Pending[], sent: ReadonlySet<bigint>, connection: number): Promise<void> {
    let last: bigint;
    try {
      last = await withTimeout(
        this.#transport.queryLastId(),
        this.#options.connectTimeoutMs,
        `querying the last ID of changelog "${this.#options.stream}"`,
      );
    } catch (err) {
      if (this.#connection === connection && covered[0] !== undefined) this.#failed(err, covered[0]);
      return;
    }
    if (this.#connection !== connection) return;
    const ours = sent.has(last);
    for (const p of covered) {
      if (this.#queue[0] !== p) return; // ended meanwhile (given up, timed out)
      if (last === p.id || (last > p.id && ours)) {
        this.#queue.shift();
        this.#failures = 0;
        this.#backoff.reset();
        p.resolve('landed');
      } else if (last > p.id) {
        this.#endFrom(0, () => 'fenced');
        return;
      } else {
        // Confirmed, and yet the broker's last ID is below ours: a new leader without our entry.
        this.#failed(
          new Error(`the broker confirmed changelog entry ${p.id} but now reports ${last} as its last ID`),
          p,
        );
        return;
      }
    }
  }

  /**
   * An attempt failed: a permanent refusal ends every append at once; anything else drops the
   * connection, and the undecided entries are sent again on the next one (after a backoff).
   */
  #failed(err: unknown, head: Pending): void {
    if (err instanceof DedupError && err.code === 'DEDUP_BROKER_REFUSED' && this.#connected) {
      this.#endFrom(0, () => err);
      return;
    }
    // Refused for good (no write permission on the changelog, a changelog its create could not
    // make): retrying until appendTimeoutMs only reported it as unreachable, and the member
    // then re-ran the handler and failed again, forever. The broker's code stays in the message.
    const refusal = permanentRefusal(err);
    if (refusal !== undefined) {
      this.#connected = false;
      this.#endFrom(
        0,
        () =>
          new DedupError(
            'DEDUP_BROKER_REFUSED',
            `changelog "${this.#options.stream}" cannot be written by producer ` +
              `"${this.#options.producerName}": ${refusal}: ${errorText(err)}`,
            { cause: err },
          ),
      );
      return;
    }
    this.#lastError = err;
    this.#connected = false;
    this.#retrying = true;
    if (this.#failures++ === 0) {
      this.#options.logger.warn(
        { changelog: this.#options.stream, id: head.id.toString(), err: errorText(err) },
        'stream-dedup: changelog append failed; trying again',
      );
    }
    this.#kick();
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
