/**
 * The verifying consumer's public types: the handler and what it is given, the events, the
 * options shared by every transport, and the counters. The transports add their own options.
 */
import type { MessageIdentity } from '../identity/headers.js';
import type { DedupStore } from '../store/store.js';
import type { ConsumerStoreProvider } from './consumer-store.js';
import type { ChunkIdentity } from '../store/chunk-identity.js';
import type { Logger } from '../telemetry/logger.js';
import type { IdRange, PolicySpec } from '../verifier/types.js';

/**
 * A message handed to the handler: identity verified, seen for the first time in its scope.
 *
 * @remarks Since 0.1.0
 */
export interface VerifiedMessage {
  /** The message's body, as the broker delivered it. */
  readonly body: Buffer;
  /** Position in the stream (stream protocol) or the `x-stream-offset` (AMQP 0-9-1). */
  readonly offset: bigint;
  /** The stamped identity; `undefined` only for unidentified messages under `unidentified: 'pass-through'`. */
  readonly identity: MessageIdentity | undefined;
  /** The message's tenant, as the `tenant` option computed it (`''` without that option). */
  readonly tenant: string;
  /** The message's headers (application properties, then annotations, merged). */
  readonly headers: Readonly<Record<string, unknown>>;
}

/**
 * The handler's view of the store: its writes are committed in the same LevelDB batch as the
 * verifier state and the consumer's offset, or not at all. Reads see the batch's own writes.
 * Keys live in the consumer's own namespace: two consumers never see each other's keys.
 *
 * @remarks Since 0.1.0
 */
export interface EffectTransaction {
  /**
   * The value of an effect key as this handler sees it: written earlier in the same batch (by
   * this message or an earlier one not yet committed), or committed; `undefined` when the key was
   * never written or was deleted. Always a Buffer, and a copy: changing it changes nothing stored.
   * What was put as a string reads back as its UTF-8 bytes:
   * `Number((await tx.get('balance'))?.toString() ?? 0)`.
   *
   * @param key - the handler's key (any string; the consumer's namespace is added in the store).
   */
  get(key: string): Promise<Buffer | undefined>;
  /**
   * Writes an effect key in the batch of this message's dedup state. A string is stored as UTF-8;
   * a Uint8Array (a Buffer included) is copied at the call, so the handler may reuse it at once.
   * Writing a key twice in one batch keeps the last value.
   *
   * @param key - the handler's key.
   * @param value - the value to store.
   * @throws TypeError when `key` is not a string, or `value` neither a string nor a Uint8Array.
   */
  put(key: string, value: string | Uint8Array): void;
  /**
   * Deletes an effect key in the batch of this message's dedup state; `get` returns `undefined`
   * for it from now on. Deleting a key that does not exist is not an error.
   *
   * @param key - the handler's key.
   * @throws TypeError when `key` is not a string.
   */
  del(key: string): void;
}

/**
 * Processes one new message; whatever it writes through `tx` commits atomically with the dedup state.
 *
 * @remarks Since 0.1.0
 */
export type MessageHandler = (message: VerifiedMessage, tx: EffectTransaction) => void | Promise<void>;

/**
 * Something the verifier noticed, for observation (metrics, logs, alerts).
 *
 * @remarks Since 0.1.0
 */
