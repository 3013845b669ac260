import type { Headers } from '../store/codec.js';
import type { DedupStore } from '../store/store.js';
import type { Logger } from '../telemetry/logger.js';

/** How a sub-entry batch's data may be compressed ('none': written as it is). */
export type BatchCodec = 'none' | 'gzip' | 'zstd';

/**
 * A message for a transport to put on the wire. The transport stamps the identity
 * (`x-dedup-producer`, `x-dedup-id`) next to the caller's `headers`.
 */
export interface OutgoingMessage {
  readonly publishingId: bigint;
  readonly body: Uint8Array;
  readonly headers: Headers | undefined;
  /**
   * The members of its sub-entry batch, in ID order (itself included): they leave together as one
   * entry with the last member's ID (docs/design.md §10). `undefined`: an entry of its own.
   */
  readonly batch?: readonly OutgoingMessage[] | undefined;
}

/** What a transport reports back to the publisher core. */
export interface TransportHandlers {
  /** The broker confirmed these IDs (stored, or an equal-or-higher ID was already stored). */
  confirmed(publishingIds: readonly bigint[]): void;
  /** The connection is gone or unusable; the core reconnects and re-sends. */
  disconnected(error: Error): void;
}

/**
 * The broker-specific half of a dedup publisher. The core (IDs, outbox, reconcile, backpressure,
 * reconnect) is the same for every transport; a transport only connects, publishes and confirms.
 */
export interface PublishTransport {
  /** What the producer publishes into: a stream name, or an AMQP queue. */
  readonly target: string;
  /**
   * Connects (or reconnects from scratch) and declares the producer. Resolves with the broker's
   * last publishing ID for the name (0n when it never published), or `undefined` when the
   * transport cannot ask the broker (AMQP 0-9-1).
   */
  connect(handlers: TransportHandlers): Promise<bigint | undefined>;
  /** Puts messages on the wire in order. Rejects when the connection is unusable. */
  publish(messages: readonly OutgoingMessage[]): Promise<void>;
  /** The broker's last publishing ID for the name, for the name-conflict watch. */
  queryLastId(): Promise<bigint | undefined>;
  /** The largest body plus headers, in bytes, that fits one message. */
  readonly maxMessageBytes: number;
  /**
   * The most messages one entry may carry (sub-entry batching, stream protocol only); 1 or
   * absent: one message per entry.
   */
  readonly subEntrySize?: number;
  /**
   * The most uncompressed bytes one sub-entry batch may declare (the broker's
   * `stream.max_uncompressed_sub_entry_batch_size`); absent: 64 MiB, the broker's default.
   */
  readonly maxBatchBytes?: number;
  /**
   * How the transport compresses a sub-entry batch: the cut's size bound is that codec's, not the
   * worst one's (absent: the worst).
   */
  readonly subEntryCompression?: BatchCodec;
  /**
   * True when a sub-entry batch (`OutgoingMessage.batch`) leaves as one entry that the broker
   * stores or drops whole and confirms by its last member's ID (the stream protocol, whatever
   * `subEntrySize` is now). Absent or false (AMQP 0-9-1): every message is an entry of its own,
   * confirmed by its own ID, so a batch recorded in the outbox by a stream life is re-sent and
   * settled member by member.
   */
  readonly carriesBatches?: boolean;
  /** Frees the producer name on the broker and closes connections. Idempotent, never throws. */
  close(): Promise<void>;
}

/** How the outbox protects messages. */
export type Durability = 'outbox' | 'reserve';

/** Reconnect behaviour after a lost connection or a broker restart. */
export interface ReconnectOptions {
  /** First delay before reconnecting, in ms. @defaultValue 100 */
  readonly initialDelayMs?: number;
  /** Largest delay between attempts, in ms (exponential backoff with jitter up to it). @defaultValue 5000 */
  readonly maxDelayMs?: number;
  /**
   * Give up after this long without a connection, in ms: the publisher then closes with
   * `DEDUP_BROKER_UNREACHABLE`; unconfirmed messages stay in the outbox for the next `open()`.
   * @defaultValue 120000
   */
  readonly giveUpAfterMs?: number;
}

