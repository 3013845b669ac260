/**
 * The publisher's options: defaults merged into one frozen, fully typed object, and every option
 * checked before any I/O (a typo fails `open()` at once instead of silently becoming the default).
 * Combinations that cannot be made safe whatever the broker says are refused here too.
 */
import { DedupError } from '../errors.js';
import { assertProducerName } from '../identity/producer-name.js';
import type { IdMode } from '../store/codec.js';
import { DedupStore } from '../store/store.js';
import { resolveLogger, type Logger } from '../telemetry/logger.js';
import {
  booleanOption,
  choiceOption,
  expectObject,
  expectOptionalObject,
  integerOption,
  timerOption,
  typeMismatch,
} from '../util/options.js';
import type { DedupPublisherOptions, Durability } from './types.js';

/** The options of a publisher with every default filled in; frozen. */
export interface ResolvedPublisherOptions {
  readonly producerName: string;
  readonly store: string | DedupStore;
  readonly sync: boolean;
  readonly durability: Durability;
  readonly idMode: IdMode;
  readonly keyRetention: { readonly maxKeys: number; readonly maxAgeMs: number };
  readonly onBrokerAhead: 'error' | 'adopt';
  readonly maxInFlight: number;
  readonly maxBatch: number;
  readonly reserveBlock: number;
  readonly confirmTimeoutMs: number;
  readonly closeTimeoutMs: number;
  readonly reconnect: {
    readonly initialDelayMs: number;
    readonly maxDelayMs: number;
    readonly giveUpAfterMs: number;
  };
  readonly watchIntervalMs: number;
  readonly logger: Logger;
  readonly tracing: boolean;
}

/** The defaults (README, "API"). */
const PUBLISHER_DEFAULTS = Object.freeze({
  sync: false,
  durability: 'outbox',
  idMode: 'auto',
  maxKeys: 100_000,
  maxKeyAgeMs: 7 * 24 * 3_600_000,
  onBrokerAhead: 'error' as const,
  maxInFlight: 5_000,
  maxBatch: 2_000,
  reserveBlock: 10_000,
  confirmTimeoutMs: 30_000,
  closeTimeoutMs: 10_000,
  initialDelayMs: 100,
  maxDelayMs: 5_000,
  giveUpAfterMs: 120_000,
  watchIntervalMs: 0,
});

/**
 * Checks every option the publisher core reads and returns them with the defaults filled in.
 *
 * @throws TypeError for an option of the wrong type, RangeError for one out of range (message
 * "Expected <name> to be <what>, got <value>"); DedupError `DEDUP_UNSAFE_OPTIONS` for keyed IDs
 * without an outbox.
 */
