/**
 * `PgOutboxRelay.open()`'s options, checked and with their defaults, before any I/O.
 */
import type { Pool } from 'pg';
import type { Client } from 'rabbitmq-stream-js-client';
import { assertProducerName } from '../../identity/producer-name.js';
import { measureUtf8 } from '../../identity/utf8.js';
import type { ReconnectOptions } from '../../publisher/types.js';
import type { StreamConnectionOptions } from '../../transport/util.js';
import {
  absent,
  expectObject,
  expectOptionalFunction,
  expectOptionalObject,
  integerOption,
  timerOption,
  typeMismatch,
} from '../../util/options.js';
import { checkSchemaName } from '../schema.js';

/**
 * What a relay reports as it runs (`onEvent`), for observation only.
 *
 * - `active`: this relay took the producer name over (lease `epoch`).
 * - `recovered`: rows assigned by an earlier life were found: `alreadyStored` were at or below the
 *   broker's last ID and deleted unsent, `resent` were re-sent under their IDs.
 * - `confirmed`: the broker confirmed `count` rows of `target`, up to publishing ID `lastId`; their
 *   rows are deleted.
 * - `retrying`: a transient failure (broker or database connection); the relay retries.
 * - `stopped`: the relay stopped, on `close()` (`error` undefined) or on a permanent failure.
 *
 * @remarks Since 0.6.0
 */
export type OutboxRelayEvent =
  | {
      /** This relay took the producer name over (it holds the lock). */
      readonly type: 'active';
      /** The lease epoch it numbers under. */
      readonly epoch: bigint;
    }
  | {
      /** The crash-recovery step of a target ran (docs/design.md §14). */
      readonly type: 'recovered';
      /** The stream or partition. */
      readonly target: string;
      /** Numbered rows the broker already held (deleted without a re-send). */
      readonly alreadyStored: number;
      /** Numbered rows re-sent under their IDs. */
      readonly resent: number;
    }
  | {
      /** The broker confirmed rows (they are deleted). */
      readonly type: 'confirmed';
      /** The stream or partition. */
      readonly target: string;
      /** How many rows. */
      readonly count: number;
      /** The highest publishing ID among them. */
      readonly lastId: bigint;
    }
  | {
      /** A transient failure: the relay reconnects and goes on. */
      readonly type: 'retrying';
      /** What failed. */
      readonly error: Error;
    }
  | {
      /** The relay stopped. */
      readonly type: 'stopped';
      /** Why (`undefined` after `close()`). */
      readonly error: Error | undefined;
    };

/**
 * The options of `PgOutboxRelay.open` whatever its target: see {@link PgOutboxRelayOptions}, which
 * adds exactly one of `stream` and `superStream`.
 *
 * @remarks Since 0.6.0
 */
