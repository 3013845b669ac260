/**
 * The relay's hold on its producer name (docs/design.md §14, "one active relay"): two session
 * advisory locks on one dedicated connection, a lease bound on that session, and the check that
 * tells which server failed when the relay gives up.
 *
 * - The *name* lock, `stream-dedup-outbox-name:` + `JSON.stringify([kind, target, producerName])`, is
 *   database-wide: the broker deduplicates per (stream, producer name), so two outboxes (two
 *   schemas) relaying one name into one stream must never both be active. It is taken first.
 * - The *outbox* lock, `stream-dedup-outbox:<schema>:<producerName>` (the key `outbox status`
 *   shows), orders the relays of one outbox, whatever their target.
 * - The lease: the lock session runs with `idle_session_timeout = leaseTimeoutMs`, and the active
 *   relay runs {@link RelayLock.held} on it every `leaseTimeoutMs / 5`: a paused (SIGSTOPped)
 *   relay's session is ended by the server within `leaseTimeoutMs`, its locks go, a standby takes
 *   over; the lease epoch fences whatever the paused relay does when it wakes.
 */
import type pg from 'pg';
import type { PoolClient } from 'pg';
import { DedupError } from '../../errors.js';

/** What the lock statements run through (RelayDb.run: bounded). */
type Run = <R extends pg.QueryResultRow>(
  client: PoolClient,
  text: string,
  values?: unknown[],
) => Promise<pg.QueryResult<R>>;

/** The advisory lock's `classid` and `objid` of a key, as `pg_locks` shows them. */
const LOCK_ROW = (param: string): string =>
  `l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
   AND l.classid = ((hashtextextended(${param}, 0) >> 32) & 4294967295)::oid
   AND l.objid = (hashtextextended(${param}, 0) & 4294967295)::oid`;

/** The first PostgreSQL version with `idle_session_timeout`. */
const IDLE_SESSION_TIMEOUT_SINCE = 140_000;

/** @internal */
export class RelayLock {
  /** The outbox lock's key (per schema; `outbox status` reads it). */
  readonly outboxKey: string;
  /** The name lock's key (per database: target and producer name). */
  readonly nameKey: string;
  /** The session that held the name lock at the last try while the outbox lock was free. */
  #suspect: number | undefined;

  constructor(
    private readonly run: Run,
    private readonly schema: string,
    private readonly producerName: string,
    private readonly target: { readonly kind: 'stream' | 'superStream'; readonly name: string },
    private readonly leaseTimeoutMs: number,
  ) {
    this.outboxKey = `stream-dedup-outbox:${schema}:${producerName}`;
    // JSON, not ':'-joined: stream and producer names may hold ':', and ('a:b', 'c') must not
    // share a key with ('a', 'b:c') (a false DEDUP_NAME_CONFLICT).
    this.nameKey = `stream-dedup-outbox-name:${JSON.stringify([target.kind, target.name, producerName])}`;
  }

  /** How often the active relay proves its session alive (0: no lease). */
  get heartbeatMs(): number {
    return this.leaseTimeoutMs === 0 ? 0 : Math.max(1, Math.floor(this.leaseTimeoutMs / 5));
  }

  /**
   * Refuses a lease on a server without `idle_session_timeout` (PostgreSQL < 14): the bound would
   * not hold. Run at open, before anything is locked.
   */
  async checkServer(client: PoolClient): Promise<void> {
    if (this.leaseTimeoutMs === 0) return;
    const found = await this.run<{ v: number }>(
      client,
      `SELECT current_setting('server_version_num')::int AS v`,
    );
    const version = found.rows[0]?.v ?? 0;
    if (version < IDLE_SESSION_TIMEOUT_SINCE) {
      throw new DedupError(
        'DEDUP_UNSAFE_OPTIONS',
        `the outbox relay's lease (leaseTimeoutMs ${this.leaseTimeoutMs}) needs PostgreSQL 14 or later ` +
          `(idle_session_timeout); the server is ${version}. Upgrade, or set leaseTimeoutMs: 0 (a paused relay ` +
          'then keeps the name until its session ends); nothing was sent',
      );
    }
  }

