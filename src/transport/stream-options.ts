/**
 * What `StreamDedupPublisher.open()` takes: the options every dedup publisher shares, plus the
 * stream protocol's.
 */
import type { Client } from 'rabbitmq-stream-js-client';
import { DEFAULT_MAX_UNCOMPRESSED_BATCH_BYTES } from '../publisher/sub-entries.js';
import type { DedupPublisherOptions } from '../publisher/types.js';
import { MAX_SUB_ENTRY_SIZE } from '../store/codec.js';
import { absent, choiceOption, expectObject, integerOption, outOfRange } from '../util/options.js';
import { HAS_ZSTD } from './compression.js';
import { DEFAULT_MAX_INFLATED_BYTES, type ChunkLimits } from './stream-chunks.js';
import type { StreamConnectionOptions } from './util.js';

/** How a sub-entry batch's messages are compressed (the stream protocol's codes 0, 1 and 4). */
export type SubEntryCompression = 'none' | 'gzip' | 'zstd';

/**
 * Sub-entry batching: up to `size` messages travel in one stream entry (optionally compressed)
 * whose publishing ID is the highest among them; the broker stores or drops the entry whole.
 * Every message keeps its own `x-dedup-id` and its own `send()` result. See docs/design.md §10.
 *
 * @remarks Since 0.4.0
 */
export interface SubEntryOptions {
  /**
   * The most messages per entry, 2 to 65 535. An entry never spans two group commits, so entries
   * hold fewer when sends arrive slower than the pump writes (at most `maxBatch`), and fewer when
   * their bytes would exceed the broker's frame size.
   */
  readonly size: number;
  /**
   * `'gzip'` (Node's zlib) or `'zstd'` (only where Node's zlib has it: Node 22.15 or later; refused
   * at `open()` elsewhere). Consumers must decode what is chosen here: stream-dedup's verifying
   * consumer and `audit` decode all three. @defaultValue 'none'
   */
  readonly compression?: SubEntryCompression;
  /**
   * The most uncompressed bytes one entry's messages may add up to: set it to the broker's
   * `stream.max_uncompressed_sub_entry_batch_size` (RabbitMQ 4.3.5 and later) when that is not
   * the default. The broker refuses a batch declaring more (publish error 17), and a batch is
   * re-sent as it was first cut, so batches are cut below it; a message above it by itself is sent
   * as an entry of its own. Batches are also cut to the frame size (1 MiB by default), so the cap
   * only cuts batches when it is below the frame size or the frame size is raised above it. An
   * integer from 1 to 4 294 967 295 (the u32 the protocol declares it in).
   * @defaultValue 67108864 (64 MiB, the broker's default)
   * @remarks Since 0.6.0
   */
  readonly maxUncompressedBytes?: number;
}

/**
 * The options of {@link StreamDedupPublisher.open} whatever the `idMode`: see
 * {@link StreamDedupPublisherOptions}.
 *
 * @remarks Since 0.6.0 (before, these were all of `StreamDedupPublisherOptions`).
 */
export interface StreamPublisherCommonOptions extends DedupPublisherOptions {
  /**
   * Connection parameters, or an existing `Client` to share. Defaults: `hostname` 'localhost',
   * `port` 5552, `username` and `password` 'guest', `vhost` '/'. With parameters the publisher
   * opens its own connections and reconnects them (through the next of `endpoints` each time);
   * publisher connections dial the host the broker advertises (`stream.advertised_host`) unless
   * `addressResolver` is set. With a `Client` the producer is declared on that client (its
   * connection may carry the application's own publishers: confirms are told apart by producer
   * id; once that pooled connection has issued 256 producer IDs, which the client never reuses, the
   * producer goes on a new connection of the client), reconnections go through that client's
   * locator connection, and `close()` leaves the
   * client open — it stays the application's to close. When the shared client's own connection is
   * gone, reconnection waits for it (for example the application's `client.restart()`) until
   * `reconnect.giveUpAfterMs`, then closes with `DEDUP_BROKER_UNREACHABLE`; the outbox keeps what
   * was unconfirmed.
   * @defaultValue `{ hostname: 'localhost', port: 5552, username: 'guest', password: 'guest', vhost: '/' }`
   */
  readonly connection?: StreamConnectionOptions | Client;
  /** The stream to publish into. */
  readonly stream: string;
  /** Create the stream if it does not exist. @defaultValue false */
  readonly createStream?: boolean;
  /** How long one connection attempt may take, in ms. @defaultValue 10000 */
  readonly connectTimeoutMs?: number;
  /**
   * Publish in sub-entry batches (off by default: one message per entry). See {@link SubEntryOptions}.
   * @remarks Since 0.4.0
   * @defaultValue none: one message per entry
   */
  readonly subEntry?: SubEntryOptions;
}