export interface PgOutboxRelayCommonOptions {
  /** The database: the relay takes up to two connections of it (the lock, and its work). */
  readonly pool: Pool;
  /** The schema `migrate()` created. */
  readonly schema: string;
  /** The producer name: the outbox rows it publishes (`PgOutbox`'s `producerName`), and its name on the broker. */
  readonly producerName: string;
  /**
   * Connection parameters, or an existing `Client` (as `StreamDedupPublisher.open` takes them).
   * @defaultValue the publishers' defaults: localhost:5552, guest/guest, vhost `/`
   */
  readonly connection?: StreamConnectionOptions | Client;
  /**
   * How long one broker connection attempt may take, in ms; also the bound on the broker's answer
   * to the other-writer check (its last publishing ID) before confirmed rows are deleted: a check
   * not answered within it ends the relay's life like any broker failure. @defaultValue 10000
   */
  readonly connectTimeoutMs?: number;
  /**
   * Rows numbered per assignment transaction (at most 16 MiB of bodies are read at once whatever it
   * is). Each numbering costs two database round trips and a WAL flush: 2 000 relayed 53 000 rows/s
   * where 500 relayed 35 000–41 000 (bench:outbox, loaded 2-core machine). @defaultValue 2000
   */
  readonly batchSize?: number;
  /**
   * Most rows sent and not yet confirmed (all targets together); apart from those, most rows of
   * confirmed batch records not yet deleted (their other-writer check is one broker round trip,
   * up to `connectTimeoutMs`): past either the relay numbers nothing more until they drain.
   * @defaultValue 5000
   */
  readonly maxInFlight?: number;
  /**
   * The polling fallback, in ms: the relay looks for rows this often even without a notification
   * (notifications are lost while its listening connection is down). @defaultValue 1000
   */
  readonly pollIntervalMs?: number;
  /**
   * How often a standby relay tries to take the producer name over, in ms: a standby becomes active
   * at most this long (plus its connect) after the active relay's database session ends.
   * @defaultValue 1000
   */
  readonly takeoverIntervalMs?: number;
  /**
   * The lease, in ms: the longest a relay that stopped running (a SIGSTOPped or frozen process, a
   * host that stopped answering) keeps the producer name. The active relay's lock session runs with
   * PostgreSQL's `idle_session_timeout` (and its work session with
   * `idle_in_transaction_session_timeout`) set to this, and proves itself alive every
   * `leaseTimeoutMs / 5`; a relay that does not is cut off by the server, and a standby takes over
   * within `leaseTimeoutMs + takeoverIntervalMs` plus its connect. A relay that wakes up after that
   * numbers and deletes nothing more (the lease epoch fences it); what it still had on the wire are
   * IDs the broker deduplicates. A healthy relay starved of CPU for longer loses the name the same
   * way (safely). Needs PostgreSQL 14 or later; 0: no lease (a paused relay keeps the name until
   * its session ends). Since 0.6.0.
   * @defaultValue 5000
   */
  readonly leaseTimeoutMs?: number;
  /** Each database statement's bound, in ms (`statement_timeout` and the driver's). @defaultValue 30000 */
  readonly queryTimeoutMs?: number;
  /** How long the broker may take to confirm a message before the relay reconnects and re-sends. @defaultValue 30000 */
  readonly confirmTimeoutMs?: number;
  /** The longest `close()` waits for confirms of what was sent, in ms. @defaultValue 10000 */
  readonly closeTimeoutMs?: number;
  /**
   * Reconnect backoff (broker and database). The relay stops after `giveUpAfterMs` of failures.
   * A life that takes the name over and fails again is part of the same failure (the clock goes
   * on) unless batch records were deleted after the broker's confirm in it, or it ran for
   * `maxDelayMs` with nothing left unconfirmed; a wait as a standby (another relay holds the
   * name) ends the failure.
   * @defaultValue as the publishers': initialDelayMs 100, maxDelayMs 5000, giveUpAfterMs 120000
   */
  readonly reconnect?: ReconnectOptions;
  /**
   * Observation hook; must not throw (what it throws is ignored).
   * @defaultValue none
   */
  readonly onEvent?: (event: OutboxRelayEvent) => void;
}

/**
 * A relay publishing into one stream.
 *
 * @remarks Since 0.6.0
 */
export interface PgOutboxRelayStreamOptions extends PgOutboxRelayCommonOptions {
  /** The stream to publish into (it must exist). */
  readonly stream: string;
  /** Left out: a relay publishes into a stream or a super stream. @defaultValue none */
  readonly superStream?: undefined;
}

/**
 * A relay publishing into a super stream.
 *
 * @remarks Since 0.6.0
 */
export interface PgOutboxRelaySuperStreamOptions extends PgOutboxRelayCommonOptions {
  /**
   * The super stream to publish into: each row goes to the partition its routing key (`routingKey`,
   * else `key`) hashes to, as `SuperStreamDedupPublisher`'s `hash` routing does (MurmurHash3, seed
   * 104729), with its own publishing IDs per partition under the same producer name. A row with
   * neither key stops the relay (`DEDUP_BROKER_REFUSED` naming it). The partition list is read at
   * takeover.
   */
  readonly superStream: string;
  /** Left out: a relay publishes into a stream or a super stream. @defaultValue none */
  readonly stream?: undefined;
}

/**
 * Options of `PgOutboxRelay.open`: exactly one of `stream` and `superStream`. The types say what
 * `open()` checks at run time (a TypeError for a caller the types do not reach).
 *
 * @remarks Since 0.6.0
 */
export type PgOutboxRelayOptions = PgOutboxRelayStreamOptions | PgOutboxRelaySuperStreamOptions;

/** The options with every default; frozen. @internal */
export interface ResolvedRelayOptions {
  readonly pool: Pool;
  readonly schema: string;
  readonly producerName: string;
  readonly target: { readonly kind: 'stream' | 'superStream'; readonly name: string };
  readonly connection: StreamConnectionOptions | Client | undefined;
  readonly connectTimeoutMs: number;
  readonly batchSize: number;
  readonly maxInFlight: number;
  readonly pollIntervalMs: number;
  readonly takeoverIntervalMs: number;
  readonly leaseTimeoutMs: number;
  readonly queryTimeoutMs: number;
  readonly confirmTimeoutMs: number;
  readonly closeTimeoutMs: number;
  readonly reconnect: {
    readonly initialDelayMs: number;
    readonly maxDelayMs: number;
    readonly giveUpAfterMs: number;
  };
  readonly onEvent: (event: OutboxRelayEvent) => void;
}

