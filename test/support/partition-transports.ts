import { DedupError } from '../../src/errors.js';
import { permanentFailure } from '../../src/publisher/errors.js';
import type { OutgoingMessage, PublishTransport, TransportHandlers } from '../../src/publisher/types.js';
import type { Logger } from '../../src/telemetry/logger.js';

/**
 * Stand-ins for the stream transports of a super stream's partitions, for unit and property
 * tests of `SuperStreamDedupPublisher` without a broker (the test replaces `StreamTransport`
 * with {@link ScriptedTransport} through `vi.mock`). The test decides when each partition's
 * first connect answers, and when a partition fails for good: its connection drops and every
 * reconnect is refused, as when the partition is deleted.
 */
export class PartitionTransports {
  readonly #byStream = new Map<string, ScriptedTransport>();

  /**
   * The publishers' logger: a core logs "publisher open" once it exists and runs, which marks its
   * transport {@link ScriptedTransport.coreStarted} (the moment a failure can first reach it).
   */
  readonly logger: Logger = {
    debug: () => undefined,
    info: (obj, msg) => {
      const target = (obj as { target?: unknown }).target;
      if (msg === 'stream-dedup: publisher open' && typeof target === 'string') this.of(target).markStarted();
    },
    warn: () => undefined,
    error: () => undefined,
  };

  /** The transport the publisher made for `stream` (made on demand, so a test may script it first). */
  of(stream: string): ScriptedTransport {
    let t = this.#byStream.get(stream);
    if (t === undefined) {
      t = new ScriptedTransport(stream);
      this.#byStream.set(stream, t);
    }
    return t;
  }

  /** Every transport made so far. */
  all(): ScriptedTransport[] {
    return [...this.#byStream.values()];
  }

  clear(): void {
    this.#byStream.clear();
  }
}

/** A partition's transport whose first connect answers when the test says so. */
export class ScriptedTransport implements PublishTransport {
  readonly target: string;
  readonly maxMessageBytes = 1_048_576;
  readonly subEntrySize = 1;
  /** connect() calls so far (the first is open's, the others reconnects). */
  connects = 0;
  /** True once the publisher core of this partition exists and runs (see PartitionTransports.logger). */
  coreStarted = false;
  /** Resolves when {@link ScriptedTransport.coreStarted} becomes true. */
  readonly started: Promise<void>;
  #resolveStarted!: () => void;
  /** How many times close() was called. */
  closes = 0;
  /** Resolves at the first close(). */
  readonly closedOnce: Promise<void>;
  #resolveClosed!: () => void;
  #handlers: TransportHandlers | undefined;
  #refusal: DedupError | undefined;
  #highest = 0n;
  #first: { resolve: (last: bigint) => void; reject: (err: unknown) => void } | undefined;
  readonly #firstConnect: Promise<bigint>;

  constructor(target: string) {
    this.target = target;
    this.closedOnce = new Promise((resolve) => (this.#resolveClosed = resolve));
    this.started = new Promise((resolve) => (this.#resolveStarted = resolve));
    this.#firstConnect = new Promise((resolve, reject) => (this.#first = { resolve, reject }));
  }

  /** The core logged its open (it exists and runs). */
  markStarted(): void {
    this.coreStarted = true;
    this.#resolveStarted();
  }

  /** The first connect answers: the broker knows no ID for the name. */
  open(): void {
    this.#first?.resolve(0n);
  }

  /** The first connect is refused for good (the partition does not exist). */
  refuseOpen(): DedupError {
    const err = this.#refused('refused at open');
    this.#first?.reject(err);
    return err;
  }

  /**
   * The partition fails for good: the connection drops (if there is one) and every reconnect is
   * refused with a permanent `DEDUP_BROKER_REFUSED`. Returns that error.
   */
  fail(): DedupError {
    const err = this.#refused('deleted');
    this.#refusal = err;
    const handlers = this.#handlers;
    this.#handlers = undefined;
    handlers?.disconnected(new Error(`partition ${this.target} cut`));
    return err;
  }

  connect(handlers: TransportHandlers): Promise<bigint | undefined> {
    this.connects++;
    if (this.#refusal !== undefined) return Promise.reject(this.#refusal);
    this.#handlers = handlers;
    return this.connects === 1 ? this.#firstConnect : Promise.resolve(this.#highest);
  }

  publish(messages: readonly OutgoingMessage[]): Promise<void> {
    const handlers = this.#handlers;
    if (handlers === undefined) return Promise.reject(new Error('not connected'));
    const ids = messages.map((m) => m.publishingId);
    for (const id of ids) if (id > this.#highest) this.#highest = id;
    queueMicrotask(() => {
      if (this.#handlers === handlers) handlers.confirmed(ids);
    });
    return Promise.resolve();
  }

  queryLastId(): Promise<bigint | undefined> {
    return Promise.resolve(this.#highest);
  }

  close(): Promise<void> {
    this.closes++;
    this.#handlers = undefined;
    this.#resolveClosed();
    return Promise.resolve();
  }

  #refused(what: string): DedupError {
    return permanentFailure(
      new DedupError('DEDUP_BROKER_REFUSED', `partition "${this.target}" ${what} (scripted)`),
    );
  }
}
