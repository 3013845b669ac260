import { ID_HEADER, PRODUCER_HEADER } from '../../src/identity/headers.js';
import { headersSize, stampBytesOf } from '../../src/publisher/message.js';
import type { OutgoingMessage, PublishTransport, TransportHandlers } from '../../src/publisher/types.js';
import { ModelBroker } from '../../test/support/model-broker.js';
import { never } from './disk.js';

/** One header of a frame, in the order the frame carries it. */
export type WireHeader = readonly [name: string, value: string | number];

/** A message on its way to the broker. */
export interface WireMessage {
  readonly stream: string;
  readonly producerName: string;
  readonly publishingId: bigint;
  readonly body: string;
  /**
   * The frame's headers as the stream transport encodes them when `publish()` is called: the two
   * identity stamps, then the caller's headers as they are at that moment (a map on the wire:
   * a caller's `x-dedup-id` would be a second identity key).
   */
  readonly headers: readonly WireHeader[];
  /**
   * The sub-entry batch it travels in (docs/design.md §10): its members are written one after
   * another, and the broker takes the batch when it has read the last, stores or drops it whole by
   * the last ID, and confirms that ID only. `undefined`: an entry of its own.
   */
  readonly entry?: { readonly lastId: bigint; readonly size: number } | undefined;
}

/** What a connection is: live (both ways), a zombie (frames still in the broker's buffers) or gone. */
export type ConnectionState = 'live' | 'zombie' | 'gone';

/** Observation hooks, for tests that hand every step to `fc.scheduler`. */
export interface ConnectionHooks {
  /** Messages were queued on the wire. */
  readonly onQueued?: (connection: Connection, count: number) => void;
  /** The broker queued a confirm for the client. */
  readonly onConfirmQueued?: (connection: Connection, publishingId: bigint) => void;
}

/**
 * One TCP connection of the fault-injecting channel. Messages reach the broker in the order they
 * were written (TCP), when the test says so (`deliver`): delay is the default. The broker answers
 * each delivered message with a confirm, stored or not; confirms reach the client in any order the
 * test picks (`confirm`), which the broker allows. A cut loses everything in flight, or leaves a
 * zombie whose written frames the broker may still read later (a half-open connection); a zombie's
 * confirms go nowhere.
 */
export class Connection {
  readonly id: number;
  state: ConnectionState = 'live';
  /** Written, not yet read by the broker (in order). */
  readonly outbound: WireMessage[] = [];
  /** Confirms the broker sent, not yet read by the client (the test picks the order). */
  readonly inbound: bigint[] = [];
  /** Messages the broker read from this connection, in order. */
  readonly delivered: WireMessage[] = [];
  /** Members of a sub-entry batch read so far (the broker acts on a batch once it has all of it). */
  #partial: WireMessage[] = [];
  /** Confirms the client read. */
  readonly confirmed: bigint[] = [];
  /** Messages written, in write order (what the publisher put on this wire). */
  readonly written: WireMessage[] = [];
  readonly #network: SimNetwork;
  #handlers: TransportHandlers | undefined;
  readonly #hooks: ConnectionHooks;
  /** The process life (transport) that opened this connection. */
  readonly owner: SimTransport | undefined;

  constructor(
    network: SimNetwork,
    id: number,
    handlers: TransportHandlers,
    hooks: ConnectionHooks,
    owner?: SimTransport,
  ) {
    this.#network = network;
    this.id = id;
    this.#handlers = handlers;
    this.#hooks = hooks;
    this.owner = owner;
  }

  /** Puts messages on the wire. */
  write(messages: readonly WireMessage[]): void {
    this.outbound.push(...messages);
    this.written.push(...messages);
    this.#network.activity++;
    this.#hooks.onQueued?.(this, messages.length);
  }