/**
 * Automatic or explicit IDs: every `durability`.
 *
 * @remarks Since 0.6.0
 */
export interface StreamNumberedPublisherOptions extends StreamPublisherCommonOptions {
  /**
   * `'auto'` (the default) or `'explicit'`; `'keyed'` is {@link StreamKeyedPublisherOptions}.
   * @defaultValue 'auto'
   */
  readonly idMode?: 'auto' | 'explicit';
}

/**
 * Keyed IDs: `durability` is `'outbox'` (`'reserve'` is refused with `DEDUP_UNSAFE_OPTIONS`: a
 * crash could leave a key recorded whose message never reached the broker).
 *
 * @remarks Since 0.6.0
 */
export interface StreamKeyedPublisherOptions extends StreamPublisherCommonOptions {
  /** Keyed IDs. */
  readonly idMode: 'keyed';
  /** Only `'outbox'`. @defaultValue 'outbox' */
  readonly durability?: 'outbox';
}

/**
 * Options of {@link StreamDedupPublisher.open}. Keyed IDs take no `durability: 'reserve'`: the
 * types say what `open()` checks at run time (`DEDUP_UNSAFE_OPTIONS` for a caller the types do
 * not reach).
 *
 * @remarks Since 0.1.0; a union of {@link StreamNumberedPublisherOptions} and
 *   {@link StreamKeyedPublisherOptions} since 0.6.0 (before, one interface).
 */
export type StreamDedupPublisherOptions = StreamNumberedPublisherOptions | StreamKeyedPublisherOptions;

/** {@link SubEntryOptions} checked, with their defaults; `size` 1 is off. @internal */
export interface ResolvedSubEntry {
  readonly size: number;
  readonly compression: SubEntryCompression;
  readonly maxUncompressedBytes: number;
}

/** Sub-entry batching off. @internal */
export const NO_SUB_ENTRIES: ResolvedSubEntry = Object.freeze({
  size: 1,
  compression: 'none',
  maxUncompressedBytes: DEFAULT_MAX_UNCOMPRESSED_BATCH_BYTES,
});

/**
 * Checks `subEntry` before any I/O.
 *
 * @throws TypeError, RangeError "Expected subEntry… to be <what>, got <value>"; zstd where Node's
 *   zlib has no zstd is a RangeError naming the Node version it needs.
 * @internal
 */
export function resolveSubEntry(value: unknown, name = 'subEntry'): ResolvedSubEntry {
  if (absent(value)) return NO_SUB_ENTRIES;
  expectObject(value, name);
  const size = integerOption(value.size, `${name}.size`, Number.NaN, 2, MAX_SUB_ENTRY_SIZE);
  if (Number.isNaN(size))
    outOfRange(`${name}.size`, `an integer from 2 to ${MAX_SUB_ENTRY_SIZE}`, value.size);
  const compression = choiceOption(
    value.compression,
    `${name}.compression`,
    ['none', 'gzip', 'zstd'],
    'none',
  );
  if (compression === 'zstd' && !HAS_ZSTD) {
    outOfRange(
      `${name}.compression`,
      `'none' or 'gzip' on Node ${process.versions.node} (zstd needs Node's zlib from 22.15 on)`,
      compression,
    );
  }
  const maxUncompressedBytes = integerOption(
    value.maxUncompressedBytes,
    `${name}.maxUncompressedBytes`,
    DEFAULT_MAX_UNCOMPRESSED_BATCH_BYTES,
    1,
    0xffff_ffff,
  );
  return Object.freeze({ size, compression, maxUncompressedBytes });
}

/**
 * Checks a reader's `maxInflatedBytes` (the chunk decoder's ceiling on what the compressed batches
 * of one chunk inflate to) before any I/O: an integer from 0 (no compressed batch read) to
 * 2^32 - 1 (the most one batch can announce, and a Buffer can hold on every Node.js version);
 * absent gives 16 MiB.
 *
 * @throws TypeError, RangeError "Expected maxInflatedBytes to be …, got …".
 * @internal
 */
export function resolveChunkLimits(value: unknown, name = 'maxInflatedBytes'): ChunkLimits {
  return Object.freeze({
    maxInflatedBytes: integerOption(value, name, DEFAULT_MAX_INFLATED_BYTES, 0, 0xffff_ffff),
  });
}