export type VerifyEvent =
  | {
      /** A publishing ID already recorded in its scope: skipped, not applied. */
      readonly kind: 'duplicate';
      /** The scope key (identity/scope-key): consumer, tenant and producer. */
      readonly scope: string;
      /** The message's publishing ID. */
      readonly publishingId: bigint;
      /** The message's offset. */
      readonly offset: bigint;
    }
  | {
      /** Left of the window: an old repeat or a very late new message. Not applied, never counted as a duplicate. */
      readonly kind: 'stale';
      /** The scope key (identity/scope-key): consumer, tenant and producer. */
      readonly scope: string;
      /** The message's publishing ID. */
      readonly publishingId: bigint;
      /** The message's offset. */
      readonly offset: bigint;
    }
  | {
      /**
       * IDs missing, possibly lost: `confirmed` false when first jumped over, true when they left the
       * window unseen. Never IDs their producer declared skipped (those are `skip`).
       */
      readonly kind: 'gap';
      /** The scope key (identity/scope-key): consumer, tenant and producer. */
      readonly scope: string;
      /** The missing IDs. */
      readonly range: IdRange;
      /** False when the IDs were first jumped over (they may still come), true when they left the window unseen. */
      readonly confirmed: boolean;
    }
  | {
      /**
       * The message `publishingId` declares that its producer never used the IDs of `range` (a
       * crash in `reserve` durability, an adopting open): not a loss. Reported once per delivery
       * of the declaring message; its IDs are never reported as a `gap`. Since 0.2.0.
       */
      readonly kind: 'skip';
      /** The scope key (identity/scope-key): consumer, tenant and producer. */
      readonly scope: string;
      /** The IDs the producer declared it never used. */
      readonly range: IdRange;
      /** The ID of the declaring message. */
      readonly publishingId: bigint;
      /** The offset of the declaring message. */
      readonly offset: bigint;
    }
  | {
      /** A message without a valid identity. */
      readonly kind: 'unidentified';
      /** The message's offset. */
      readonly offset: bigint;
      /** Why its identity could not be read (`'no identity headers'`, or what is malformed). */
      readonly reason: string;
      /** True under `unidentified: 'pass-through'` (the handler ran), false under `'reject'`. */
      readonly applied: boolean;
    };

/**
 * Options shared by the verifying consumers of every transport. Each is checked at `open()`
 * before anything is opened or connected: a wrong type throws a `TypeError`, a value out of range
 * a `RangeError`, both as "Expected <option> to be <what>, got <value>".
 *
 * @remarks Since 0.1.0
 */
export interface VerifyingConsumerOptions {
  /** The consuming application's name: part of every scope key and of the offset record. */
  readonly consumerName: string;
  /**
   * A LevelDB folder (opened and closed by the consumer), an opened `DedupStore`, or (since 0.6.0)
   * a `PostgresStore` from `stream-dedup/postgres`, whose handlers get a database client instead of
   * an {@link EffectTransaction}.
   */
  readonly store: string | DedupStore | ConsumerStoreProvider;
  /** fsync every commit; only when `store` is a path. @defaultValue false */
  readonly sync?: boolean;
  /** The handler applied once per new message. */
  readonly handler: MessageHandler;
  /**
   * The sequence policy per (consumer, tenant, producer). `window` accepts reordering up to its
   * size (1 to 2^20); `highest` only strictly increasing IDs.
   * @defaultValue `{ kind: 'window', size: 1024 }`
   */
  readonly policy?: PolicySpec;
  /** The tenant of a message (part of the scope key). @defaultValue `() => ''` */
  readonly tenant?: (message: { readonly headers: Readonly<Record<string, unknown>> }) => string;
  /**
   * Messages without identity or with malformed identity: `reject` skips them (reported as
   * `unidentified`), `pass-through` applies them without deduplication. Never a crash.
   * @defaultValue 'reject'
   */
  readonly unidentified?: 'reject' | 'pass-through';
  /**
   * `message`: one LevelDB batch per message. `batch`: one per `commitEvery` messages, or after
   * `commitLingerMs` without a new message.
   * @defaultValue 'batch'
   */
  readonly commit?: 'message' | 'batch';
  /** Messages per batch under `commit: 'batch'` (an integer ≥ 1). @defaultValue 1000 */
  readonly commitEvery?: number;
  /** Quiet time in ms after which a partial batch commits (an integer ≥ 1). @defaultValue 5 */
  readonly commitLingerMs?: number;
  /**
   * Forget the state of a scope idle longer than this many ms (checked at open and hourly). A
   * duplicate that arrives after its scope was forgotten takes effect again. 0 keeps state forever.
   * @defaultValue 0
   */
  readonly scopeTtlMs?: number;
  /**
   * Observation: duplicates, stale messages, gaps, skips, unidentified messages.
   * @defaultValue none: outcomes are only counted in `stats`
   */
  readonly onEvent?: (event: VerifyEvent) => void;
  /**
   * A pino-compatible logger (open, commit failures). Silent by default.
   * @defaultValue none: the library logs nothing
   */
  readonly logger?: Logger;
  /**
   * Observation hooks around each commit (for example fault injection in tests). A hook that
   * throws stops the consumer with what it threw: nothing of the batch is written when
   * `beforeCommit` throws (its messages come again after a restart); the batch stays committed
   * when `afterCommit` throws.
   * @defaultValue none
   */
  readonly hooks?: {
    /** Called before a batch is written. @defaultValue none */
    readonly beforeCommit?: (info: { readonly messages: number; readonly lastOffset: bigint }) => void;
    /** Called once a batch is durable, before its messages are settled. @defaultValue none */
    readonly afterCommit?: (info: { readonly messages: number; readonly lastOffset: bigint }) => void;
  };
}