export function resolvePublisherOptions(options: DedupPublisherOptions): ResolvedPublisherOptions {
  expectObject(options, 'options');
  assertProducerName(options.producerName);
  if (typeof options.store !== 'string' && !(options.store instanceof DedupStore)) {
    typeMismatch('store', 'a folder path or an opened DedupStore', options.store);
  }
  if (typeof options.store === 'string' && options.store.length === 0) {
    typeMismatch('store', 'a folder path or an opened DedupStore', options.store);
  }
  const sync = booleanOption(options.sync, 'sync', PUBLISHER_DEFAULTS.sync);
  const durability = choiceOption(
    options.durability,
    'durability',
    ['outbox', 'reserve'],
    PUBLISHER_DEFAULTS.durability,
  );
  const idMode = choiceOption(
    options.idMode,
    'idMode',
    ['auto', 'explicit', 'keyed'],
    PUBLISHER_DEFAULTS.idMode,
  );
  expectOptionalObject(options.keyRetention, 'keyRetention');
  expectOptionalObject(options.reconnect, 'reconnect');
  const retention: NonNullable<DedupPublisherOptions['keyRetention']> = options.keyRetention ?? {};
  const reconnect: NonNullable<DedupPublisherOptions['reconnect']> = options.reconnect ?? {};
  const resolved: ResolvedPublisherOptions = {
    producerName: options.producerName,
    store: options.store,
    sync,
    durability,
    idMode,
    keyRetention: Object.freeze({
      maxKeys: integerOption(retention.maxKeys, 'keyRetention.maxKeys', PUBLISHER_DEFAULTS.maxKeys, 1),
      maxAgeMs: integerOption(retention.maxAgeMs, 'keyRetention.maxAgeMs', PUBLISHER_DEFAULTS.maxKeyAgeMs, 1),
    }),
    onBrokerAhead: choiceOption(
      options.onBrokerAhead,
      'onBrokerAhead',
      ['error', 'adopt'],
      PUBLISHER_DEFAULTS.onBrokerAhead,
    ),
    maxInFlight: integerOption(options.maxInFlight, 'maxInFlight', PUBLISHER_DEFAULTS.maxInFlight, 1),
    maxBatch: integerOption(options.maxBatch, 'maxBatch', PUBLISHER_DEFAULTS.maxBatch, 1),
    reserveBlock: integerOption(options.reserveBlock, 'reserveBlock', PUBLISHER_DEFAULTS.reserveBlock, 1),
    // Compared with the clock, never a timer's delay: any size (a huge one turns timeouts off).
    confirmTimeoutMs: integerOption(
      options.confirmTimeoutMs,
      'confirmTimeoutMs',
      PUBLISHER_DEFAULTS.confirmTimeoutMs,
      1,
    ),
    closeTimeoutMs: timerOption(
      options.closeTimeoutMs,
      'closeTimeoutMs',
      PUBLISHER_DEFAULTS.closeTimeoutMs,
      0,
    ),
    reconnect: Object.freeze({
      initialDelayMs: timerOption(
        reconnect.initialDelayMs,
        'reconnect.initialDelayMs',
        PUBLISHER_DEFAULTS.initialDelayMs,
        1,
      ),
      maxDelayMs: timerOption(reconnect.maxDelayMs, 'reconnect.maxDelayMs', PUBLISHER_DEFAULTS.maxDelayMs, 1),
      giveUpAfterMs: integerOption(
        reconnect.giveUpAfterMs,
        'reconnect.giveUpAfterMs',
        PUBLISHER_DEFAULTS.giveUpAfterMs,
        1,
      ),
    }),
    watchIntervalMs: timerOption(
      options.watchIntervalMs,
      'watchIntervalMs',
      PUBLISHER_DEFAULTS.watchIntervalMs,
      0,
    ),
    logger: resolveLogger(options.logger),
    tracing: booleanOption(options.tracing, 'tracing', true),
  };
  if (idMode === 'keyed' && durability === 'reserve') {
    // A key's record is written before its message leaves. After a crash the record may name a
    // message that never reached the broker ('duplicate' to every re-send: a silent loss), or
    // one whose frames are still on their way from the dead process (forgetting the key and
    // re-sending it under a new ID lands it twice; the publisher model found that race). Only
    // the outbox ties the record to the message.
    throw new DedupError(
      'DEDUP_UNSAFE_OPTIONS',
      `idMode 'keyed' needs durability 'outbox': without it a crash can leave a key recorded whose message ` +
        `never reached the broker (lost) or is still on its way (published twice if the key is re-sent)`,
    );
  }
  return Object.freeze(resolved);
}

/**
 * Refuses sub-entry batching where a re-send could be cut into other batches than the first send
 * (docs/design.md §10): explicit IDs without an outbox. After a crash the caller re-sends its own
 * IDs, cut by the new process's group commits; a batch of the dead process still on its way can
 * land after the new process asked the broker for its last ID, and a re-cut batch straddling it
 * would be stored whole with messages already in the stream.
 *
 * @throws DedupError `DEDUP_UNSAFE_OPTIONS`.
 */
export function assertSubEntriesSafe(opts: ResolvedPublisherOptions, subEntrySize: number): void {
  if (subEntrySize > 1 && opts.idMode === 'explicit' && opts.durability === 'reserve') {
    throw new DedupError(
      'DEDUP_UNSAFE_OPTIONS',
      `subEntry with idMode 'explicit' needs durability 'outbox': without it the messages you re-send after a ` +
        `crash are batched anew, and a new batch that overlaps one the dead process still had on its way is ` +
        `stored whole, duplicating what that one stored`,
    );
  }
}
