/**
 * `PgOutboxRelay`: publishes the outbox rows committed for one producer name, exactly once
 * (docs/design.md §14). The relay numbers committed rows itself, in the order it reads them, in a
 * transaction that commits before anything is sent; a later life re-sends the numbered rows the
 * broker does not hold under the same IDs, and deletes the ones it does.
 */
import { randomUUID } from 'node:crypto';
import type { Notification, PoolClient } from 'pg';
import { DedupError } from '../../errors.js';
import { assertFits, stampBytesOf, validateHeaders } from '../../publisher/message.js';
import type { OutgoingMessage } from '../../publisher/types.js';
import { Locator } from '../../superstream/partitions.js';
import { partitionForKey } from '../../superstream/routing.js';
import { StreamTransport } from '../../transport/stream-transport.js';
import { withTimeout } from '../../transport/util.js';
import { Backoff, sleep } from '../../util/backoff.js';
import { checkout } from '../checkout.js';
import { refusal } from '../refusal.js';
import { checkSchema } from '../schema.js';
import { isStoreFailure, markStore, RelayLock, storeMarked } from './relay-lock.js';
import {
  FencedError,
  RelayDb,
  type AssignedRow,
  type NumberedBatch,
  type Placement,
  type WaitingRow,
} from './relay-db.js';
import {
  resolveRelayOptions,
  type OutboxRelayEvent,
  type PgOutboxRelayOptions,
  type ResolvedRelayOptions,
} from './relay-options.js';
import {
  OUTBOX_COLUMNS,
  OUTBOX_SHAPE_QUERIES,
  outboxChannel,
  outboxShapeProblems,
  type FoundColumn,
  type FoundKey,
} from '../outbox-tables.js';
import { SentBatches, type SentBatch } from './relay-batches.js';
import { asReported, isPermanent, OutboxPoisonRowError, type OutboxRelayStats } from './relay-errors.js';

export { OutboxPoisonRowError, type OutboxRelayStats } from './relay-errors.js';

/** A target stream's producer and what it has in flight. */
interface Target {
  readonly name: string;
  readonly transport: StreamTransport;
  /** Sent, unconfirmed: ID → send time (insertion order is ID order). */
  readonly inFlight: Map<bigint, number>;
  /** Batch records sent and not yet deleted. */
  readonly batches: SentBatches;
  /** The highest ID this outbox numbered on the target (the broker's last ID may not pass it). */
  lastNumbered: bigint;
}

/** Confirmed batch records to delete once their other-writer check (started after the confirms) passed. */
interface PendingDelete {
  readonly done: ReadonlyMap<string, readonly SentBatch[]>;
  /** The rows the records hold (this life sent). */
  readonly rows: number;
  passed: boolean;
}

/**
 * Publishes committed outbox rows of one producer name to a stream or a super stream, exactly once:
 * one active relay per producer name and target (session advisory locks, a lease of
 * `leaseTimeoutMs`), others wait as standbys.
 *
 * @example
 * ```ts
 * await using relay = await PgOutboxRelay.open({
 *   pool, schema: 'stream_dedup', producerName: 'orders-svc', stream: 'orders',
 *   connection: { hostname: '127.0.0.1', port: 5552 },
 * });
 * ```
 * @remarks Since 0.6.0
 */
export class PgOutboxRelay {
  readonly #opts: ResolvedRelayOptions;
  readonly #db: RelayDb;
  readonly #holder = randomUUID();
  readonly #lock: RelayLock;
  /** The lease heartbeat (docs/design.md §14): proves the lock session alive while it is held. */
  #heartbeat: NodeJS.Timeout | undefined;
  /** Aborted at close(): every wait for a pool connection ends on it. */
  readonly #closeSignal = new AbortController();
  /** The release of each connection #connectDb took (checkout.ts), until #destroyDb. */
  readonly #held = new WeakMap<PoolClient, (destroy?: boolean | Error) => void>();
  #lockClient: PoolClient | undefined;
  #work: PoolClient | undefined;
  #epoch: bigint | undefined;
  #targets = new Map<string, Target>();
  #partitions: string[] | undefined;
  /** A failure the broker reported (a lost connection); the pump ends the life on it. */
  #failure: Error | undefined;
  /** Rows may be waiting (a notification, the poll, a numbering that filled its batch). */
  #dirty = true;
  #wake: (() => void) | undefined;
  #closing = false;
  #loop: Promise<void> | undefined;
  #stopError: Error | undefined;
  readonly #closed: Promise<Error | undefined>;
  #resolveClosed!: (error: Error | undefined) => void;
  #counters = { published: 0, resent: 0, alreadyStored: 0, confirmed: 0, lagMs: 0, takeovers: 0 };