  /**
   * Tries both locks on `client`'s session (a fresh one): true when both are held (the session
   * then carries the lease bound). False: another relay is active, and this session holds nothing
   * (the caller ends it).
   *
   * @throws DedupError `DEDUP_NAME_CONFLICT` when, at two tries in a row, the same session held the
   *   name lock while this outbox's lock was free: a relay of another outbox (another schema of this
   *   database) publishes the producer name into the same target. (Seen once, it may be a relay of
   *   this outbox whose session is ending and has released one lock of two.)
   */
  async acquire(client: PoolClient): Promise<boolean> {
    // One statement (the select list is evaluated in order): a relay taking the name holds the one
    // lock without the other for microseconds, not for a round trip another relay could watch.
    const got = await this.run<{ name: boolean; outbox: boolean }>(
      client,
      `${this.#tag()} SELECT pg_try_advisory_lock(hashtextextended($1, 0)) AS name,
         pg_try_advisory_lock(hashtextextended($2, 0)) AS outbox`,
      [this.nameKey, this.outboxKey],
    );
    const gotName = got.rows[0]?.name === true;
    const gotOutbox = got.rows[0]?.outbox === true;
    if (gotName && gotOutbox) {
      this.#suspect = undefined;
      if (this.leaseTimeoutMs > 0)
        await this.run(client, `SET idle_session_timeout = ${this.leaseTimeoutMs}`);
      return true;
    }
    if (gotName || !gotOutbox) {
      // A relay of this outbox is active (on this target or another): a standby.
      this.#suspect = undefined;
      return false;
    }
    const holder = await this.run<{ pid: number; application_name: string; query: string }>(
      client,
      `SELECT a.pid, a.application_name, a.query FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
        WHERE ${LOCK_ROW('$1')} LIMIT 1`,
      [this.nameKey],
    );
    const other = holder.rows[0];
    if (other === undefined) {
      this.#suspect = undefined;
      return false;
    }
    if (this.#suspect !== other.pid) {
      this.#suspect = other.pid;
      return false;
    }
    const seen = /stream-dedup outbox relay schema=(\S+) |LISTEN "stream_dedup_outbox_([^"]+)"/.exec(
      other.query,
    );
    const schema = seen?.[1] ?? seen?.[2];
    throw new DedupError(
      'DEDUP_NAME_CONFLICT',
      `another outbox relay (PostgreSQL session ${other.pid}` +
        `${other.application_name === '' ? '' : `, application "${other.application_name}"`}` +
        `${schema === undefined ? '' : `, schema "${schema}"`}) publishes producer name "${this.producerName}" into ` +
        `${this.target.kind === 'stream' ? 'stream' : 'super stream'} "${this.target.name}", which the outbox of schema ` +
        `"${this.schema}" relays too: the broker deduplicates per stream and name, so one relay's rows would be ` +
        "dropped as duplicates of the other's IDs. Give each outbox its own producer name; nothing was sent",
    );
  }

  /**
   * Whether `client`'s session holds both locks (false when it cannot answer). The active relay's
   * heartbeat: the statement also keeps the session from `idle_session_timeout`.
   */
  async held(client: PoolClient): Promise<boolean> {
    try {
      const found = await this.run<{ n: number }>(
        client,
        `${this.#tag()} SELECT count(*)::int AS n FROM pg_locks l
          WHERE l.pid = pg_backend_pid() AND ((${LOCK_ROW('$1')}) OR (${LOCK_ROW('$2')}))`,
        [this.nameKey, this.outboxKey],
      );
      return found.rows[0]?.n === 2;
    } catch {
      return false;
    }
  }

  /** A comment naming the holder, which `pg_stat_activity.query` shows to another outbox's relay. */
  #tag(): string {
    return `/* stream-dedup outbox relay schema=${this.schema} */`;
  }
}

/** Errors that came from PostgreSQL (a statement, a pool connect, the lock session's end). */
const fromStore = new WeakSet<object>();

/** Marks `err` as the database's. @internal */
export function markStore(err: unknown): unknown {
  if (typeof err === 'object' && err !== null) fromStore.add(err);
  return err;
}

/** Whether `err` came from PostgreSQL (see {@link markStore}). @internal */
export function isStoreFailure(err: unknown): boolean {
  return typeof err === 'object' && err !== null && fromStore.has(err);
}

/**
 * `db` whose every method's rejection is marked as the database's ({@link markStore}): the relay
 * names PostgreSQL, not the broker, when it gives up after a database outage. @internal
 */
export function storeMarked<T extends object>(db: T): T {
  return new Proxy(db, {
    get(target, prop, receiver) {
      const value: unknown = Reflect.get(target, prop, receiver);
      if (typeof value !== 'function') return value;
      return (...args: unknown[]): unknown => {
        const result: unknown = (value as (...a: unknown[]) => unknown).apply(target, args);
        return result instanceof Promise
          ? result.catch((err: unknown) => {
              throw markStore(err);
            })
          : result;
      };
    },
  });
}
