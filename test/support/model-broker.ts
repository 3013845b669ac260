import { InvariantError } from '../../src/publisher/errors.js';
import type { OutgoingMessage, PublishTransport, TransportHandlers } from '../../src/publisher/types.js';

/** A message the model broker stored. */
export interface StoredMessage {
  readonly producerName: string;
  readonly publishingId: bigint;
  readonly body: string;
  /** The message's headers as stored (identity stamps included), when the sender passed them. */
  readonly headers?: Readonly<Record<string, string | number>>;
}

/** Options of a {@link ModelBroker}. */
export interface ModelBrokerOptions {
  /**
   * How many producer names a stream remembers across a segment roll-over (osiris keeps 255).
   * @defaultValue Infinity (never forgets)
   */
  readonly maxProducerNames?: number;
}

/**
 * An in-memory model of the broker's measured rules (docs/design.md §3), for unit and property tests:
 * per (stream, producer name) a message is stored only if its ID is above the highest stored;
 * otherwise it is dropped and still confirmed. Streams are independent. A restart keeps the
 * stored messages and the per-name highest. With `maxProducerNames`, {@link ModelBroker.rollSegment}
 * forgets the least recently written names beyond the limit, as osiris does at segment roll-over.
 */
export class ModelBroker {
  readonly #streams = new Map<string, { messages: StoredMessage[]; highest: Map<string, bigint> }>();
  readonly #maxProducerNames: number;

  constructor(options: ModelBrokerOptions = {}) {
    this.#maxProducerNames = options.maxProducerNames ?? Number.POSITIVE_INFINITY;
  }

  #stream(name: string): { messages: StoredMessage[]; highest: Map<string, bigint> } {
    let s = this.#streams.get(name);
    if (s === undefined) {
      s = { messages: [], highest: new Map() };
      this.#streams.set(name, s);
    }
    return s;
  }

  /** Stores or drops one message; returns true when stored. Either way the caller confirms it. */
  publish(
    stream: string,
    producerName: string,
    publishingId: bigint,
    body: string,
    headers?: Readonly<Record<string, string | number>>,
  ): boolean {
    const s = this.#stream(stream);
    if (publishingId <= (s.highest.get(producerName) ?? 0n)) return false;
    // Delete first: the Map's order is then the order of last writes (oldest first).
    s.highest.delete(producerName);
    s.highest.set(producerName, publishingId);
    s.messages.push(
      headers === undefined
        ? { producerName, publishingId, body }
        : { producerName, publishingId, body, headers },
    );
    return true;
  }

  /**
   * Stores or drops one sub-entry batch as a whole, by its last (highest) ID, as the broker does
   * (docs/design.md §10): all of it when that ID is above the highest stored, none otherwise.
   * Returns true when stored. Either way the caller confirms the last ID only.
   */
  publishEntry(
    stream: string,
    producerName: string,
    members: ReadonlyArray<{
      readonly publishingId: bigint;
      readonly body: string;
      readonly headers?: Readonly<Record<string, string | number>> | undefined;
    }>,
  ): boolean {
    const last = members[members.length - 1]!.publishingId;
    const s = this.#stream(stream);
    if (last <= (s.highest.get(producerName) ?? 0n)) return false;
    s.highest.delete(producerName);
    s.highest.set(producerName, last);
    for (const m of members) {
      s.messages.push(
        m.headers === undefined
          ? { producerName, publishingId: m.publishingId, body: m.body }
          : { producerName, publishingId: m.publishingId, body: m.body, headers: m.headers },
      );
    }
    return true;
  }

  /**
   * A segment roll-over: the stream keeps the state of its `maxProducerNames` most recently
   * written names and forgets the others, whose late retries are then stored again. Returns the
   * forgotten names.
   */
  rollSegment(stream: string): string[] {
    const s = this.#stream(stream);
    const forgotten: string[] = [];
    for (const name of s.highest.keys()) {
      if (s.highest.size - forgotten.length <= this.#maxProducerNames) break;
      forgotten.push(name);
    }
    for (const name of forgotten) s.highest.delete(name);
    return forgotten;
  }

  lastId(stream: string, producerName: string): bigint {
    return this.#stream(stream).highest.get(producerName) ?? 0n;
  }

  messages(stream: string): readonly StoredMessage[] {
    return this.#stream(stream).messages;
  }
}

/** What a {@link ModelTransport} does with the next published messages. */
export interface TransportFaults {
  /** Hold confirms instead of sending them at once (release with `releaseConfirms`). */
  holdConfirms: boolean;
  /** Confirm held messages in reverse order. */
  reverseConfirms: boolean;
  /** Connecting fails while true. */
  refuseConnect: boolean;
}

