/**
 * The stable error codes of stream-dedup. A code, once released, keeps its meaning in every later
 * minor and patch version and is not removed before the next major version (one that is no longer
 * thrown stays, marked deprecated); new codes may be added in minor versions.
 *
 * @remarks Since 0.1.0
 */
export type DedupErrorCode =
  /** Another process (or another open store object) holds the LevelDB lock on the store folder. */
  | 'DEDUP_STORE_LOCKED'
  /** The store holds a record this version cannot decode, or its folder cannot be opened. */
  | 'DEDUP_STORE_CORRUPT'
  /** On open, the broker's last publishing ID for the name is above the store's: the name is used elsewhere, or the store was lost or restored. */
  | 'DEDUP_SEQUENCE_REGRESSION'
  /** An application-supplied publishing ID is not above the last accepted one: the broker would drop it silently. */
  | 'DEDUP_ID_REGRESSION'
  /** The publisher was opened in one ID mode (automatic, explicit or keyed) and a send used another. */
  | 'DEDUP_ID_MODE_MISMATCH'
  /** While running, the broker's last ID for our name moved past ours: another writer uses the name. */
  | 'DEDUP_NAME_CONFLICT'
  /** The broker did not confirm a message in time. The message stays in the outbox and is re-sent. */
  | 'DEDUP_CONFIRM_TIMEOUT'
  /** `send()` after `close()`, or a send still waiting when `close()` gave up on it. */
  | 'DEDUP_PUBLISHER_CLOSED'
  /** The broker could not be reached or refused the connection (open, or reconnect exhausted). */
  | 'DEDUP_BROKER_UNREACHABLE'
  /** The broker refused an operation (stream missing, access refused, publish error). */
  | 'DEDUP_BROKER_REFUSED'
  /**
   * Reserved: never thrown. Meant for a message's missing or malformed identity headers, which the
   * verifying consumer reports instead through its `unidentified` option, `unidentified` events and
   * `stats.unidentified`. Kept so that code switching on it still compiles. Deprecated since
   * 0.2.0: nothing throws it; do not wait for it. (A union member takes no `@deprecated` tag:
   * TypeScript does not mark it, and TypeDoc refuses block tags there.)
   */
  | 'DEDUP_INVALID_IDENTITY'
  /**
   * A wait was cancelled through an `AbortSignal`; or (PostgreSQL store, since 0.6.0) a handler's
   * query after its batch was rolled back under it (a consumer group's partition revoked).
   */
  | 'DEDUP_ABORTED'
  /**
   * `open()` refused a combination of options that cannot keep the exactly-once promise: keyed IDs
   * without an outbox (`durability: 'reserve'`), or explicit IDs without one where the broker cannot
   * report its last publishing ID (AMQP 0-9-1). Nothing was sent. Since 0.2.0.
   */
  | 'DEDUP_UNSAFE_OPTIONS'
  /**
   * A `DedupStore` was used after its `close()`: a publisher or consumer opened on a closed store,
   * or a store closed under a publisher still writing to it. (0.1 reported this as
   * `DEDUP_STORE_CORRUPT`.) Since 0.2.0.
   */
  | 'DEDUP_STORE_CLOSED'
  /** A verifying consumer was used after `close()`. Since 0.2.0. */
  | 'DEDUP_CONSUMER_CLOSED'
  /**
   * A super stream's partitions are not the ones the store last saw for the producer (another
   * count, other names or another order), or its bindings route a key to a stream that is not one
   * of them. Routing would move keys to other partitions, away from their per-partition IDs,
   * outboxes and keys: the publisher refuses rather than reroute silently. Nothing was sent.
   * Since 0.3.0.
   */
  | 'DEDUP_PARTITIONS_CHANGED'
  /**
   * A chunk the broker delivered cannot be decoded: malformed bytes, or a sub-entry batch
   * compressed with a codec this process cannot read (snappy, lz4; zstd before Node.js 22.15). The
   * verifying stream consumer stops before applying anything of that chunk, and a restart stops at
   * the same chunk: nothing is skipped silently. `readStreamToEnd` (and `audit`) fail with it.
   * Since 0.4.0.
   */
  | 'DEDUP_STREAM_UNREADABLE'
  /**
   * A consumer group's changelog (docs/design.md §12) cannot be restored from: an entry that does
   * not decode, writes outside its partition's keys, is out of order, starts after the state it
   * would apply to (a hole), or the changelog lost its first entries (a retention policy). The
   * member stops before applying anything of the partition: nothing is guessed.
   * Since 0.5.0.
   */
  | 'DEDUP_CHANGELOG_INVALID'
  /**
   * The verifying stream consumer's stream was deleted and recreated under the same name (or the
   * store belongs to another stream or cluster): it is empty although an offset was committed, or
   * the chunk found at the committed chunk's offset has another first offset or timestamp than the
   * one stored with the offset (a stream still shorter than that waits until it grows there: the
   * node answering may be a replica behind). Resuming
   * would skip the new stream's first messages silently; the consumer (or a group member taking
   * over the partition) stops instead, before any handler runs. Not detected: a recreated stream
   * that retention also trimmed past the committed chunk, and the AMQP 0-9-1 consumer (its
   * deliveries carry no chunk header).
   * Since 0.6.0.
   */
  | 'DEDUP_STREAM_REGRESSION'
  /**
   * The PostgreSQL store (`stream-dedup/postgres`) refused: a wrong password, an unknown database,
   * an unreachable server, a missing schema or one of another version (run `migrate`), a role
   * without the rights the store needs (read-only), or a batch the server would not commit. The
   * server's error is the `cause`. Also a LevelDB store that opened but cannot be written (a full
   * disk, read-only files), refused by `DedupStore.open`. Since 0.6.0.
   */
  | 'DEDUP_STORE_REFUSED'
  /**
   * A verifying consumer on the PostgreSQL store found its committed offset moved by another
   * process consuming under the same name (a second instance, a zombie after a pause): its batch
   * was rolled back, nothing of it applied. The stream and AMQP 0-9-1 consumers go on from the
   * stored offset instead of stopping (`stats.fences`). Since 0.6.0.
   */
  | 'DEDUP_CONSUMER_FENCED';

/**
 * Every operational failure stream-dedup reports is a `DedupError` with a stable {@link DedupErrorCode}.
 * Misuse of the API (an argument of the wrong type or out of range) throws a plain `TypeError` or
 * `RangeError` instead.
 *
 * @example
 * ```ts
 * try {
 *   await StreamDedupPublisher.open(options);
 * } catch (err) {
 *   if (err instanceof DedupError && err.code === 'DEDUP_SEQUENCE_REGRESSION') {
 *     // the broker knows a higher publishing ID for this name than our store: investigate
 *   }
 *   throw err;
 * }
 * ```
 * @remarks Since 0.1.0
 */
export class DedupError extends Error {
  /** The stable code; switch on it, not on the message. */
  readonly code: DedupErrorCode;

  /** `options.cause` is the underlying error, where there is one. */
  constructor(code: DedupErrorCode, message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = new.target.name;
    this.code = code;
  }
}

/** True when `err` is a {@link DedupError}, optionally with the given code. */
export function isDedupError(err: unknown, code?: DedupErrorCode): err is DedupError {
  return err instanceof DedupError && (code === undefined || err.code === code);
}
