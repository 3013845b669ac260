/**
 * What `SuperStreamDedupPublisher.open()` takes, and its options checked before any I/O: the
 * single-stream publisher's options (checked by the same code), plus the super stream, the
 * routing and the connection.
 */
import type { Client } from 'rabbitmq-stream-js-client';
import { measureUtf8 } from '../identity/utf8.js';
import {
  assertSubEntriesSafe,
  resolvePublisherOptions,
  type ResolvedPublisherOptions,
} from '../publisher/options.js';
import type { DedupPublisherOptions, SendResult } from '../publisher/types.js';
import { resolveSubEntry, type ResolvedSubEntry, type SubEntryOptions } from '../transport/stream-options.js';
import type { StreamConnectionOptions } from '../transport/util.js';
import {
  absent,
  choiceOption,
  expectFunction,
  expectObject,
  expectOptionalObject,
  outOfRange,
  timerOption,
  typeMismatch,
} from '../util/options.js';

/**
 * Gives a message's routing key. Called once per `send()`, synchronously, with the body and the
 * headers as passed to `send()`; it must return a non-empty string (the same string for the same
 * logical message, or its repeats land in another partition).
 */
export type RoutingKeyFunction = (
  body: Uint8Array,
  headers: Readonly<Record<string, string | number>> | undefined,
) => string;

/**
 * How a message finds its partition.
 *
 * - `hash`: MurmurHash3 of the routing key's UTF-8 bytes (seed 104729) modulo the partition count,
 *   over the partitions in the order the broker lists them: what the Java, JavaScript, Go, .NET,
 *   Python and Rust clients do, so every client routes one key to one partition. With
 *   `idMode: 'keyed'` the domain key (`send()`'s `key`) is the routing key and `key` is left out.
 * - `key`: the super stream exchange's bindings (the broker's route query) route the routing key,
 *   as with the clients' "routing key" strategy; results are cached per routing key. Not with
 *   `idMode: 'keyed'`. The store pins the partition list, not the bindings: a binding changed to
 *   send a key to another existing partition is not detected.
 */
export type SuperStreamRouting =
  | {
      /** MurmurHash3 of the routing key modulo the partition count. */
      readonly kind: 'hash';
      /**
       * Gives the routing key (left out only with keyed IDs: the domain key).
       * @defaultValue none: only with keyed IDs, where the domain key routes
       */
      readonly key?: RoutingKeyFunction;
    }
  | {
      /** The exchange's bindings route the routing key. */
      readonly kind: 'key';
      /** Gives the routing key. */
      readonly key: RoutingKeyFunction;
    };

/**
 * The options of `SuperStreamDedupPublisher.open` whatever the `idMode`: see
 * {@link SuperStreamDedupPublisherOptions}, which adds `routing`.
 *
 * @remarks Since 0.6.0 (before, these were all of `SuperStreamDedupPublisherOptions`).
 */
export interface SuperStreamPublisherCommonOptions extends DedupPublisherOptions {
  /**
   * Connection parameters (as for `StreamDedupPublisher`), or an existing `Client` to share. With
   * parameters every partition has its own connections and reconnects them by itself, and one
   * more connection asks the broker for partitions (and, with `routing.kind: 'key'`, routes);
   * with a `Client` every partition's producer is declared on it and `close()` leaves it open.
   * @defaultValue `{ hostname: 'localhost', port: 5552, username: 'guest', password: 'guest', vhost: '/' }`
   */
  readonly connection?: StreamConnectionOptions | Client;
  /** The super stream (its exchange's name); its partitions are discovered at `open()`. */
  readonly superStream: string;
  /** How long one connection attempt or query may take, in ms. @defaultValue 10000 */
  readonly connectTimeoutMs?: number;
  /**
   * Publish every partition in sub-entry batches, as `StreamDedupPublisher` does.
   * @remarks Since 0.4.0
   * @defaultValue none: one message per entry
   */
  readonly subEntry?: SubEntryOptions;
}

/**
 * Automatic or explicit IDs: `routing` is required.
 *
 * @remarks Since 0.6.0
 */
export interface SuperStreamRoutedPublisherOptions extends SuperStreamPublisherCommonOptions {
  /**
   * `'auto'` (the default) or `'explicit'`; `'keyed'` is {@link SuperStreamKeyedPublisherOptions}.
   * @defaultValue 'auto'
   */
  readonly idMode?: 'auto' | 'explicit';
  /** How a message finds its partition. */
  readonly routing: SuperStreamRouting;
}

/**
 * Keyed IDs: the domain key (`send()`'s `key`) routes by hash, so `routing` is left out (or
 * `{ kind: 'hash' }` without a `key`), and `durability` is `'outbox'` (`'reserve'` is refused
 * with `DEDUP_UNSAFE_OPTIONS`, as for every publisher).
 *
 * @remarks Since 0.6.0
 */
export interface SuperStreamKeyedPublisherOptions extends SuperStreamPublisherCommonOptions {
  /** Keyed IDs. */
  readonly idMode: 'keyed';
  /** Only `'outbox'`. @defaultValue 'outbox' */
  readonly durability?: 'outbox';
  /** Left out, or `{ kind: 'hash' }`: the domain key is the routing key. @defaultValue `{ kind: 'hash' }` */
  readonly routing?: {
    /** By hash: the only routing keyed IDs take. */
    readonly kind: 'hash';
    /** Left out: the domain key is the routing key. @defaultValue none: the domain key routes */
    readonly key?: undefined;
  };
}