/**
 * A transport over the model broker. Messages reach the broker in publish order (one connection);
 * confirms can be held, reordered and released; the connection can be cut.
 */
export class ModelTransport implements PublishTransport {
  readonly target: string;
  readonly maxMessageBytes = 1_000_000;
  /** As the stream transport: a sub-entry batch is one entry, confirmed by its last ID. */
  readonly carriesBatches = true;
  readonly faults: TransportFaults = { holdConfirms: false, reverseConfirms: false, refuseConnect: false };
  readonly published: OutgoingMessage[] = [];
  /** The IDs of every entry published, in order (a sub-entry batch is one entry). */
  readonly entries: bigint[][] = [];
  readonly #broker: ModelBroker;
  readonly #producerName: string;
  #handlers: TransportHandlers | undefined;
  #held: bigint[] = [];
  connects = 0;
  closed = false;
  /** Sub-entry batching as the stream transport's option sets it (1: off). */
  readonly subEntrySize: number;

  constructor(broker: ModelBroker, stream: string, producerName: string, subEntrySize = 1) {
    this.#broker = broker;
    this.target = stream;
    this.#producerName = producerName;
    this.subEntrySize = subEntrySize;
  }

  connect(handlers: TransportHandlers): Promise<bigint> {
    if (this.faults.refuseConnect) return Promise.reject(new Error('model broker refuses connections'));
    this.connects++;
    this.#handlers = handlers;
    this.#held = [];
    return Promise.resolve(this.#broker.lastId(this.target, this.#producerName));
  }

  publish(messages: readonly OutgoingMessage[]): Promise<void> {
    const handlers = this.#handlers;
    if (handlers === undefined) return Promise.reject(new Error('not connected'));
    const ids: bigint[] = [];
    for (let i = 0; i < messages.length;) {
      const m = messages[i]!;
      const batch = m.batch;
      if (batch === undefined) {
        this.published.push(m);
        this.#broker.publish(this.target, this.#producerName, m.publishingId, Buffer.from(m.body).toString());
        this.entries.push([m.publishingId]);
        ids.push(m.publishingId);
        i++;
        continue;
      }
      // One entry: whole, in order, confirmed by its last ID (the stream transport refuses a part).
      if (batch.some((b, k) => messages[i + k] !== b)) {
        return Promise.reject(
          new InvariantError(`sub-entry batch at ID ${m.publishingId} handed over in part`),
        );
      }
      this.published.push(...batch);
      this.entries.push(batch.map((b) => b.publishingId));
      this.#broker.publishEntry(
        this.target,
        this.#producerName,
        batch.map((b) => ({ publishingId: b.publishingId, body: Buffer.from(b.body).toString() })),
      );
      ids.push(batch[batch.length - 1]!.publishingId);
      i += batch.length;
    }
    if (this.faults.holdConfirms) this.#held.push(...ids);
    else queueMicrotask(() => handlers.confirmed(ids));
    return Promise.resolve();
  }

  /** Sends the held confirms (in reverse when `reverseConfirms`). */
  releaseConfirms(): void {
    const ids = this.faults.reverseConfirms ? [...this.#held].reverse() : this.#held;
    this.#held = [];
    for (const id of ids) this.#handlers?.confirmed([id]);
  }

  /** Cuts the connection: held confirms are lost, the core is told. */
  cut(): void {
    const handlers = this.#handlers;
    this.#handlers = undefined;
    this.#held = [];
    handlers?.disconnected(new Error('model connection cut'));
  }

  queryLastId(): Promise<bigint> {
    return Promise.resolve(this.#broker.lastId(this.target, this.#producerName));
  }

  close(): Promise<void> {
    this.closed = true;
    this.#handlers = undefined;
    return Promise.resolve();
  }
}

/** A model transport that, while `losing`, takes messages and neither stores nor confirms them (lost in flight). */
export class LossyTransport extends ModelTransport {
  losing = false;
  lost = 0;
  override publish(messages: readonly OutgoingMessage[]): Promise<void> {
    if (!this.losing) return super.publish(messages);
    this.lost += messages.length;
    return Promise.resolve();
  }
}

/** `model` as an AMQP 0-9-1 transport would be: it cannot report the broker's last publishing ID. */
export function blind(model: ModelTransport): PublishTransport {
  return {
    target: model.target,
    maxMessageBytes: model.maxMessageBytes,
    connect: async (handlers) => {
      await model.connect(handlers);
      return undefined;
    },
    publish: (messages) => model.publish(messages),
    queryLastId: () => Promise.resolve(undefined),
    close: () => model.close(),
  };
}