  private constructor(opts: ResolvedRelayOptions) {
    this.#opts = opts;
    this.#db = storeMarked(new RelayDb(opts.schema, opts.producerName, opts.queryTimeoutMs));
    this.#lock = new RelayLock(
      (client, text, values) => this.#db.run(client, text, values),
      opts.schema,
      opts.producerName,
      opts.target,
      opts.leaseTimeoutMs,
    );
    this.#closed = new Promise((resolve) => (this.#resolveClosed = resolve));
  }

  /**
   * Checks the options and the schema, then tries once to take the producer name: when it is free,
   * the relay takes it over, connects, and recovers what an earlier life left (all before this
   * resolves, so that a refusal is thrown here); when another relay holds it, this one resolves as
   * a standby (`stats.isActive` false) and tries again every `takeoverIntervalMs`.
   *
   * @throws TypeError, RangeError for invalid options, before any I/O.
   * @throws DedupError `DEDUP_STORE_REFUSED` (wrong credentials, a missing schema or outbox table, a
   *   schema of another version), `DEDUP_BROKER_REFUSED` (a missing stream or super stream, access
   *   refused), `DEDUP_BROKER_UNREACHABLE`, `DEDUP_SEQUENCE_REGRESSION` (the broker holds a higher
   *   ID for the name than the outbox ever numbered: another writer uses it, or the database was
   *   restored from an older backup), `DEDUP_PARTITIONS_CHANGED`, `DEDUP_UNSAFE_OPTIONS` (a lease
   *   on PostgreSQL < 14; rows numbered for another target).
   */
  static async open(options: PgOutboxRelayOptions): Promise<PgOutboxRelay> {
    const relay = new PgOutboxRelay(resolveRelayOptions(options));
    // Before the first lock: the lock session runs with idle_session_timeout = the lease from the
    // moment it holds the locks, and the first activation (a broker connect per target, up to
    // connectTimeoutMs each; recovery's re-sends) can outlast the lease (revR finding 4).
    if (relay.#lock.heartbeatMs > 0) {
      relay.#heartbeat = setInterval(() => void relay.#beat(), relay.#lock.heartbeatMs);
      relay.#heartbeat.unref();
    }
    try {
      await relay.#checkSchema();
      if (await relay.#tryLock()) await relay.#activate();
    } catch (err) {
      clearInterval(relay.#heartbeat);
      await relay.#teardown();
      throw asReported(err, `outbox relay "${relay.#opts.producerName}" cannot open`);
    }
    relay.#loop = relay.#run();
    return relay;
  }

  /** The counters since `open()`. */
  get stats(): OutboxRelayStats {
    let inFlight = 0;
    for (const t of this.#targets.values()) inFlight += t.inFlight.size;
    return { isActive: this.#epoch !== undefined, inFlight, ...this.#counters };
  }

  /**
   * Resolves when the relay has stopped: with `undefined` after `close()`, with the error that
   * stopped it otherwise (an `OutboxPoisonRowError`, `DEDUP_STORE_REFUSED` (also after
   * `reconnect.giveUpAfterMs` of database failures), `DEDUP_BROKER_REFUSED`,
   * `DEDUP_BROKER_UNREACHABLE` after `reconnect.giveUpAfterMs` of broker failures,
   * `DEDUP_NAME_CONFLICT` (another outbox's relay holds the name on the target in this database, or
   * the broker's last ID moved past what this outbox numbered), …). Never rejects.
   */
  closed(): Promise<Error | undefined> {
    return this.#closed;
  }

  /**
   * Stops numbering, waits up to `closeTimeoutMs` for the confirms of what was sent (deleting
   * their rows), closes the broker connections (at most 10 s more) and gives the producer name up.
   * Rows not confirmed by then are re-sent by the next relay. Idempotent; never throws.
   */
  async close(): Promise<void> {
    if (!this.#closing) {
      this.#closing = true;
      this.#closeStarted = performance.now();
      this.#closeSignal.abort();
      this.#wake?.();
    }
    // Bounded whatever the loop waits for: the teardown closes the producers, which ends any write;
    // a wait for a pool connection ends on the close signal, and the loop tears down again as it
    // ends (what it took after the teardown below: review A).
    await Promise.race([this.#loop, sleep(this.#opts.closeTimeoutMs + 1_000)]);
    await this.#teardown();
    await Promise.race([this.#loop, sleep(this.#opts.queryTimeoutMs + 1_000)]);
    if (this.#stopError === undefined) this.#emit({ type: 'stopped', error: undefined });
    this.#finish(undefined);
  }

  /** Calls {@link PgOutboxRelay.close} (`await using relay = …`). */
  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }

  #emit(event: OutboxRelayEvent): void {
    this.#opts.onEvent(event);
  }

  #finish(error: Error | undefined): void {
    clearInterval(this.#heartbeat);
    this.#stopError ??= error;
    this.#resolveClosed(this.#stopError);
  }

  /**
   * A pool connection, bounded by `connectTimeoutMs` (a pool without its own bound waits forever)
   * and by close(). Through checkout() (checkout.ts: an 'error' listener from the hand-over on);
   * given back only through #destroyDb.
   */
  async #connectDb(): Promise<PoolClient> {
    if (this.#closing) throw new Error('the outbox relay is closing');
    try {
      const { client, release } = await checkout(this.#opts.pool, {
        timeoutMs: this.#opts.connectTimeoutMs,
        timeoutName: 'connectTimeoutMs',
        signal: this.#closeSignal.signal,
      });
      this.#held.set(client, release);
      return client;
    } catch (err) {
      throw markStore(this.#closeSignal.signal.aborted ? new Error('the outbox relay is closing') : err);
    }
  }

  /**
   * Closes a connection of #connectDb (the relay never hands one back for reuse: a session that
   * held the lock, or failed, must not serve anyone else), with checkout()'s release: its listener
   * goes too. Once per connection; later calls do nothing.
   */
  #destroyDb(client: PoolClient | undefined): void {
    if (client === undefined) return;
    const release = this.#held.get(client);
    this.#held.delete(client);
    release?.(true);
  }

  async #checkSchema(): Promise<void> {
    const client = await this.#connectDb().catch((err: unknown) => {
      throw refusal(err, `outbox relay "${this.#opts.producerName}" cannot connect to PostgreSQL`);
    });
    try {
      await checkSchema(client, this.#opts.schema);
      await this.#lock.checkServer(client);
      await this.#db.run(client, `SELECT 1 FROM ${this.#db.tables.outbox} LIMIT 0`).catch((err: unknown) => {
        throw refusal(err, `cannot read the outbox of schema "${this.#opts.schema}"`);
      });
      // Every column the relay reads or writes and every primary key, as created: a table altered
      // or made by hand (of another version, or half-migrated) is refused here, before anything is
      // read or sent, not found by the first numbering.
      const tables = Object.keys(OUTBOX_COLUMNS);
      const [found, keys] = await Promise.all([
        this.#db.run<FoundColumn>(client, OUTBOX_SHAPE_QUERIES.columns, [this.#opts.schema, tables]),
        this.#db.run<FoundKey>(client, OUTBOX_SHAPE_QUERIES.keys, [this.#opts.schema, tables]),
      ]).catch((err: unknown) => {
        throw refusal(err, `cannot read the catalog of schema "${this.#opts.schema}"`);
      });
      const problems = outboxShapeProblems(found.rows, keys.rows);
      if (problems.length > 0) {
        throw new DedupError(
          'DEDUP_STORE_REFUSED',
          `the outbox tables of schema "${this.#opts.schema}" are not the ones this library creates: ` +
            `${problems.join('; ')}. Run migrate() (or 'stream-dedup migrate') on a schema of its own; nothing was read or sent`,
        );
      }
    } finally {
      this.#destroyDb(client);
    }
  }

  /**
   * Tries the session advisory lock on a dedicated connection; true when held. A lock connection
   * kept from an earlier life counts only once the server says its session still holds the lock:
   * its 'end' may not have arrived yet when another connection's failure ended the life, and a
   * standby may hold the lock by now (docs/design.md §14, "one active relay").
   */
  async #tryLock(): Promise<boolean> {
    const kept = this.#lockClient;
    if (kept !== undefined) {
      if (!this.#lockLost && (await this.#lock.held(kept))) return true;
      this.#lockClient = undefined;
      this.#lockLost = false;
      this.#destroyDb(kept);
    }
    const client = await this.#connectDb();
    try {
      // Both locks on this session (relay-lock.ts), or none: a standby, or a DEDUP_NAME_CONFLICT.
      if (!(await this.#lock.acquire(client)) || this.#closing) {
        this.#destroyDb(client);
        return false;
      }
      // Lost connection = lost lock: the pump stops at its next step (the lease epoch fences it anyway).
      const lost = (err: Error): void => {
        if (this.#lockClient !== client) return;
        this.#lockLost = true;
        this.#fail(markStore(err) as Error);
      };
      client.on('error', lost);
      client.on('end', () => lost(new Error('the outbox relay lock connection closed')));
      client.on('notification', (n: Notification) => {
        if (n.payload === this.#opts.producerName) this.#poke();
      });
      await this.#db.run(client, `LISTEN "${outboxChannel(this.#opts.schema)}"`);
      this.#lockClient = client;
      return true;
    } catch (err) {
      this.#destroyDb(client);
      throw err;
    }
  }

  /** The lease heartbeat: a lock session the server no longer holds the locks for ends the life. */
  async #beat(): Promise<void> {
    const client = this.#lockClient;
    if (client === undefined || this.#beating) return;
    this.#beating = true;
    try {
      if (!(await this.#lock.held(client)) && this.#lockClient === client) {
        this.#lockLost = true;
        this.#fail(markStore(new Error('the outbox relay lost its lock session (lease)')) as Error);
      }
    } finally {
      this.#beating = false;
    }
  }

  #poke(): void {
    this.#dirty = true;
    this.#wake?.();
  }

  #fail(error: Error): void {
    this.#failure ??= error;
    this.#rejectFailed?.(this.#failure);
    this.#wake?.();
  }

  /** Rejects with the life's failure once one is reported (a broker wait races it). */
  #failed: Promise<never> = Promise.race([]);
  #rejectFailed: ((error: Error) => void) | undefined;

  /** Takes the name over, connects every target and recovers what an earlier life numbered. */
  async #activate(): Promise<void> {
    this.#failure = undefined;
    this.#failed = new Promise<never>((_, reject) => (this.#rejectFailed = reject));
    this.#failed.catch(() => undefined);
    this.#work ??= await this.#connectDb();
    await this.#db.prepare(this.#work);
    if (this.#opts.leaseTimeoutMs > 0) {
      // A relay paused inside its numbering transaction holds the lease row's lock: the server ends
      // that transaction within the lease, so the standby's take-over does not wait for it.
      await this.#db.run(
        this.#work,
        `SET idle_in_transaction_session_timeout = ${this.#opts.leaseTimeoutMs}`,
      );
    }
    const { target } = this.#opts;
    if (target.kind === 'superStream' && this.#partitions === undefined) {
      const locator = new Locator(this.#opts.connection, this.#opts.connectTimeoutMs);
      try {
        this.#partitions = await locator.partitions(target.name);
      } finally {
        await locator.close();
      }
    }
    const names = target.kind === 'stream' ? [target.name] : this.#partitions!;
    const epoch = await this.#db.takeover(this.#work, this.#holder, this.#partitions, names);
    const targets = new Map<string, Target>();
    try {
      for (const name of names) {
        // The stream half of StreamDedupPublisher, without its LevelDB core: the database is the store.
        const transport = new StreamTransport({
          producerName: this.#opts.producerName,
          store: 'unused: the transport never reads it',
          stream: name,
          connection: this.#opts.connection,
          connectTimeoutMs: this.#opts.connectTimeoutMs,
        });
        const t: Target = {
          name,
          transport,
          inFlight: new Map(),
          batches: new SentBatches(),
          lastNumbered: 0n,
        };
        targets.set(name, t);
        const brokerLast = await transport.connect({
          confirmed: (ids) => this.#confirmed(t, ids),
          disconnected: (error) => this.#fail(error),
        });
        await this.#recover(t, brokerLast, epoch);
      }
    } catch (err) {
      await Promise.all([...targets.values()].map((t) => t.transport.close()));
      throw err;
    }
    this.#targets = targets;
    this.#epoch = epoch;
    this.#counters.takeovers++;
    this.#dirty = true;
    this.#emit({ type: 'active', epoch });
  }

  /**
   * The crash-recovery step (docs/design.md §14): rows numbered at or below the broker's last ID are
   * stored (IDs of a target are dense and sent in order), so batch records wholly at or below it are
   * deleted unsent; the other rows are re-sent from their records, in ID order, under their IDs.
   */
  async #recover(t: Target, brokerLast: bigint, epoch: bigint): Promise<void> {
    const work = this.#work!;
    const numbered = await this.#db.lastAssigned(work, t.name);
    t.lastNumbered = numbered;
    if (brokerLast > numbered) {
      throw new DedupError(
        'DEDUP_SEQUENCE_REGRESSION',
        `the broker's last publishing ID for "${this.#opts.producerName}" on stream "${t.name}" is ${brokerLast}, ` +
          `above the ${numbered} the outbox of schema "${this.#opts.schema}" ever numbered: another writer uses the ` +
          'name (another outbox relaying it from another database, or a publisher), or the database was ' +
          'restored from an older backup; new rows would be dropped as duplicates, so nothing was sent',
      );
    }
    let alreadyStored = await this.#db.deleteStoredBatches(work, t.name, brokerLast, epoch);
    let resent = 0;
    let after = 0n;
    for (;;) {
      // A few records at a time: each holds at most batchSize rows and BATCH_RECORD_BYTES of bodies.
      const batches = await this.#db.batchesAfter(work, t.name, after, 4);
      if (batches.length === 0) break;
      for (const batch of batches) {
        // A record straddling the broker's last ID: its rows at or below it are stored.
        const rows = batch.rows.filter((r) => r.publishingId > brokerLast);
        alreadyStored += batch.rows.length - rows.length;
        await this.#sendBatch(t, batch, rows);
        resent += rows.length;
        after = batch.firstId;
      }
    }
    this.#counters.alreadyStored += alreadyStored;
    this.#counters.resent += resent;
    if (alreadyStored > 0 || resent > 0) {
      this.#emit({ type: 'recovered', target: t.name, alreadyStored, resent });
    }
  }

  /** Sends `rows` (those of `batch` still to send, in ID order) and tracks the batch record. */
  async #sendBatch(t: Target, batch: NumberedBatch, rows: readonly AssignedRow[]): Promise<void> {
    t.batches.add(batch.firstId, batch.rows.length, rows.length);
    await this.#send(t, rows);
  }

  async #send(t: Target, rows: readonly AssignedRow[]): Promise<void> {
    const now = performance.now();
    const messages: OutgoingMessage[] = rows.map((r) => {
      t.inFlight.set(r.publishingId, now);
      return { publishingId: r.publishingId, body: r.body, headers: r.headers };
    });
    // Bounded: a broker that stops reading (a paused node, a full window) never drains the socket.
    await withTimeout(
      t.transport.publish(messages),
      this.#opts.confirmTimeoutMs,
      `writing ${messages.length} messages to stream "${t.name}"`,
    );
  }

  #confirmed(t: Target, ids: readonly bigint[]): void {
    let any = false;
    for (const id of ids) {
      if (t.inFlight.delete(id) && t.batches.confirm(id)) any = true;
    }
    if (!any) return;
    this.#scheduleCheck();
    this.#wake?.();
  }

  /**
   * Starts the other-writer check of the records confirmed in full as soon as they are, not when
   * the pump next comes round: that waited for the numbering under way, and the records then for
   * the numbering after it. Once for every confirm frame a socket read held (a microtask runs after
   * them), and none while any check (this path's or the pump's) is unanswered: when that one passes
   * it starts the next (the confirms of a fast relay arrive every millisecond; one broker round trip
   * each would be a query storm; the pump still starts its own each turn, as before). The mark a
   * check asks with is as valid here as in the pump: every frame written so far was numbered at or
   * below it (test/postgres/relay-check-at-confirm.test.ts).
   */
  #scheduleCheck(): void {
    if (this.#checkQueued || this.#pending.some((p) => !p.passed)) return;
    this.#checkQueued = true;
    queueMicrotask(() => {
      this.#checkQueued = false;
      if (this.#epoch !== undefined && this.#failure === undefined) this.#startChecks();
    });
  }

  /** A microtask will start the checks of the records confirmed meanwhile. */
  #checkQueued = false;

  /** Where a waiting row goes, or why it cannot be published. */
  #place(row: WaitingRow): Placement {
    let target: string;
    if (this.#opts.target.kind === 'stream') {
      target = this.#opts.target.name;
    } else {
      const key = row.routingKey ?? row.key;
      if (key === null || key.length === 0)
        return { poison: 'it has neither a routing key nor a key, and goes to a super stream' };
      target = partitionForKey(key, this.#partitions!);
    }
    try {
      const headers = validateHeaders(
        row.headers === null ? undefined : (row.headers as Record<string, string | number>),
      );
      const transport = this.#targets.get(target)!.transport;
      assertFits(row.body, headers, stampBytesOf(this.#opts.producerName), transport.maxMessageBytes);
      return { target, headers };
    } catch (err) {
      return { poison: (err as Error).message };
    }
  }

  /**
   * Starts the other-writer check of the records confirmed since the last call; deletes the records
   * whose check passed (one statement per target), unless a numbering follows at once: it deletes
   * them in its own transaction.
   */
  async #flushConfirms(): Promise<void> {
    this.#startChecks();
    if (this.#willNumber()) return;
    for (const [target, done] of this.#takeChecked()) {
      // A check that failed meanwhile (another writer) ends the life: delete nothing more.
      if (this.#failure !== undefined) return;
      await this.#db.deleteBatches(
        this.#work!,
        target,
        done.map((b) => b.first),
        this.#epoch!,
      );
      this.#deleted(target, done);
    }
  }

  #willNumber(): boolean {
    return (
      this.#dirty &&
      !this.#closing &&
      this.#poison === undefined &&
      this.#failure === undefined &&
      this.#room() > 0
    );
  }

  /**
   * The rows the next numbering may take: `maxInFlight` bounds the rows sent and unconfirmed, and
   * also, apart, the rows of records confirmed and not yet deleted (their other-writer check
   * pending or passed): a slow broker answer (up to `connectTimeoutMs`) otherwise let the relay
   * number, send and confirm on, each confirm burst one more entry there and its records kept in
   * `outbox_batches`, as many as were committed meanwhile (relay35).
   */
  #room(): number {
    let pendingRows = 0;
    for (const p of this.#pending) pendingRows += p.rows;
    return Math.min(this.#opts.maxInFlight - this.#inFlight(), this.#opts.maxInFlight - pendingRows);
  }

  /** Takes the records to delete out of every target: target → the records. */
  #takeDone(): Map<string, SentBatch[]> {
    const taken = new Map<string, SentBatch[]>();
    for (const t of this.#targets.values()) if (t.batches.hasDone) taken.set(t.name, t.batches.takeDone());
    return taken;
  }

  /**
   * Takes the records confirmed in full out of every target and starts their other-writer check
   * (one broker round trip per target, concurrently). Nothing waits for it: the records are deleted
   * once it passed (`#takeChecked`), by the next numbering or alone, so neither the numbering nor
   * its transaction waits on the broker (it took one round trip per numbering on the pump's path,
   * revR finding 5 put it before BEGIN). A failed check ends the life; the records stay in the
   * table and the next life's recovery deletes them as stored.
   */
  #startChecks(): void {
    const done = this.#takeDone();
    if (done.size === 0) return;
    let rows = 0;
    for (const d of done.values()) for (const b of d) rows += b.sent;
    const pending: PendingDelete = { done, rows, passed: false };
    this.#pending.push(pending);
    const current = (): boolean => this.#pending.includes(pending);
    Promise.all([...done.keys()].map((name) => this.#checkNoOtherWriter(this.#targets.get(name)!))).then(
      () => {
        if (!current()) return;
        pending.passed = true;
        // Records confirmed while this check was out start theirs now.
        if ([...this.#targets.values()].some((t) => t.batches.hasDone)) this.#scheduleCheck();
        this.#wake?.();
      },
      (err: unknown) => {
        if (current()) this.#fail(err instanceof Error ? err : new Error(String(err)));
      },
    );
  }

  /** The records whose check passed, taken out: target → the records. */
  #takeChecked(): Map<string, SentBatch[]> {
    const taken = new Map<string, SentBatch[]>();
    this.#pending = this.#pending.filter((p) => {
      if (!p.passed) return true;
      for (const [target, d] of p.done) taken.set(target, [...(taken.get(target) ?? []), ...d]);
      return false;
    });
    return taken;
  }

  /** Records of `target` deleted (committed): counted and reported. */
  #deleted(target: string, done: readonly SentBatch[]): void {
    const { count, lastId } = this.#targets.get(target)!.batches.deleted(done);
    this.#counters.confirmed += count;
    this.#emit({ type: 'confirmed', target, count, lastId });
  }

  /**
   * Before confirmed batch records are deleted (alone, or in the next numbering's transaction): a
   * broker last ID above what this outbox numbered on the target means another writer (another
   * database's outbox relaying the name, which no lock spans) got there first, and the confirms may
   * be of rows the broker dropped as its duplicates: stop, keep them (docs/design.md §14, "another
   * writer"). A relay of this outbox that took the name over is not another writer: its IDs are in
   * `outbox_ids` (the delete that follows is fenced).
   */
  async #checkNoOtherWriter(t: Target): Promise<void> {
    // The mark as of the question (relay35): the broker answers a query on the producer's
    // connection in frame order, so its answer reflects this life's frames written before the
    // query (every ID of which was numbered, hence at or below this mark) and none written after.
    // Compared with the mark at the answer instead, a numbering that committed meanwhile raised
    // it: another writer's ID in between passed, and the rows this relay then sent at or below it
    // were dropped as duplicates, confirmed, and deleted. Read before the query is written (the
    // client writes it synchronously in the call).
    const asked = t.lastNumbered;
    // Bounded, and ended by the life's failure: the stream client never answers nor rejects a
    // request whose connection closed, so a bare await hung the relay for good while its heartbeat
    // kept the lease (revR finding 1). The life then ends like on any broker failure.
    const brokerLast = await Promise.race([
      withTimeout(
        t.transport.queryLastId(),
        this.#opts.connectTimeoutMs,
        `querying the broker's last publishing ID on stream "${t.name}"`,
      ),
      this.#failed,
    ]);
    if (brokerLast <= asked) return;
    // Another life of this outbox (a standby that took over while this relay was paused) numbers
    // in the same table and sends under the name: not another writer, but this life is over (its
    // deletes are fenced anyway): it ends, and the next one recovers from the broker's last ID.
    const epoch = await this.#db.leaseEpoch(this.#work!);
    if (epoch !== this.#epoch) {
      throw new FencedError(
        `outbox relay "${this.#opts.producerName}" was taken over by another relay (lease epoch ${epoch ?? 'gone'}, ours ${this.#epoch ?? 'none'})`,
      );
    }
    throw new DedupError(
      'DEDUP_NAME_CONFLICT',
      `the broker's last publishing ID for "${this.#opts.producerName}" on stream "${t.name}" was ${brokerLast}, ` +
        `above the ${asked} the outbox of schema "${this.#opts.schema}" had numbered when the relay asked: another writer publishes ` +
        'under the name (another outbox relaying it from another database or server, or a publisher). The broker ' +
        'may have dropped rows of this outbox as duplicates of its IDs: they were kept, not deleted; the relay stopped',
    );
  }

  #inFlight(): number {
    let n = 0;
    for (const t of this.#targets.values()) n += t.inFlight.size;
    return n;
  }

  #oldestSend(): number | undefined {
    let oldest: number | undefined;
    for (const t of this.#targets.values()) {
      for (const sentAt of t.inFlight.values()) {
        if (oldest === undefined || sentAt < oldest) oldest = sentAt;
        break;
      }
    }
    return oldest;
  }

  /** One active life: numbers and sends until closing or a failure. */
  async #pump(): Promise<void> {
    const closeDeadline = (): number => this.#closeStarted + this.#opts.closeTimeoutMs;
    for (;;) {
      if (this.#failure !== undefined) throw this.#failure;
      await this.#flushConfirms();
      const oldest = this.#oldestSend();
      if (oldest !== undefined && performance.now() - oldest > this.#opts.confirmTimeoutMs) {
        throw new DedupError(
          'DEDUP_CONFIRM_TIMEOUT',
          `no confirm within ${this.#opts.confirmTimeoutMs} ms: re-sending`,
        );
      }
      const poison = this.#poison;
      const drained = this.#inFlight() === 0 && this.#pending.length === 0;
      if (poison !== undefined && (drained || performance.now() >= poison.deadline)) {
        throw poison.error;
      }
      if (this.#closing || poison !== undefined) {
        // Draining: no more numbering; wait for the confirms of what was sent and the deletes of
        // their records (bounded).
        const deadline = poison?.deadline ?? closeDeadline();
        if (this.#closing && (drained || performance.now() >= deadline)) return;
        await sleep(Math.min(50, Math.max(1, deadline - performance.now())), (w) => (this.#wake = w));
        continue;
      }
      const room = this.#room();
      if (this.#dirty && room > 0) {
        this.#dirty = false;
        const limit = Math.min(this.#opts.batchSize, room);
        // The confirmed records whose other-writer check passed by the time the read returns are
        // deleted in this numbering's transaction; the others wait for the next one (or are
        // deleted alone): the transaction never waits on the broker while it holds the lease row
        // (revR finding 5: a reply slower than the lease got the work session ended). A check that
        // failed rolls the numbering back: nothing numbered or deleted.
        let done = new Map<string, SentBatch[]>();
        const numbered = await this.#db.assign(
          this.#work!,
          this.#epoch!,
          limit,
          (row) => this.#place(row),
          () => {
            if (this.#failure !== undefined) throw this.#failure;
            done = this.#takeChecked();
            return new Map([...done].map(([target, d]) => [target, d.map((b) => b.first)]));
          },
        );
        for (const [target, d] of done) this.#deleted(target, d);
        this.#counters.lagMs = numbered.oldestAgeMs === undefined ? 0 : Math.round(numbered.oldestAgeMs);
        if (numbered.more) this.#dirty = true;
        for (const batch of numbered.batches) {
          const t = this.#targets.get(batch.target)!;
          const last = batch.firstId + BigInt(batch.rows.length) - 1n;
          if (last > t.lastNumbered) t.lastNumbered = last;
        }
        for (const batch of numbered.batches) {
          await this.#sendBatch(this.#targets.get(batch.target)!, batch, batch.rows);
          this.#counters.published += batch.rows.length;
        }
        if (numbered.poison !== undefined) {
          // Stops once the rows before it are confirmed (deleted), at most closeTimeoutMs from now.
          this.#poison = {
            error: new OutboxPoisonRowError(numbered.poison.id, numbered.poison.reason),
            deadline: performance.now() + this.#opts.closeTimeoutMs,
          };
        }
        continue;
      }
      const hasConfirms =
        [...this.#targets.values()].some((t) => t.batches.hasDone) || this.#pending.some((p) => p.passed);
      if (hasConfirms || this.#failure !== undefined) continue;
      const wait = Math.min(this.#opts.pollIntervalMs, this.#opts.confirmTimeoutMs);
      await sleep(wait, (w) => (this.#wake = w));
      this.#wake = undefined;
      // The polling fallback: a notification lost while disconnected is found here.
      this.#dirty = true;
    }
  }

  #closeStarted = 0;
  /** Confirmed records taken out for deletion, by other-writer check (this life's). */
  #pending: PendingDelete[] = [];
  /** A poison row was met: the relay drains what it sent, then stops with this error. */
  #poison: { error: OutboxPoisonRowError; deadline: number } | undefined;
  /** The lock connection failed: the lock may be gone. */
  #lockLost = false;
  /** A heartbeat is running. */
  #beating = false;

  /** The relay's life cycle: standby → active → (failure → retry) … until close or a permanent failure. */
  async #run(): Promise<void> {
    try {
      await this.#life();
    } finally {
      // What the loop took after close()'s teardown (a pool connection it was waiting for, a lock).
      if (this.#closing) await this.#teardown();
    }
  }

  async #life(): Promise<void> {
    const backoff = new Backoff(this.#opts.reconnect);
    let failingSince: number | undefined;
    /** The running life: when its pump started, and the rows confirmed by then. */
    let life: { startedAt: number; confirmed: number } | undefined;
    while (!this.#closing) {
      try {
        if (this.#epoch === undefined) {
          if (!(await this.#tryLock())) {
            // Another relay holds the name: waiting as its standby is not failing. A failure that
            // came before (a take-over that fenced this life) must not count against a life
            // started hours later, when the name comes back.
            failingSince = undefined;
            backoff.reset();
            await sleep(this.#opts.takeoverIntervalMs, (w) => (this.#wake = w));
            continue;
          }
          if (this.#closing) break;
          await this.#activate();
        }
        life = { startedAt: performance.now(), confirmed: this.#counters.confirmed };
        await this.#pump();
      } catch (err) {
        // The failures end only with a life that did something: one whose records were deleted
        // after the broker's confirm, or one that ran for the longest backoff with nothing left
        // unconfirmed (an idle relay whose connection dropped after an hour). A life that
        // activates and fails at once (a statement that fails every time, a table without the
        // constraint a statement needs), or whose sends are never confirmed (a broker that takes
        // writes and stores nothing: DEDUP_CONFIRM_TIMEOUT at every life), is part of one failure,
        // which gives up after giveUpAfterMs. Clearing it at every activation retried such a
        // failure for ever, at the shortest backoff, taking the lease again each time (1 041
        // take-overs in 3 s, a hostile review's fake).
        if (
          life !== undefined &&
          (this.#counters.confirmed > life.confirmed ||
            (this.#inFlight() === 0 && performance.now() - life.startedAt >= this.#opts.reconnect.maxDelayMs))
        ) {
          failingSince = undefined;
          backoff.reset();
        }
        life = undefined;
        await this.#deactivate(err instanceof FencedError || this.#lockLost);
        if (this.#closing) break;
        if (isPermanent(err)) {
          this.#stop(asReported(err, `outbox relay "${this.#opts.producerName}" stopped`));
          return;
        }
        failingSince ??= performance.now();
        if (performance.now() - failingSince > this.#opts.reconnect.giveUpAfterMs) {
          // Named after the server that failed last: PostgreSQL (a statement, a pool connect, the
          // lock session) or the broker.
          const store = isStoreFailure(err);
          this.#stop(
            new DedupError(
              store ? 'DEDUP_STORE_REFUSED' : 'DEDUP_BROKER_UNREACHABLE',
              `outbox relay "${this.#opts.producerName}" gave up after ${this.#opts.reconnect.giveUpAfterMs} ms of failures; ` +
                `the last: ${store ? 'PostgreSQL' : 'the broker'}: ${err instanceof Error ? err.message : String(err)}`,
              { cause: err },
            ),
          );
          return;
        }
        this.#emit({ type: 'retrying', error: err instanceof Error ? err : new Error(String(err)) });
        await sleep(backoff.next(), (w) => (this.#wake = w));
      }
    }
  }

  #stop(error: Error): void {
    this.#stopError ??= error;
    this.#emit({ type: 'stopped', error });
    void this.#teardown().then(() => this.#finish(error));
  }

  /** Ends a life: closes the producers; drops the database connections when they may be broken. */
  async #deactivate(dropLock: boolean): Promise<void> {
    // Everything taken out before the first await: close() may tear down while the loop does too,
    // and a pg client released twice throws.
    this.#epoch = undefined;
    // A check of this life that settles later is ignored; its records stay for the next recovery.
    this.#pending = [];
    const targets = [...this.#targets.values()];
    this.#targets = new Map();
    const work = this.#work;
    this.#work = undefined;
    const lock = dropLock ? this.#lockClient : undefined;
    if (dropLock) {
      this.#lockClient = undefined;
      this.#lockLost = false;
    }
    this.#failure = undefined;
    // The work connection first: a statement waiting on it fails now, not after the broker's close.
    this.#destroyDb(work);
    this.#destroyDb(lock);
    await Promise.all(targets.map((t) => t.transport.close()));
  }

  async #teardown(): Promise<void> {
    await this.#deactivate(true);
  }
}