  /** The broker reads up to `count` messages, in order; returns how many. */
  deliver(count = Number.POSITIVE_INFINITY): number {
    if (this.state === 'gone' || !this.#network.brokerUp) return 0;
    let n = 0;
    while (n < count && this.outbound.length > 0) {
      this.#brokerRead(this.outbound.shift()!);
      n++;
    }
    return n;
  }

  /** The broker reads the last entry it read from this connection once more (a replayed frame). */
  duplicateLast(): boolean {
    const last = this.delivered[this.delivered.length - 1];
    if (last === undefined || this.state === 'gone' || !this.#network.brokerUp) return false;
    if (last.entry === undefined) this.#brokerRead(last);
    else if (this.#partial.length === 0) {
      for (const m of this.delivered.slice(-last.entry.size)) this.#brokerRead(m);
    } else return false;
    return true;
  }

  /** The client reads the confirm at `index` (modulo the queue), then up to `count - 1` after it. */
  confirm(index: number, count = 1): number {
    if (this.state !== 'live' || this.inbound.length === 0) return 0;
    const start = index % this.inbound.length;
    const ids = this.inbound.splice(start, Math.min(count, this.inbound.length - start));
    this.#read(ids);
    return ids.length;
  }

  /** The client reads the confirm for `publishingId`, if the broker sent it. */
  confirmId(publishingId: bigint): boolean {
    const i = this.inbound.indexOf(publishingId);
    if (this.state !== 'live' || i < 0) return false;
    this.inbound.splice(i, 1);
    this.#read([publishingId]);
    return true;
  }

  /** The client reads every confirm, in reverse or in broker order. */
  confirmAll(reverse = false): number {
    if (this.state !== 'live') return 0;
    const ids = this.inbound.splice(0);
    this.#read(reverse ? ids.reverse() : ids);
    return ids.length;
  }

  /** The client reads a confirm it already read (a duplicated frame). */
  duplicateConfirm(index: number): boolean {
    if (this.state !== 'live' || this.confirmed.length === 0) return false;
    this.#read([this.confirmed[index % this.confirmed.length]!]);
    return true;
  }

  /**
   * Ends the connection. `zombie`: the frames already written may still reach the broker; otherwise
   * they are lost. Confirms in flight are lost either way. `notify` tells the client.
   */
  cut(zombie: boolean, notify: boolean): void {
    if (this.state !== 'live') return;
    this.state = zombie && this.outbound.length > 0 ? 'zombie' : 'gone';
    if (this.state === 'gone') this.outbound.length = 0;
    else this.#network.zombies.push(this);
    this.inbound.length = 0;
    const handlers = this.#handlers;
    this.#handlers = undefined;
    this.#network.activity++;
    if (notify) handlers?.disconnected(new Error(`simulated connection ${this.id} cut`));
  }

  /** The broker restarted: nothing in flight survives. */
  drop(): void {
    this.state = 'gone';
    this.outbound.length = 0;
    this.inbound.length = 0;
    this.#handlers = undefined;
  }

  #brokerRead(m: WireMessage): void {
    if (m.entry !== undefined) {
      this.delivered.push(m);
      this.#partial.push(m);
      if (m.publishingId !== m.entry.lastId) return;
      const members = this.#partial;
      this.#partial = [];
      if (members.length !== m.entry.size || members.some((b) => b.entry?.lastId !== m.entry!.lastId)) {
        this.#network.entryViolations.push(
          `connection ${this.id}: batch ending at ${m.entry.lastId} arrived as ${members.map((b) => b.publishingId).join(',')}`,
        );
      }
      this.#network.broker.publishEntry(
        m.stream,
        m.producerName,
        members.map((b) => ({
          publishingId: b.publishingId,
          body: b.body,
          headers: Object.fromEntries(b.headers),
        })),
      );
    } else {
      // A map, as the broker stores it: a caller's header named like a stamp replaces the stamp.
      this.#network.broker.publish(
        m.stream,
        m.producerName,
        m.publishingId,
        m.body,
        Object.fromEntries(m.headers),
      );
      this.delivered.push(m);
    }
    this.#network.activity++;
    if (this.state !== 'live') return;
    this.inbound.push(m.publishingId);
    this.#hooks.onConfirmQueued?.(this, m.publishingId);
  }

  #read(ids: bigint[]): void {
    if (ids.length === 0) return;
    this.confirmed.push(...ids);
    this.#network.activity++;
    if (this.#handlers !== undefined) this.owner?.noteConfirmed(ids);
    this.#handlers?.confirmed(ids);
  }
}