/**
 * Counters since open.
 *
 * @remarks Since 0.1.0
 */
export interface VerifyStats {
  /** New messages: the handler ran and the ID was recorded (pass-through messages are `unidentified`). */
  new: number;
  /** Messages skipped as duplicates (`duplicate` events). */
  duplicate: number;
  /** Messages left of the window, skipped without being called duplicates (`stale` events). */
  stale: number;
  /** Gaps reported when IDs were jumped over (`gap` events with `confirmed: false`). */
  gapsReported: number;
  /** Gaps confirmed when IDs left the window unseen (`gap` events with `confirmed: true`). */
  gapsConfirmed: number;
  /** Skip declarations seen (`skip` events). Since 0.2.0. */
  skips: number;
  /** Messages without a valid identity, rejected or passed through (`unidentified` events). */
  unidentified: number;
  /** LevelDB batches committed (each with effects, verifier state and offset). */
  commits: number;
  /**
   * Times the consumer found its offset moved by another process under its name (PostgreSQL store):
   * each time its batch was rolled back and it went on from the stored offset. Since 0.6.0.
   */
  fences: number;
  /**
   * Batches rolled back and run again after a serialization failure or a deadlock (PostgreSQL
   * store). Since 0.6.0.
   */
  retries: number;
  /**
   * Batches dropped because the connection to the store was lost (PostgreSQL store), each followed
   * by a reconnection attempt. Since 0.6.0.
   */
  reconnects: number;
}

/**
 * A message as a transport hands it to the core: the shape of the stream client's delivered
 * message, so that the stream consumer passes deliveries through as they are (no wrapper object
 * per message).
 *
 * @internal
 */
export interface IncomingMessage {
  /** The message's offset in the stream. */
  readonly offset: bigint;
  /** The message's body. */
  readonly content: Buffer;
  /** Where the identity is read first: application properties (stream), headers (AMQP 0-9-1). */
  readonly applicationProperties?: Readonly<Record<string, unknown>> | undefined;
  /** Read second: AMQP 0-9-1 `x-` headers arrive here in a stream consumer (see `readIdentity`). */
  readonly messageAnnotations?: Readonly<Record<string, unknown>> | undefined;
  /** Called once the message's outcome is committed (AMQP: ack). */
  readonly settle?: (() => void) | undefined;
  /** The stream chunk the message came in (stream protocol only): stored with the offset. */
  readonly chunk?: ChunkIdentity | undefined;
}

/**
 * How a verifying consumer subscribes and resubscribes, whatever its transport.
 */
export interface SubscriptionOptions {
  /**
   * Where a consumer without a committed offset starts: the stream's first message, or the next
   * one published (AMQP 0-9-1: the `x-stream-offset` argument). A consumer with a committed offset
   * always resumes just after it.
   * @defaultValue 'first'
   */
  readonly startFrom?: 'first' | 'next';
  /**
   * The backoff between attempts to subscribe again after a lost connection, in ms (integers ≥ 1):
   * the first wait is `initialDelayMs`, each next one doubles up to `maxDelayMs`, with jitter.
   * @defaultValue `{ initialDelayMs: 100, maxDelayMs: 5000 }`
   */
  readonly reconnect?: {
    /** The first wait, in ms. @defaultValue 100 */
    readonly initialDelayMs?: number;
    /** The longest wait, in ms. @defaultValue 5000 */
    readonly maxDelayMs?: number;
  };
  /**
   * How long one connection attempt may take, in ms (an integer ≥ 1), all of it: over AMQP 0-9-1
   * the handshake, the channel's opening, prefetch and consume together (a late channel is closed).
   * @defaultValue 10000
   */
  readonly connectTimeoutMs?: number;
}