/** Options every dedup publisher shares, whatever its transport. */
export interface DedupPublisherOptions {
  /**
   * The producer's stable name: the same logical producer must use the same name after every
   * restart, and no two live producers may share it on one stream. 1 to 256 UTF-8 bytes, no
   * control characters.
   */
  readonly producerName: string;
  /** A LevelDB folder (opened and closed by the publisher), or an opened {@link DedupStore} shared by several producers. */
  readonly store: string | DedupStore;
  /**
   * `outbox`: each message is written to LevelDB (one batch per flush) before it is sent, and
   * re-sent with its original ID after a crash. `reserve`: only IDs are made durable, in blocks;
   * a message whose `send()` had not resolved when the process died is not re-sent.
   * @defaultValue 'outbox'
   */
  readonly durability?: Durability;
  /** fsync every LevelDB commit. Only when `store` is a path. @defaultValue false */
  readonly sync?: boolean;
  /**
   * `auto`: the publisher numbers messages 1, 2, 3, … `explicit`: every `send()` passes its own
   * `publishingId` (for example a source offset + 1), strictly increasing. `keyed`: every `send()`
   * passes a domain `key`; a key already published (within `keyRetention`) publishes nothing and
   * resolves with its first ID. A store remembers the mode and refuses to reopen in another.
   * @defaultValue 'auto'
   */
  readonly idMode?: 'auto' | 'explicit' | 'keyed';
  /**
   * `keyed` mode: how long a key is remembered — the last `maxKeys` IDs and at most `maxAgeMs`.
   * A repeat after that is published again.
   * @defaultValue `{ maxKeys: 100_000, maxAgeMs: 7 days }`
   */
  readonly keyRetention?: {
    /** How many of the last keys are remembered. @defaultValue 100000 */
    readonly maxKeys?: number;
    /** How long a key is remembered, in ms. @defaultValue 604800000 (7 days) */
    readonly maxAgeMs?: number;
  };
  /**
   * When the broker's last ID for the name is above the store's on open: `error` throws
   * `DEDUP_SEQUENCE_REGRESSION`; `adopt` continues above the broker's ID and re-sends any
   * outbox messages under new IDs (they may then be in the stream twice).
   * @defaultValue 'error'
   */
  readonly onBrokerAhead?: 'error' | 'adopt';
  /**
   * Most messages accepted and not yet confirmed; sends beyond it wait in memory, unwritten and
   * unsent, until confirms make room. Each unconfirmed message is live memory until its confirm:
   * on loopback 5 000 gave 10–20 % more throughput than 10 000 (less for every young-generation
   * collection to copy), and covers a 10 ms round trip at 500 000 messages a second.
   * @defaultValue 5000
   */
  readonly maxInFlight?: number;
  /** Most messages in one group commit (one LevelDB record). @defaultValue 2000 */
  readonly maxBatch?: number;
  /**
   * IDs reserved per LevelDB write in `reserve` durability. With explicit IDs, the ceiling the
   * store records above the caller's IDs (one write per block, not per batch); `open()` reports a
   * broker above it as `DEDUP_SEQUENCE_REGRESSION`. @defaultValue 10000
   */
  readonly reserveBlock?: number;
  /** A `send()` not confirmed within this many ms rejects with `DEDUP_CONFIRM_TIMEOUT` (the message stays in the outbox and is re-sent). @defaultValue 30000 */
  readonly confirmTimeoutMs?: number;
  /** How long `close()` waits for outstanding confirms, in ms. @defaultValue 10000 */
  readonly closeTimeoutMs?: number;
  /** Reconnect policy. @defaultValue `{ initialDelayMs: 100, maxDelayMs: 5000, giveUpAfterMs: 120000 }` */
  readonly reconnect?: ReconnectOptions;
  /**
   * Every this many ms, compare the broker's last ID for the name with ours; a higher one means
   * another writer uses the name: the publisher closes with `DEDUP_NAME_CONFLICT`. 0 turns the
   * watch off. @defaultValue 0
   */
  readonly watchIntervalMs?: number;
  /**
   * A pino-compatible logger for open, reconnects, timeouts and fatal errors. Silent by default.
   * @defaultValue none: the library logs nothing
   */
  readonly logger?: Logger;
  /**
   * `send` spans and the trace context in each message's headers (OpenTelemetry, when an SDK is
   * installed). `false` skips both: about 0.7 µs a send without an SDK.
   *
   * @defaultValue true
   * @remarks Since 0.6.0
   */
  readonly tracing?: boolean;
}

/** Per-message options of `send()`. */
export interface SendOptions {
  /**
   * Application properties (stream) or headers (AMQP). Values are non-empty strings or non-zero
   * 32-bit integers: other values crash the stream client's decoder on the consumer side. Names
   * starting with `x-dedup-` are reserved.
   * @defaultValue none: only the identity stamps
   */
  readonly headers?: Readonly<Record<string, string | number>>;
  /**
   * In `explicit` ID mode: this message's publishing ID, above every earlier one.
   * @defaultValue none (required with `idMode: 'explicit'`, refused otherwise)
   */
  readonly publishingId?: bigint;
  /**
   * In `keyed` ID mode: the message's domain key (1 to 512 UTF-8 bytes), e.g. `'credit-17'`.
   * @defaultValue none (required with `idMode: 'keyed'`, refused otherwise)
   */
  readonly key?: string;
  /**
   * Cancels the wait for room (backpressure) and for the confirm; the message may still be published.
   * @defaultValue none: the send waits for its confirm or `confirmTimeoutMs`
   */
  readonly signal?: AbortSignal;
}

/** What a resolved `send()` tells. */
export interface SendResult {
  /** The message's publishing ID (for a duplicate key: the ID it was first published with). */
  readonly publishingId: bigint;
  /**
   * `published`: the broker confirmed it. `duplicate` (keyed mode): the key was published before,
   * within the retention; nothing was sent.
   */
  readonly outcome: 'published' | 'duplicate';
}

/** What `open()` found and did while reconciling. */
export interface OpenReport {
  /** The store's highest ID before open (0n for a new producer). */
  readonly localLastId: bigint;
  /** The broker's last ID for the name, or `undefined` when the transport cannot tell. */
  readonly brokerLastId: bigint | undefined;
  /** Outbox messages re-sent with their original IDs. */
  readonly resent: number;
  /** Outbox messages re-sent under new IDs because the broker was ahead and `onBrokerAhead: 'adopt'`. */
  readonly reassigned: number;
}