/**
 * The broker (a {@link ModelBroker}) and the connections to it. A broker restart drops every
 * connection and everything in flight; the broker keeps its stored messages and the per-name
 * highest IDs. While it is down, nothing is delivered and nobody connects.
 */
export class SimNetwork {
  readonly broker: ModelBroker;
  brokerUp = true;
  /** Cut connections whose written frames the broker may still read. */
  zombies: Connection[] = [];
  /**
   * Broken sub-entry rules: a message sent in two different batches (by any life: the batches a
   * re-send rebuilds must be the ones first sent), or a batch that reached the broker in part.
   */
  readonly entryViolations: string[] = [];
  /** Per (stream, producer, ID): the batch it was first written in (`first-last`, or the ID alone). */
  readonly #entryOf = new Map<string, string>();
  /** Incremented on every event (progress detection). */
  activity = 0;
  #nextId = 1;
  readonly #transports = new Set<SimTransport>();

  constructor(broker: ModelBroker = new ModelBroker()) {
    this.broker = broker;
  }

  /** A transport for one process life of one producer. */
  transport(
    stream: string,
    producerName: string,
    hooks: ConnectionHooks = {},
    options: SimTransportOptions = {},
  ): SimTransport {
    const t = new SimTransport(this, stream, producerName, hooks, options);
    this.#transports.add(t);
    return t;
  }