/**
 * Options of `SuperStreamDedupPublisher.open`. `routing` is required unless `idMode` is
 * `'keyed'`, where the domain key routes by hash: the types say what `open()` checks at run time
 * (a TypeError or RangeError for a caller the types do not reach).
 *
 * @remarks A union of {@link SuperStreamRoutedPublisherOptions} and
 *   {@link SuperStreamKeyedPublisherOptions} since 0.6.0; before, one interface in which `routing`
 *   was optional.
 */
export type SuperStreamDedupPublisherOptions =
  SuperStreamRoutedPublisherOptions | SuperStreamKeyedPublisherOptions;

/** What a resolved `send()` of a super stream publisher tells. */
export interface SuperStreamSendResult extends SendResult {
  /** The partition (stream) the message went to. */
  readonly partition: string;
}

/** The super stream options with every default filled in; frozen. @internal */
export interface ResolvedSuperStreamOptions {
  readonly superStream: string;
  readonly routing: { readonly kind: 'hash' | 'key'; readonly key: RoutingKeyFunction | undefined };
  readonly connection: StreamConnectionOptions | Client | undefined;
  readonly connectTimeoutMs: number;
  /** Sub-entry batching of every partition (`size` 1: off). */
  readonly subEntry: ResolvedSubEntry;
  /** The options every partition's publisher core takes, checked. */
  readonly publisher: ResolvedPublisherOptions;
}

/** The longest stream name RabbitMQ takes; partitions add a suffix to the super stream's. */
const MAX_NAME = 255;

/**
 * Checks every option before any I/O and fills in the defaults.
 *
 * @throws TypeError for an option of the wrong type, RangeError for one out of range (message
 *   "Expected <name> to be <what>, got <value>"); DedupError `DEDUP_UNSAFE_OPTIONS` as the
 *   single-stream publisher (keyed IDs without an outbox).
 * @internal
 */
export function resolveSuperStreamOptions(
  options: SuperStreamDedupPublisherOptions,
): ResolvedSuperStreamOptions {
  expectObject(options, 'options');
  const superStream: unknown = options.superStream;
  const what = `a non-empty string of at most ${MAX_NAME} UTF-8 bytes`;
  if (typeof superStream !== 'string') typeMismatch('superStream', what, superStream);
  // The broker bounds names in bytes (a short string); 255 characters of 'é' are 510 bytes.
  const measured = measureUtf8(superStream);
  if (superStream.length === 0 || measured.bytes > MAX_NAME) outOfRange('superStream', what, superStream);
  if (measured.loneSurrogate) {
    outOfRange('superStream', 'a string without lone UTF-16 surrogates', superStream);
  }
  // A super stream publisher has no `stream`: refuse one rather than let it look used.
  const stray = options as { stream?: unknown; createStream?: unknown };
  if (!absent(stray.stream))
    outOfRange('stream', 'left out (the partitions come from superStream)', stray.stream);
  if (!absent(stray.createStream)) {
    outOfRange('createStream', 'left out (create the super stream beforehand)', stray.createStream);
  }
  const publisher = resolvePublisherOptions(options);
  expectOptionalObject(options.connection, 'connection');
  const connectTimeoutMs = timerOption(options.connectTimeoutMs, 'connectTimeoutMs', 10_000, 1);
  const subEntry = resolveSubEntry(options.subEntry);
  assertSubEntriesSafe(publisher, subEntry.size);
  return Object.freeze({
    superStream,
    subEntry,
    routing: Object.freeze(resolveRouting(options.routing, publisher.idMode === 'keyed')),
    connection: options.connection ?? undefined,
    connectTimeoutMs,
    publisher,
  });
}

function resolveRouting(
  routing: unknown,
  keyed: boolean,
): { kind: 'hash' | 'key'; key: RoutingKeyFunction | undefined } {
  if (keyed) {
    // The domain key alone decides the partition: a repeat of a key then always reaches the
    // partition whose key index holds it. A routing function could send it elsewhere.
    if (absent(routing)) return { kind: 'hash', key: undefined };
    expectObject(routing, 'routing');
    const kind = choiceOption(routing.kind, 'routing.kind', ['hash', 'key'], 'hash');
    if (kind !== 'hash')
      outOfRange('routing.kind', "'hash' with idMode 'keyed' (the domain key routes)", kind);
    if (!absent(routing.key)) {
      outOfRange(
        'routing.key',
        "left out with idMode 'keyed' (the domain key is the routing key)",
        routing.key,
      );
    }
    return { kind, key: undefined };
  }
  if (typeof routing !== 'object' || routing === null || Array.isArray(routing)) {
    typeMismatch('routing', "an object { kind: 'hash' | 'key', key: (body, headers) => string }", routing);
  }
  const r = routing as Record<string, unknown>;
  if (absent(r.kind)) typeMismatch('routing.kind', "one of 'hash', 'key'", r.kind);
  const kind = choiceOption(r.kind, 'routing.kind', ['hash', 'key'], 'hash');
  expectFunction(r.key, 'routing.key');
  return { kind, key: r.key as RoutingKeyFunction };
}