function streamName(value: unknown, name: string): string {
  if (typeof value !== 'string' || value.length === 0 || Buffer.byteLength(value, 'utf8') > 255) {
    typeMismatch(name, 'a non-empty string of at most 255 UTF-8 bytes', value);
  }
  // PostgreSQL text cannot hold U+0000 (the name lock's statement would fail after I/O with an
  // untyped 22021), and UTF-8 turns every lone surrogate into U+FFFD: two names would become one.
  if (value.includes('\u0000')) throw new RangeError(`${name} must not contain U+0000`);
  if (measureUtf8(value).loneSurrogate) {
    throw new RangeError(`${name} must not contain a lone UTF-16 surrogate`);
  }
  return value;
}

/** 0 (no lease) or 200 ms to 2^31 - 1 (a PostgreSQL timeout setting's range). */
function leaseOption(value: unknown): number {
  const ms = integerOption(value, 'leaseTimeoutMs', 5_000, 0, 2_147_483_647);
  if (ms > 0 && ms < 200)
    throw new RangeError(`Expected leaseTimeoutMs to be 0 or an integer ≥ 200, got ${ms}`);
  return ms;
}

/**
 * Checks every option. @internal
 *
 * @throws TypeError, RangeError "Expected x to be …, got …".
 */
export function resolveRelayOptions(options: PgOutboxRelayOptions): ResolvedRelayOptions {
  expectObject(options, 'options');
  const pool = options.pool as unknown;
  if (typeof (pool as { connect?: unknown } | null)?.connect !== 'function') {
    typeMismatch('pool', 'a pg Pool', pool);
  }
  const schema = checkSchemaName(options.schema);
  assertProducerName(options.producerName);
  if (absent(options.stream) === absent(options.superStream)) {
    typeMismatch('stream or superStream', 'exactly one of them', options.stream ?? options.superStream);
  }
  const target = absent(options.superStream)
    ? { kind: 'stream' as const, name: streamName(options.stream, 'stream') }
    : { kind: 'superStream' as const, name: streamName(options.superStream, 'superStream') };
  expectOptionalObject(options.connection, 'connection');
  expectOptionalObject(options.reconnect, 'reconnect');
  expectOptionalFunction(options.onEvent, 'onEvent');
  const reconnect: ReconnectOptions = options.reconnect ?? {};
  const hook = options.onEvent;
  return Object.freeze({
    pool: options.pool,
    schema,
    producerName: options.producerName,
    target: Object.freeze(target),
    connection: options.connection ?? undefined,
    connectTimeoutMs: timerOption(options.connectTimeoutMs, 'connectTimeoutMs', 10_000, 1),
    batchSize: integerOption(options.batchSize, 'batchSize', 2_000, 1, 100_000),
    maxInFlight: integerOption(options.maxInFlight, 'maxInFlight', 5_000, 1),
    pollIntervalMs: timerOption(options.pollIntervalMs, 'pollIntervalMs', 1_000, 1),
    takeoverIntervalMs: timerOption(options.takeoverIntervalMs, 'takeoverIntervalMs', 1_000, 1),
    leaseTimeoutMs: leaseOption(options.leaseTimeoutMs),
    queryTimeoutMs: integerOption(options.queryTimeoutMs, 'queryTimeoutMs', 30_000, 1, 2_147_483_647),
    confirmTimeoutMs: timerOption(options.confirmTimeoutMs, 'confirmTimeoutMs', 30_000, 1),
    closeTimeoutMs: timerOption(options.closeTimeoutMs, 'closeTimeoutMs', 10_000, 0),
    reconnect: Object.freeze({
      initialDelayMs: timerOption(reconnect.initialDelayMs, 'reconnect.initialDelayMs', 100, 1),
      maxDelayMs: timerOption(reconnect.maxDelayMs, 'reconnect.maxDelayMs', 5_000, 1),
      giveUpAfterMs: integerOption(reconnect.giveUpAfterMs, 'reconnect.giveUpAfterMs', 120_000, 1),
    }),
    onEvent: (event: OutboxRelayEvent) => {
      try {
        hook?.(event);
      } catch {
        // Observation only: a throwing hook must not stop the relay.
      }
    },
  });
}