  /** @internal */
  connection(handlers: TransportHandlers, hooks: ConnectionHooks, owner?: SimTransport): Connection {
    return new Connection(this, this.#nextId++, handlers, hooks, owner);
  }

  /**
   * @internal Checks that every message keeps the batch it was first written in, by every life on
   * one store. A message is its ID and its body (a lost or restored store hands an unstored ID to
   * another message), and a store replaced by a loss or a backup starts over: its lives cannot know
   * the batches of the lost one (with explicit IDs that can duplicate: docs/design.md §5).
   */
  noteEntry(
    stream: string,
    producerName: string,
    storeEpoch: number,
    messages: ReadonlyArray<OutgoingMessage>,
  ): void {
    const ids = messages.map((m) => m.publishingId);
    const shape = ids.length === 1 ? `${ids[0]}` : `${ids[0]}-${ids[ids.length - 1]}`;
    for (const m of messages) {
      const id = m.publishingId;
      const key = `${stream}\0${producerName}\0${storeEpoch}\0${id}\0${Buffer.from(m.body).toString()}`;
      const first = this.#entryOf.get(key);
      if (first === undefined) this.#entryOf.set(key, shape);
      else if (first !== shape) {
        this.entryViolations.push(
          `${stream}/${producerName} ID ${id} was sent in batch ${first}, then in batch ${shape}`,
        );
      }
    }
  }

  /** @internal */
  forget(t: SimTransport): void {
    this.#transports.delete(t);
  }

  /** The broker goes down: every connection and every frame in flight is lost. */
  stopBroker(): void {
    this.brokerUp = false;
    for (const z of this.zombies) z.drop();
    this.zombies = [];
    for (const t of this.#transports) t.connection?.cut(false, true);
    this.activity++;
  }

  /** The broker is back (with its stored messages and per-name highest IDs). */
  startBroker(): void {
    this.brokerUp = true;
    this.activity++;
  }

  /** The broker reads up to `count` frames a cut connection had written; returns how many. */
  deliverZombie(index: number, count = Number.POSITIVE_INFINITY): number {
    if (this.zombies.length === 0) return 0;
    const z = this.zombies[index % this.zombies.length]!;
    const n = z.deliver(count);
    if (z.outbound.length === 0) this.zombies = this.zombies.filter((c) => c !== z);
    return n;
  }
}

/** How a {@link SimTransport} answers `connect()` after its first. */
export type ConnectPolicy = 'immediate' | 'manual';

/** Options of one process life's {@link SimTransport}. */
export interface SimTransportOptions {
  /**
   * Whether `connect()` and `queryLastId()` report the broker's last publishing ID (the stream
   * protocol does; AMQP 0-9-1 cannot, and resolves `undefined`). @defaultValue true
   */
  readonly reportsLastId?: boolean;
  /**
   * The producer's `maxInFlight`: at no time may more distinct IDs be written on this life's
   * connections without their confirm having reached the client. Exceeding it is recorded in
   * {@link SimTransport.violations}.
   */
  readonly maxUnconfirmed?: number;
  /** Sub-entry batching, as the stream transport's `subEntry.size` sets it. @defaultValue 1 (off) */
  readonly subEntrySize?: number;
  /** Which store (lost and restored stores count anew) this life opened: batches are its record. */
  readonly storeEpoch?: number;
  /**
   * Whether a sub-entry batch travels as one entry confirmed by its last ID (the stream transport),
   * or each message alone, confirmed by its own ID, as AMQP 0-9-1 does. @defaultValue true
   */
  readonly carriesBatches?: boolean;
  /**
   * The sub-entry cap of this life (`subEntry.maxUncompressedBytes`, the broker's
   * `stream.max_uncompressed_sub_entry_batch_size`): a batch whose estimated uncompressed bytes are
   * above it is recorded in {@link SimTransport.violations} (the broker would refuse it, error 17).
   * @defaultValue unbounded
   */
  readonly maxBatchBytes?: number;
}

/**
 * The transport of one process life over a {@link SimNetwork}. The first `connect()` (inside
 * `open()`) answers at once: with the broker's last ID, or a refusal while the broker is down.
 * Later ones (reconnects) wait for {@link SimTransport.acceptConnect} under the `manual` policy, so
 * the test decides when the network comes back — even after `close()`: a connect the core started
 * before closing may complete afterwards, and the core must close that connection too (`close()`
 * may be called again and then ends it). `kill()` is the process dying: nothing reaches the dead
 * core any more, and anything it calls never settles.
 */
export class SimTransport implements PublishTransport {
  readonly target: string;
  readonly producerName: string;
  readonly maxMessageBytes = 1_000_000;
  connectPolicy: ConnectPolicy = 'manual';
  connection: Connection | undefined;
  readonly connections: Connection[] = [];
  connects = 0;
  isDead = false;
  isClosed = false;
  /** `close()` calls. */
  closeCalls = 0;
  readonly reportsLastId: boolean;
  readonly maxUnconfirmed: number;
  readonly subEntrySize: number;
  readonly storeEpoch: number;
  readonly carriesBatches: boolean;
  readonly maxBatchBytes: number | undefined;
  /**
   * The socket stops draining (a paused broker, a full TCP window): a publish writes its frames
   * and then waits for a `drain` that comes only with {@link SimTransport.resumeDraining}, or ends
   * (rejects) when the connection is cut or closed, as both real transports do.
   */
  drainStopped = false;
  /** Publishes waiting for `drain`. */
  readonly #undrained: Array<{ resolve: () => void; reject: (error: Error) => void }> = [];
  /** Sub-entry batches written and not confirmed: last ID → every member's ID. */
  readonly #batches = new Map<bigint, readonly bigint[]>();
  /** IDs written on this life's connections whose confirm has not reached the client. */
  readonly unconfirmed = new Set<bigint>();
  /** Most IDs ever unconfirmed at once. */
  peakUnconfirmed = 0;
  /** Broken wire rules (more than `maxUnconfirmed` unconfirmed IDs). */
  readonly violations: string[] = [];
  readonly #network: SimNetwork;
  readonly #hooks: ConnectionHooks;
  #pending:
    | {
        handlers: TransportHandlers;
        resolve: (id: bigint | undefined) => void;
        reject: (error: Error) => void;
      }
    | undefined;
  #attemptWaiters: Array<() => void> = [];

  constructor(
    network: SimNetwork,
    stream: string,
    producerName: string,
    hooks: ConnectionHooks,
    options: SimTransportOptions = {},
  ) {
    this.#network = network;
    this.target = stream;
    this.producerName = producerName;
    this.#hooks = hooks;
    this.reportsLastId = options.reportsLastId ?? true;
    this.maxUnconfirmed = options.maxUnconfirmed ?? Number.POSITIVE_INFINITY;
    this.subEntrySize = options.subEntrySize ?? 1;
    this.storeEpoch = options.storeEpoch ?? 0;
    this.carriesBatches = options.carriesBatches ?? true;
    this.maxBatchBytes = options.maxBatchBytes;
  }

  /** Publishes waiting for a `drain` that has not come. */
  get waitingForDrain(): number {
    return this.#undrained.length;
  }

  /** The socket drains again: every waiting publish returns. */
  resumeDraining(): void {
    this.drainStopped = false;
    for (const w of this.#undrained.splice(0)) w.resolve();
  }

  /** The connection ended: a publish waiting for `drain` rejects (the transports' `lost`). */
  #endUndrained(): void {
    for (const w of this.#undrained.splice(0)) w.reject(new Error('simulated: connection closed'));
  }

  /** True while the core waits for a reconnect to be accepted. */
  get hasPendingConnect(): boolean {
    return this.#pending !== undefined;
  }

  connect(handlers: TransportHandlers): Promise<bigint | undefined> {
    if (this.isDead || this.isClosed) return never();
    this.#network.activity++;
    if (this.connects === 0 || this.connectPolicy === 'immediate') {
      if (!this.#network.brokerUp) return Promise.reject(new Error('simulated broker is down'));
      return Promise.resolve(this.#establish(handlers));
    }
    return new Promise<bigint | undefined>((resolve, reject) => {
      this.#pending = { handlers, resolve, reject };
      for (const wake of this.#attemptWaiters.splice(0)) wake();
    });
  }

  /** Resolves once the core is waiting in `connect()` (at once if it already is). */
  connectAttempt(): Promise<void> {
    if (this.#pending !== undefined) return Promise.resolve();
    return new Promise<void>((resolve) => this.#attemptWaiters.push(resolve));
  }

  /**
   * Lets the waiting reconnect through (the broker must be up). After `close()` this is a connect
   * that completes late: the connection is established all the same.
   */
  acceptConnect(): void {
    const pending = this.#pending;
    if (pending === undefined || !this.#network.brokerUp || this.isDead) return;
    this.#pending = undefined;
    pending.resolve(this.#establish(pending.handlers));
  }

  /** The waiting reconnect fails (refused, or timed out); the core may try again. */
  refuseConnect(): void {
    const pending = this.#pending;
    if (pending === undefined || this.isDead) return;
    this.#pending = undefined;
    this.#network.activity++;
    pending.reject(new Error('simulated: connection refused'));
  }

  publish(messages: readonly OutgoingMessage[]): Promise<void> {
    if (this.isDead) return never();
    const c = this.connection;
    if (c === undefined || c.state !== 'live') return Promise.reject(new Error('simulated: not connected'));
    // As the stream transport's encoder: a batch goes whole or not at all.
    for (let i = 0; i < messages.length;) {
      // Over AMQP 0-9-1 every message is an entry of its own, whatever the core tied it to.
      const batch = this.carriesBatches ? messages[i]!.batch : undefined;
      const size = batch?.length ?? 1;
      if (batch !== undefined && batch.some((b, k) => messages[i + k] !== b)) {
        return Promise.reject(
          new Error(`sub-entry batch at ID ${messages[i]!.publishingId} handed over in part`),
        );
      }
      const entry = messages.slice(i, i + size);
      // The entry-shape rule is the stream protocol's (AMQP 0-9-1 has no sub-entries).
      if (this.carriesBatches)
        this.#network.noteEntry(this.target, this.producerName, this.storeEpoch, entry);
      const ids = entry.map((m) => m.publishingId);
      if (batch !== undefined) this.#batches.set(ids[ids.length - 1]!, ids);
      if (batch !== undefined && this.maxBatchBytes !== undefined) {
        const stamps = stampBytesOf(this.producerName);
        const bytes = entry.reduce((n, m) => n + m.body.length + headersSize(m.headers) + stamps, 0);
        if (bytes > this.maxBatchBytes) {
          this.violations.push(
            `batch [${ids.join(',')}] of ${bytes} bytes over the cap of ${this.maxBatchBytes}`,
          );
        }
      }
      i += size;
    }
    c.write(
      messages.map((m) => ({
        stream: this.target,
        producerName: this.producerName,
        publishingId: m.publishingId,
        body: Buffer.from(m.body).toString(),
        // Encoded now, as the stream transport does: whatever the headers object holds at this call.
        headers: [
          [PRODUCER_HEADER, this.producerName],
          [ID_HEADER, m.publishingId.toString()],
          ...(m.headers === undefined ? [] : Object.entries(m.headers)),
        ],
        entry:
          m.batch === undefined || !this.carriesBatches
            ? undefined
            : { lastId: m.batch[m.batch.length - 1]!.publishingId, size: m.batch.length },
      })),
    );
    for (const m of messages) this.unconfirmed.add(m.publishingId);
    if (this.unconfirmed.size > this.peakUnconfirmed) this.peakUnconfirmed = this.unconfirmed.size;
    if (this.unconfirmed.size > this.maxUnconfirmed) {
      this.violations.push(
        `${this.unconfirmed.size} IDs unconfirmed on the wire (maxInFlight ${this.maxUnconfirmed}): ` +
          [...this.unconfirmed].join(','),
      );
    }
    if (!this.drainStopped) return Promise.resolve();
    return new Promise<void>((resolve, reject) => this.#undrained.push({ resolve, reject }));
  }

  /** @internal The client read these confirms on one of this life's connections. */
  noteConfirmed(ids: readonly bigint[]): void {
    for (const id of ids) {
      this.unconfirmed.delete(id);
      for (const member of this.#batches.get(id) ?? []) this.unconfirmed.delete(member);
    }
  }

  queryLastId(): Promise<bigint | undefined> {
    if (this.isDead) return never();
    if (!this.#network.brokerUp) return Promise.reject(new Error('simulated broker is down'));
    return Promise.resolve(this.#lastId());
  }

  /** Cuts the live connection and tells the core. */
  cut(zombie: boolean): void {
    this.#endUndrained();
    this.connection?.cut(zombie, true);
  }

  /** The process died: frames written may still reach the broker (`zombie`); nothing reaches the core. */
  kill(zombie: boolean): void {
    this.isDead = true;
    this.#pending = undefined;
    this.connection?.cut(zombie, false);
    this.#network.forget(this);
  }

  /**
   * A graceful close: what was written may still arrive; nothing more is read. A connect still
   * pending stays pending (the network may complete it late, see {@link acceptConnect}); a later
   * call closes whatever connection is live then.
   */
  close(): Promise<void> {
    this.closeCalls++;
    this.isClosed = true;
    this.#endUndrained();
    this.connection?.cut(true, false);
    return Promise.resolve();
  }

  /** A connection of this life still live after `close()` was called: a leak. */
  get leakedConnection(): Connection | undefined {
    return this.isClosed && this.connection?.state === 'live' ? this.connection : undefined;
  }

  #lastId(): bigint | undefined {
    return this.reportsLastId ? this.#network.broker.lastId(this.target, this.producerName) : undefined;
  }

  #establish(handlers: TransportHandlers): bigint | undefined {
    this.connects++;
    this.#endUndrained();
    this.connection?.cut(false, false);
    const c = this.#network.connection(handlers, this.#hooks, this);
    this.connection = c;
    this.connections.push(c);
    return this.#lastId();
  }
}
